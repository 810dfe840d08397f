"""The FUSE operations: a read-only view of a :class:`~mounts.tree.Tree` served by a Reader.

This is the errno boundary: every failure below becomes an errno here, and nothing else
escapes to libfuse. NotFound -> ENOENT, AccessDenied -> EACCES, ObjectChanged, transient
failures and timeouts -> EIO; writes -> EROFS.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import stat
import threading
import time
from typing import Any, Callable, TypeVar

from lading.mounts.reader import OpenFile, Reader
from lading.mounts.tree import Tree
from lading.stores import AccessDenied, LadingError, NotFound

log = logging.getLogger("lading.mount")

F = TypeVar("F", bound=Callable[..., Any])
DIR_TYPE = {"st_mode": stat.S_IFDIR}
FILE_TYPE = {"st_mode": stat.S_IFREG}


def _errno_for(err: BaseException) -> int:
    if isinstance(err, NotFound):
        return errno.ENOENT
    if isinstance(err, AccessDenied):
        return errno.EACCES
    return errno.EIO


def _safely(describe: Callable[..., str], args: tuple[Any, ...]) -> str:
    try:
        return describe(*args)
    except Exception:  # noqa: BLE001 - a description must never hide the real failure
        return "a file operation"


def make_operations(
    mfusepy: Any,
    tree: Tree,
    reader: Reader,
    on_init: Callable[[], None] | None = None,
    on_destroy: Callable[[], None] | None = None,
    on_first_request: Callable[[], object] | None = None,
) -> Any:
    """Build the mfusepy ``Operations`` instance (mfusepy is imported lazily by the caller).
    ``on_first_request`` runs once, in the first stat or open, before it is answered."""
    fuse_error = mfusepy.FuseOSError
    first_request = threading.Lock()
    pending: list[Callable[[], object] | None] = [on_first_request]

    def first() -> None:
        with first_request:
            if pending[0] is not None:
                hook, pending[0] = pending[0], None
                hook()

    def boundary(describe: Callable[..., str], is_read: bool = False) -> Callable[[F], F]:
        """Turn every error of the method into an errno, logged in the user's terms
        (``describe(self, *args)``: "read train/a.jpg at 0 (+131072 bytes)"); a failed read
        also counts in the ``read_errors`` statistic."""

        def decorate(method: F) -> F:
            @functools.wraps(method)
            def guarded(*args: Any) -> Any:
                try:
                    return method(*args)
                except fuse_error as err:
                    if is_read:
                        reader.stats.add(read_errors=1)
                    raise err
                except Exception as err:
                    code = _errno_for(err) if isinstance(err, LadingError) else errno.EIO
                    if is_read:
                        reader.stats.add(read_errors=1)
                    what = _safely(describe, args)
                    if isinstance(err, LadingError):
                        log.warning("%s failed (%s): %s", what, errno.errorcode.get(code, code), err.message)
                    else:  # a bug must not take the mount down: log it, answer EIO
                        log.exception("%s failed (EIO): internal error", what)
                    raise fuse_error(code) from None

            return guarded  # type: ignore[return-value]

        return decorate

    def read_of(self: Any, path: str, size: int, offset: int, fh: int) -> str:
        return f"read {path} at {offset} (+{size} bytes)"

    def read_into_of(self: Any, fh: int, dest: int, size: int, offset: int) -> str:
        handle = self._handles.get(fh)
        name = "/" + handle.entry.key if handle is not None else f"(closed file {fh})"
        return f"read {name} at {offset} (+{size} bytes)"

    def verb(name: str) -> Callable[..., str]:
        return lambda self, path, *rest: f"{name} {path}"

    def read_only(self: Any, *args: Any) -> int:
        """Every write operation."""
        raise fuse_error(errno.EROFS)

    class LadingFS(mfusepy.Operations):
        """Read-only, immutable tree; file data from the reader."""

        use_ns = True

        def __init__(self) -> None:
            self._handles: dict[int, OpenFile] = {}
            self._ids = itertools.count(1)
            self._lock = threading.Lock()
            uid, gid = os.getuid(), os.getgid()
            now = time.time_ns()  # directories have no time of their own: show the mount's
            self._dir_attrs = {
                "st_mode": stat.S_IFDIR | 0o555,
                "st_nlink": 2,
                "st_uid": uid,
                "st_gid": gid,
                "st_mtime": now,
                "st_ctime": now,
                "st_atime": now,
            }
            self._uid, self._gid = uid, gid

        def init(self, path: str) -> None:
            """The kernel sees the mount: report readiness."""
            if on_init is not None:
                on_init()

        def destroy(self, path: str) -> None:
            """Unmounted."""
            if on_destroy is not None:
                on_destroy()

        @boundary(verb("stat"))
        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            """Attributes from the tree: read-only files and directories."""
            if pending[0] is not None:
                first()
            key = path[1:]
            index = tree.file_index(key)
            if index is None:
                if tree.is_dir(key):
                    return self._dir_attrs
                raise fuse_error(errno.ENOENT)
            size = tree.size(index)
            mtime = int(tree.mtime(index) * 1e9)
            return {
                "st_mode": stat.S_IFREG | 0o444,
                "st_nlink": 1,
                "st_size": size,
                "st_blocks": (size + 511) // 512,
                "st_mtime": mtime,
                "st_ctime": mtime,
                "st_atime": mtime,
                "st_uid": self._uid,
                "st_gid": self._gid,
            }

        @boundary(verb("list"))
        def readdir(self, path: str, fh: int) -> list[Any]:
            """A directory's entries, with their types."""
            key = path[1:]
            try:
                names = tree.children(key)
            except KeyError:
                raise fuse_error(errno.ENOTDIR if tree.file_index(key) is not None else errno.ENOENT) from None
            # With the type in each entry, `find` and `os.walk` need no stat per file.
            prefix = f"{key}/" if key else ""
            is_dir = tree.is_dir
            return [
                (".", DIR_TYPE, 0),
                ("..", DIR_TYPE, 0),
                *[(name, DIR_TYPE if is_dir(prefix + name) else FILE_TYPE, 0) for name in names],
            ]

        @boundary(verb("open"))
        def open(self, path: str, flags: int) -> int:
            """A read handle (write modes: EROFS)."""
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
                raise fuse_error(errno.EROFS)
            if pending[0] is not None:
                first()
            index = tree.file_index(path[1:])
            if index is None:
                raise fuse_error(errno.EISDIR if tree.is_dir(path[1:]) else errno.ENOENT)
            handle = reader.open(tree.entry(index))
            with self._lock:
                fh = next(self._ids)
                self._handles[fh] = handle
            return fh

        @boundary(read_of, is_read=True)
        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            """Bytes of an open file (mfusepy's generic path)."""
            return reader.read(self._handles[fh], offset, size)

        @boundary(read_into_of, is_read=True)
        def read_into(self, fh: int, dest: int, size: int, offset: int) -> int:
            """Bytes of an open file copied to FUSE's buffer at ``dest`` (LadingFUSE's path)."""
            return reader.read_into(self._handles[fh], offset, size, dest)

        @boundary(verb("close"))
        def release(self, path: str, fh: int) -> int:
            """Forget a handle."""
            with self._lock:
                handle = self._handles.pop(fh, None)
            if handle is not None:
                reader.release(handle)
            return 0

        @boundary(verb("statfs"))
        def statfs(self, path: str) -> dict[str, int]:
            """Totals of the tree; no free space."""
            block = 4096
            blocks = (tree.total_bytes + block - 1) // block
            return {
                "f_bsize": block,
                "f_frsize": block,
                "f_blocks": blocks,
                "f_bfree": 0,
                "f_bavail": 0,
                "f_files": tree.file_count + tree.dir_count,
                "f_ffree": 0,
                "f_namemax": 1024,
            }

        def access(self, path: str, amode: int) -> int:
            """Existence check; write access is EROFS."""
            if amode & os.W_OK:
                raise fuse_error(errno.EROFS)
            key = path[1:]
            if tree.file_index(key) is None and not tree.is_dir(key):
                raise fuse_error(errno.ENOENT)
            return 0

        write = create = unlink = mkdir = rmdir = rename = truncate = read_only
        chmod = chown = utimens = symlink = link = mknod = setxattr = removexattr = read_only

    return LadingFS()


def make_fuse_class(mfusepy: Any) -> type:
    """mfusepy's FUSE with a read callback that copies our buffers straight into FUSE's buffer
    (mfusepy's own needs a bytes object per read: one more copy of every byte served)."""
    import ctypes

    class LadingFUSE(mfusepy.FUSE):
        """mfusepy's FUSE with a copy-free read callback."""

        def read(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
            """Copy straight into FUSE's buffer; return the byte count."""
            dest = ctypes.cast(buf, ctypes.c_void_p).value
            return self.operations.read_into(fip.contents.fh, dest, size, offset)

    return LadingFUSE
