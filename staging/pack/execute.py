"""Running the writes a plan calls for: shards cut into tasks of about 16 MB that fill disjoint
byte ranges of pre-sized shard files, on forked worker processes, threads, or inline.

Python spends a few microseconds per file (header, bookkeeping) holding the GIL, and with
many small files that, not the disk, is the limit; so a local pack forks worker processes.
They inherit the plan (nothing large is pickled) and open the shard files themselves. Forking
a process with live threads can deadlock the child, so processes are used only when no other
thread runs and the source is local; otherwise the tasks run on threads (their system calls
still overlap). Shards are committed to the publisher in order, each once all its tasks are done.
"""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing
import os
import signal
import threading
from collections import deque
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from lading.core.errors import LadingError, ProblemFound, local_error
from lading.pack.grouping import Member
from lading.pack.plan import PackPlan, ShardPlan
from lading.pack.sources import LocalSource, MemberSource
from lading.pack.writer import ShardWriter, drop_spare_buffers

TASK_BYTES = 16 << 20
_PR_SET_PDEATHSIG = 1

#: One shared byte, set when the pack is interrupted: workers (threads, or processes forked after
#: it was mapped) check it before each sample and stop, so Ctrl-C does not wait for a 16 MB task.
_STOP = mmap.mmap(-1, 1)


class Stopped(Exception):
    """A write task that stopped early because the pack was interrupted (never reported)."""


@dataclass(frozen=True)
class WriteTask:
    """Samples ``[start, end)`` of shard ``shard``, written from byte ``offset``; ``last`` also
    writes the end-of-archive blocks."""

    shard: int
    start: int
    end: int
    offset: int
    last: bool


def split_tasks(plan: PackPlan, task_bytes: int = TASK_BYTES) -> list[WriteTask]:
    """Every shard cut at sample boundaries into runs of about ``task_bytes``, in shard order."""
    tasks = []
    for number, shard in enumerate(plan.shards):
        start = 0
        for index in range(1, len(shard.samples) + 1):
            if index == len(shard.samples) or shard.offsets[index] - shard.offsets[start] >= task_bytes:
                tasks.append(WriteTask(number, start, index, shard.offsets[start], index == len(shard.samples)))
                start = index
    return tasks


def interleave(tasks: list[WriteTask]) -> list[int]:
    """Indices of ``tasks`` taking one task of each shard in turn (first tasks of every shard,
    then second tasks, ...), so workers running side by side fill different shard files:
    writers of one file queue on its inode lock, and the kernel spins while they wait."""
    rank: list[int] = []
    taken = [0] * (max(task.shard for task in tasks) + 1 if tasks else 0)
    for task in tasks:
        rank.append(taken[task.shard])
        taken[task.shard] += 1
    return sorted(range(len(tasks)), key=lambda index: (rank[index], tasks[index].shard))


def write_error(err: OSError, path: Path) -> LadingError:
    """An OSError while writing a shard, as a one-line project error: permission denied and a
    read-only file system are exit 4, a full disk or an I/O error exit 6 (:func:`local_error`)."""
    return local_error(err, f"write {path}")


def _run_task(
    task: WriteTask, shard: ShardPlan, source: MemberSource, path: Path, progress: Callable[[int], None] | None
) -> int:
    """Write one task's members into the shard file; return the payload bytes written."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as err:
        raise write_error(err, path) from err
    try:
        writer = ShardWriter(fd, progress, task.offset)
        source.write_members(_members_until_stopped(shard, task), writer)
        if task.last:
            end, expected = writer.finish(), shard.nbytes
        else:
            writer.close()
            end, expected = writer.offset, shard.offsets[task.end]
    except OSError as err:
        raise write_error(err, path) from err
    finally:
        os.close(fd)
    if end != expected:  # the plan and the writer disagree: a bug, never publish such a shard
        raise ProblemFound(f"{shard.name}: samples {task.start}..{task.end} ended at byte {end}, planned {expected}")
    return writer.payload_bytes


def _members_until_stopped(shard: ShardPlan, task: WriteTask) -> Iterator[Member]:
    """The task's members, sample by sample, until the pack is interrupted."""
    stop = _STOP
    for sample in shard.samples[task.start : task.end]:
        if stop[0]:
            raise Stopped()
        yield from sample.members


def create_shard_file(shard: ShardPlan, path: Path) -> None:
    """Create the shard file at its final size (zero-filled), ready for writes at any offset."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, shard.nbytes)
        finally:
            os.close(fd)
    except OSError as err:
        raise write_error(err, path) from err


def write_shard(
    shard: ShardPlan, source: MemberSource, path: Path, progress: Callable[[int], None] | None = None
) -> int:
    """Write one whole shard into ``path`` on this thread, as the plan lays it out (the same
    writer and checks as :func:`write_shards`); return the payload bytes written. This is the
    unit of work other engines (``lading pack --engine ray``) run, one call per shard."""
    create_shard_file(shard, path)
    return _run_task(WriteTask(0, 0, len(shard.samples), 0, True), shard, source, path, progress)


def cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: What forked workers inherit: (plan, source, shard paths, tasks). Set just before the fork.
_INHERITED: tuple[PackPlan, MemberSource, list[Path], list[WriteTask]] | None = None


def _run_inherited(index: int) -> int:
    assert _INHERITED is not None, "worker did not inherit the plan"
    plan, source, paths, tasks = _INHERITED
    task = tasks[index]
    return _run_task(task, plan.shards[task.shard], source, paths[task.shard], None)


def _worker_start(parent: int) -> None:
    """In each worker process: leave Ctrl-C to the parent (a worker interrupted while holding the
    task queue's lock would hang the others), and die with the parent (Linux), so a killed pack
    leaves no process behind. SIGINT arrives blocked (see :func:`_held_signals`): ignore it,
    then unblock it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: workers end when their current task does
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _executor(plan: PackPlan, source: MemberSource, tasks: list[WriteTask], processes_allowed: bool) -> Executor:
    workers = max(1, min(cpus() + 1, len(tasks), 8))  # one more than CPUs: a worker may wait for the disk
    fork_safe = threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods()
    if processes_allowed and fork_safe and isinstance(source, LocalSource) and workers > 1:
        return ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("fork"), initializer=_worker_start, initargs=(os.getpid(),)
        )
    return ThreadPoolExecutor(workers, thread_name_prefix="lading-pack-write")


@contextmanager
def _held_signals(held: bool) -> Iterator[None]:
    """Hold Ctrl-C while the process pool forks its workers (at its first submit): a SIGINT
    in the middle of a fork left a worker the pool did not know about, and the pack then hung
    at exit waiting for it. The signal is delivered (KeyboardInterrupt) right after."""
    if not held:
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def write_shards(
    plan: PackPlan,
    source: MemberSource,
    paths: list[Path],
    on_bytes: Callable[[int], None],
    on_shard_done: Callable[[int], None],
    processes_allowed: bool = True,
    shards_ahead: int | None = None,
) -> None:
    """Write all shards of ``plan`` into ``paths``; ``on_shard_done(number)`` is called in
    shard order, from this thread, as each shard is complete. With ``shards_ahead``, at most
    that many shards are being written at once (bounds the disk a bucket upload's temporary
    shards take: the next shard starts only when an earlier one is done); without it, all
    shard files are created up front and their tasks are interleaved (see :func:`interleave`)."""
    global _INHERITED
    tasks = split_tasks(plan, TASK_BYTES)
    lock = threading.Lock()

    def locked_progress(nbytes: int) -> None:
        with lock:
            on_bytes(nbytes)

    _INHERITED = (plan, source, paths, tasks)
    executor = _executor(plan, source, tasks, processes_allowed)
    in_processes = isinstance(executor, ProcessPoolExecutor)
    pending: deque[tuple[int, Future[int]]] = deque()
    open_shards: deque[int] = deque()
    unfinished = [0] * len(plan.shards)  # tasks not yet done, per shard
    for task in tasks:
        unfinished[task.shard] += 1
    reported = 0  # shards before this one were handed to on_shard_done

    def finish_oldest() -> None:
        nonlocal reported
        index, future = pending.popleft()
        task = tasks[index]
        written = future.result()
        if in_processes:  # workers in other processes report their bytes once, here
            on_bytes(written)
        unfinished[task.shard] -= 1
        while reported < len(unfinished) and unfinished[reported] == 0:
            open_shards.popleft()
            on_shard_done(reported)
            reported += 1

    try:
        order = range(len(tasks)) if shards_ahead is not None else interleave(tasks)
        for index in order:
            task = tasks[index]
            if task.start == 0:  # the shard's first task: make room, then create its file
                while shards_ahead is not None and len(open_shards) >= shards_ahead:
                    finish_oldest()
                create_shard_file(plan.shards[task.shard], paths[task.shard])
                open_shards.append(task.shard)
            shard, path = plan.shards[task.shard], paths[task.shard]
            with _held_signals(in_processes and not pending):
                future = (
                    executor.submit(_run_inherited, index)
                    if in_processes
                    else executor.submit(_run_task, task, shard, source, path, locked_progress)
                )
            pending.append((index, future))
        while pending:
            finish_oldest()
    except BaseException:
        _STOP[0] = 1  # running tasks stop at their next sample; queued ones are cancelled
        executor.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        executor.shutdown(wait=True)
        _STOP[0] = 0
        _INHERITED = None
        drop_spare_buffers()
