"""Reusing a node-local copy of a packed dataset: the check ``lading sync`` can make before it
transfers anything.

A packed dataset's index records its name, its version and each shard's ETag as uploaded. A
cached copy is current when its index names the same dataset, version and ETags, every shard
is there with the recorded size, and the bucket's listing still shows those ETags. That last
part is a real content check: a shard replaced since the pack (or a pack still being
re-uploaded) has another ETag, and the copy is not reused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from staging.errors import LadingError
from staging.keys import safe_join
from staging.pack.index import INDEX_KIND, parse_index
from staging.stores.base import ObjectInfo

INDEX_SUFFIX = ".index.json"


@dataclass(frozen=True)
class PackedDataset:
    """What an index says: name, version, and shard key -> (ETag, size), keys relative to the listing."""

    name: str
    version: str | None
    index_key: str
    shards: Mapping[str, tuple[str, int]]


def index_keys(listing: Iterable[ObjectInfo]) -> list[str]:
    """Keys that look like packed-dataset indexes (``NAME.index.json``)."""
    return sorted(info.key for info in listing if info.key.endswith(INDEX_SUFFIX))


def read_packed(index_key: str, data: bytes) -> PackedDataset | None:
    """The dataset an index describes, or None when it is not a lading-packed wids index."""
    try:
        document = parse_index(data, index_key)
    except LadingError:
        return None
    if document.get("__kind__") != INDEX_KIND or not isinstance(document.get("lading"), dict):
        return None
    folder = index_key.rpartition("/")[0]
    shards = {}
    for shard in document["shardlist"]:
        url, etag = shard["url"], shard.get("etag")
        if "://" in url or url.startswith("/") or not isinstance(etag, str):
            return None  # only self-contained datasets (relative shard names, recorded ETags)
        shards[f"{folder}/{url}" if folder else url] = (etag, int(shard.get("filesize", -1)))
    return PackedDataset(str(document.get("name", "")), document["lading"].get("version"), index_key, shards)


def listing_mismatches(dataset: PackedDataset, listing: Mapping[str, ObjectInfo]) -> list[str]:
    """Shards the listing shows missing or with another ETag or size than the index recorded."""
    problems = []
    for key, (etag, size) in sorted(dataset.shards.items()):
        info = listing.get(key)
        if info is None:
            problems.append(f"{key}: listed in {dataset.index_key} but not in the bucket")
        elif info.version != etag or (size >= 0 and info.size != size):
            problems.append(f"{key}: ETag {info.version} in the bucket, {etag} in {dataset.index_key}")
    return problems


def cached_copy_is_current(dataset: PackedDataset, cache_dir: Path) -> bool:
    """True when ``cache_dir`` holds this dataset: same index (name, version, ETags) and every
    shard present with its recorded size."""
    try:
        cached = read_packed(dataset.index_key, safe_join(cache_dir, dataset.index_key).read_bytes())
        if cached is None or (cached.name, cached.version, dict(cached.shards)) != \
                (dataset.name, dataset.version, dict(dataset.shards)):
            return False
        return all(safe_join(cache_dir, key).stat().st_size == size for key, (_, size) in dataset.shards.items())
    except (OSError, LadingError, json.JSONDecodeError):
        return False


def reusable(dataset: PackedDataset, listing: Mapping[str, ObjectInfo], cache_dir: Path) -> bool:
    """The whole check: the bucket still matches the index, and the cached copy matches both."""
    return not listing_mismatches(dataset, listing) and cached_copy_is_current(dataset, cache_dir)
