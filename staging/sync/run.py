"""Entry points: plan a sync (``--dry-run``) or run it, directly or through the node cache.

``run_sync`` is also what other commands call to stage a dataset (``lading hook``): it takes
DEST's lock, so processes syncing the same DEST on one host run one after another, and the
state record makes every run after the first a listing with no GET.
"""

from __future__ import annotations

from pathlib import Path

from staging.errors import AccessDenied, UsageError
from staging.stores.base import Store
from staging.sync.apply import (Fetcher, NoSyncEvents, SyncEvents, SyncSummary, apply_plan, store_fetcher,
                                sweep_temporaries)
from staging.sync.locks import exclusive_lock
from staging.sync.plan import Selection, SyncPlan, SyncRequest, plan_sync, select_objects
from staging.sync.state import JOURNAL_NAME, LOCK_NAME, SyncState
from staging.transfer import TransferOptions

#: Substrings of temporary names a killed run may leave in DEST (ours and the transfer engine's).
TEMP_MARKERS: tuple[str, ...] = (".lading-link-", ".lading-part")


def plan_only(store: Store, request: SyncRequest, workers: int = 32) -> SyncPlan:
    """The plan ``run_sync`` would execute now, without writing anything (``--dry-run``)."""
    selection = select_objects(store, request, workers)
    return plan_sync(selection, request, SyncState.load(Path(request.dest)))


def sync_into(
    fetcher: Fetcher,
    selection: Selection,
    request: SyncRequest,
    options: TransferOptions = TransferOptions(),
    events: SyncEvents = NoSyncEvents(),
    phase: str = "download",
    skip_keys: frozenset[str] = frozenset(),
) -> SyncSummary:
    """Plan and apply ``selection`` into ``request.dest`` under DEST's lock.

    ``skip_keys`` are left out of the fetches (but still count as selected, so ``--delete`` keeps
    their old copies). A previous run killed mid-way left its journal: its stray temporaries are
    swept once this run's fetches are done.
    """
    dest = Path(request.dest)
    make_directory(dest, "DEST")
    with exclusive_lock(dest / LOCK_NAME):
        interrupted = (dest / JOURNAL_NAME).exists()
        state = SyncState.load(dest)
        state.source = request.source
        plan = plan_sync(selection, request, state)
        if skip_keys:
            plan.to_fetch = [item for item in plan.to_fetch if item.info.key not in skip_keys]
        if plan.to_fetch:
            state.begin()
        try:
            summary = apply_plan(plan, state, fetcher, options, events, phase)
        finally:
            state.close()
        if interrupted:
            # After the fetches, so a large download can resume from its parts first; what is
            # left belongs to no live download, except failed keys' parts, kept for the next run.
            keep = {dest.joinpath(*failed.key.split("/")) for failed in summary.failed}
            sweep_temporaries(dest, TEMP_MARKERS, keep)
        return summary


def make_directory(path: Path, what: str) -> None:
    """``mkdir -p`` with one-line errors: a file in the way is a usage error, EACCES access denied."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{what} {path} exists and is not a directory") from None
    except PermissionError:
        raise AccessDenied(f"cannot create {what} {path}: permission denied") from None
    except OSError as err:
        raise UsageError(f"cannot create {what} {path}: {err.strerror or err}") from None


def run_sync(
    store: Store,
    request: SyncRequest,
    options: TransferOptions = TransferOptions(),
    events: SyncEvents = NoSyncEvents(),
    cache_root: Path | None = None,
) -> SyncSummary:
    """List, plan and apply; through the node cache in ``cache_root`` when given."""
    selection = select_objects(store, request, options.workers)
    if cache_root is not None:
        from staging.sync.nodecache import sync_through_cache

        return sync_through_cache(store, selection, request, Path(cache_root), options, events)
    summary = sync_into(store_fetcher(store), selection, request, options, events)
    summary.downloaded_bytes = summary.bytes
    return summary


__all__ = ["plan_only", "run_sync", "sync_into", "TEMP_MARKERS"]
