"""The node cache: each file downloaded once per node, shared by every rank, worker and process,
by ``lading sync`` and by the datasets alike (one cache, one lock protocol, one location rule).

The root is ``cache_dir=`` / ``--cache-dir``, else ``$LADING_CACHE_DIR``, else
``$XDG_CACHE_HOME/lading`` when set, else ``/tmp/lading-cache-<uid>`` (node-local, per user, created 0700; refused when another user owns
it or others can write to it). Layout under it::

    <name>-<digest>/ , <name>-<digest>.lock   lading sync's entries (see :mod:`lading.sync.nodecache`)
    datasets/.lading-entries             the index of cached files: one "+ path size" / "- path" line
                                         per download / removal, so eviction reads no record
    datasets/<slug>-<digest>/            one folder per shard location (the index's folder)
        dataset.json                     {"uri": "s3://bucket/datasets/pets/v1/"}
        pets-000000.tar                  the shard, exactly as stored
        pets-000000.tar.lading-meta      {"uri", "version", "size", "downloaded"}; mtime = last use
        pets-000000.tar.lading-lock      the shard's flock

Rules:

- **One download per shard per node.** A process that needs a shard takes the shard's lock
  shared and checks the record: same version (ETag / generation, as the index recorded it) and
  size. If not, it takes the lock exclusive, checks again (another process may have just
  downloaded it), downloads to a temporary name, renames, writes the record, and reads on under
  the shared lock. Waiting has no timeout; the kernel drops the lock of a process that dies.
  A prefetch *claims* a download instead (:meth:`NodeCache.claim`: the fetch lock taken without
  waiting), so a process never queues behind a download another one already started.
- **In use is never evicted.** Readers hold the shared lock while they read. With
  ``cache_limit``, a process about to download evicts the least recently used shards (by record
  mtime, touched at every open) whose exclusive lock it can take *without waiting*: a shard
  some process holds is skipped. When everything left is in use, the cache goes over the limit
  for a while (logged) rather than wait: a limit below what is read at once never deadlocks.
- **Only what it downloaded.** Eviction and ``lading cache clear`` remove only shards that have
  a record; other files in the cache root are never touched.
- **A safe root.** A root that is not owned by this user, or that others can write to, is
  refused (anyone who can write there could plant shards).
- **Stored once.** A file ``lading sync`` put in its entry is linked (same inode) into the
  ``datasets`` folder with its record (:meth:`NodeCache.adopt`), so a pack synced, then read by
  ShardDataset or PackedDataset, is neither downloaded nor stored twice.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import mmap
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator

from lading.core.atomic import write_atomically
from lading.core.cacheroot import CACHE_ROOT_RULE, default_cache_root  # noqa: F401 - used here, re-exported
from lading.core.errors import AccessDenied, NotFound, ObjectChanged, ProblemFound, UsageError, local_error
from lading.stores.base import ObjectInfo, Store
from lading.transfer.verify import InlineCrc32c, Verifier

log = logging.getLogger(__name__)

META = ".lading-meta"
LOCK = ".lading-lock"
#: Held exclusively by the one process downloading a shard; readers hold LOCK shared (in use,
#: so not evicted). Two files, so a reader never waits for an exclusive lock that readers of the
#: same shard keep from being granted (DataLoader workers hold shards while they wait for work).
FETCH = ".lading-fetch"
_TMP = ".lading-tmp-"
_DATASETS = "datasets"
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _download_shard(
    store: Store, key: str, version: str | None, dest: Path, size: int | None = None, crc32c: str | None = None
) -> None:
    """Download one object at ``version`` to ``dest`` (the one place the cache moves bytes): on
    the I/O core in parallel ranged parts when the store can (its ``size`` known). Checked against
    the CRC32C the index recorded as the bytes are written; an index without one (packed before
    lading recorded it) is checked against the MD5 an S3 ETag stands for, read back from the
    file, as ``lading sync`` checks it."""
    if crc32c is None:
        store.download(key, dest, version=version, size=size)
        _verify_md5(store, key, version, dest)
        return
    check = InlineCrc32c(key, crc32c)
    store.download(key, dest, version=version, size=size, on_piece=check)
    check.check(os.path.getsize(dest))


def _verify_md5(store: Store, key: str, version: str | None, dest: Path) -> None:
    """Raise IntegrityError when ``version`` is a single-part S3 ETag (an MD5) that the file's
    bytes do not have, unless the store says the ETag is not the content's MD5 (SSE-KMS, SSE-C):
    the transfer engine's :class:`Verifier`, over the file."""
    md5 = store.md5_of_version(version) if version else None
    if md5 is None:
        return
    size = os.path.getsize(dest)
    verifier = Verifier(ObjectInfo(key, size, version or "", md5=md5))
    fd = os.open(dest, os.O_RDONLY)
    try:
        verifier.update_from_file(fd, 0, size)
    finally:
        os.close(fd)
    if verifier.md5_mismatch(size) and not store.etag_is_md5(key):
        return
    verifier.check(size)


def parse_limit(limit: int | str | None) -> int | None:
    """A cache limit in bytes: an int, or ``"50GB"``, ``"1.5GiB"``, ``"800MB"``."""
    if limit is None or isinstance(limit, int):
        if isinstance(limit, int) and limit <= 0:
            raise UsageError(f"cache_limit={limit} must be positive")
        return limit
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(limit))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise UsageError(f"cache_limit={limit!r} is not a size", "use bytes or a unit: 50GB, 1.5GiB, 800MB")
    return parse_limit(int(float(match.group(1)) * _UNITS[unit]))


_OWN_DIRECTORY = "set LADING_CACHE_DIR (or cache_dir=) to a directory you can write"


def check_root(
    root: Path, what: str = "the cache directory", elsewhere: str = _OWN_DIRECTORY, modes_follow_umask: bool = False
) -> None:
    """The one safety rule of the node cache's directories (``lading sync``'s and the datasets'):
    refuse (AccessDenied, exit 4) one that is not owned by this user, or that group or others can
    write to (``modes_follow_umask``: skip that, for entries inside a checked root), or that we may
    not read or enter. A symlink counts only if this user owns the link itself (one another user
    planted in /tmp is refused); its target is then judged. Missing: NotFound; a file: UsageError.
    ``elsewhere`` says how to use another directory."""
    me = os.geteuid()
    try:
        link = os.lstat(root)
        st = os.stat(root) if stat.S_ISLNK(link.st_mode) else link
    except OSError as err:
        raise local_error(err, f"use {what} {root}", elsewhere) from None
    if link.st_uid != me:  # the symlink's owner (or the directory's, when it is none)
        kind = "a symlink " if stat.S_ISLNK(link.st_mode) else ""
        raise AccessDenied(
            f"refusing {what} {root}: it is {kind}owned by uid {link.st_uid}, not by you "
            f"(uid {me}); its files would end up in your data",
            elsewhere,
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what} {root} is not a directory", elsewhere)
    if st.st_uid != me:
        raise AccessDenied(
            f"refusing {what} {root}: it is owned by uid {st.st_uid}, not by you "
            f"(uid {me}); its files would end up in your data",
            elsewhere,
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not modes_follow_umask:
        raise AccessDenied(
            f"refusing {what} {root}: others can write to it "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); its files would end up in your data",
            f"chmod go-w {root}, or {elsewhere}",
        )
    if not os.access(root, os.R_OK | os.X_OK):
        raise AccessDenied(f"cannot use {what} {root}: permission denied", elsewhere)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def location_folder(parent_uri: str) -> str:
    """The cache folder name of a shard location: a readable slug and a digest of the URI."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", parent_uri.split("://", 1)[-1]).strip("_.")[-48:]
    return f"{slug or 'shards'}-{_digest(parent_uri)}"


def _hold(path: Path, mode: int) -> int:
    """An fd holding ``flock(mode)`` on ``path``, waiting as long as it takes."""
    fd = _lock(path, mode)
    assert fd is not None
    return fd


def _lock(path: Path, mode: int, wait: bool = True) -> int | None:
    """An fd holding ``flock(mode)`` on ``path``, or None when ``wait`` is False and it is held.

    Lock files may be deleted by eviction (under their exclusive lock): after locking, the path
    must still name the locked file, else the lock is taken again on the new one.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, mode if wait else mode | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            current = os.stat(path)
            held = os.fstat(fd)
            if (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


@dataclass(frozen=True)
class ShardSource:
    """Where a shard comes from: its URI, the store and key to download it, and the version
    (ETag / generation), size and CRC32C the index recorded (None: unknown, take the store's;
    no CRC32C: check the MD5 an ETag stands for)."""

    uri: str
    store: Callable[[], Store]
    key: str
    version: str | None
    size: int | None
    crc32c: str | None = None


class CachedShard:
    """A shard in the cache, mapped into memory, held under its shared lock until :meth:`close`.
    ``file``: a descriptor of the same file (the one mapped), open for ``os.pread`` until then."""

    def __init__(self, path: Path, fd: int | None, buffer: mmap.mmap | bytes, file: int | None = None) -> None:
        self.path, self._fd, self.buffer, self.file = path, fd, buffer, file

    def __del__(self) -> None:
        self.close()

    def unmap(self) -> None:
        """Unmap and close the file but keep the lock (in use: never evicted) until :meth:`close`."""
        self._close_mapping()
        self.buffer = b""
        self._close_file()

    def _close_mapping(self) -> None:
        if isinstance(self.buffer, mmap.mmap):
            try:
                self.buffer.close()
            except BufferError:  # a slice or sample still references it: the mapping goes with that
                pass

    def _close_file(self) -> None:
        if self.file is not None:
            os.close(self.file)
            self.file = None

    def release(self) -> None:
        """Release the lock but leave the mapping to whoever still slices it: it is unmapped
        when the last reference goes (for readers that share one mapping across threads)."""
        self.buffer = b""
        self.close()

    def close(self) -> None:
        """Unmap and release the lock (eviction may take the shard from now on)."""
        self._close_mapping()
        self._close_file()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class FetchClaim:
    """A shard this process will download (:meth:`NodeCache.claim`): its two locks, released by
    :meth:`NodeCache.fetch` or :meth:`release`."""

    def __init__(self, source: ShardSource, fd: int, fetching: int) -> None:
        self.source = source
        self._fds: tuple[int, int] | None = (fd, fetching)
        self._lock = threading.Lock()

    def take(self) -> tuple[int, int]:
        """The two descriptors (shared lock, fetch lock), handed over once."""
        with self._lock:
            fds, self._fds = self._fds, None
        if fds is None:
            raise RuntimeError(f"the claim on {self.source.uri} was already spent")
        return fds

    def release(self) -> None:
        """Give the claim up without downloading (idempotent)."""
        with self._lock:
            fds, self._fds = self._fds, None
        if fds is not None:
            for fd in fds:
                os.close(fd)

    def __del__(self) -> None:
        self.release()


def map_file(path: Path) -> mmap.mmap | bytes:
    """A read-only mapping of ``path`` (empty files give ``b""``, which mmap refuses)."""
    with open(path, "rb") as handle:
        return map_fd(handle.fileno())


def map_fd(fd: int) -> mmap.mmap | bytes:
    """A read-only mapping of the open file ``fd`` (empty files give ``b""``); ``fd`` stays open."""
    if os.fstat(fd).st_size == 0:
        return b""
    mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        mapped.madvise(mmap.MADV_WILLNEED)
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        pass
    return mapped


class NodeCache:
    """Shards on local disk (see the module docstring). One per process; thread-safe."""

    def __init__(self, root: Path | str | None = None, limit: int | str | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_root()
        self.limit = parse_limit(limit)
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            check_root(self.root)
            self.folder = self.root / _DATASETS
            self.folder.mkdir(exist_ok=True, mode=0o700)
            check_root(self.folder)
        except OSError as err:
            raise local_error(err, f"use the cache directory {self.root}", _OWN_DIRECTORY) from err
        self._known: set[Path] = set()
        self._folders: dict[str, Path] = {}
        self._lock = threading.Lock()
        self.index = EntryIndex(self.folder)

    def paths(self, uri: str) -> tuple[Path, Path, Path]:
        """``(shard, record, lock)`` paths of the shard at ``uri``."""
        parent, _, name = uri.rstrip("/").rpartition("/")
        if not name or name in (".", "..") or name.endswith((META, LOCK, FETCH)) or _TMP in name:
            raise UsageError(f"cannot cache {uri!r}: not a usable file name")
        folder = self._folders.get(parent)
        if folder is None:
            folder = self._folders[parent] = self.folder / location_folder(parent + "/")
        if folder not in self._known:
            folder.mkdir(exist_ok=True, mode=0o700)
            record = folder / "dataset.json"
            if not record.exists():
                write_atomically(
                    record,
                    json.dumps({"uri": parent + "/"}) + "\n",
                    mode=0o600,
                    tmp=folder / f".dataset.json{_TMP}{os.getpid()}-{threading.get_ident()}",
                )
            with self._lock:
                self._known.add(folder)
        return folder / name, folder / (name + META), folder / (name + LOCK)

    def holds(self, uri: str) -> bool:
        """Whether the cache has a copy of ``uri`` (one stat, no lock: its version is checked
        when it is opened). Readers use it to skip prefetching what is already here."""
        return os.path.exists(self.paths(uri)[1])

    def find(self, uri: str, version: str | None, size: int | None) -> CachedShard | None:
        """The shard when the cache holds it at ``version`` (no download), else None."""
        path, record, lock = self.paths(uri)
        if not record.exists():
            return None
        fd = _hold(lock, fcntl.LOCK_SH)
        try:
            if _current(path, record, version, size):
                return self._opened(path, record, fd)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return None

    def open(self, source: ShardSource) -> CachedShard:
        """The shard, downloaded first unless the cache holds it at the recorded version."""
        path, record, lock = self.paths(source.uri)
        fd = _hold(lock, fcntl.LOCK_SH)  # in use from here on: never evicted under us

        def download_if_stale() -> None:
            if _current(path, record, source.version, source.size):
                return
            fetching = _hold(lock.with_name(path.name + FETCH), fcntl.LOCK_EX)
            try:
                if not _current(path, record, source.version, source.size):  # another may have
                    self._download(source, path, record)
            finally:
                os.close(fetching)

        return self._open_held(fd, path, record, download_if_stale)

    def claim(self, source: ShardSource) -> FetchClaim | None:
        """The right to download ``source`` (for a prefetch), taken without waiting: None when
        the cache holds it current, or another process or thread of the node is downloading it
        (its reader opens it when it needs it, waiting then). A claim holds the shard's lock
        shared (so eviction cannot take the file under the download) and its fetch lock."""
        path, record, lock = self.paths(source.uri)
        fd = _hold(lock, fcntl.LOCK_SH)
        fetching = _lock(lock.with_name(path.name + FETCH), fcntl.LOCK_EX, wait=False)
        if fetching is None or _current(path, record, source.version, source.size):
            if fetching is not None:
                os.close(fetching)
            os.close(fd)
            return None
        return FetchClaim(source, fd, fetching)

    def fetch(self, claim: FetchClaim) -> CachedShard:
        """Download a claimed shard and open it (see :meth:`claim`); the claim is spent either way."""
        path, record, _ = self.paths(claim.source.uri)
        fd, fetching = claim.take()

        def download() -> None:
            try:
                self._download(claim.source, path, record)
            finally:
                os.close(fetching)

        return self._open_held(fd, path, record, download)

    def _open_held(self, fd: int, path: Path, record: Path, prepare: Callable[[], None]) -> CachedShard:
        """Run ``prepare`` (a download, if needed) while holding the shard's shared lock ``fd``,
        then open the shard; ``fd`` is closed if either fails, else the shard owns it."""
        try:
            prepare()
            return self._opened(path, record, fd)
        except BaseException:
            os.close(fd)
            raise

    def _opened(self, path: Path, record: Path, fd: int) -> CachedShard:
        file = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            buffer = map_fd(file)
        except BaseException:
            os.close(file)
            raise
        try:
            os.utime(record)  # last use, for least-recently-used eviction
        except FileNotFoundError:  # evicted in the instant between the two locks: still mapped
            pass
        return CachedShard(path, fd, buffer, file)

    def _download(self, source: ShardSource, path: Path, record: Path) -> None:
        """Download under the shard's fetch lock: temporary, rename, then the record. Readers of
        an older copy keep their mapping of the replaced file."""
        for stale in path.parent.glob(f"{path.name}{_TMP}*"):
            stale.unlink(missing_ok=True)  # a download killed mid-way (we hold the fetch lock)
        store = source.store()
        version, size = source.version, source.size
        if version is None or size is None:
            info = store.stat(source.key)
            version, size = version or info.version, info.size if size is None else size
        self.make_room(size, keep=path)
        tmp = path.with_name(f"{path.name}{_TMP}{os.getpid()}-{threading.get_ident()}")
        started = time.monotonic()
        try:
            _download_shard(store, source.key, version, tmp, size, source.crc32c)
            got = os.path.getsize(tmp)
            if got != size:
                raise ObjectChanged(
                    f"{source.uri}: downloaded {got} bytes, the index says {size}",
                    "the shard was replaced after the index was written: re-pack the dataset",
                )
            record.unlink(missing_ok=True)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._recorded(record, path, source.uri, version, size)
        log.debug("cached %s (%d bytes) in %.2fs", source.uri, size, time.monotonic() - started)

    def _recorded(self, record: Path, path: Path, uri: str, version: str | None, size: int) -> None:
        """Write the record of a shard just put at ``path`` (what makes it current), and count it."""
        text = json.dumps({"uri": uri, "version": version, "size": size, "downloaded": time.time()})
        write_atomically(
            record,
            text + "\n",
            mode=0o600,
            tmp=record.with_name(f"{record.name}{_TMP}{os.getpid()}-{threading.get_ident()}"),
        )
        self.index.added(path, size)

    def adopt(self, uri: str, version: str | None, size: int, file: Path) -> bool:
        """Link ``file`` (a current copy of ``uri`` at ``version``, e.g. in a sync entry) into the
        cache as that shard, unless it is already there: stored once, no download. False when
        it could not be linked (another filesystem)."""
        path, record, lock = self.paths(uri)
        fd = _hold(lock.with_name(path.name + FETCH), fcntl.LOCK_EX)
        try:
            if _current(path, record, version, size):
                return True
            tmp = path.with_name(f"{path.name}{_TMP}{os.getpid()}-{threading.get_ident()}")
            tmp.unlink(missing_ok=True)
            try:
                os.link(file, tmp)
            except OSError:
                return False
            record.unlink(missing_ok=True)
            os.replace(tmp, path)
            self._recorded(record, path, uri, version, size)
            return True
        finally:
            os.close(fd)

    def make_room(self, incoming: int, keep: Path | None = None) -> None:
        """Evict least recently used shards not in use until ``incoming`` more bytes fit."""
        if self.limit is None:
            return
        sizes = self.index.current()
        total = sum(size for path, size in sizes.items() if path != keep)
        if total + incoming <= self.limit:
            return  # the common case: no record read, no file stat'ed
        entries = sorted(self.index.entries(sizes), key=lambda entry: entry.last_used)
        for entry in entries:
            if total + incoming <= self.limit:
                return
            if entry.path == keep:
                continue
            if remove_entry(entry):
                self.index.removed(entry.path)
                total -= entry.size
                log.debug("evicted %s (%d bytes) from the node cache", entry.path, entry.size)
        if total + incoming > self.limit:
            log.warning(
                "node cache %s: %d bytes in use by readers, over cache_limit %d; going over until they are done",
                self.root,
                total + incoming,
                self.limit,
            )


class EntryIndex:
    """The index of cached files, shared by the node's processes: ``datasets/.lading-entries``,
    one appended line per download (``+ PATH SIZE``) or removal (``- PATH``), read incrementally.
    Built once from the records when missing (a cache from before it, or after ``clear``).
    Rewritten as its live entries once it holds more than twice as many lines as files (plus
    :data:`COMPACT_SLACK`), so that a process started in a later epoch does not replay every
    download and removal since the cache began."""

    NAME = ".lading-entries"
    #: Lines beyond twice the live entries that the index may hold before it is compacted.
    COMPACT_SLACK = 1024

    def __init__(self, folder: Path) -> None:
        self.folder, self.file = folder, folder / self.NAME
        self._sizes: dict[Path, int] = {}
        self._offset = 0
        self._lines = 0  # complete lines read from the file as it is now (its inode)
        self._inode: int | None = None

    def _append(self, line: str) -> None:
        data = line.encode("utf-8", "surrogateescape")
        while True:
            fd = os.open(self.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if self._is_current(fd):  # not replaced by a compaction while we waited for the lock
                    os.write(fd, data)
                    return
            finally:
                os.close(fd)

    def _is_current(self, fd: int) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(self.file).st_ino
        except FileNotFoundError:
            return True  # cleared meanwhile: the line goes to the unlinked file, the rebuild reads records

    def added(self, path: Path, size: int) -> None:
        """Record a file the cache now holds."""
        if self.file.exists():
            self._append(f"+ {path.relative_to(self.folder)}\t{size}\n")
        else:
            self.current()  # builds it from the records, this file included

    def removed(self, path: Path) -> None:
        """Record a file the cache removed."""
        if self.file.exists():
            self._append(f"- {path.relative_to(self.folder)}\n")

    def _rebuild(self) -> None:
        fd = os.open(self.folder / f"{self.NAME}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self.file.exists():
                return
            lines = "".join(f"+ {e.path.relative_to(self.folder)}\t{e.size}\n" for e in iter_entries(self.folder))
            write_atomically(self.file, lines, mode=0o600, tmp=self._temporary())
        finally:
            os.close(fd)

    def _temporary(self) -> Path:
        return self.folder / f"{self.NAME}{_TMP}{os.getpid()}-{threading.get_ident()}"

    def current(self) -> dict[Path, int]:
        """Cached files and their sizes, from the lines appended since the last call."""
        if not self.file.exists():
            self._rebuild()
        try:
            with open(self.file, "rb") as handle:
                self._read_new(handle)
                if self._lines > 2 * len(self._sizes) + self.COMPACT_SLACK:
                    self._compact(handle)
        except FileNotFoundError:
            pass
        return dict(self._sizes)

    def _read_new(self, handle: IO[bytes]) -> None:
        inode = os.fstat(handle.fileno()).st_ino
        if inode != self._inode:  # rebuilt or compacted: read it again from the start
            self._sizes, self._offset, self._lines, self._inode = {}, 0, 0, inode
        handle.seek(self._offset)
        data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode("utf-8", "surrogateescape").splitlines():
            self._lines += 1
            op, _, rest = line.partition(" ")
            name, _, size = rest.rpartition("\t") if op == "+" else (rest, "", "")
            if op == "+" and size.isdigit():
                self._sizes[self.folder / name] = int(size)
            elif op == "-":
                self._sizes.pop(self.folder / rest, None)

    def _compact(self, handle: IO[bytes]) -> None:
        """Replace the file by its live entries, holding the appenders' lock on it (an appender
        that opened it before the rename finds it replaced and appends to the new one)."""
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            if not self._is_current(handle.fileno()):
                return  # another process compacted or cleared it first
            self._read_new(handle)  # lines appended since, under the lock
            lines = "".join(f"+ {path.relative_to(self.folder)}\t{size}\n" for path, size in self._sizes.items())
            write_atomically(self.file, lines, mode=0o600, tmp=self._temporary())
            self._inode = os.stat(self.file).st_ino
            self._offset = len(lines.encode("utf-8", "surrogateescape"))
            self._lines = len(self._sizes)
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def entries(self, sizes: dict[Path, int]) -> Iterator[Entry]:
        """The indexed files as entries, last use from their records' mtimes (a stat each)."""
        for path, size in sizes.items():
            try:
                last_used = os.stat(path.with_name(path.name + META)).st_mtime
            except FileNotFoundError:
                continue  # removed by ``lading cache clear`` (which resets the index)
            yield Entry(path, "", size, last_used, last_used)


def _current(path: Path, record: Path, version: str | None, size: int | None) -> bool:
    """Whether the cached shard is the one wanted: the record's version and size, and the file's size."""
    try:
        with open(record, "rb") as handle:  # not Path.read_text: this runs once per shard opened
            meta = json.loads(handle.read())
        actual = os.stat(path).st_size
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict) or meta.get("size") != actual:
        return False
    return (version is None or meta.get("version") == version) and (size is None or size == actual)


@dataclass(frozen=True)
class Entry:
    """One cached shard, from its record."""

    path: Path
    uri: str
    size: int
    last_used: float
    downloaded: float


def iter_entries(folder: Path) -> Iterator[Entry]:
    """Every cached shard (those with a record) under the ``datasets`` folder."""
    try:
        locations = list(os.scandir(folder))
    except FileNotFoundError:
        return
    for location in locations:
        if not location.is_dir(follow_symlinks=False):
            continue
        try:
            names = os.listdir(location.path)
        except OSError:
            continue
        for name in names:
            if not name.endswith(META) or _TMP in name:
                continue
            record = Path(location.path) / name
            try:
                meta = json.loads(record.read_text())
                last_used = record.stat().st_mtime
                size = int(meta["size"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            yield Entry(
                record.with_name(name[: -len(META)]),
                str(meta.get("uri", "")),
                size,
                last_used,
                float(meta.get("downloaded", last_used)),
            )


def remove_entry(entry: Entry) -> bool:
    """Remove a cached shard if no process holds it (never waits); False when in use."""
    lock = entry.path.with_name(entry.path.name + LOCK)
    fd = _lock(lock, fcntl.LOCK_EX, wait=False)
    if fd is None:
        return False
    try:
        record = entry.path.with_name(entry.path.name + META)
        if not record.exists():
            return False  # someone else removed it first
        record.unlink()
        entry.path.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)
        entry.path.with_name(entry.path.name + FETCH).unlink(missing_ok=True)
    finally:
        os.close(fd)
    return True


@dataclass
class CachedDataset:
    """A folder of the cache: where its files (shards, offsets file) come from, how many, how
    large, when last used."""

    folder: Path
    uri: str
    files: int = 0
    bytes: int = 0
    last_used: float = 0.0
    downloaded: float = 0.0
    kind: str = "datasets"

    def as_json(self) -> dict[str, object]:
        """For ``lading cache --json``."""
        return {
            "folder": str(self.folder),
            "uri": self.uri,
            "files": self.files,
            "bytes": self.bytes,
            "last_used": self.last_used,
            "downloaded": self.downloaded,
            "kind": self.kind,
        }


def open_root(root: Path | str | None) -> Path:
    """The cache root to inspect (checked like a dataset would check it), or NotFound-like empty."""
    path = Path(root).expanduser() if root is not None else default_cache_root()
    try:
        check_root(path)
    except NotFound:
        pass  # nothing cached yet
    return path


def summarize(root: Path | str | None = None) -> list[CachedDataset]:
    """What the node cache holds, most recently used first: the datasets' shard folders, then
    ``lading sync``'s entries (``kind="sync"``; files linked into a shard folder are counted there,
    once)."""
    top = open_root(root)
    folder = top / _DATASETS
    found: dict[Path, CachedDataset] = {}
    inodes: set[tuple[int, int]] = set()
    for entry in iter_entries(folder):
        try:
            st = os.stat(entry.path)
            inodes.add((st.st_dev, st.st_ino))
        except FileNotFoundError:
            pass
        location = entry.path.parent
        dataset = found.get(location)
        if dataset is None:
            dataset = found[location] = CachedDataset(location, _location_uri(location))
        dataset.files += 1
        dataset.bytes += entry.size
        dataset.last_used = max(dataset.last_used, entry.last_used)
        dataset.downloaded = max(dataset.downloaded, entry.downloaded)
    rows = sorted(found.values(), key=lambda dataset: -dataset.last_used)
    return rows + sorted(_sync_entries(top, inodes), key=lambda dataset: -dataset.last_used)


def _sync_entries(top: Path, counted: set[tuple[int, int]]) -> Iterator[CachedDataset]:
    """``lading sync``'s entries under the root (folders with a sync state), bytes not counted yet."""
    from lading.sync.state import SyncState

    try:
        folders = [path for path in top.iterdir() if path.is_dir() and path.name != _DATASETS and not path.is_symlink()]
    except FileNotFoundError:
        return
    for path in folders:
        state = SyncState.load(path)
        row = CachedDataset(path, state.source, kind="sync")
        tracked = 0
        for key in (entry.key for entry in state.rows()):
            tracked += 1
            try:
                st = os.stat(path / key)
            except OSError:
                continue
            row.files += 1
            if (st.st_dev, st.st_ino) not in counted:
                counted.add((st.st_dev, st.st_ino))
                row.bytes += st.st_size
            row.last_used = max(row.last_used, st.st_mtime)
            row.downloaded = row.last_used
        if tracked:
            yield row


def _location_uri(location: Path) -> str:
    try:
        return str(json.loads((location / "dataset.json").read_text())["uri"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


@dataclass
class Cleared:
    """What ``clear`` did: files and bytes removed, files skipped because a process reads them,
    and how many cached files ``dataset`` matched at all (at any age: none means a typo)."""

    files: int = 0
    bytes: int = 0
    busy: int = 0
    matched: int = 0


def clear(
    root: Path | str | None = None,
    dataset: str | None = None,
    older_than: float | None = None,
    now: Callable[[], float] = time.time,
) -> Cleared:
    """Remove cached shards: all, or those of ``dataset`` (a URI prefix or folder name), or those
    not used for ``older_than`` seconds. Shards in use are skipped; other files stay."""
    folder = open_root(root) / _DATASETS
    result = Cleared()
    for entry in list(iter_entries(folder)):
        if dataset is not None and not _matches(entry, dataset):
            continue
        result.matched += 1
        if older_than is not None and now() - entry.last_used < older_than:
            continue
        if remove_entry(entry):
            result.files += 1
            result.bytes += entry.size
        else:
            result.busy += 1
    for location in folder.iterdir() if folder.is_dir() else ():
        if location.is_dir():
            _remove_if_empty(location)
    (folder / EntryIndex.NAME).unlink(missing_ok=True)  # rebuilt from the records on next use
    return result


def _matches(entry: Entry, dataset: str) -> bool:
    location = entry.path.parent
    uri = _location_uri(location)
    wanted = dataset.rstrip("/")
    return location.name == dataset or entry.uri.startswith(wanted + "/") or uri.rstrip("/") == wanted


def _remove_if_empty(location: Path) -> None:
    """Remove a dataset folder holding nothing but its ``dataset.json``."""
    try:
        names = set(os.listdir(location))
    except OSError:
        return
    if names <= {"dataset.json"}:
        try:
            (location / "dataset.json").unlink(missing_ok=True)
            location.rmdir()
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                raise ProblemFound(f"cannot remove {location}: {err.strerror}") from err


__all__ = [
    "CachedDataset",
    "CachedShard",
    "Cleared",
    "NodeCache",
    "ShardSource",
    "clear",
    "default_cache_root",
    "map_file",
    "parse_limit",
    "summarize",
]
