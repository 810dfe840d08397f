"""Node-local sharing: several ranks on one host sync the same source, the bytes are fetched once.

The cache root is the one node cache's (:mod:`lading.sync.cache`: ``--cache-dir``, else
``$LADING_CACHE_DIR``, else ``/tmp/lading-cache-<uid>``, created 0700), shared with the datasets;
a root or entry that another user owns or could write into is refused, since its files would be
linked into the job's data. The files of an entry are also linked into the datasets' shard
folders (:meth:`~lading.sync.cache.NodeCache.adopt`), so ShardDataset and PackedDataset read a
synced pack from the same inodes, with no GET. The cache entry for a source is
``CACHE_ROOT/<name>-<digest>``, where the digest covers the
source URI, the include/exclude globs, the manifest entries and, for sharded syncs, the rank's
shard (so ranks with different shards never share an entry). Each rank:

1. takes the entry's exclusive ``flock`` (``CACHE_ROOT/<entry>.lock``), waiting as long as the
   holder needs (no fixed timeout; the kernel drops the lock if the holder dies);
2. syncs the source into the entry exactly like a plain sync (state record, journal, verified
   atomic writes, ``--delete`` semantics so the entry mirrors the source). The first rank
   downloads; the ranks after it find everything up to date and make no GET;
3. still under the lock, builds its own DEST from the entry: a hard link per file, or a copy
   when DEST is on another filesystem (``EXDEV``), each placed atomically (temporary name, then
   rename), with DEST's own state record.

A packed dataset (``lading pack`` output) gets a content check on top
(:mod:`lading.sync.packed`): a current copy is reused with no GET, a listing that disagrees
with the dataset's index stops the sync before DEST is touched.

Files in DEST share their inode with the cache entry and the other ranks' DESTs: treat them as
read-only (replacing a file is fine; editing it in place changes every copy).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from lading.core.errors import AccessDenied, LadingError, UsageError, local_error
from lading.core.keys import safe_join
from lading.core.locks import exclusive_lock
from lading.core.names import hidden_sibling
from lading.stores.base import Store
from lading.sync.cache import NodeCache, check_root
from lading.sync.apply import Fetcher, NoSyncEvents, SyncEvents, SyncSummary, store_fetcher
from lading.sync.into import sync_into
from lading.sync.plan import Selection, SyncRequest, plan_sync
from lading.sync.state import Entry, SyncState
from lading.transfer import TransferItem, TransferOptions, TransferResult
from lading.transfer.types import TransferEvents

if TYPE_CHECKING:  # lading.pack is imported only by a sync that goes through the cache
    from lading.pack.reuse import PackedDataset

log = logging.getLogger(__name__)


def ensure_private_root(root: Path) -> None:
    """Create the cache root (0700) if needed, and refuse one that others could write into.

    Everything under the root ends up hard-linked into DESTs, so the root (and each entry, see
    :func:`lading.sync.cache.check_root`, the one rule the datasets' cache follows too) must
    belong to this user and be writable by nobody else: a root owned by another user, writable
    by group or others, or a symlink another user made, is refused (exit 4).
    """
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as err:
        error = local_error(err, f"create the node cache {root}")
        raise (error if isinstance(error, AccessDenied) else UsageError(error.message)) from None
    check_root(root, "the node cache", _ELSEWHERE)


#: How to use another node cache directory (the hint of a refused one).
_ELSEWHERE = "use another directory: --cache-dir DIR"


def cache_entry_name(request: SyncRequest) -> str:
    """A stable directory name for what ``request`` selects (independent of DEST)."""
    identity: dict[str, object] = {
        "source": request.source,
        "include": list(request.include),
        "exclude": list(request.exclude),
        "manifest": list(request.manifest.entries) if request.manifest else None,
    }
    if request.distribution == "sharded" and request.world_size > 1:
        identity.update(rank=request.rank, world_size=request.world_size, balance=request.balance)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", request.source.split("://", 1)[-1]).strip("_.")[:48]
    return f"{slug or 'source'}-{digest}"


def link_fetcher(entry: Path) -> Fetcher:
    """A fetcher that places files from the cache ``entry`` (hard link, or copy across
    filesystems), checking each against the entry's index, read alongside (batches come in key order)."""
    cache_index = _IndexCursor(SyncState.load(entry))

    def fetch(items: Iterable[TransferItem], options: TransferOptions, events: TransferEvents) -> list[TransferResult]:
        results = []
        for item in items:
            result = _place(entry, cache_index.get(item.info.key), item)
            if result.ok:
                events.on_bytes(item.info.size)
            events.on_done(result)
            results.append(result)
        return results

    return fetch


class _IndexCursor:
    """Looks keys up in an index read forward: keys asked in ascending order cost one pass
    (a key below the last one asked starts the pass again)."""

    def __init__(self, state: SyncState) -> None:
        self.state = state
        self.rows = state.rows()
        self.current: Entry | None = next(self.rows, None)
        self.last = ""

    def get(self, key: str) -> Entry | None:
        """The entry for ``key``, or None."""
        if key < self.last:
            self.rows = self.state.rows()
            self.current = next(self.rows, None)
        self.last = key
        while self.current is not None and self.current.key < key:
            self.current = next(self.rows, None)
        return self.current if self.current is not None and self.current.key == key else None


def _place(entry: Path, cached: Entry | None, item: TransferItem) -> TransferResult:
    key = item.info.key
    source = safe_join(entry, key)
    try:
        st = os.lstat(source)
        if cached is None or cached.version != item.info.version or not cached.matches_local(st):
            raise LadingError(f"{key}: the node cache copy is not current")
        try:
            if os.path.samestat(st, os.lstat(item.dest)):
                return TransferResult(key, item.dest, True, item.info.size)  # already this inode
        except FileNotFoundError:
            pass
        tmp = item.dest.with_name(hidden_sibling(item.dest.name, f".lading-link-{os.getpid()}"))
        tmp.unlink(missing_ok=True)
        try:
            try:
                os.link(source, tmp)
            except OSError as err:
                if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
                log.debug("%s: no hard link into %s (%s), copying", key, tmp.parent, err.strerror)
                shutil.copyfile(source, tmp)  # another filesystem (or no hard links there): copy
            os.replace(tmp, item.dest)
        except OSError:
            tmp.unlink(missing_ok=True)  # e.g. a copy cut short by a full disk
            raise
    except LadingError as err:
        return TransferResult(key, item.dest, False, error=err)
    except OSError as err:
        return TransferResult(key, item.dest, False, error=LadingError(f"{key}: {err.strerror or err}"))
    return TransferResult(key, item.dest, True, item.info.size)


def _fill_entry(
    store: Store,
    selection: Selection,
    request: SyncRequest,
    entry: Path,
    options: TransferOptions,
    events: SyncEvents,
) -> tuple[SyncSummary, list[PackedDataset]]:
    """Sync the source into the cache ``entry`` (the caller holds its lock), unless the packed
    datasets in it are reusable as they are (then no GET, and they are returned). Raises
    :class:`~lading.core.errors.ProblemFound` when a listing disagrees with its dataset's index."""
    # Imported here: lading.pack is only needed when a sync goes through the cache.
    from lading.sync.packed import cached_datasets, packed_index_keys, refuse_mismatched, reusable_datasets

    cache_request = replace(request, dest=entry, delete=True)
    indexes = packed_index_keys(selection, request)
    listing = {info.key: info for info in selection.objects()} if indexes else {}  # packs: a few shards
    if indexes:
        with plan_sync(selection, cache_request, SyncState.load(entry), options.workers) as cache_plan:
            reused = reusable_datasets(indexes, cache_plan, entry, listing, request.source)
        if reused:
            return SyncSummary(request.source, str(entry), skipped=selection.selected_files), reused
    cached = sync_into(store_fetcher(store), selection, cache_request, options, events, "download")
    if indexes:  # the indexes just fetched are the listed ones: check their shards before linking
        failed = {f.key for f in cached.failed}
        refuse_mismatched(
            cached_datasets(entry, [key for key in indexes if key not in failed]), listing, request.source
        )
    return cached, []


def share_with_datasets(cache_root: Path, entry: Path, source: str) -> int:
    """Link the entry's files into the datasets' shard folders of the same cache (one copy on
    disk for both); returns how many were linked. Best effort: a failure is logged, not raised."""
    try:
        cache = NodeCache(cache_root)
        state = SyncState.load(entry)
        base = source.rstrip("/") + "/"
        linked = 0
        for row in state.rows():
            key = row.key
            if "://" not in base or key.endswith((".lading-meta", ".lading-lock")):
                continue
            if cache.adopt(base + key, row.version, row.size, entry / key):
                linked += 1
        return linked
    except (LadingError, OSError) as err:
        log.info("node cache: not shared with the datasets: %s", err)
        return 0


def sync_through_cache(
    store: Store,
    selection: Selection,
    request: SyncRequest,
    cache_root: Path,
    options: TransferOptions = TransferOptions(),
    events: SyncEvents = NoSyncEvents(),
) -> SyncSummary:
    """Fill the node cache entry for ``request`` (once per node), then build DEST from it.

    A packed dataset already current in the entry is reused without a GET; one whose listing
    disagrees with its index raises :class:`~lading.core.errors.ProblemFound` before DEST is touched.
    """
    started = time.monotonic()
    ensure_private_root(cache_root)
    entry = cache_root / cache_entry_name(request)

    def waiting() -> None:
        events.on_phase("waiting for another process on this node to fill the cache", None)

    with exclusive_lock(cache_root / f"{entry.name}.lock", on_wait=waiting):
        if os.path.lexists(entry):  # reuse only what this user made, never a planted entry
            check_root(entry, "the node cache entry", _ELSEWHERE, modes_follow_umask=True)
        cached, reused = _fill_entry(store, selection, request, entry, options, events)
        failed = frozenset(f.key for f in cached.failed)
        summary = sync_into(link_fetcher(entry), selection, request, options, events, "link", skip_keys=failed)
        share_with_datasets(cache_root, entry, request.source)
    summary.downloaded_bytes = cached.bytes
    summary.failed = sorted(cached.failed + summary.failed, key=lambda f: f.key)
    summary.cache = str(entry)
    summary.reused = [{"name": d.name, "version": d.version, "index": d.index_key} for d in reused]
    summary.seconds = time.monotonic() - started
    return summary
