"""The dataset's index (wids shard-index format) and its SageMaker ManifestFile.

The index is what readers open first, so it is written last. Shard URLs are relative to the
index, as wids resolves them, so a synced copy of the directory stays readable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lading.core.errors import ProblemFound
from lading.pack.plan import PackPlan

INDEX_KIND = "wids-shard-index-v1"


@dataclass(frozen=True)
class PublishedShard:
    """A shard as stored: its file name, sample count, size, the store's version (ETag) and the
    CRC32C of its bytes (base64, big-endian; what the node cache checks each download against)."""

    name: str
    nsamples: int
    filesize: int
    etag: str
    crc32c: str | None = None

    def entry(self, without: tuple[str, ...] = ()) -> dict[str, Any]:
        """Its entry in the index: ``url``, ``nsamples``, ``filesize``, ``etag`` and ``crc32c``
        (when known), less the fields named in ``without``."""
        entry = {"url": self.name, "nsamples": self.nsamples, "filesize": self.filesize, "etag": self.etag}
        if self.crc32c is not None:
            entry["crc32c"] = self.crc32c
        return {name: value for name, value in entry.items() if name not in without}


def build_index(plan: PackPlan, shards: list[PublishedShard], offsets: PublishedShard | None = None) -> dict[str, Any]:
    """The wids index: ``__kind__``, ``wids_version``, ``name``, ``shardlist`` (url, nsamples,
    filesize, plus the stored ``etag`` and the ``crc32c``), and lading's own ``lading`` block
    (version, order, and the offsets file as ``{url, filesize, etag, crc32c}``: see
    :mod:`lading.pack.offsets`)."""
    options = plan.options
    index: dict[str, Any] = {
        "__kind__": INDEX_KIND,
        "wids_version": 1,
        "name": options.name,
        "shardlist": [shard.entry() for shard in shards],
        "lading": {
            "format": 1,
            "version": options.version,
            "shuffle": options.shuffle,
            "seed": options.seed if options.shuffle else None,
            "shard_size": options.shard_size,
            "nsamples": plan.nsamples,
            "nfiles": sum(shard.nfiles for shard in plan.shards),
            "input_bytes": plan.input_bytes,
        },
    }
    if offsets is not None:
        index["lading"]["offsets"] = offsets.entry(without=("nsamples",))
    return index


def build_manifest(dest_prefix_uri: str, plan: PackPlan) -> list[Any]:
    """A SageMaker ManifestFile: ``[{"prefix": "<dest>/"}, "NAME-000000.tar", ...]``."""
    prefix = dest_prefix_uri if dest_prefix_uri.endswith("/") else dest_prefix_uri + "/"
    return [{"prefix": prefix}, *(shard.name for shard in plan.shards)]


def dump(document: Any) -> bytes:
    """Stable JSON bytes (sorted keys inside objects, list order kept)."""
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def parse_index(data: bytes, where: str) -> dict[str, Any]:
    """Load and check an index: wids_version 1 and a shardlist of {url, nsamples}."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise ProblemFound(f"{where} is not valid JSON: {err}") from err
    shardlist = document.get("shardlist") if isinstance(document, dict) else None
    if document.get("wids_version") != 1 if isinstance(document, dict) else True:
        raise ProblemFound(f'{where} is not a wids shard index (no "wids_version": 1)')
    if not isinstance(shardlist, list) or not all(
        isinstance(shard, dict) and isinstance(shard.get("url"), str) and isinstance(shard.get("nsamples"), int)
        for shard in shardlist
    ):
        raise ProblemFound(f'{where} has no valid "shardlist" of {{url, nsamples}} entries')
    return document
