"""The node-cache reuse check for packed datasets: name, version and ETags must all match."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from staging.pack import PackOptions, plan_pack, run_pack
from staging.pack.reuse import index_keys, listing_mismatches, read_packed, reusable
from staging.stores.local import LocalStore


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


def test_identical_copy_is_reused(tmp_path):
    bucket = packed_bucket(tmp_path)
    dataset, listing = load(bucket)
    assert dataset.name == "ds" and dataset.version == "v1" and len(dataset.shards) >= 3
    assert all(key.startswith("ds/v1/ds-") for key in dataset.shards)
    cache = tmp_path / "cache"
    shutil.copytree(bucket, cache)
    assert reusable(dataset, listing, cache)


def test_replaced_shard_in_bucket_is_not_reused(tmp_path):
    bucket = packed_bucket(tmp_path)
    dataset, _ = load(bucket)
    cache = tmp_path / "cache"
    shutil.copytree(bucket, cache)
    first = sorted(dataset.shards)[0]
    os.utime(bucket / first, ns=(1, 1))  # a new version of the object: its ETag changes
    listing = {info.key: info for info in LocalStore(bucket).list()}
    assert listing_mismatches(dataset, listing) == [
        f"{first}: ETag {listing[first].version} in the bucket, {dataset.shards[first][0]} in ds/v1/ds.index.json"]
    assert not reusable(dataset, listing, cache)


def test_cache_of_another_version_or_incomplete_is_not_reused(tmp_path):
    bucket = packed_bucket(tmp_path)
    dataset, listing = load(bucket)
    cache = tmp_path / "cache"
    shutil.copytree(bucket, cache)
    index_path = cache / dataset.index_key
    document = json.loads(index_path.read_text())
    document["lading"]["version"] = "v0"
    index_path.write_text(json.dumps(document))
    assert not reusable(dataset, listing, cache)
    shutil.rmtree(cache)
    shutil.copytree(bucket, cache)
    (cache / sorted(dataset.shards)[-1]).write_bytes(b"truncated")
    assert not reusable(dataset, listing, cache)
    assert not reusable(dataset, listing, tmp_path / "empty")


def test_non_lading_indexes_are_ignored(tmp_path):
    plain = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": [{"url": "a.tar", "nsamples": 1}]}
    assert read_packed("x.index.json", json.dumps(plain).encode()) is None
    assert read_packed("x.index.json", b"not json") is None
