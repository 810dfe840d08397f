"""The optional disk cache of file data: an LRU of fixed-size chunks.

Chunks are named after the object's key *and version*, so a changed object can never be served
from a stale cache. (The memory cache is the reader's, :mod:`lading.mounts.reader`.)
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

from lading.core.errors import local_error

log = logging.getLogger("lading.mount")

#: Bytes per disk-cache chunk (the last chunk of a file is shorter).
CHUNK = 256 * 1024


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
        except OSError as err:  # denied or read-only 4, a file in the way 2, a full disk 6
            raise local_error(
                err, f"use {root} as the disk cache", "point the cache at a writable local directory"
            ) from err

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
