"""Packed datasets in a listing: the content check ``lading sync`` makes before it reuses a
node-local copy (:mod:`lading.sync.packed`).

A packed dataset's index records its name, its version and each shard's ETag and size as
uploaded. The bucket's listing must still show exactly those: a shard replaced since the pack,
or a pack still being re-uploaded, has another ETag, and the dataset is inconsistent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from lading.core.errors import LadingError
from lading.pack.index import INDEX_KIND, parse_index
from lading.stores.base import ObjectInfo

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
