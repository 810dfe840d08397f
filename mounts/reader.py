"""Lazy reads for the mount: version-pinned ranged GETs, shaped by how a file is read.

FUSE's threads plan what to fetch under one lock and wait only for the bytes they need. Each GET
is the store's blocking ranged read (:mod:`lading.stores.ranged`: obstore's blocking call, the GIL
released while it waits) on a thread of one of two pools, one for what a reader waits for, one
for readahead and files ahead of a directory walk; a random reader's miss is one try on the FUSE
thread that asks for it (no hand-off to a pool thread and back). Measured on RGW (2026-11-26), a GET made this
way costs the daemon a third of the CPU of the same GET as a coroutine on the I/O core (whose
future, wake-ups and callbacks dominate small GETs), and CPU is what a mount on a busy node lacks.
A GET's answer is one zero-copy buffer of the store client's, copied once, straight into the
page the kernel asked for.

What is fetched depends on the access pattern, per open file:

- **Sequential** (each read starts near where the previous one ended, twice in a row): a readahead
  window that starts at :data:`INITIAL_WINDOW` and doubles with each read up to :data:`MAX_WINDOW`
  (and to the reader's share of the memory budget), as parts in flight at once: an eighth of the
  reader's share (at most :data:`MAX_PART`), on multiples of their size, each asked for as soon as
  the window has room for it.
- **Random**: what was asked for, rounded out to :data:`BLOCK`, with no readahead; misses of one
  read at most :data:`GAP` apart become one GET (the bytes between come along).
- **Small files** (up to :data:`SMALL_FILE`) are fetched whole, in one GET, when opened; when files
  are opened in listing order (a directory being walked), the next few small files are fetched too.

Fetched ranges (*extents*) are cached until read (a sequential reader's are dropped once served:
the kernel's page cache has them) or evicted, least recently used first. Every byte held or in
flight counts against one budget (:attr:`ReaderConfig.max_memory`): readahead uses only what is
free, a reader's demand may evict.
"""

from __future__ import annotations

import bisect
import ctypes
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Callable

from lading.mounts.cache import CHUNK, DiskCache, chunk_prefix
from lading.mounts.memory import buffer_address
from lading.mounts.stats import Stats
from lading.mounts.tree import FileEntry
from lading.stores import LadingError, Store, TransientError
from lading.stores.ranged import RangeRequest, attempt_reader, range_reader

log = logging.getLogger("lading.mount")

BLOCK = 16 << 10
#: Misses of one file at most this far apart are fetched as one GET, the bytes between included.
GAP = BLOCK
SMALL_FILE = 1 << 20
INITIAL_WINDOW = 1 << 20
MAX_WINDOW = 64 << 20
MIN_PART = 512 << 10
MAX_PART = 8 << 20
#: A read this close to where the last one ended continues it (the kernel's readahead requests
#: arrive out of order); once streaming, anything inside the window counts too.
NEAR = 256 << 10
STREAM_SLACK = 8 << 20
#: Files fetched ahead of a directory walk, and the share of the budget they may take.
WALK_AHEAD = 32
WALK_SHARE = 4
WALK_JITTER = 16  # several readers walking together open files a little out of order
STALL_GRACE = 0.5  # seconds during which a file whose read just timed out fails without waiting


class ReadTimeout(TransientError):
    """The store did not answer within the mount's --timeout."""


@dataclass
class ReaderConfig:
    """Tuning of the read path. ``max_memory``: bytes of file data held or in flight at most."""

    max_memory: int = 64 << 20
    concurrency: int = 32
    timeout: float = 30.0
    small_file: int = SMALL_FILE
    max_window: int = MAX_WINDOW


class Extent:
    """Bytes ``[start, end)`` of one file: in flight (``data`` None) or arrived."""

    __slots__ = ("index", "start", "end", "data", "address", "future", "served", "live")

    def __init__(self, index: int, start: int, end: int) -> None:
        self.index = index
        self.start = start
        self.end = end
        self.data: memoryview | None = None  # keeps the buffer at ``address`` alive
        self.address = 0
        self.future: Future[int] = Future()  # the address, once arrived
        self.served = 0
        self.live = True  # still in the cache's index (else its bytes are no longer counted)

    def arrive(self, data: memoryview) -> None:
        """The bytes are in: note where they are (readers are woken separately)."""
        self.address = buffer_address(data)
        self.data = data  # set last: a reader that sees it may use ``address``


class FileCache:
    """One file's extents, sorted and non-overlapping."""

    __slots__ = ("starts", "extents", "stalled")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.extents: list[Extent] = []
        self.stalled = 0.0  # when a read of this file last timed out

    def add(self, extent: Extent) -> None:
        """Insert an extent (it overlaps none)."""
        i = bisect.bisect_left(self.starts, extent.start)
        self.starts.insert(i, extent.start)
        self.extents.insert(i, extent)

    def remove(self, extent: Extent) -> None:
        """Drop an extent from the index."""
        i = bisect.bisect_left(self.starts, extent.start)
        if i < len(self.extents) and self.extents[i] is extent:
            del self.starts[i]
            del self.extents[i]

    def overlapping(self, start: int, end: int) -> list[Extent]:
        """Extents that share bytes with ``[start, end)``, in order."""
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        found = []
        extents = self.extents
        while i < len(extents) and extents[i].start < end:
            if extents[i].end > start:
                found.append(extents[i])
            i += 1
        return found

    def holes(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` no extent covers."""
        gaps = []
        position = start
        for extent in self.overlapping(start, end):
            if extent.start > position:
                gaps.append((position, extent.start))
            position = max(position, extent.end)
        if position < end:
            gaps.append((position, end))
        return gaps


class OpenFile:
    """One open file handle: the entry it reads and its access-pattern state."""

    __slots__ = ("entry", "next_offset", "streak", "window", "prefetched_to", "opened", "answered")

    def __init__(self, entry: FileEntry) -> None:
        self.entry = entry
        self.next_offset = 0
        self.streak = 0  # consecutive reads that continued the previous one
        self.window = INITIAL_WINDOW
        self.prefetched_to = 0
        self.opened = time.monotonic()
        self.answered = False

    @property
    def streaming(self) -> bool:
        """Whether this handle reads sequentially (and gets readahead)."""
        return self.streak >= 2


@dataclass
class _Fetch:
    """One GET: bytes ``[start, end)`` of ``entry`` for the extents that tile it."""

    entry: FileEntry
    start: int
    end: int
    extents: list[Extent]
    demand: bool
    random: bool = False  # a random reader's miss: may be merged with another across a gap
    part: bool = False  # a readahead part: its own GET, in flight beside the others


class Reader:
    """Serves byte ranges of tree entries from memory, the disk cache or the store."""

    def __init__(
        self,
        store: Store,
        config: ReaderConfig,
        disk: DiskCache | None = None,
        stats: Stats | None = None,
        entry_at: Callable[[int], FileEntry] | None = None,
        file_count: int = 0,
    ) -> None:
        self.store = store
        self.config = config
        self.disk = disk
        self.stats = stats or Stats()
        self.budget = config.max_memory
        self._read_range = range_reader(store)
        self._try_range = attempt_reader(store)
        self._lock = threading.Lock()
        self._files: dict[int, FileCache] = {}
        self._unread: OrderedDict[Extent, None] = OrderedDict()  # arrived, nothing served yet
        self._leftover: OrderedDict[Extent, None] = OrderedDict()  # arrived, partly served
        self._held = 0  # bytes of live extents, arrived or in flight
        self._streams: set[OpenFile] = set()
        # Each GET blocks one of these threads (in the store client, the GIL released): what a
        # reader waits for on one, readahead and files ahead of a walk on the other.
        self._demand_pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="lading-get")
        self._ahead_pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="lading-ahead")
        self._entry_at = entry_at
        self._file_count = file_count
        self._walk_next = -1
        self._walk_streak = 0
        self._walked_to = -1
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="lading-disk") if disk else None
        self._closed = False

    def close(self) -> None:
        """Stop accepting reads; GETs in flight finish on their threads (the interpreter's exit
        waits for them), GETs not started yet are dropped."""
        self._closed = True
        self._demand_pool.shutdown(wait=False, cancel_futures=True)
        self._ahead_pool.shutdown(wait=False, cancel_futures=True)
        if self._writer is not None:
            self._writer.shutdown(wait=True)

    @property
    def held(self) -> int:
        """Bytes of file data held or in flight."""
        return self._held

    # -- handles ---------------------------------------------------------------------------------
    def open(self, entry: FileEntry) -> OpenFile:
        """A new handle; a small file starts downloading whole right away, and so do the next
        small files when files are being opened in listing order."""
        handle = OpenFile(entry)
        self.stats.add(opens=1)
        fetches: list[_Fetch] = []
        with self._lock:
            if 0 < entry.size <= self.config.small_file:
                self._whole_file(entry, fetches)
                handle.prefetched_to = entry.size
            self._walk(entry.index, fetches)
            self._coalesce(fetches)
        self._start(fetches)
        return handle

    def release(self, handle: OpenFile) -> None:
        """A handle was closed."""
        with self._lock:
            self._streams.discard(handle)

    def read(self, handle: OpenFile, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset+size)`` of the file (short at end of file)."""
        buffer = (ctypes.c_char * max(1, size))()
        count = self.read_into(handle, offset, size, ctypes.addressof(buffer))
        return buffer.raw[:count]

    def read_into(self, handle: OpenFile, offset: int, size: int, dest: int) -> int:
        """Copy bytes ``[offset, offset+size)`` to address ``dest`` (FUSE's buffer); return the count."""
        end = min(offset + size, handle.entry.size)
        if offset >= end or self._closed:
            return 0
        deadline = time.monotonic() + self.config.timeout
        if self.disk is not None:
            self._load_from_disk(handle.entry, offset, end)
        fetches: list[_Fetch] = []
        with self._lock:
            files = self._files.setdefault(handle.entry.index, FileCache())
            self._fail_fast_if_stalled(handle, files)
            self._classify(handle, offset, end)
            # Held here, so that making room for new GETs cannot take the bytes of this read away.
            needed = files.overlapping(offset, end)
            self._demand(handle, files, offset, end, fetches)
            needed += [
                extent for fetch in fetches for extent in fetch.extents if extent.start < end and extent.end > offset
            ]
            needed.sort(key=lambda extent: extent.start)
            if handle.streaming:
                self._readahead(handle, files, end, fetches)
            self._coalesce(fetches)
        # A read that continues nothing: a random reader's miss, fetched on this thread. The first
        # read of a scan (at 0, or continuing the last) keeps its GET on a GET thread as before.
        here = next((fetch for fetch in fetches if fetch.random and fetch.demand and not handle.streak), None)
        self._start([fetch for fetch in fetches if fetch is not here])
        if here is not None:
            self._get_here(here)
        copied = self._copy(handle, needed, offset, end, dest, deadline)
        self.stats.add(reads=1, bytes_served=copied)
        if not handle.answered:
            handle.answered = True
            self.stats.sample("ttfb", time.monotonic() - handle.opened)
        return copied

    # -- what to fetch ---------------------------------------------------------------------------
    def _classify(self, handle: OpenFile, offset: int, end: int) -> None:
        """Count the reads that continue the previous one; anything else restarts the count."""
        slack = max(STREAM_SLACK, handle.window // 2) if handle.streaming else NEAR
        continues = handle.next_offset - slack <= offset <= handle.next_offset + slack or (
            handle.streaming and offset < handle.prefetched_to and end > handle.next_offset - slack
        )
        if handle.answered or handle.streak:
            handle.streak = handle.streak + 1 if continues else 0
        elif offset == 0:
            handle.streak = 1  # a first read at the start: likely the beginning of a scan
        if handle.streaming:
            self._streams.add(handle)
        else:
            self._streams.discard(handle)
            handle.window = INITIAL_WINDOW
            handle.prefetched_to = (
                max(handle.prefetched_to, end) if handle.entry.size <= self.config.small_file else end
            )
        handle.next_offset = max(end, handle.next_offset) if continues else end

    def _demand(self, handle: OpenFile, files: FileCache, offset: int, end: int, fetches: list[_Fetch]) -> None:
        """GETs for the bytes this read needs and nobody has: rounded out to :data:`BLOCK`; a
        streaming reader's first GET reaches :data:`MIN_PART` further."""
        size = handle.entry.size
        lo = offset - offset % BLOCK
        hi = min(size, -(-end // BLOCK) * BLOCK)
        if handle.streaming:
            hi = min(size, max(hi, lo + MIN_PART))
        holes = files.holes(lo, hi)
        if not holes:
            self.stats.add(memory_hits=1)
            return
        self.stats.add(misses=1)
        for start, stop in holes:
            if stop <= offset or start >= end:
                if not handle.streaming:
                    continue  # rounding only: fetch it only with a hole the read needs
            self._make_room(stop - start, demand=True)
            fetches.append(self._fetch(handle.entry, files, start, stop, demand=True))
            fetches[-1].random = not handle.streaming
        handle.prefetched_to = max(handle.prefetched_to, hi)

    def _readahead(self, handle: OpenFile, files: FileCache, end: int, fetches: list[_Fetch]) -> None:
        """Keep a streaming reader's window ahead of it, within its share of the free budget, in
        whole parts (a power of two bytes, on multiples of their size): a part is asked for as soon
        as the window has room for it, so that GETs keep arriving while the reader reads."""
        size = handle.entry.size
        share = max(MIN_PART, self.budget // (2 * max(1, len(self._streams))))
        window = min(handle.window, self.config.max_window, share)
        handle.window = min(handle.window * 2, self.config.max_window)  # it grows with each read of the stream
        if handle.prefetched_to >= size:
            return
        # Parts are sized for the whole window the reader may grow to (not the one it has so far).
        part = 1 << (min(MAX_PART, max(MIN_PART, min(share, self.config.max_window) // 8)).bit_length() - 1)
        start = max(handle.prefetched_to, end)
        stop = end + window
        stop = size if size - stop < MIN_PART // 2 else stop - stop % part
        position = start
        while position < stop:
            piece_end = min(stop, (position // part + 1) * part)
            if size - piece_end < MIN_PART // 2:
                piece_end = size  # no tiny last part
            if self._held + (piece_end - position) > self.budget:
                self._make_room(piece_end - position, demand=False)
                if self._held + (piece_end - position) > self.budget:
                    break
            for hole_start, hole_end in files.holes(position, piece_end):
                fetches.append(self._fetch(handle.entry, files, hole_start, hole_end, demand=False))
                fetches[-1].part = True
            position = piece_end
        handle.prefetched_to = max(handle.prefetched_to, position)

    def _whole_file(self, entry: FileEntry, fetches: list[_Fetch], demand: bool = True) -> None:
        files = self._files.setdefault(entry.index, FileCache())
        for start, stop in files.holes(0, entry.size):
            if self.disk is not None and self._on_disk(entry, start, stop):
                continue
            self._make_room(stop - start, demand=demand)
            fetches.append(self._fetch(entry, files, start, stop, demand=demand))

    def _walk(self, index: int, fetches: list[_Fetch]) -> None:
        """Files opened in listing order (a directory walked, one or several readers): fetch the
        next small files ahead, within a quarter of the budget."""
        if self._entry_at is None:
            return
        near = self._walk_next - WALK_AHEAD <= index <= self._walk_next + WALK_JITTER
        self._walk_streak = self._walk_streak + 1 if near else 0
        self._walk_next = max(self._walk_next, index) if near else index
        if self._walk_streak < 3:
            return
        allowance = self.budget // WALK_SHARE
        target = min(self._file_count, self._walk_next + 1 + WALK_AHEAD)
        position = max(self._walked_to, self._walk_next + 1)
        if position - self._walk_next > WALK_AHEAD // 2:
            return  # still half a window ahead: top up in batches, one wake of the I/O core for many GETs
        while position < target:
            entry = self._entry_at(position)
            if entry.size > self.config.small_file:
                break  # a large file: its reader's own pattern decides
            if entry.size and entry.index not in self._files:
                if self._held + entry.size > allowance:
                    break
                self._whole_file(entry, fetches, demand=False)
            position += 1
        self._walked_to = position

    def _fetch(self, entry: FileEntry, files: FileCache, start: int, end: int, demand: bool) -> _Fetch:
        extent = Extent(entry.index, start, end)
        if self._files.get(entry.index) is not files:  # made room by dropping this file's last extent
            self._files[entry.index] = files
        files.add(extent)
        self._held += end - start
        return _Fetch(entry, start, end, [extent], demand)

    def _coalesce(self, fetches: list[_Fetch]) -> None:
        """Merge GETs of one file that touch, and random readers' misses at most :data:`GAP` apart
        (at most :data:`MAX_PART` each); the bytes between that nobody holds become extents too
        (a sequential reader's GETs are never bridged: no byte of its file is fetched twice).
        Readahead parts stay apart: they are sized to be in flight together."""
        fetches.sort(key=lambda f: (f.entry.index, f.start))
        merged: list[_Fetch] = []
        for fetch in fetches:
            last = merged[-1] if merged else None
            gap = GAP if last is not None and last.random and fetch.random else 0
            if (
                last is not None
                and last.entry.index == fetch.entry.index
                and fetch.start - last.end <= gap
                and fetch.end - last.start <= MAX_PART
                and not (last.part and fetch.part)
            ):
                if fetch.start > last.end:
                    self._fill_gap(last, fetch.start)
                last.end = fetch.end
                last.extents.extend(fetch.extents)
                last.demand = last.demand or fetch.demand
                last.random = last.random and fetch.random
                last.part = last.part or fetch.part
            else:
                merged.append(fetch)
        fetches[:] = merged

    def _fill_gap(self, fetch: _Fetch, stop: int) -> None:
        """Extend ``fetch`` to ``stop``: the holes in between get extents (the rest is discarded)."""
        files = self._files.get(fetch.entry.index)
        if files is not None:
            for start, end in files.holes(fetch.end, stop):
                self._make_room(end - start, demand=False)
                extent = Extent(fetch.entry.index, start, end)
                files.add(extent)
                self._held += end - start
                fetch.extents.append(extent)
        fetch.end = stop

    def _make_room(self, nbytes: int, demand: bool) -> None:
        """Evict arrived extents, least recently used first, until ``nbytes`` more fit the budget:
        readahead evicts only what was partly read already, a reader's demand anything arrived."""
        queues = (self._leftover, self._unread) if demand else (self._leftover,)
        for queue in queues:
            while queue and self._held + nbytes > self.budget:
                extent, _ = queue.popitem(last=False)
                self._drop(extent)

    def _drop(self, extent: Extent) -> None:
        """Forget an extent (its bytes stay valid for whoever holds a reference)."""
        if not extent.live:
            return
        extent.live = False
        self._held -= extent.end - extent.start
        self._unread.pop(extent, None)
        self._leftover.pop(extent, None)
        files = self._files.get(extent.index)
        if files is not None:
            files.remove(extent)
            if not files.extents and not files.stalled:
                del self._files[extent.index]

    # -- the GETs --------------------------------------------------------------------------------
    def _start(self, fetches: list[_Fetch]) -> None:
        """Start GETs (outside the lock), each on a thread of its pool."""
        if not fetches:
            return
        self.stats.add(requests=len(fetches))
        for fetch in fetches:
            pool = self._demand_pool if fetch.demand else self._ahead_pool
            try:
                pool.submit(self._get, fetch)
            except RuntimeError as err:  # unmounting: the pools are shut down
                self._failed(fetch, TransientError(f"unmounting: {err}"))

    def _get(self, fetch: _Fetch) -> None:
        """One GET, on the calling (pool) thread."""
        began = time.monotonic()
        try:
            entry = fetch.entry
            view = self._whole(
                fetch, self._read_range(RangeRequest(entry.key, fetch.start, fetch.end, entry.version or None))
            )
        except BaseException as err:  # noqa: BLE001 - every failure must reach the waiting reader
            self._failed(fetch, err)
            return
        self._got(fetch, view, began)

    def _get_here(self, fetch: _Fetch) -> None:
        """A random reader's miss, fetched on the FUSE thread that waits for it: no hand-off to a
        GET thread and back, two thread wake-ups per read that cost 0.3-0.9 ms at load
        (bench/RESULTS.md, session 8). One try, which the store client's connect and read
        timeouts (the mount's --timeout) bound; a transient failure, or a read the store cannot
        bound, goes to a GET thread as any other (retried there, waited for until the deadline)."""
        self.stats.add(requests=1)
        began = time.monotonic()
        entry = fetch.entry
        try:
            view = self._try_range(RangeRequest(entry.key, fetch.start, fetch.end, entry.version or None))
            if view is not None:
                view = self._whole(fetch, view)
        except TransientError as err:
            log.debug("GET %s [%d, %d) failed, retrying: %s", entry.key, fetch.start, fetch.end, err)
            self.stats.add(request_errors=1)
            view = None
        except BaseException as err:  # noqa: BLE001 - every failure must reach the waiting reader
            self._failed(fetch, err)
            return
        if view is None:
            self._start([fetch])
        else:
            self._got(fetch, view, began)

    @staticmethod
    def _whole(fetch: _Fetch, view: memoryview) -> memoryview:
        if len(view) != fetch.end - fetch.start:
            raise TransientError(
                f"{fetch.entry.key}: short read ({len(view)} of {fetch.end - fetch.start} bytes at {fetch.start})"
            )
        return view

    def _got(self, fetch: _Fetch, view: memoryview, began: float) -> None:
        self.stats.sample("get_latency", time.monotonic() - began)
        self.stats.add(bytes_fetched=len(view))
        self._arrived(fetch, view)

    def _arrived(self, fetch: _Fetch, view: memoryview) -> None:
        for extent in fetch.extents:
            extent.arrive(view[extent.start - fetch.start : extent.end - fetch.start])
        with self._lock:
            for extent in fetch.extents:
                if extent.live:
                    self._unread[extent] = None
        for extent in fetch.extents:
            extent.future.set_result(extent.address)
        if self._writer is not None:
            self._writer.submit(self._to_disk, fetch.entry, fetch.start, view)

    def _failed(self, fetch: _Fetch, err: BaseException) -> None:
        self.stats.add(request_errors=1)
        if not isinstance(err, LadingError):
            log.warning("GET %s [%d, %d) failed: %r", fetch.entry.key, fetch.start, fetch.end, err)
            err = TransientError(f"{fetch.entry.key}: {err}")
        with self._lock:
            for extent in fetch.extents:
                self._drop(extent)  # the next read asks the store again
        for extent in fetch.extents:
            extent.future.set_exception(err)

    # -- serving ---------------------------------------------------------------------------------
    def _copy(self, handle: OpenFile, extents: list[Extent], offset: int, end: int, dest: int, deadline: float) -> int:
        """Wait for each extent in turn (until ``deadline``) and copy its part of the read into ``dest``."""
        waited = 0.0
        copied = 0
        position = offset
        for extent in extents:
            if extent.data is None:
                began = time.monotonic()
                try:
                    extent.future.result(timeout=max(0.0, deadline - began))
                except FutureTimeout:
                    self._timed_out(handle, extent)
                    raise ReadTimeout(
                        f"{handle.entry.key}: no answer from the store within {self.config.timeout:g}s"
                    ) from None
                waited += time.monotonic() - began
            lo, hi = max(position, extent.start), min(end, extent.end)
            if lo != position or hi <= lo:
                raise TransientError(f"{handle.entry.key}: internal error: no data for [{position}, {end})")
            ctypes.memmove(dest + copied, extent.address + lo - extent.start, hi - lo)
            copied += hi - lo
            position = hi
        if waited:
            self.stats.add(wait_us=int(waited * 1e6))
        self._served(handle, extents, offset, end)
        return copied

    def _served(self, handle: OpenFile, extents: list[Extent], offset: int, end: int) -> None:
        """Account the bytes served: an extent served whole is dropped (the kernel's page cache
        has it now); one served in part stays, as the most recently used leftover."""
        with self._lock:
            for extent in extents:
                extent.served += min(end, extent.end) - max(offset, extent.start)
                if not extent.live:
                    continue
                if extent.served >= extent.end - extent.start:
                    self._drop(extent)
                else:
                    self._unread.pop(extent, None)
                    self._leftover[extent] = None
                    self._leftover.move_to_end(extent)

    def _timed_out(self, handle: OpenFile, extent: Extent) -> None:
        self.stats.add(read_timeouts=1)
        with self._lock:
            self._drop(extent)  # the next read asks the store again
            self._files.setdefault(handle.entry.index, FileCache()).stalled = time.monotonic()

    def _fail_fast_if_stalled(self, handle: OpenFile, files: FileCache) -> None:
        """Fail at once if this file just timed out: the kernel retries a failed readahead with a
        second read at once, and that one must not wait another --timeout."""
        if files.stalled and time.monotonic() - files.stalled < STALL_GRACE:
            self.stats.add(read_timeouts=1)
            raise ReadTimeout(f"{handle.entry.key}: the store just timed out")
        files.stalled = 0.0

    # -- the disk cache --------------------------------------------------------------------------
    def _on_disk(self, entry: FileEntry, start: int, end: int) -> bool:
        assert self.disk is not None
        prefix = chunk_prefix(entry.key, entry.version)
        return all(self.disk.has(f"{prefix}-{chunk}") for chunk in range(start // CHUNK, -(-end // CHUNK)))

    def _load_from_disk(self, entry: FileEntry, offset: int, end: int) -> None:
        """Cached chunks of ``[offset, end)`` not in memory become extents (read outside the lock)."""
        assert self.disk is not None
        prefix = chunk_prefix(entry.key, entry.version)
        for chunk in range(offset // CHUNK, -(-end // CHUNK)):
            lo, hi = chunk * CHUNK, min(entry.size, (chunk + 1) * CHUNK)
            with self._lock:
                files = self._files.get(entry.index)
                holes = files.holes(lo, hi) if files is not None else [(lo, hi)]
            if not holes or not self.disk.has(f"{prefix}-{chunk}"):
                continue
            data = self.disk.get(f"{prefix}-{chunk}")
            if data is None or len(data) != hi - lo:
                continue
            view = memoryview(data)
            with self._lock:
                files = self._files.setdefault(entry.index, FileCache())
                for start, stop in files.holes(lo, hi):
                    self._make_room(stop - start, demand=True)
                    extent = self._fetch(entry, files, start, stop, demand=True).extents[0]
                    extent.arrive(view[start - lo : stop - lo])
                    extent.future.set_result(extent.address)
                    self._unread[extent] = None
            self.stats.add(disk_hits=1)

    def _to_disk(self, entry: FileEntry, start: int, view: memoryview) -> None:
        """Whole chunks of a GET's answer (and the file's last one) into the disk cache."""
        assert self.disk is not None
        prefix = chunk_prefix(entry.key, entry.version)
        end = start + len(view)
        for chunk in range(-(-start // CHUNK), -(-end // CHUNK)):
            lo, hi = chunk * CHUNK, min(entry.size, (chunk + 1) * CHUNK)
            if hi <= end and not self.disk.has(f"{prefix}-{chunk}"):
                self.disk.put(f"{prefix}-{chunk}", view[lo - start : hi - start])
