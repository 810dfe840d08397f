"""Build the mount's tree: from a listing or a manifest, optionally only this rank's shard."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from mounts.tree import Tree
from staging.errors import NotFound
from staging.stores.base import ObjectInfo, Store


@dataclass(frozen=True)
class ViewSpec:
    """Which objects the mount shows."""

    manifest: Path | None = None
    rank: int = 0
    world_size: int = 1
    distribution: str = "replicated"
    balance: str = "count"


def build_tree(store: Store, source: str, view: ViewSpec, concurrency: int = 16) -> Tree:
    """List (or stat the manifest's keys), shard, and build the immutable tree."""
    infos: Iterable[ObjectInfo]
    if view.manifest is not None:
        infos = _stat_manifest(store, source, view.manifest, concurrency)
    else:
        infos = store.list("")
    if view.distribution == "sharded" and view.world_size > 1:
        from staging.sharding import select_for_rank

        infos = select_for_rank(list(infos), view.rank, view.world_size, "sharded", view.balance)
    return Tree(infos)


def _stat_manifest(store: Store, source: str, path: Path, concurrency: int) -> Iterator[ObjectInfo]:
    """The manifest's objects, HEAD-ed in parallel (sizes and versions are needed up front)."""
    from staging.manifest import keys_under, load_manifest

    keys = keys_under(load_manifest(path), source)
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for key, info in zip(keys, pool.map(_stat_or_none, [store] * len(keys), keys)):
            if info is None:
                raise NotFound(f"{path}: {key!r} is listed but does not exist in {source}")
            yield info


def _stat_or_none(store: Store, key: str) -> ObjectInfo | None:
    try:
        return store.stat(key)
    except NotFound:
        return None
