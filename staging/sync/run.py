"""Entry points: plan a sync (``--dry-run``) or run it, directly or through the node cache.

``run_sync`` is also what other commands call to stage a dataset (``lading hook``): it takes
DEST's lock, so processes syncing the same DEST on one host run one after another, and the
state record makes every run after the first a listing with no GET.
"""

from __future__ import annotations

from pathlib import Path

from lading.core.cacheroot import default_cache_root
from lading.stores.base import Store
from lading.sync.apply import NoSyncEvents, SyncEvents, SyncSummary, store_fetcher
from lading.sync.into import sync_into, sync_listing_into
from lading.sync.plan import SyncPlan, SyncRequest, plan_listing, select_objects
from lading.sync.state import SyncState
from lading.transfer import TransferOptions


#: The node cache's root unless ``--cache-dir`` says otherwise. Per user, so another user on the
#: node cannot plant files that this user's jobs then link into their data: the one rule of
#: :func:`lading.core.cacheroot.default_cache_root` (``/tmp/lading-cache-<uid>`` unless
#: ``$LADING_CACHE_DIR`` says otherwise; on /tmp, like the default DESTs, so files are hard-linked
#: rather than copied), read when lading is imported.
DEFAULT_CACHE_ROOT = default_cache_root()


def use_node_cache(local_world_size: int, cache_dir_given: bool, no_cache: bool, source_is_local: bool) -> bool:
    """The rule for ``lading sync``: use the node cache when more than one rank runs on this node
    (or ``--cache-dir`` was given), unless ``--no-cache`` or the source is a local directory
    (nothing to save there)."""
    if no_cache or source_is_local:
        return False
    return local_world_size > 1 or cache_dir_given


def plan_only(store: Store, request: SyncRequest, workers: int = 32) -> SyncPlan:
    """The plan ``run_sync`` would execute now, without writing anything (``--dry-run``); close
    it when done (its lists are runs on disk)."""
    return plan_listing(store, request, SyncState.load(Path(request.dest)), workers)


def run_sync(
    store: Store,
    request: SyncRequest,
    options: TransferOptions = TransferOptions(),
    events: SyncEvents = NoSyncEvents(),
    cache_root: Path | None = None,
) -> SyncSummary:
    """List, plan and apply; through the node cache in ``cache_root`` when given.

    A re-sync of a listing into a DEST that exists plans in one pass (no selection on disk);
    a first sync selects first, so a refused selection leaves no DEST behind."""
    if cache_root is None and request.manifest is None and Path(request.dest).is_dir():
        summary = sync_listing_into(store, request, options, events)
        summary.downloaded_bytes = summary.bytes
        return summary
    with select_objects(store, request, options.workers) as selection:
        if cache_root is not None:
            from lading.sync.nodecache import sync_through_cache  # its modules load only when used

            summary = sync_through_cache(store, selection, request, Path(cache_root), options, events)
        else:
            summary = sync_into(store_fetcher(store), selection, request, options, events)
            summary.downloaded_bytes = summary.bytes
        if request.manifest is not None and selection.records is not None and not summary.failed:
            # an augmented manifest: its lines, refs rewritten to paths in DEST, once every object is there
            from lading.selection.manifest import write_local_manifest

            write_local_manifest(
                request.manifest,
                request.source,
                Path(request.dest),
                selection.records,
                {info.key for info in selection.objects()},
            )
    return summary


__all__ = ["DEFAULT_CACHE_ROOT", "plan_only", "run_sync", "use_node_cache"]
