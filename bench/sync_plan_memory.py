"""Peak memory and time of planning a sync of N keys (default 200,000), listing excluded.

The listing comes from a synthetic store (no network), so this isolates what lading holds:
the selected ObjectInfo records, the sharding, the state record and the plan. Object sizes are
drawn from 1 KiB .. 1 GiB (``--max-size``) to show memory does not depend on them.

    .venv/bin/python bench/sync_plan_memory.py [--keys 200000] [--max-size BYTES]
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from staging.stores.base import ObjectInfo  # noqa: E402
from staging.sync.plan import SyncRequest, plan_sync, select_objects  # noqa: E402
from staging.sync.state import Entry, SyncState  # noqa: E402


class SyntheticStore:
    """Yields ``n`` objects in key order, like a paged listing would."""

    url = "synthetic://"

    def __init__(self, n: int, max_size: int) -> None:
        self.n, self.max_size = n, max_size

    def list(self, prefix: str = ""):
        rng = random.Random(0)
        for i in range(self.n):
            key = f"train/shard-{i // 1000:04d}/sample-{i:07d}.jpg"
            yield ObjectInfo(key, rng.randint(1024, self.max_size), f"{rng.getrandbits(128):032x}")


def measure(n: int, max_size: int, world: int) -> None:
    store = SyntheticStore(n, max_size)
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp)
        tracemalloc.start()
        started = time.perf_counter()
        request = SyncRequest("synthetic://", dest, distribution="sharded" if world > 1 else "replicated",
                              world_size=world)
        selection = select_objects(store, request)
        plan = plan_sync(selection, request, SyncState.load(dest))
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"keys={n} world={world} max_size={max_size}: planned {len(plan.to_fetch)} fetches in "
              f"{seconds:.2f}s, peak traced {peak / 2**20:.1f} MiB, maxrss "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        # The re-run: a state record covering everything, no local files -> all "missing".
        state = SyncState(dest)
        state.entries = {o.key: Entry(o.key, o.size, o.version, 0, o.size) for o in selection.objects}
        state.begin()
        state.save()
        started = time.perf_counter()
        loaded = SyncState.load(dest)
        plan = plan_sync(selection, request, loaded)
        print(f"  with a {len(loaded.entries)}-entry state record: load+plan {time.perf_counter() - started:.2f}s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--max-size", type=int, default=1 << 30)
    args = parser.parse_args()
    measure(args.keys, 2048, 1)
    measure(args.keys, args.max_size, 1)
    measure(args.keys, args.max_size, 8)
