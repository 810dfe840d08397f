"""A local directory as a Store: ``/abs/path`` or ``file:///abs/path``.

Conditional writes (:meth:`LocalStore.put`, :meth:`LocalStore.delete`): the version they
compare is a digest of the content (mtime and size could miss a rewrite within the file
system's time resolution). Creating an absent name is a ``link(2)`` of a complete temporary
file (fails when the name exists); replacing or deleting holds ``flock`` on the current file,
checks it is still the same inode and content, then renames or unlinks.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import stat as stat_mode
import uuid
from bisect import bisect_left
from concurrent.futures import Future, ThreadPoolExecutor
from operator import itemgetter
from pathlib import Path
from typing import Callable, Iterator, Sequence

from lading.core.errors import AccessDenied, LadingError, NotFound, ObjectChanged, TransientError, UsageError
from lading.core.keys import key_parts, safe_join
from lading.core.names import hidden_sibling
from lading.stores.base import (
    Fetched,
    ObjectInfo,
    Outcomes,
    OnPiece,
    PAGE_ROWS,
    Page,
    Row,
    ProgressCallback,
    RangeRequest,
    Sink,
    Store,
    Views,
)
from lading.stores.config import StoreConfig

_CHUNK = 1 << 20


def _version(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns}-{st.st_size}"


#: Threads reading directories for :meth:`LocalStore.list` (one: each ``stat`` is a short system
#: call between two takes of the GIL, and more threads only queue for it; on an idle machine
#: they also spend system time handing the GIL over), and how many directories it may read
#: ahead of the one being yielded.
_SCAN_THREADS = 1
_SCAN_AHEAD = 16

#: A directory's subdirectory: ``(key + "/", path)``; ``key + "/"`` is where the keys under it
#: start among the directory's files, in key order.
_Dir = tuple[str, str]
#: A directory read: its regular files' rows and its subdirectories, each in key order.
_Scanned = tuple[list[Row], list[_Dir]]


def _scan(directory: str, rel: str, prefix: str) -> _Scanned:
    """The entries of ``directory`` (keys under ``rel``) in key order: its regular files (and
    symlinks to them) stat'ed relative to the directory's descriptor (no path walk per file),
    its subdirectories that can hold keys under ``prefix``."""
    try:
        fd = os.open(directory, _DIRECTORY_FLAGS)
    except OSError as err:
        raise _translate(err, directory) from err
    rows: list[Row] = []
    dirs: list[_Dir] = []
    try:
        with os.scandir(fd) as listing:
            for entry in listing:
                name = entry.name
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                key = rel + name
                if is_dir:
                    if not prefix or prefix.startswith(key + "/") or key.startswith(prefix):
                        dirs.append((key + "/", f"{directory}/{name}"))
                    continue
                if prefix and not key.startswith(prefix):
                    continue
                try:
                    st = entry.stat(follow_symlinks=True)  # fstatat(fd, name)
                except OSError:
                    continue  # broken symlink
                if not stat_mode.S_ISREG(st.st_mode):  # (st followed the link, as isfile would: no second stat)
                    continue
                size = st.st_size
                rows.append((key, size, f"{st.st_mtime_ns}-{size}", st.st_mtime, None, None))
    except OSError as err:
        raise _translate(err, directory) from err
    finally:
        os.close(fd)
    rows.sort(key=_first)  # names are unique in a directory: the key alone orders
    dirs.sort()
    return rows, dirs


_first = itemgetter(0)


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _translate(err: OSError, what: str) -> LadingError:
    """The one place local OS errors become project errors."""
    if isinstance(err, FileNotFoundError) or err.errno == errno.ENOTDIR:
        return NotFound(f"not found: {what}")
    if isinstance(err, PermissionError):
        return AccessDenied(f"permission denied: {what}")
    return TransientError(f"I/O error on {what}: {err.strerror or err}")


def _pages(rows: list[Row], start: int, stop: int) -> Iterator[Page]:
    """``rows[start:stop]`` as pages of at most :data:`PAGE_ROWS` (the whole list when it is one)."""
    if start == 0 and stop == len(rows) <= PAGE_ROWS:
        if rows:
            yield rows
        return
    for first in range(start, stop, PAGE_ROWS):
        yield rows[first : min(first + PAGE_ROWS, stop)]


class LocalStore(Store):
    """Objects are the regular files under ``root``; keys are their relative POSIX paths."""

    scheme = "file"

    def __init__(self, root: str | Path, config: StoreConfig | None = None) -> None:
        self.root = Path(root)
        self._root = str(self.root)
        self.url = str(self.root)
        self.config = config or StoreConfig()

    def _path(self, key: str) -> Path:
        return safe_join(self.root, key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Walk the tree in key order (:meth:`list_pages`)."""
        return (ObjectInfo(*row) for page in self.list_pages(prefix) for row in page)

    def list_pages(self, prefix: str = "") -> Iterator[Page]:
        """Walk the tree in key order; symlinks to files count, directory links are not followed.
        A page holds files of one directory (at most :data:`PAGE_ROWS`).

        Directories are read (``scandir`` and a ``stat`` per file) by a thread up to
        :data:`_SCAN_AHEAD` directories ahead of the one being yielded, so the system calls
        overlap the caller's work; memory holds those directories' entries only.
        """
        if not self.root.is_dir():
            if self.root.exists():
                raise UsageError(f"{self.root} is a file, not a directory", "name the directory that holds it instead")
            raise NotFound(f"no such directory: {self.root}")
        with ThreadPoolExecutor(max_workers=_SCAN_THREADS, thread_name_prefix="lading-list") as pool:
            yield from self._walk(pool, _scan(str(self.root), "", prefix), prefix)

    def _walk(self, pool: ThreadPoolExecutor, scanned: _Scanned, prefix: str) -> Iterator[Page]:
        rows, dirs = scanned
        ahead: dict[int, Future[_Scanned]] = {}
        submitted = done = 0  # files before ``done`` were yielded
        for index, (start, _) in enumerate(dirs):
            while submitted < len(dirs) and len(ahead) < _SCAN_AHEAD:
                ahead[submitted] = pool.submit(_scan, dirs[submitted][1], dirs[submitted][0], prefix)
                submitted += 1
            cut = bisect_left(rows, start, done, key=_first)  # the files that sort before the directory's keys
            yield from _pages(rows, done, cut)
            done = cut
            yield from self._walk(pool, ahead.pop(index).result(), prefix)
        yield from _pages(rows, done, len(rows))

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
        return bytes(self._read(RangeRequest(key, start, end, version)))

    def _read(self, request: RangeRequest) -> memoryview:
        path = os.path.join(self._root, *key_parts(request.key))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                current = os.fstat(fd)
                if stat_mode.S_ISDIR(current.st_mode):
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
                stop = current.st_size if request.end is None else request.end
                data = b""
                if stop > request.start:
                    data = _pread_all(fd, request.start, stop)
                    current = os.fstat(fd)  # a change while reading shows in the version
            finally:
                os.close(fd)
        except OSError as err:
            raise _translate(err, str(path)) from err
        if request.version is not None and _version(current) != request.version:
            raise ObjectChanged(f"{self.url}/{request.key} changed while reading it")
        return memoryview(data)

    def read_many(self, requests: Sequence[RangeRequest]) -> Views:
        """Each range, read in turn (a local file answers faster than a thread hop)."""
        return [self._read(request) for request in requests]

    def read_each(self, requests: Sequence[RangeRequest]) -> Outcomes:
        """Each range, or the error its read ended with."""
        out: list[memoryview | BaseException] = []
        for request in requests:
            try:
                out.append(self._read(request))
            except LadingError as err:
                out.append(err)
        return out

    def stream(
        self,
        key: str,
        sink: Sink,
        version: str | None,
        start: int = 0,
        end: int | None = None,
        on_version: Callable[[str], None] | None = None,
    ) -> Fetched:
        """The file's bytes ``[start, end)`` in pieces of 1 MiB, checked against ``version``."""
        path = self._path(key)
        delivered = 0
        try:
            with open(path, "rb") as handle:
                current = os.fstat(handle.fileno())
                got = _version(current)
                if version is not None and got != version:
                    raise ObjectChanged(f"{self.url}/{key} changed since it was listed")
                if on_version is not None:
                    on_version(got)
                stop = current.st_size if end is None else min(end, current.st_size)
                handle.seek(start)
                while delivered < stop - start:
                    chunk = handle.read(min(_CHUNK, stop - start - delivered))
                    if not chunk:
                        break
                    sink(memoryview(chunk))
                    delivered += len(chunk)
        except OSError as err:
            raise _translate(err, str(path)) from err
        return Fetched(delivered, current.st_size, got)

    def download(
        self,
        key: str,
        dest: Path,
        version: str | None = None,
        progress: ProgressCallback | None = None,
        size: int | None = None,
        on_piece: OnPiece | None = None,
    ) -> None:
        """Copy the file to ``dest``, on file descriptors: a Python file object costs three more
        system calls per file (``fstat``, the ``isatty`` probe, ``lseek``) and a sync of a tree of
        small files is made of little else."""
        path = os.path.join(self._root, *key_parts(key))
        try:
            src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if version is not None and _version(os.fstat(src)) != version:
                    raise ObjectChanged(f"{path} changed since it was listed")
                out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
                try:
                    _copy_fd(src, out, progress, on_piece)
                finally:
                    os.close(out)
            finally:
                os.close(src)
        except OSError as err:
            raise _translate(err, path) from err

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

    # -- conditional writes (the claims protocol) -------------------------------------------------

    def read_object(self, key: str) -> tuple[bytes, str] | None:
        """The file's bytes and their digest (the version conditional writes compare)."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise _translate(err, str(path)) from err
        return data, _digest(data)

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_version: str | None = None) -> str:
        """Write ``data`` atomically; conditionally as :meth:`Store.put` says (see the module)."""
        path = self._path(key)
        try:
            if if_version is not None:
                return self._replace(path, key, data, if_version)
            tmp = _temporary(path, data)
            try:
                if if_absent:
                    os.link(tmp, path)  # atomic, and fails when the name exists
                else:
                    os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
        except FileExistsError:
            raise ObjectChanged(f"{self.url}/{key} exists already") from None
        except OSError as err:
            raise _translate(err, str(path)) from err
        return _digest(data)

    def _replace(self, path: Path, key: str, data: bytes, version: str) -> str:
        fd = _locked_current(path)
        if fd is None:
            raise NotFound(f"not found: {path}")
        try:
            if _digest(_read_fd(fd)) != version:
                raise ObjectChanged(f"{self.url}/{key} is no longer version {version}")
            os.replace(_temporary(path, data), path)  # while holding the old file's lock
        finally:
            os.close(fd)
        return _digest(data)

    def delete(self, key: str, version: str | None = None) -> bool:
        """Unlink the file (only if its content is still ``version``); folders left empty go too."""
        path = self._path(key)
        try:
            fd = _locked_current(path)
            if fd is None:
                return False
            try:
                if version is not None and _digest(_read_fd(fd)) != version:
                    return False
                path.unlink()
            finally:
                os.close(fd)
        except FileNotFoundError:
            return False
        except OSError as err:
            raise _translate(err, str(path)) from err
        remove_empty_dirs(self.root, key.rpartition("/")[0])
        return True

    def delete_many(self, keys: Sequence[str]) -> None:
        """Unlink each file (missing ones are no error); folders left empty go too."""
        folders = set()
        for key in keys:
            path = self._path(key)
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as err:
                raise _translate(err, str(path)) from err
            folders.add(key.rpartition("/")[0])
        for folder in sorted(folders, key=len, reverse=True):
            remove_empty_dirs(self.root, folder)


def _pread_all(fd: int, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of ``fd``, fewer only at its end (one ``pread`` returns at most 2 GiB)."""
    data = os.pread(fd, stop - start, start)
    if len(data) == stop - start or not data:
        return data
    pieces = [data]
    offset = start + len(data)
    while offset < stop and (piece := os.pread(fd, stop - offset, offset)):
        pieces.append(piece)
        offset += len(piece)
    return b"".join(pieces)


def _copy_fd(src: int, out: int, progress: ProgressCallback | None, on_piece: OnPiece | None) -> None:
    """Copy ``src`` to its end into ``out``, piece by piece."""
    offset = 0
    while chunk := os.read(src, _CHUNK):
        view = memoryview(chunk)
        while view:
            view = view[os.write(out, view) :]
        if on_piece is not None:
            on_piece(memoryview(chunk), offset)
        offset += len(chunk)
        if progress is not None:
            progress(len(chunk))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _temporary(path: Path, data: bytes) -> Path:
    """A complete, synced copy of ``data`` beside ``path`` under a unique hidden name."""
    tmp = path.with_name(hidden_sibling(path.name, f".lading-tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def _locked_current(path: Path) -> int | None:
    """An fd holding ``flock(LOCK_EX)`` on the file ``path`` names now, or None when there is none.

    Replacements rename a new file over the name while holding the lock on the old one: after
    locking, the name must still be the locked file (else the lock is taken again on the new one)."""
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _read_fd(fd: int) -> bytes:
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def remove_empty_dirs(root: Path, prefix: str) -> None:
    """Remove directories under ``root/prefix`` (deepest first), and ``prefix``'s own folders up to
    ``root``, when they are empty."""
    base = safe_join(root, prefix.rstrip("/")) if prefix.strip("/") else root
    if base.is_dir():
        for directory, _, _ in sorted(os.walk(base), key=lambda entry: -len(entry[0])):
            if Path(directory) != root:  # the store's own root stays
                _rmdir(Path(directory))
    current = base
    while current != root and root in current.parents:
        if not _rmdir(current):
            break
        current = current.parent


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except OSError as err:
        if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
            return False
        raise
