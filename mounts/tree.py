"""The mount's immutable, compact view of a listing: files, implicit directories, metadata.

Memory layout (see bench/RESULTS.md for 100,000 keys): one sorted list of file keys (found by
binary search), parallel ``array`` columns for sizes and mtimes, versions packed as 16 bytes
each when they are MD5 ETags (else a list of strings), and per directory a tuple of child
names. No per-file objects are kept.

Rules, applied while the listing streams in:
- directories are implicit from ``/`` in keys; a zero-byte ``dir/`` marker object only makes
  ``dir`` exist (useful for empty directories) and is never shown as a file;
- a key that is both a file and a directory prefix (``a`` and ``a/b``): **the directory wins**,
  the file ``a`` is hidden and counted in :attr:`Tree.hidden`;
- keys that are unsafe as paths (``..``, ``.``, empty segments, NUL, backslash) are hidden and
  counted too; so are non-empty keys ending in ``/``.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Iterable

from lading.stores import ObjectInfo, UnsafeKey, key_parts


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One visible file, materialised on demand from the tree's columns."""

    index: int
    key: str
    size: int
    version: str
    mtime: float


@dataclass
class HiddenKeys:
    """Keys the tree does not show, by reason (the first few of each are kept as examples)."""

    shadowed: list[str] = field(default_factory=list)  # a file that is also a directory prefix
    unsafe: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"shadowed": 0, "unsafe": 0})

    def add(self, reason: str, key: str) -> None:
        """Record one hidden key."""
        self.counts[reason] += 1
        examples = getattr(self, reason)
        if len(examples) < 5:
            examples.append(key)


def _pack_versions(versions: list[str]) -> bytes | None:
    """All versions as 16 bytes each when they are all lowercase MD5 hex (single-part ETags),
    a fifth of the memory of the strings; None otherwise (multipart ETags, GCS generations)."""
    try:
        packed = b"".join(bytes.fromhex(v) for v in versions if len(v) == 32)
    except ValueError:
        return None
    if len(packed) != 16 * len(versions) or any(v != v.lower() for v in versions):
        return None
    return packed


class Tree:
    """An immutable directory tree over a set of objects. Paths are keys: no leading ``/``."""

    def __init__(self, infos: Iterable[ObjectInfo]) -> None:
        self.hidden = HiddenKeys()
        self._keys: list[str] = []
        self._sizes = array("q")
        self._mtimes = array("d")
        self._versions: list[str] = []
        children: dict[str, list[str]] = {"": []}
        for info in infos:
            self._add(info, children)
        self._drop_shadowed_files(children)
        self._dirs: dict[str, tuple[str, ...]] = {path: tuple(sorted(set(names))) for path, names in children.items()}
        self.total_bytes = sum(self._sizes)

    def _add(self, info: ObjectInfo, children: dict[str, list[str]]) -> None:
        key = info.key
        is_marker = key.endswith("/")
        try:
            parts = key_parts(key[:-1] if is_marker else key)
        except UnsafeKey:
            self.hidden.add("unsafe", key)
            return
        if is_marker and info.size:
            self.hidden.add("unsafe", key)
            return
        self._add_dirs(parts if is_marker else parts[:-1], children)
        if is_marker:
            return
        parent = key.rpartition("/")[0]
        children[parent].append(sys.intern(parts[-1]) if len(parts[-1]) < 16 else parts[-1])
        self._keys.append(key)
        self._sizes.append(info.size)
        self._mtimes.append(info.mtime)
        self._versions.append(info.version)

    @staticmethod
    def _add_dirs(parts: tuple[str, ...], children: dict[str, list[str]]) -> None:
        path = ""
        for part in parts:
            child = f"{path}/{part}" if path else part
            if child not in children:
                children[path].append(sys.intern(part))
                children[child] = []
            path = child

    def _drop_shadowed_files(self, children: dict[str, list[str]]) -> None:
        keep = [i for i, key in enumerate(self._keys) if key not in children]
        if len(keep) != len(self._keys):  # rare: only when some file is also a directory
            for i, key in enumerate(self._keys):
                if key in children:
                    self.hidden.add("shadowed", key)
            self._keys = [self._keys[i] for i in keep]
            self._sizes = array("q", (self._sizes[i] for i in keep))
            self._mtimes = array("d", (self._mtimes[i] for i in keep))
            self._versions = [self._versions[i] for i in keep]
        order = sorted(range(len(self._keys)), key=self._keys.__getitem__)
        if order != list(range(len(order))):  # a manifest need not be sorted
            self._keys = [self._keys[i] for i in order]
            self._sizes = array("q", (self._sizes[i] for i in order))
            self._mtimes = array("d", (self._mtimes[i] for i in order))
            self._versions = [self._versions[i] for i in order]
        self._packed = _pack_versions(self._versions)
        if self._packed is not None:
            self._versions = []

    @property
    def file_count(self) -> int:
        """How many files the mount shows."""
        return len(self._keys)

    @property
    def dir_count(self) -> int:
        """How many directories the mount shows, the root included."""
        return len(self._dirs)

    def is_dir(self, path: str) -> bool:
        """Whether ``path`` (``""`` is the root) is a directory."""
        return path in self._dirs

    def file_index(self, path: str) -> int | None:
        """The file's index, or None when ``path`` is not a file (binary search: no index dict)."""
        keys = self._keys
        i = bisect_left(keys, path)
        return i if i < len(keys) and keys[i] == path else None

    def version(self, index: int) -> str:
        """The version (ETag, generation) file ``index`` was listed with."""
        if self._packed is not None:
            return self._packed[index * 16 : (index + 1) * 16].hex()
        return self._versions[index]

    def size(self, index: int) -> int:
        """Size of file ``index``."""
        return self._sizes[index]

    def mtime(self, index: int) -> float:
        """Modification time of file ``index`` (seconds since the epoch)."""
        return self._mtimes[index]

    def entry(self, index: int) -> FileEntry:
        """Everything known about file ``index``."""
        return FileEntry(index, self._keys[index], self._sizes[index], self.version(index), self._mtimes[index])

    def children(self, path: str) -> tuple[str, ...]:
        """Sorted names directly inside directory ``path``; raises KeyError if not a directory."""
        return self._dirs[path]

    def keys(self) -> list[str]:
        """All visible file keys, sorted (do not mutate)."""
        return self._keys
