"""Plan a sync as data: which objects this rank gets, which to fetch, which are up to date, which to delete.

Two steps, both pure with respect to DEST (nothing is written):

1. :func:`select_objects` lists the source (streaming pages) or stats the manifest's keys, keeps
   keys matching the ``--include``/``--exclude`` globs, skips directory markers (zero-byte keys
   ending in ``/``), refuses unsafe keys for the whole selection (so every rank agrees) and an
   empty one (a mistyped prefix; unless ``allow_empty``), then applies the sharding rule of
   :mod:`lading.selection.sharding`.
2. :func:`plan_sync` compares the selection with the destination's state record
   (:mod:`lading.sync.state`) and the files on disk.

The :class:`SyncPlan` is what ``--dry-run`` and ``--json`` show.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import stat as stat_mode
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from lading.core.errors import NotFound, UnsafeKey, UsageError
from lading.core.keys import find_collisions, key_parts
from lading.selection.manifest import Manifest, keys_under, share_records
from lading.selection.sharding import BALANCES, DISTRIBUTIONS, select_for_rank
from lading.stores.base import ObjectInfo, Store
from lading.sync.state import RESERVED_NAMES, SyncState

log = logging.getLogger(__name__)

_SHOWN_UNSAFE = 5


@dataclass(frozen=True)
class SyncRequest:
    """What to sync where, for which rank. ``dest`` is the already-rendered destination."""

    source: str
    dest: Path
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    manifest: Manifest | None = None
    distribution: str = "replicated"
    balance: str = "count"
    rank: int = 0
    world_size: int = 1
    delete: bool = False
    allow_empty: bool = False  # an empty listing (or none matching the filters) is not an error

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise UsageError(f"unknown distribution {self.distribution!r}", "use replicated or sharded")
        if self.balance not in BALANCES:
            raise UsageError(f"unknown balance {self.balance!r}", "use count or bytes")
        if not 0 <= self.rank < self.world_size:
            raise UsageError(f"rank {self.rank} is outside 0..{self.world_size - 1}")


@dataclass
class Selection:
    """The objects this rank gets (key order), and counts from the listing."""

    objects: list[ObjectInfo]
    listed: int = 0
    matched: int = 0
    markers: int = 0
    records: tuple[int, ...] | None = None  # augmented manifest: this rank's lines (share_records)


@dataclass(frozen=True)
class PlannedFetch:
    """An object to fetch and why: new, changed, missing, modified or untracked."""

    info: ObjectInfo
    reason: str


@dataclass
class SyncPlan:
    """The sync, as data. ``to_fetch``/``up_to_date`` are this rank's objects; ``to_delete`` are
    files lading tracks in DEST that left the selection (only with ``--delete``)."""

    source: str
    dest: str
    rank: int
    world_size: int
    distribution: str
    balance: str
    to_fetch: list[PlannedFetch] = field(default_factory=list)
    up_to_date: list[ObjectInfo] = field(default_factory=list)
    to_delete: list[str] = field(default_factory=list)
    listed: int = 0
    matched: int = 0

    @property
    def fetch_bytes(self) -> int:
        """Bytes the plan will fetch."""
        return sum(item.info.size for item in self.to_fetch)

    def totals(self) -> dict[str, int]:
        """Counts and bytes per category."""
        return {
            "listed": self.listed,
            "matched": self.matched,
            "selected_files": len(self.to_fetch) + len(self.up_to_date),
            "selected_bytes": self.fetch_bytes + sum(info.size for info in self.up_to_date),
            "fetch_files": len(self.to_fetch),
            "fetch_bytes": self.fetch_bytes,
            "up_to_date_files": len(self.up_to_date),
            "delete_files": len(self.to_delete),
        }

    def to_json(self) -> dict[str, object]:
        """The JSON shape of ``lading sync --dry-run --json``."""
        return {
            "source": self.source,
            "dest": self.dest,
            "rank": self.rank,
            "world_size": self.world_size,
            "distribution": self.distribution,
            "balance": self.balance,
            "totals": self.totals(),
            "to_fetch": [{"key": item.info.key, "size": item.info.size, "version": item.info.version,
                          "reason": item.reason} for item in self.to_fetch],
            "up_to_date": [info.key for info in self.up_to_date],
            "to_delete": list(self.to_delete),
        }


def matches_filters(key: str, include: Iterable[str], exclude: Iterable[str]) -> bool:
    """True when ``key`` matches an include glob (or there are none) and no exclude glob.

    Globs use :mod:`fnmatch` on the whole key relative to the source, so ``*`` also crosses
    ``/``: ``*.jpg`` matches ``a/b/c.jpg`` and ``train/*`` everything under ``train/``.
    """
    include = tuple(include)
    if include and not any(fnmatch.fnmatchcase(key, pattern) for pattern in include):
        return False
    return not any(fnmatch.fnmatchcase(key, pattern) for pattern in exclude)


def source_objects(store: Store, manifest: Manifest | None, source: str, workers: int = 32) -> Iterator[ObjectInfo]:
    """The store's listing, or (with a manifest) one ``stat`` per key, done in parallel."""
    if manifest is None:
        yield from store.list()
        return
    keys = keys_under(manifest, source)
    unsafe = [reason for reason in map(unsafe_reason, keys) if reason is not None]
    if unsafe:  # never hand an escaping key to a store; name every problem at once
        safe = [key for key in keys if unsafe_reason(key) is None]
        _refuse(unsafe, _collision_reasons(safe), source)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(keys) or 1))) as pool:
        yield from pool.map(store.stat, keys)


def unsafe_reason(key: str, raise_it: bool = False) -> str | None:
    """Why ``key`` can't be written under DEST (None if it can)."""
    try:
        parts = key_parts(key)
    except UnsafeKey as err:
        if raise_it:
            raise
        return err.message
    if parts[0] in RESERVED_NAMES:
        message = f"refusing key {key!r}: the name is reserved for lading's state record"
        if raise_it:
            raise UnsafeKey(message)
        return message
    return None


def select_objects(store: Store, request: SyncRequest, workers: int = 32) -> Selection:
    """List (or stat the manifest), filter, check safety and shard: this rank's objects."""
    kept: list[ObjectInfo] = []
    unsafe: list[str] = []
    listed = markers = 0
    for info in source_objects(store, request.manifest, request.source, workers):
        listed += 1
        if info.key.endswith("/") and info.size == 0:
            markers += 1  # a "folder" created by a console: nothing to write
            continue
        if not matches_filters(info.key, request.include, request.exclude):
            continue
        reason = unsafe_reason(info.key)
        if reason is not None:
            unsafe.append(reason)
            continue
        kept.append(info)
    if markers:
        log.debug("%s: skipped %d directory marker(s) (zero-byte keys ending in /)", request.source, markers)
    if not kept and not unsafe and not request.allow_empty:
        _refuse_empty(request, listed - markers)
    clashes = _collision_reasons(info.key for info in kept)
    if unsafe or clashes:  # unsafe keys and clashes in one report, not one kind per run
        _refuse(unsafe, clashes, request.source)
    mine = select_for_rank(kept, request.rank, request.world_size, request.distribution, request.balance)
    records = None
    if request.manifest is not None and request.manifest.augmented:  # a line's objects stay together
        mine, records = share_records(request.manifest, request.source, kept, mine, request.rank,
                                      request.world_size, request.distribution, request.balance)
    return Selection(mine, listed=listed, matched=len(kept), markers=markers, records=records)


def _refuse_empty(request: SyncRequest, objects: int) -> None:
    """An empty selection is almost always a mistyped prefix or filter, or an empty manifest:
    say which (exit 3)."""
    if request.manifest is not None and not request.manifest.entries:
        raise NotFound(f"the manifest {request.manifest.origin} is empty: it lists no keys",
                       "check the file; --allow-empty accepts an empty source")
    if objects == 0:
        raise NotFound(f"nothing at {request.source}: no objects under this prefix",
                       "check the bucket and prefix, keys are case-sensitive; --allow-empty accepts an empty source")
    raise NotFound(f"nothing at {request.source} matches the filters: {objects} object(s) listed, "
                   "none kept by --include/--exclude",
                   "the globs match keys relative to SOURCE; --allow-empty accepts an empty selection")


def _collision_reasons(keys: Iterable[str]) -> list[str]:
    return [f"key {file_key!r} is a file and also the directory of {other!r}"
            for file_key, other in find_collisions(keys)]


def _refuse(unsafe: list[str], clashes: list[str], source: str) -> None:
    """One error naming the unsafe keys and the file/directory clashes (a few of each kind)."""
    shown = unsafe[:_SHOWN_UNSAFE] + clashes[:_SHOWN_UNSAFE]
    total = len(unsafe) + len(clashes)
    more = f" (and {total - len(shown)} more)" if total > len(shown) else ""
    raise UnsafeKey(f"{total} unsafe key(s) in {source}, nothing was written: {'; '.join(shown)}{more}",
                    "rename them in the bucket, or leave them out with --exclude")


def _classify(info: ObjectInfo, dest: str, state: SyncState) -> str | None:
    """Why ``info`` must be fetched into ``dest``, or None when the local copy is current."""
    entry = state.entries.get(info.key)
    try:
        st = os.lstat(f"{dest}/{info.key}")  # keys were checked by key_parts: plain relative paths
    except OSError:
        st = None
    if entry is None:
        return "new" if st is None else "untracked"
    if entry.version != info.version or entry.size != info.size:
        return "changed"
    if st is None:
        return "missing"
    if not stat_mode.S_ISREG(st.st_mode) or not entry.matches_local(st):
        return "modified"
    return None


def plan_sync(selection: Selection, request: SyncRequest, state: SyncState) -> SyncPlan:
    """Compare this rank's objects with DEST's state record and files. Writes nothing."""
    dest = Path(request.dest)
    plan = SyncPlan(request.source, str(dest), request.rank, request.world_size, request.distribution,
                    request.balance, listed=selection.listed, matched=selection.matched)
    root = str(dest)
    for info in selection.objects:
        reason = _classify(info, root, state)
        if reason is None:
            plan.up_to_date.append(info)
        else:
            plan.to_fetch.append(PlannedFetch(info, reason))
    if request.delete:
        wanted = {info.key for info in selection.objects}
        plan.to_delete = sorted(key for key in state.entries if key not in wanted)
    return plan
