"""Sizes of many directory entries, the expensive part of a walk: one stat per file.

Python spends about as long building each ``os.stat_result`` as the kernel spends in the
syscall, so for big trees on Linux with a spare CPU (load average at most CPUs - 1) the list is
split with a forked child that stats the second half and sends the sizes back through a pipe. The child only stats, writes and
``os._exit``s; it is never used while other Python threads run.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Callable, Sequence

#: Codes for entries that are not simply "a readable regular file of N bytes".
FAILED, NOT_REGULAR, NOT_READABLE = -1, -2, -3
PARALLEL_MIN_ENTRIES = 20_000
_CHUNK = 2048

Readable = Callable[[os.stat_result], bool]


def stat_sizes(paths: Sequence[str], readable: Readable | None, fork: bool = False) -> list[int]:
    """Size of each path (following links), or a negative code: FAILED, NOT_REGULAR, NOT_READABLE.

    Paths rather than ``os.DirEntry`` objects: an entry caches its stat result, and a batch of
    cached results costs memory for nothing. ``fork`` allows a forked helper process: only a
    caller that owns its process (the CLI) asks for it."""
    if fork and len(paths) >= PARALLEL_MIN_ENTRIES and _can_fork():
        try:
            return _stat_in_two_processes(paths, readable)
        except OSError:
            pass  # no fork or pipe available: do it here
    return _stat_serial(paths, readable)


def _stat_serial(paths: Sequence[str], readable: Readable | None) -> list[int]:
    sizes: list[int] = []
    for start in range(0, len(paths), _CHUNK):  # stat results are big: hold a few at a time
        sizes += _stat_chunk(paths[start : start + _CHUNK], readable)
    return sizes


def _stat_chunk(paths: Sequence[str], readable: Readable | None) -> list[int]:
    try:
        infos = list(map(os.stat, paths))
    except OSError:
        return [_code(path, readable) for path in paths]
    if all(map(stat.S_ISREG, [info.st_mode for info in infos])) and (readable is None or all(map(readable, infos))):
        return [info.st_size for info in infos]
    return [_code(path, readable) for path in paths]


def _code(path: str, readable: Readable | None) -> int:
    try:
        info = os.stat(path)
    except OSError:
        return FAILED
    if not stat.S_ISREG(info.st_mode):
        return NOT_REGULAR
    if readable is not None and not readable(info):
        return NOT_READABLE
    return info.st_size


def _can_fork() -> bool:
    """Linux, no other Python thread, and a CPU to spare (a busy machine gains nothing)."""
    threading = sys.modules.get("threading")  # not imported: nobody started a Python thread
    if not sys.platform.startswith("linux") or (threading is not None and threading.active_count() != 1):
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
        return cpus >= 2 and os.getloadavg()[0] <= cpus - 1
    except (AttributeError, OSError):
        return False


def _stat_in_two_processes(paths: Sequence[str], readable: Readable | None) -> list[int]:
    half = len(paths) // 2
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid == 0:  # the child: stat the second half, send it, leave without any cleanup
        status = 1
        try:
            os.close(read_end)
            _write_all(write_end, _pack(_stat_serial(paths[half:], readable)))
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        mine = _stat_serial(paths[:half], readable)
        data = _read_exactly(read_end, (len(paths) - half) * 8)
    finally:
        os.close(read_end)
        _reap(pid)
    if data is None:  # the child failed: do its half here
        return mine + _stat_serial(paths[half:], readable)
    return mine + _unpack(data)


def _pack(sizes: list[int]) -> bytes:
    import array

    return array.array("q", sizes).tobytes()


def _unpack(data: bytes) -> list[int]:
    import array

    return array.array("q", data).tolist()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, received = [], 0
    while received < size:
        chunk = os.read(fd, min(size - received, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        received += len(chunk)
    return b"".join(chunks)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:  # the host application reaped it already
        pass
