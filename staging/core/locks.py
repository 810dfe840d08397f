"""Blocking, process-wide file locks (``fcntl.flock``) for a destination or a node cache entry.

A waiting process blocks on the lock for as long as the holder needs: there is no fixed timeout,
because the holder may be downloading terabytes. The kernel releases the lock if the holder dies
(even with ``kill -9``), so a crash never leaves a stale lock behind.
"""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from lading.core.errors import local_error


@contextmanager
def exclusive_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed); call ``on_wait`` if we must wait.

    A lock file that cannot be created or opened raises a project error (see
    :func:`~lading.core.errors.local_error`): permission denied or a read-only file system is exit 4.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as err:  # an unwritable or read-only directory: one line, exit 4
        raise local_error(err, f"write in {path.parent} (lock file {path.name})") from None
    try:
        _acquire(fd, on_wait)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@contextmanager
def directory_lock(directory: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` itself, so no lock file is left behind.

    Like :func:`exclusive_lock`, it is for writers: a directory this process may not write in
    (permissions, a read-only file system) raises at once (exit 4). Where a directory cannot be
    locked (some network file systems), falls back to a hidden ``.lading-lock`` file in it.
    """
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if not os.access(directory, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
            code = errno.EROFS if os.fstatvfs(fd).f_flag & os.ST_RDONLY else errno.EACCES
            os.close(fd)
            raise OSError(code, os.strerror(code), str(directory))
    except OSError as err:
        raise local_error(err, f"write in {directory}") from None
    try:
        try:
            _acquire(fd, on_wait)
            locked = True
        except OSError:  # not BlockingIOError (handled in _acquire): no flock on directories here
            locked = False
        if locked:
            yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
    if not locked:
        with exclusive_lock(directory / ".lading-lock", on_wait):
            yield


def _acquire(fd: int, on_wait: Callable[[], None] | None) -> None:
    """flock ``fd`` exclusively, calling ``on_wait`` first if another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if on_wait is not None:
            on_wait()
        fcntl.flock(fd, fcntl.LOCK_EX)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts: it may still hold what it made)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
