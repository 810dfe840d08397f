"""Lazy reads for the mount: chunked, version-guarded ranged GETs with adaptive prefetch.

Data is addressed in fixed chunks (``CHUNK`` bytes). A GET covers a run of chunks and is
always guarded by the object's version, so every byte of a file comes from the version that
was listed; a changed object raises ObjectChanged instead of mixing bytes.

- Sequential readers (each read starting near where the previous one ended) get a prefetch
  window that starts at ``INITIAL_WINDOW`` and doubles up to ``MAX_WINDOW``, split into GETs
  of up to ``MAX_GET`` bytes that run in parallel on the fetch pool.
- Random readers get only the aligned chunks they touch.
- Small files are fetched whole when opened.
- Every byte held in memory or in flight counts against one global budget.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from lading.mounts.cache import BufferPool, ChunkId, DiskCache, MemoryCache, chunk_prefix
from lading.mounts.source import range_streamer
from lading.mounts.stats import Stats
from lading.mounts.tree import FileEntry
from lading.stores import DEFAULT_POLICY, LadingError, Store, TransientError

log = logging.getLogger("lading.mount")

CHUNK = 256 * 1024
INITIAL_WINDOW = 1 << 20
MAX_WINDOW = 128 << 20
MAX_GET = 4 << 20
MIN_GET = 1 << 20
SEQUENTIAL_SLACK = 8 << 20  # > the kernel readahead the daemon sets (4 MiB)
SMALL_FILE = 1 << 20
STALL_GRACE = 0.5  # seconds during which a chunk that just timed out fails without waiting


class ReadTimeout(TransientError):
    """The store did not answer within the mount's --timeout."""


@dataclass
class ReaderConfig:
    """Tuning of the read path."""

    max_memory: int = 512 << 20
    concurrency: int = 32
    timeout: float = 30.0
    small_file: int = SMALL_FILE
    max_window: int = MAX_WINDOW


class OpenFile:
    """One open file handle: the entry it reads and its sequential-read state."""

    __slots__ = ("entry", "prefix", "lock", "next_offset", "window", "prefetched_to", "opened", "answered")

    def __init__(self, entry: FileEntry, prefix: str) -> None:
        self.entry = entry
        self.prefix = prefix
        self.lock = threading.Lock()
        self.next_offset = 0
        self.window = INITIAL_WINDOW
        self.prefetched_to = 0
        self.opened = time.monotonic()
        self.answered = False


class Reader:
    """Serves byte ranges of tree entries from memory, disk cache or the store."""

    def __init__(self, store: Store, config: ReaderConfig, disk: DiskCache | None = None,
                 stats: Stats | None = None) -> None:
        self.store = store
        self._stream = range_streamer(store)
        self._retry = getattr(getattr(store, "config", None), "retry", DEFAULT_POLICY)
        self.config = config
        self.memory = MemoryCache(config.max_memory)
        self.disk = disk
        self.stats = stats or Stats()
        self._pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="lading-get")
        self._pending: dict[ChunkId, Future[memoryview]] = {}
        self._stalled: dict[ChunkId, float] = {}  # chunk -> when a reader last timed out on it
        self._buffers = BufferPool(MAX_GET, max(0, config.max_memory // 4) // MAX_GET)
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stop the fetch pool without waiting for stuck requests."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- handles ---------------------------------------------------------------------------
    def open(self, entry: FileEntry) -> OpenFile:
        """A new handle; small files start downloading whole right away."""
        handle = OpenFile(entry, chunk_prefix(entry.key, entry.version) if self.disk else "")
        self.stats.add(opens=1)
        if 0 < entry.size <= self.config.small_file:
            self._ensure(handle, 0, _chunks_in(entry.size), demand=False)
            handle.prefetched_to = entry.size
        return handle

    def read(self, handle: OpenFile, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset+size)`` of the file (short at end of file)."""
        return b"".join(self.slices(handle, offset, size))

    def read_into(self, handle: OpenFile, offset: int, size: int, dest: int) -> int:
        """Copy bytes ``[offset, offset+size)`` to address ``dest`` (FUSE's buffer); return the count.

        One copy from our buffers straight into the kernel's: no intermediate bytes object.
        """
        written = 0
        for piece in self.slices(handle, offset, size):
            n = len(piece)
            ctypes.memmove(dest + written, ctypes.addressof(ctypes.c_char.from_buffer(piece)), n)
            written += n
        return written

    def slices(self, handle: OpenFile, offset: int, size: int) -> list[memoryview]:
        """Views of our buffers that together hold bytes ``[offset, offset+size)``."""
        end = min(offset + size, handle.entry.size)
        if offset >= end:
            return []
        self._plan_prefetch(handle, offset, end)
        pieces = self._gather(handle, offset, end)
        self.stats.add(reads=1, bytes_served=end - offset)
        if not handle.answered:
            handle.answered = True
            self.stats.sample("ttfb", time.monotonic() - handle.opened)
        return pieces

    # -- prefetch policy -------------------------------------------------------------------
    def _plan_prefetch(self, handle: OpenFile, offset: int, end: int) -> None:
        size = handle.entry.size
        with handle.lock:
            # The kernel's readahead sends several requests at once and they arrive in any
            # order: anything near the last read, or inside what we prefetched, is sequential.
            slack = max(SEQUENTIAL_SLACK, handle.window // 2)
            sequential = (handle.next_offset - slack <= offset <= handle.next_offset + slack
                          or handle.next_offset <= offset < handle.prefetched_to)
            if not sequential:
                handle.window = INITIAL_WINDOW
                handle.prefetched_to = end
            handle.next_offset = max(end, handle.next_offset) if sequential else end
            if not sequential or handle.prefetched_to >= size:
                return
            if handle.prefetched_to >= end + handle.window // 2:
                return
            start = max(handle.prefetched_to, offset)
            stop = min(size, end + handle.window)
            budget = max(0, self.memory.headroom())
            stop = min(stop, max(end, start + budget))
            if stop <= start:
                return
            handle.prefetched_to = stop
            handle.window = min(handle.window * 2, self.config.max_window)
            get_size = min(MAX_GET, max(MIN_GET, handle.window // 4))
            first, last = start // CHUNK, _chunks_in(stop)
            # Chunks well behind a sequential reader are in the page cache: drop our copy.
            behind = offset // CHUNK - 16
            for chunk in range(max(0, behind - 2 * (handle.window // CHUNK)), max(0, behind)):
                self.memory.discard((handle.entry.index, chunk))
        self._ensure(handle, first, last, demand=False, get_chunks=max(1, get_size // CHUNK))

    # -- data path -------------------------------------------------------------------------
    def _gather(self, handle: OpenFile, offset: int, end: int) -> list[memoryview]:
        first, last = offset // CHUNK, _chunks_in(end)
        index = handle.entry.index
        views = []
        missing = False
        for chunk in range(first, last):
            view = self.memory.get((index, chunk))
            if view is None:
                missing = True
                break
            views.append(view)
        if missing:
            waited = time.monotonic()
            views = self._wait_chunks(handle, first, last)
            self.stats.add(misses=1, wait_us=int((time.monotonic() - waited) * 1e6))
        else:
            self.stats.add(memory_hits=1)
        pieces = []
        position = first * CHUNK
        for view in views:
            lo, hi = max(offset - position, 0), min(end - position, len(view))
            if hi > lo:
                pieces.append(view[lo:hi])
            position += len(view)
        return pieces

    def _wait_chunks(self, handle: OpenFile, first: int, last: int) -> list[memoryview]:
        deadline = time.monotonic() + self.config.timeout
        self._fail_fast_if_stalled(handle, first, last)
        futures = self._ensure(handle, first, last, demand=True)
        views = []
        for chunk in range(first, last):
            future = futures[chunk]
            try:
                views.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
            except FutureTimeout:
                with self._lock:
                    key = (handle.entry.index, chunk)
                    if self._pending.get(key) is future:
                        del self._pending[key]  # the next read asks the store again
                    self._stalled[key] = time.monotonic()
                self.stats.add(read_timeouts=1)
                raise ReadTimeout(f"{handle.entry.key}: no answer from the store within "
                                  f"{self.config.timeout:g}s") from None
        return views

    def _fail_fast_if_stalled(self, handle: OpenFile, first: int, last: int) -> None:
        """Fail at once if these chunks just timed out: the kernel retries a failed readahead
        with a second read at once, and that one must not wait another --timeout."""
        if not self._stalled:
            return
        now = time.monotonic()
        with self._lock:
            for chunk in range(first, last):
                when = self._stalled.get((handle.entry.index, chunk))
                if when is not None and now - when < STALL_GRACE:
                    self.stats.add(read_timeouts=1)
                    raise ReadTimeout(f"{handle.entry.key}: the store just timed out")

    def _ensure(self, handle: OpenFile, first: int, last: int, demand: bool,
                get_chunks: int | None = None) -> dict[int, Future[memoryview]]:
        """Make sure chunks ``[first, last)`` are cached or being fetched; return their futures.

        Missing runs become GETs of at most ``get_chunks`` chunks (demand reads: one GET).
        """
        index = handle.entry.index
        futures: dict[int, Future[memoryview]] = {}
        run: list[int] = []
        runs: list[list[int]] = []
        limit = get_chunks or (last - first)
        if demand and self.disk is not None:  # disk reads outside the lock
            for chunk in range(first, last):
                if self.memory.get((index, chunk)) is None:
                    self._from_disk(handle, chunk)
        with self._lock:
            for chunk in range(first, last):
                key = (index, chunk)
                view = self.memory.get(key)
                if view is not None:
                    if demand:
                        done: Future[memoryview] = Future()
                        done.set_result(view)
                        futures[chunk] = done
                    if run:
                        runs.append(run)
                        run = []
                    continue
                pending = self._pending.get(key)
                if pending is None and not demand and self.disk is not None \
                        and self.disk.has(f"{handle.prefix}-{chunk}"):
                    if run:  # the disk cache has it; read it when asked for
                        runs.append(run)
                        run = []
                    continue
                if pending is not None:
                    futures[chunk] = pending
                    if run:
                        runs.append(run)
                        run = []
                    continue
                future = Future()
                self._pending[key] = future
                futures[chunk] = future
                run.append(chunk)
                if len(run) >= limit:
                    runs.append(run)
                    run = []
            if run:
                runs.append(run)
        for chunks in runs:
            self._submit(handle, chunks, {c: futures[c] for c in chunks})
        return futures

    def _from_disk(self, handle: OpenFile, chunk: int) -> memoryview | None:
        assert self.disk is not None
        data = self.disk.get(f"{handle.prefix}-{chunk}")
        if data is None:
            return None
        view = memoryview(bytearray(data))  # writable, like every buffer read_into copies from
        self.memory.put((handle.entry.index, chunk), view)
        self.stats.add(disk_hits=1)
        return view

    def _submit(self, handle: OpenFile, chunks: list[int], futures: dict[int, Future[memoryview]]) -> None:
        entry = handle.entry
        start = chunks[0] * CHUNK
        stop = min(entry.size, (chunks[-1] + 1) * CHUNK)
        self.memory.reserve(stop - start)
        try:
            self._pool.submit(self._fetch, handle, chunks, futures, start, stop)
        except RuntimeError:  # the pool is shut down: we are unmounting
            self.memory.release(stop - start)
            self._fail(entry.index, futures, TransientError("unmounting"))

    def _fetch(self, handle: OpenFile, chunks: list[int], futures: dict[int, Future[memoryview]],
               start: int, stop: int) -> None:
        """One GET for a run of chunks, publishing each chunk as soon as its bytes are in.

        A transient failure mid-body is retried from the first chunk not yet published.
        """
        entry = handle.entry
        began = time.monotonic()
        buffer = self._buffers.take(stop - start)
        view = memoryview(buffer)
        state = {"filled": 0, "published": 0}
        attempt = 1

        def sink(piece: memoryview) -> None:  # the piece is already in place in ``buffer``
            size = len(piece)
            filled = state["filled"] + size
            state["filled"] = filled
            self.stats.add(bytes_fetched=size)  # counted before the chunk is handed out
            while state["published"] < len(chunks):
                chunk_end = min(len(buffer), (state["published"] + 1) * CHUNK)
                if filled < chunk_end:
                    break
                self._publish(handle, chunks[state["published"]], futures,
                              view[state["published"] * CHUNK:chunk_end])
                state["published"] += 1

        try:
            while True:
                resume = state["published"] * CHUNK
                self.stats.add(requests=1)
                state["filled"] = resume
                try:
                    self._stream(entry.key, start + resume, stop, entry.version, view[resume:], sink)
                    if state["published"] < len(chunks):
                        raise TransientError(f"{entry.key}: short read ({state['filled']} of {len(buffer)} bytes)")
                    break
                except TransientError as err:
                    if attempt >= self._retry.attempts:
                        raise
                    log.info("GET %s [%d, %d) attempt %d failed, retrying: %s", entry.key, start + resume,
                             stop, attempt, err.message)
                    time.sleep(self._retry.delay(attempt))
                    attempt += 1
        except BaseException as err:  # noqa: BLE001 - every failure must reach the waiting reader
            self.memory.release(stop - start)
            self.stats.add(request_errors=1)
            if not isinstance(err, LadingError):
                log.warning("GET %s [%d, %d) failed: %r", entry.key, start, stop, err)
                err = TransientError(f"{entry.key}: {err}")
            self._fail(entry.index, futures, err)
            return
        self.memory.release(stop - start)
        self.stats.sample("get_latency", time.monotonic() - began)

    def _publish(self, handle: OpenFile, chunk: int, futures: dict[int, Future[memoryview]],
                 data: memoryview) -> None:
        key = (handle.entry.index, chunk)
        self.memory.put(key, data)
        if self.disk is not None:
            self.disk.put(f"{handle.prefix}-{chunk}", data)
        with self._lock:
            if self._pending.get(key) is futures[chunk]:
                del self._pending[key]
            self._stalled.pop(key, None)
        futures[chunk].set_result(data)

    def _fail(self, index: int, futures: dict[int, Future[memoryview]], err: BaseException) -> None:
        with self._lock:
            for chunk, future in futures.items():
                if self._pending.get((index, chunk)) is future:
                    del self._pending[(index, chunk)]
        for future in futures.values():
            if not future.done():
                future.set_exception(err)


def _chunks_in(end: int) -> int:
    """Number of chunks needed to cover ``[0, end)``."""
    return (end + CHUNK - 1) // CHUNK
