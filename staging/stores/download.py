"""The one resume routine and the one ranged downloader, as coroutines on the I/O core.

- :func:`fetch_range` fetches bytes ``[start, end)`` of one object through a :data:`RangeAttempt`
  (one GET, no retry), handing each piece with its offset to the caller; a transient failure
  (:mod:`lading.core.retry`) resumes after the last byte received, pinned to the version of the
  first answer. Every resumed body in lading goes through it.
- :func:`download_parts` fetches an object of known size as ranged parts, at most
  ``concurrency`` at once, each written with ``pwrite`` as it arrives, in slices of at most
  :data:`SLICE` bytes (large ``pwrite`` calls into one file from many streams cost several times
  the kernel time of sub-MiB ones), into a file preallocated with ``fallocate`` where the file
  system has it. obstore's attempt collects a part in one buffer of its own and hands it over
  without a copy (streamed pieces each cost a zeroed Python ``bytes`` and a copy under the GIL):
  at most ``concurrency`` part buffers live at once, freed as soon as written, so the allocator
  reuses them (the CLI keeps freed memory below its mmap threshold). The caller learns of each
  part on disk (``on_part``), to record it for a resume after a kill, and can feed a checksum in
  part order.
- :func:`download_file` is a whole object into a path: ranged parts when its size is known and
  larger than a part, else one resumed stream.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Awaitable, Callable, Iterable, Protocol

from lading.core.errors import LadingError, TransientError
from lading.core.retry import Attempts, RetryPolicy
from lading.stores.base import Fetched, OnPiece, ProgressCallback

#: The largest ``pwrite`` call. ext4 (Linux 6.16 and later: large folios) sizes each new page-cache
#: folio by the write; with 256 KiB writes the page-cache copy intermittently took 2-5x its usual
#: time on the benchmark VM (a 1 GiB sync at 1.2-2.0 CPU-s instead of 0.85-0.95, in 6 of 8 rounds
#: of one run), never with 64 KiB ones, which cost nothing measurable otherwise (bench/RESULTS.md,
#: session 12, big9). s5cmd writes 32 KiB, rclone 128 KiB.
SLICE = 64 << 10
#: Part size of a ranged download; objects larger than one part are fetched in parts. Each part is
#: one GET whose body is one buffer: 8 MiB parts took less CPU than 2-4 MiB ones (more requests)
#: and touched fewer fresh pages than 16 MiB ones (bench/RESULTS.md, session 7).
PART_SIZE = 8 << 20
#: Parts in flight at once per download.
PART_CONCURRENCY = 8

#: Receives one piece of the body and the offset (in the object) of its first byte.
Write = Callable[[memoryview, int], None]


class RangeAttempt(Protocol):
    """One GET of bytes ``[start, end)`` (``end`` None: to the end) pinned to ``version`` (None:
    any), no retry: each piece to ``sink`` as it arrives, ``on_version`` told of the answer's
    version before the first piece. Returns what was delivered (:class:`Fetched`; a range at or
    past the end delivers nothing). Raises a project error, TransientError for a cut body."""

    def __call__(
        self,
        key: str,
        start: int,
        end: int | None,
        version: str | None,
        sink: Callable[[memoryview], None],
        on_version: Callable[[str], None],
    ) -> Awaitable[Fetched]: ...


async def fetch_range(
    attempt: RangeAttempt,
    policy: RetryPolicy,
    where: str,
    key: str,
    start: int,
    end: int | None,
    version: str | None,
    write: Write,
) -> Fetched:
    """Bytes ``[start, end)`` of ``key`` through ``write``, a cut body resumed after the bytes
    received (pinned to the first answer's version) within ``policy``. Returns the bytes delivered,
    the object's size and its version."""
    position = start
    pinned = version or None
    attempts = Attempts(policy)

    def sink(piece: memoryview) -> None:
        nonlocal position
        if end is not None and position + len(piece) > end:
            raise LadingError(f"{where}: the server sent more than the range asked for")
        write(piece, position)
        position += len(piece)

    def pin(answered: str) -> None:
        nonlocal pinned
        pinned = pinned or answered or None

    while True:
        if end is not None and position >= end and position > start:  # it broke after the last byte
            attempts.succeeded()
            return Fetched(position - start, end, pinned or "")
        try:
            fetched = await attempt(key, position, end, pinned, sink, pin)
            stop = fetched.size if end is None else min(end, fetched.size)
            if position < stop:
                raise TransientError(f"{where}: the body ended at byte {position} of {stop}")
        except TransientError as err:
            await asyncio.sleep(attempts.failed(err))
            continue
        attempts.succeeded()
        return Fetched(position - start, max(fetched.size, position), pinned or fetched.version)


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write ``data`` at ``offset`` in slices of at most :data:`SLICE` bytes."""
    view = data if data.ndim == 1 and data.format == "B" else data.cast("B")
    while view:
        written = os.pwrite(fd, view[:SLICE], offset)
        view, offset = view[written:], offset + written


def preallocate(fd: int, size: int) -> None:
    """Make the file ``size`` bytes long, its blocks allocated where the file system can."""
    os.ftruncate(fd, size)
    if size and hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:  # not supported here (some FUSE or network file systems): sparse is fine
            pass


class Layout:
    """An object of ``size`` bytes cut into parts of ``part_size``. A plain class: a dataclass
    costs about 1 ms of start-up to create, and no caller compares, hashes or copies one."""

    __slots__ = ("size", "part_size")

    def __init__(self, size: int, part_size: int = PART_SIZE) -> None:
        self.size, self.part_size = size, part_size

    @property
    def count(self) -> int:
        """How many parts."""
        return max(1, -(-self.size // self.part_size))

    def bounds(self, index: int) -> tuple[int, int]:
        """Part ``index``'s ``[start, end)``."""
        start = index * self.part_size
        return start, min(self.size, start + self.part_size)


async def download_parts(
    attempt: RangeAttempt,
    policy: RetryPolicy,
    where: str,
    key: str,
    fd: int,
    layout: Layout,
    version: str | None,
    parts: Iterable[int],
    progress: ProgressCallback | None = None,
    on_part: Callable[[int], Awaitable[None] | None] | None = None,
    concurrency: int = PART_CONCURRENCY,
    slots: asyncio.Semaphore | None = None,
    on_piece: OnPiece | None = None,
) -> str:
    """Fetch ``parts`` of the object into ``fd`` (already ``layout.size`` bytes long) at their
    offsets, each resumed and retried on its own; returns the version they are of.

    With no ``version`` known, the first part runs alone and pins the rest to its answer's version.
    ``on_part(index)`` runs on the loop once a part is on disk (a coroutine is awaited). The first
    failure cancels the parts still running and is raised. ``slots`` (shared by several downloads)
    bounds the parts in flight instead of ``concurrency``. ``on_piece`` sees each piece once it
    is written (a checksum computed inline)."""
    todo = list(parts)
    pinned = version or None

    def write(piece: memoryview, offset: int) -> None:
        pwrite_all(fd, piece, offset)
        if on_piece is not None:
            on_piece(piece, offset)
        if progress is not None:
            progress(len(piece))

    async def one(index: int) -> None:
        nonlocal pinned
        start, end = layout.bounds(index)
        fetched = await fetch_range(attempt, policy, where, key, start, end, pinned, write)
        pinned = pinned or fetched.version or None
        if on_part is not None:
            done = on_part(index)
            if done is not None:
                await done

    bound = slots or asyncio.Semaphore(max(1, concurrency))
    failed = False

    async def bounded(index: int) -> None:
        nonlocal failed
        async with bound:
            if failed:  # a part failed: start no other (the download is over)
                return
            try:
                await one(index)
            except BaseException:
                failed = True  # before the slot is handed on
                raise

    if todo and pinned is None:
        await bounded(todo.pop(0))

    tasks = [asyncio.ensure_future(bounded(index)) for index in todo]
    try:
        for task in asyncio.as_completed(tasks):
            await task
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return pinned or ""


async def download_file(
    attempt: RangeAttempt,
    policy: RetryPolicy,
    where: str,
    key: str,
    dest: Path,
    version: str | None,
    size: int | None,
    progress: ProgressCallback | None = None,
    part_size: int = PART_SIZE,
    on_piece: OnPiece | None = None,
) -> Fetched:
    """The object into ``dest`` (created or truncated): in ranged parts when ``size`` is known and
    larger than ``part_size``, else as one resumed stream. Returns what arrived. ``on_piece``
    sees each piece once it is written."""
    fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if size is not None and size > part_size:
            layout = Layout(size, part_size)
            preallocate(fd, size)
            pinned = await download_parts(
                attempt, policy, where, key, fd, layout, version, range(layout.count), progress, on_piece=on_piece
            )
            return Fetched(size, size, pinned)

        def write(piece: memoryview, offset: int) -> None:
            pwrite_all(fd, piece, offset)
            if on_piece is not None:
                on_piece(piece, offset)
            if progress is not None:
                progress(len(piece))

        return await fetch_range(attempt, policy, where, key, 0, None, version, write)
    finally:
        os.close(fd)


__all__ = [
    "Layout",
    "PART_CONCURRENCY",
    "PART_SIZE",
    "RangeAttempt",
    "SLICE",
    "Write",
    "download_file",
    "download_parts",
    "fetch_range",
    "preallocate",
    "pwrite_all",
]
