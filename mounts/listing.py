"""Build the mount's tree: from a listing or a manifest, optionally only this rank's shard."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from lading.mounts.tree import Tree
from lading.stores import NotFound, ObjectInfo, Store, refuse_an_object


@dataclass(frozen=True)
class ViewSpec:
    """Which objects the mount shows. The caller owns the selection rules (manifest, sharding)."""

    keys: tuple[str, ...] | None = None  # a manifest's keys: stat these instead of listing
    manifest: Path | None = None  # where ``keys`` came from, for error messages
    select: Callable[[list[ObjectInfo]], Iterable[ObjectInfo]] | None = None  # e.g. one rank's shard
    allow_empty: bool = False  # mount an empty listing instead of refusing it (a mistyped prefix)


def build_tree(store: Store, source: str, view: ViewSpec, concurrency: int = 16) -> Tree:
    """List (or stat the manifest's keys), apply the view's selection, and build the tree.

    An empty listing (nothing but directory markers) raises NotFound unless ``view.allow_empty``:
    it is almost always a mistyped prefix (UsageError when the URI names one object instead).
    One rank's empty shard of a non-empty source is fine.
    """
    infos: Iterable[ObjectInfo]
    if view.keys is not None:
        infos = _stat_keys(store, source, view.keys, view.manifest, concurrency)
    else:
        infos = store.list("")
    objects = 0

    def counted(items: Iterable[ObjectInfo]) -> Iterator[ObjectInfo]:
        nonlocal objects
        for info in items:
            if info.size or not info.key.endswith("/"):  # directory markers don't count
                objects += 1
            yield info

    infos = counted(infos)
    if view.select is not None:
        infos = view.select(list(infos))
    tree = Tree(infos)
    if objects == 0 and not view.allow_empty:
        if view.keys is not None and not view.keys:  # nothing to blame on the prefix
            raise NotFound(
                f"the manifest {view.manifest or ''} is empty: it lists no keys",
                "check the file; --allow-empty mounts it anyway",
            )
        if view.keys is None:  # a URI that names one object: say so (one HEAD, exit 2)
            refuse_an_object(store, "mount the prefix that holds it, {parent}")
        raise NotFound(
            f"nothing at {source}: no objects under this prefix",
            "check the bucket and prefix, keys are case-sensitive; --allow-empty mounts it anyway",
        )
    return tree


def _stat_keys(
    store: Store, source: str, keys: tuple[str, ...], manifest: Path | None, concurrency: int
) -> Iterator[ObjectInfo]:
    """The manifest's objects, HEAD-ed in parallel (sizes and versions are needed up front)."""
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for key, info in zip(keys, pool.map(_stat_or_none, [store] * len(keys), keys)):
            if info is None:
                raise NotFound(f"{manifest or 'manifest'}: {key!r} is listed but does not exist in {source}")
            yield info


def _stat_or_none(store: Store, key: str) -> ObjectInfo | None:
    try:
        return store.stat(key)
    except NotFound:
        return None
