"""The content check behind node-cache reuse of packed datasets: the listing must show the index's ETags."""

from __future__ import annotations

import json
import os
from pathlib import Path

from lading.pack import PackOptions, plan_pack, run_pack
from lading.pack.reuse import index_keys, listing_mismatches, read_packed
from lading.stores.local import LocalStore


def packed_bucket(tmp_path: Path, version: str = "v1") -> Path:
    source, bucket = tmp_path / "src", tmp_path / "bucket"
    source.mkdir(exist_ok=True)
    for i in range(12):
        (source / f"s{i:02d}.bin").write_bytes(os.urandom(3000))
    plan = plan_pack(str(source), str(bucket), PackOptions("ds", shard_size=12_000, version=version))
    run_pack(plan, str(source), str(bucket))
    return bucket


def load(bucket: Path):
    listing = {info.key: info for info in LocalStore(bucket).list()}
    [index_key] = index_keys(listing.values())
    return read_packed(index_key, (bucket / index_key).read_bytes()), listing


def test_index_matches_its_own_listing(tmp_path):
    bucket = packed_bucket(tmp_path)
    dataset, listing = load(bucket)
    assert dataset.name == "ds" and dataset.version == "v1" and len(dataset.shards) >= 3
    assert all(key.startswith("ds/v1/ds-") for key in dataset.shards)
    assert listing_mismatches(dataset, listing) == []


def test_replaced_or_missing_shard_is_a_mismatch(tmp_path):
    bucket = packed_bucket(tmp_path)
    dataset, _ = load(bucket)
    first, last = sorted(dataset.shards)[0], sorted(dataset.shards)[-1]
    os.utime(bucket / first, ns=(1, 1))  # a new version of the object: its ETag changes
    (bucket / last).unlink()
    listing = {info.key: info for info in LocalStore(bucket).list()}
    assert listing_mismatches(dataset, listing) == [
        f"{first}: ETag {listing[first].version} in the bucket, {dataset.shards[first][0]} in ds/v1/ds.index.json",
        f"{last}: listed in ds/v1/ds.index.json but not in the bucket",
    ]


def test_non_lading_indexes_are_ignored(tmp_path):
    plain = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": [{"url": "a.tar", "nsamples": 1}]}
    assert read_packed("x.index.json", json.dumps(plain).encode()) is None
    assert read_packed("x.index.json", b"not json") is None
