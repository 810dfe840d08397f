"""The node cache of the datasets: one cache with ``lading sync``'s, defined in
:mod:`lading.sync.cache` (the lower layer both use); re-exported here for the datasets."""

from __future__ import annotations

from lading.sync.cache import (  # noqa: F401 - re-exported
    FETCH,
    LOCK,
    META,
    CachedDataset,
    CachedShard,
    Cleared,
    Entry,
    FetchClaim,
    NodeCache,
    ShardSource,
    check_root,
    clear,
    default_cache_root,
    iter_entries,
    location_folder,
    map_file,
    open_root,
    parse_limit,
    remove_entry,
    summarize,
)

__all__ = [
    "CachedDataset",
    "CachedShard",
    "Cleared",
    "NodeCache",
    "ShardSource",
    "clear",
    "default_cache_root",
    "map_file",
    "parse_limit",
    "summarize",
]
