"""Blocking, process-wide file locks (``fcntl.flock``) for a destination or a node cache entry.

A waiting process blocks on the lock for as long as the holder needs: there is no fixed timeout,
because the holder may be downloading terabytes. The kernel releases the lock if the holder dies
(even with ``kill -9``), so a crash never leaves a stale lock behind.
"""

from __future__ import annotations

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
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
