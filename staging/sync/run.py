"""Entry points: plan a sync (``--dry-run``) or run it, directly or through the node cache.

``run_sync`` is also what other commands call to stage a dataset (``lading hook``): it takes
DEST's lock, so processes syncing the same DEST on one host run one after another, and the
state record makes every run after the first a listing with no GET.
"""

from __future__ import annotations

from pathlib import Path

from lading.selection.manifest import write_local_manifest
from lading.stores.base import Store
from lading.sync.apply import NoSyncEvents, SyncEvents, SyncSummary, store_fetcher
from lading.sync.into import sync_into
from lading.sync.nodecache import sync_through_cache
from lading.sync.plan import SyncPlan, SyncRequest, plan_sync, select_objects
from lading.sync.state import SyncState
from lading.transfer import TransferOptions


def plan_only(store: Store, request: SyncRequest, workers: int = 32) -> SyncPlan:
    """The plan ``run_sync`` would execute now, without writing anything (``--dry-run``); close
    it when done (its lists are runs on disk)."""
    with select_objects(store, request, workers) as selection:
        return plan_sync(selection, request, SyncState.load(Path(request.dest)), workers)


def run_sync(
    store: Store,
    request: SyncRequest,
    options: TransferOptions = TransferOptions(),
    events: SyncEvents = NoSyncEvents(),
    cache_root: Path | None = None,
) -> SyncSummary:
    """List, plan and apply; through the node cache in ``cache_root`` when given."""
    with select_objects(store, request, options.workers) as selection:
        if cache_root is not None:
            summary = sync_through_cache(store, selection, request, Path(cache_root), options, events)
        else:
            summary = sync_into(store_fetcher(store), selection, request, options, events)
            summary.downloaded_bytes = summary.bytes
        if request.manifest is not None and selection.records is not None and not summary.failed:
            # an augmented manifest: its lines, refs rewritten to paths in DEST, once every object is there
            write_local_manifest(request.manifest, request.source, Path(request.dest), selection.records,
                                 {info.key for info in selection.objects()})
    return summary


__all__ = ["plan_only", "run_sync"]
