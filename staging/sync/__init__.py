"""``lading sync``: a bucket prefix into a per-rank directory, incrementally and safely.

Public API (also used by ``lading hook``):

- :class:`SyncRequest` -- what to sync where, for which rank;
- :func:`plan_only` -- the :class:`SyncPlan` (what ``--dry-run`` shows), writing nothing;
- :func:`run_sync` -- list, plan and apply under DEST's lock, optionally through the node cache
  (``cache_root``); returns a :class:`SyncSummary`. A second run with nothing changed makes no
  GET, only the listing (the state record in DEST is the completion marker);
- :func:`use_node_cache`, :data:`DEFAULT_CACHE_ROOT` -- the node-cache rule;
- :class:`SyncEvents` -- progress callbacks.
"""

from lading.sync.apply import FailedKey, NoSyncEvents, SyncEvents, SyncSummary
from lading.sync.plan import SyncPlan, SyncRequest
from lading.sync.run import DEFAULT_CACHE_ROOT, plan_only, run_sync, use_node_cache

__all__ = [
    "DEFAULT_CACHE_ROOT",
    "FailedKey",
    "NoSyncEvents",
    "SyncEvents",
    "SyncPlan",
    "SyncRequest",
    "SyncSummary",
    "plan_only",
    "run_sync",
    "use_node_cache",
]
