"""A local directory as a Store: ``/abs/path`` or ``file:///abs/path``."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Iterator

from lading.core.errors import AccessDenied, NotFound, ObjectChanged, TransientError, UsageError
from lading.core.keys import safe_join
from lading.core.names import hidden_sibling
from lading.stores.base import ObjectInfo, ProgressCallback

_CHUNK = 1 << 20


def _version(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns}-{st.st_size}"


def _translate(err: OSError, what: str) -> Exception:
    """The one place local OS errors become project errors."""
    if isinstance(err, FileNotFoundError) or err.errno == errno.ENOTDIR:
        return NotFound(f"not found: {what}")
    if isinstance(err, PermissionError):
        return AccessDenied(f"permission denied: {what}")
    return TransientError(f"I/O error on {what}: {err.strerror or err}")


class LocalStore:
    """Objects are the regular files under ``root``; keys are their relative POSIX paths."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        return safe_join(self.root, key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Walk the tree in key order; symlinks to files count, directory links are not followed."""
        if not self.root.is_dir():
            if self.root.exists():
                raise UsageError(f"{self.root} is a file, not a directory",
                                 "name the directory that holds it instead")
            raise NotFound(f"no such directory: {self.root}")
        yield from self._walk(self.root, "", prefix)

    def _walk(self, directory: Path, rel: str, prefix: str) -> Iterator[ObjectInfo]:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as err:
            raise _translate(err, str(directory)) from err
        # Key order: "a/b" must sort as the string "a/b", not as a directory visited first.
        items: list[tuple[str, os.DirEntry[str], bool]] = []
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            key = f"{rel}{entry.name}"
            items.append((key + "/" if is_dir else key, entry, is_dir))
        items.sort(key=lambda item: item[0])
        for sort_key, entry, is_dir in items:
            key = sort_key.rstrip("/") if is_dir else sort_key
            if is_dir:
                if prefix.startswith(key + "/") or key.startswith(prefix) or not prefix:
                    yield from self._walk(Path(entry.path), key + "/", prefix)
                continue
            if not key.startswith(prefix):
                continue
            try:
                st = entry.stat(follow_symlinks=True)
            except OSError:
                continue  # broken symlink
            if not os.path.isfile(entry.path):
                continue
            yield ObjectInfo(key, st.st_size, _version(st), st.st_mtime)

    def stat(self, key: str) -> ObjectInfo:
        """Metadata of one file."""
        path = self._path(key)
        try:
            st = path.stat()
        except OSError as err:
            raise _translate(err, str(path)) from err
        if not path.is_file():
            raise NotFound(f"not a file: {path}")
        return ObjectInfo(key, st.st_size, _version(st), st.st_mtime)

    def read_range(self, key: str, start: int, end: int, version: str | None = None) -> bytes:
        """Bytes ``[start, end)``, checked against ``version`` after the read."""
        path = self._path(key)
        try:
            with open(path, "rb") as handle:
                handle.seek(start)
                data = handle.read(max(0, end - start))
                current = _version(os.fstat(handle.fileno()))
        except OSError as err:
            raise _translate(err, str(path)) from err
        if version is not None and current != version:
            raise ObjectChanged(f"{self.url}/{key} changed while reading it")
        return data

    def download(
        self,
        key: str,
        dest: Path,
        version: str | None = None,
        progress: ProgressCallback | None = None,
    ) -> None:
        """Copy the file to ``dest``."""
        path = self._path(key)
        try:
            with open(path, "rb") as src, open(dest, "wb") as out:
                if version is not None and _version(os.fstat(src.fileno())) != version:
                    raise ObjectChanged(f"{path} changed since it was listed")
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    if progress is not None:
                        progress(len(chunk))
        except OSError as err:
            raise _translate(err, str(path)) from err

    def upload(self, src: Path, key: str, progress: ProgressCallback | None = None) -> ObjectInfo:
        """Copy ``src`` into the tree atomically (temporary name, then rename)."""
        path = self._path(key)
        tmp = path.with_name(hidden_sibling(path.name, f".lading-tmp-{os.getpid()}"))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, tmp)
            os.replace(tmp, path)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise _translate(err, str(path)) from err
        if progress is not None:
            progress(path.stat().st_size)
        return self.stat(key)
