"""Sync a selection into one DEST under DEST's lock: the step shared by plain and node-cache syncs."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from lading.core.errors import AccessDenied, UsageError, local_error
from lading.core.keys import safe_join
from lading.core.locks import exclusive_lock
from lading.stores.base import Store
from lading.sync.apply import (
    Fetcher,
    NoSyncEvents,
    SyncEvents,
    SyncSummary,
    apply_plan,
    store_fetcher,
    sweep_temporaries,
)
from lading.sync.plan import Selection, SyncPlan, SyncRequest, plan_listing, plan_sync
from lading.sync.state import JOURNAL_NAME, LOCK_NAME, SyncState
from lading.transfer import TransferOptions

#: Substrings of temporary names a killed run may leave in DEST (ours and the transfer engine's).
TEMP_MARKERS: tuple[str, ...] = (".lading-link-", ".lading-part")


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

    def plan(state: SyncState) -> SyncPlan:
        return plan_sync(selection, request, state, options.workers, list_current=False)

    return _plan_and_apply(plan, fetcher, request, options, events, phase, skip_keys)


def sync_listing_into(
    store: Store,
    request: SyncRequest,
    options: TransferOptions = TransferOptions(),
    events: SyncEvents = NoSyncEvents(),
) -> SyncSummary:
    """List, plan and apply into an existing ``request.dest`` under DEST's lock, the listing
    and the plan in one pass (:func:`~lading.sync.plan.plan_listing`): what a re-sync does. The
    selection's refusals come before anything is written, as with :func:`sync_into`."""

    def plan(state: SyncState) -> SyncPlan:
        return plan_listing(store, request, state, options.workers, list_current=False)

    return _plan_and_apply(plan, store_fetcher(store), request, options, events)


def _plan_and_apply(
    plan_for: Callable[[SyncState], SyncPlan],
    fetcher: Fetcher,
    request: SyncRequest,
    options: TransferOptions,
    events: SyncEvents,
    phase: str = "download",
    skip_keys: frozenset[str] = frozenset(),
) -> SyncSummary:
    dest = Path(request.dest)
    make_directory(dest, "DEST")
    with exclusive_lock(dest / LOCK_NAME):
        interrupted = (dest / JOURNAL_NAME).exists()
        state = SyncState.load(dest)
        state.source = request.source
        with plan_for(state) as plan:
            if plan.fetch_files:
                state.begin()
            try:
                summary = apply_plan(plan, state, fetcher, options, events, phase, skip_keys)
            finally:
                state.close()
        if interrupted:
            # After the fetches, so a large download can resume from its parts first; what is
            # left belongs to no live download, except failed keys' parts, kept for the next run.
            keep = {safe_join(dest, failed.key) for failed in summary.failed}
            sweep_temporaries(dest, TEMP_MARKERS, keep)
        return summary


def make_directory(path: Path, what: str) -> None:
    """``mkdir -p`` with one-line errors: a file in the way is a usage error (2); permission denied
    or a read-only file system is exit 4 (:func:`~lading.core.errors.local_error`)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{what} {path} exists and is not a directory") from None
    except NotADirectoryError:
        raise UsageError(f"cannot create {what} {path}: a file is in the way of one of its parents") from None
    except OSError as err:
        error = local_error(err, f"create {what} {path}")
        raise (error if isinstance(error, AccessDenied) else UsageError(error.message)) from None
