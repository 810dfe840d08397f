"""Writing shards in several processes when packing a local directory into a local directory.

Python spends a few microseconds per file (header, bookkeeping) holding the GIL; with many
small files that, not the disk, is the limit, and threads contend for the GIL. So local packs
write shards in forked worker processes, one shard per task. Workers inherit the plan through
fork (nothing large is pickled) and write into the publisher's staging files; the parent
commits the shards in order. Used only when no other thread is running (forking a process with
live threads can deadlock the child); otherwise shards are written on threads.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable

from staging.pack.plan import PackPlan, ShardPlan
from staging.pack.sources import MemberSource

#: Set in the parent just before the workers fork; read by them. (plan, source, shard paths, writer)
_INHERITED: tuple[PackPlan, MemberSource, list[Path], Callable[..., int]] | None = None


def usable_workers(shards: int, cpus: int) -> int:
    """How many processes to use: 0 (use threads) unless fork is safe and there are 2+ shards."""
    if threading.active_count() > 1 or "fork" not in multiprocessing.get_all_start_methods() or shards < 2:
        return 0
    return max(1, min(cpus + 1, shards, 8))  # one more than CPUs: a worker may wait for the disk


def _write_inherited(index: int) -> int:
    assert _INHERITED is not None, "worker did not inherit the plan"
    plan, source, paths, write = _INHERITED
    return write(plan.shards[index], source, paths[index], None)


def write_shards_in_processes(
    plan: PackPlan, source: MemberSource, paths: list[Path], workers: int,
    write: Callable[[ShardPlan, MemberSource, Path, Callable[[int], None] | None], int],
    on_shard: Callable[[int, int], None],
) -> None:
    """Write every shard of ``plan`` to ``paths`` with ``workers`` processes; ``on_shard(index, size)``
    is called in the parent, in shard order, as each completes. The first failure is re-raised
    after the other workers stopped."""
    global _INHERITED
    _INHERITED = (plan, source, paths, write)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    try:
        futures = [pool.submit(_write_inherited, index) for index in range(len(plan.shards))]
        for index, future in enumerate(futures):
            on_shard(index, future.result())
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)
        _INHERITED = None
