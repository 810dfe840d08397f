"""Buffers of file data: a memory LRU bounded by a global budget, and an optional disk LRU.

Both are keyed by chunk: ``(file index, chunk number)`` in memory, and a name derived from the
object's key *and version* on disk, so a changed object can never be served from a stale cache.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from collections import OrderedDict
from pathlib import Path

from lading.stores import AccessDenied, UsageError

log = logging.getLogger("lading.mount")

ChunkId = tuple[int, int]


class MemoryCache:
    """Chunks in memory, least recently used evicted first once ``budget`` bytes are held.

    ``reserved`` counts bytes of GETs in flight, so that prefetching can be throttled before
    the data arrives.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._chunks: OrderedDict[ChunkId, memoryview] = OrderedDict()
        self._held = 0
        self.reserved = 0
        self._lock = threading.Lock()

    def get(self, chunk: ChunkId) -> memoryview | None:
        """The chunk's bytes, marking it recently used, or None."""
        with self._lock:
            data = self._chunks.get(chunk)
            if data is not None:
                self._chunks.move_to_end(chunk)
            return data

    def put(self, chunk: ChunkId, data: memoryview) -> None:
        """Store a chunk, evicting old ones to stay within the budget."""
        with self._lock:
            old = self._chunks.pop(chunk, None)
            if old is not None:
                self._held -= len(old)
            self._chunks[chunk] = data
            self._held += len(data)
            while self._held > self.budget and len(self._chunks) > 1:
                _, evicted = self._chunks.popitem(last=False)
                self._held -= len(evicted)

    def discard(self, chunk: ChunkId) -> None:
        """Forget a chunk (already consumed by a sequential reader)."""
        with self._lock:
            old = self._chunks.pop(chunk, None)
            if old is not None:
                self._held -= len(old)

    def headroom(self) -> int:
        """Bytes that can still be reserved for prefetching without evicting anything."""
        with self._lock:
            return self.budget - self._held - self.reserved

    def reserve(self, nbytes: int) -> None:
        """Account for a GET about to be issued."""
        with self._lock:
            self.reserved += nbytes

    def release(self, nbytes: int) -> None:
        """A GET finished (its data, if any, is now ``put``)."""
        with self._lock:
            self.reserved -= nbytes

    @property
    def held(self) -> int:
        """Bytes currently cached."""
        return self._held


def chunk_prefix(key: str, version: str) -> str:
    """The disk-cache name stem of one object version."""
    return hashlib.blake2b(f"{key}\0{version}".encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


class DiskCache:
    """Chunks as files under ``root`` (``ab/abcdef...-<chunk>``), LRU-evicted beyond ``capacity`` bytes.

    Files are written under a temporary name and renamed, so a crash never leaves a torn chunk.
    """

    def __init__(self, root: Path, capacity: int) -> None:
        self.root = root
        self.capacity = capacity
        self._files: OrderedDict[str, int] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        try:
            root.mkdir(parents=True, exist_ok=True)
            self._load()
        except PermissionError as err:
            raise AccessDenied(f"permission denied: cannot use {root} as the disk cache") from err
        except OSError as err:
            raise UsageError(f"cannot use {root} as the disk cache: {err.strerror or err}",
                             "point the cache at a writable local directory") from err

    def _load(self) -> None:
        found: list[tuple[float, str, int]] = []
        for sub in self.root.iterdir():
            if not sub.is_dir() or len(sub.name) != 2:
                continue
            for entry in os.scandir(sub):
                if ".tmp" in entry.name:
                    os.unlink(entry.path)
                    continue
                st = entry.stat()
                found.append((st.st_atime, entry.name, st.st_size))
        for _, name, size in sorted(found):
            self._files[name] = size
            self._held += size
        self._evict()

    def _path(self, name: str) -> Path:
        return self.root / name[:2] / name

    def get(self, name: str) -> bytes | None:
        """The chunk's bytes, or None when not cached (or unreadable)."""
        with self._lock:
            if name not in self._files:
                return None
            self._files.move_to_end(name)
        try:
            return self._path(name).read_bytes()
        except OSError:
            with self._lock:
                self._held -= self._files.pop(name, 0)
            return None

    def has(self, name: str) -> bool:
        """Whether the chunk is cached."""
        with self._lock:
            return name in self._files

    def put(self, name: str, data: memoryview) -> None:
        """Write a chunk (errors such as a full disk are logged and ignored)."""
        path = self._path(name)
        tmp = path.with_name(f"{name}.tmp{threading.get_ident()}")
        try:
            path.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        except OSError as err:
            log.warning("disk cache: cannot write %s: %s", path, err)
            tmp.unlink(missing_ok=True)
            return
        with self._lock:
            self._held += len(data) - self._files.pop(name, 0)
            self._files[name] = len(data)
            self._evict()

    def _evict(self) -> None:
        while self._held > self.capacity and self._files:
            name, size = self._files.popitem(last=False)
            self._held -= size
            try:
                self._path(name).unlink()
            except OSError:
                pass

    @property
    def held(self) -> int:
        """Bytes on disk."""
        return self._held


class BufferPool:
    """Reuses buffers of one standard size (GETs) once nothing refers to them any more.

    ``bytearray(n)`` zeroes n bytes and, for fresh memory, takes a page fault per 4 KiB, all
    under the GIL: that was half of the daemon's GIL time on a cold sequential read. A buffer is
    free again when no chunk view points into it (its reference count is back to ours).
    """

    def __init__(self, size: int, capacity: int) -> None:
        self.size = size
        self.capacity = capacity
        self._buffers: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> bytearray:
        """A buffer of ``size`` bytes (contents undefined)."""
        if size != self.size or not self.capacity:
            return bytearray(size)
        with self._lock:
            for buffer in self._buffers:
                if sys.getrefcount(buffer) <= 3:  # the list, this loop, getrefcount's argument
                    return buffer
            buffer = bytearray(size)
            if len(self._buffers) < self.capacity:
                self._buffers.append(buffer)
            return buffer
