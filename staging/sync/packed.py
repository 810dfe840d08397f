"""Packed datasets (``lading pack`` output) through the node cache: reuse a current copy, refuse a
mixed one.

When a cache fill covers a whole source (no manifest, no key left out by filters or sharding)
that holds lading indexes (``NAME.index.json``):

- the cached copy is *reused*, with no GET at all, when the cache entry already holds every
  listed object at its listed ETag (its state record says so) and the bucket's listing shows
  every shard with the ETag and size the index recorded: same name, same version, same content;
- the sync is *refused* (nothing written into DEST) when the listing and an index disagree: a
  re-pack in progress, or shards replaced behind the index. It is checked before the fill when
  the cache already holds the listed index, and right after the fill otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

from lading.core.errors import ProblemFound
from lading.core.keys import safe_join
from lading.pack.reuse import PackedDataset, index_keys, listing_mismatches, read_packed
from lading.stores.base import ObjectInfo
from lading.sync.plan import Selection, SyncPlan, SyncRequest

_SHOWN_MISMATCHES = 3


def packed_index_keys(selection: Selection, request: SyncRequest) -> list[str]:
    """Index keys in ``selection`` when it is the whole source, else none (a partial listing
    can't tell a missing shard from one left out)."""
    whole = request.manifest is None and selection.selected_files == selection.listed - selection.markers
    return index_keys(selection.objects()) if whole else []


def cached_datasets(entry: Path, keys: Iterable[str]) -> list[PackedDataset]:
    """The lading datasets whose index files under ``entry`` are at ``keys`` (others are skipped)."""
    datasets = []
    for key in keys:
        try:
            data = safe_join(entry, key).read_bytes()
        except OSError:
            continue
        dataset = read_packed(key, data)
        if dataset is not None:
            datasets.append(dataset)
    return datasets


def refuse_mismatched(datasets: Iterable[PackedDataset], listing: Mapping[str, ObjectInfo], source: str) -> None:
    """Raise :class:`ProblemFound` when the listing's shards disagree with an index."""
    for dataset in datasets:
        problems = listing_mismatches(dataset, listing)
        if problems:
            more = f" (and {len(problems) - _SHOWN_MISMATCHES} more)" if len(problems) > _SHOWN_MISMATCHES else ""
            raise ProblemFound(
                f"{source}: packed dataset {describe(dataset)} does not match its index, nothing was written: "
                f"{'; '.join(problems[:_SHOWN_MISMATCHES])}{more}",
                "a re-pack may still be uploading, or shards were replaced: re-run once `lading pack` "
                "has finished, or re-pack the dataset",
            )


def reusable_datasets(
    index_keys_: list[str], cache_plan: SyncPlan, entry: Path, listing: Mapping[str, ObjectInfo], source: str
) -> list[PackedDataset]:
    """The datasets to reuse from the cache entry without any GET (empty: fill as usual).

    ``cache_plan`` is the fill's plan against the entry; indexes it would not fetch are the
    listed ones, so they are checked against the listing now, before anything is downloaded.
    """
    wanted = set(index_keys_)
    stale = {item.info.key for item in cache_plan.to_fetch() if item.info.key in wanted}
    datasets = cached_datasets(entry, (key for key in index_keys_ if key not in stale))
    refuse_mismatched(datasets, listing, source)
    if cache_plan.fetch_files or cache_plan.delete_files:
        return []
    return datasets


def describe(dataset: PackedDataset) -> str:
    """``name version`` (or just ``name``) for messages."""
    return f"{dataset.name} {dataset.version}" if dataset.version else dataset.name


__all__ = ["cached_datasets", "describe", "packed_index_keys", "refuse_mismatched", "reusable_datasets"]
