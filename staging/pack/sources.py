"""Where packed files come from: a local directory (opened directly, copied by the kernel) or
any Store (objects fetched ahead by a small thread pool, in plan order, bounded in memory)."""

from __future__ import annotations

import os
import stat
import tempfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Protocol, cast

from lading.core.errors import AccessDenied, NotFound, ObjectChanged, TransientError, UsageError
from lading.core.names import is_sync_bookkeeping
from lading.pack.grouping import Member
from lading.pack.writer import SMALL_FILE, ShardWriter
from lading.stores.base import Store


class MemberSource(Protocol):
    """Feeds members, in the order given, into shard writers."""

    def write_members(self, members: Iterable[Member], writer: ShardWriter) -> None:
        """Append each member's file to ``writer``."""
        ...

    def close(self) -> None:
        """Release threads and temporary files."""
        ...


class LocalSource:
    """Files under a local directory, opened by their keys (already checked by group_samples).
    Members' infos are LocalFile entries from :func:`list_local`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._prefix = str(root).rstrip("/") + "/"

    def write_members(self, members: Iterable[Member], writer: ShardWriter) -> None:
        """Copy each file into the shard, refusing one that changed since it was listed.

        Runs of files in one directory are opened relative to that directory (the kernel looks
        up one name instead of the whole path); a lone file is opened by its full path."""
        prefix = self._prefix
        open_, fstat, close, add = os.open, os.fstat, os.close, writer.add_file
        folder: str | None = None  # the previous file's directory
        folder_fd: int | None = None  # open once a second file in a row is in it
        try:
            for member in members:
                info = cast(LocalFile, member.info)
                key = info.key
                parent, _, name = key.rpartition("/")
                try:
                    if parent != folder:
                        if folder_fd is not None:
                            close(folder_fd)
                            folder_fd = None
                        folder = parent
                        fd = open_(prefix + key, os.O_RDONLY)
                    else:
                        if folder_fd is None:
                            folder_fd = open_(prefix + parent, os.O_RDONLY | os.O_DIRECTORY)
                        fd = open_(name, os.O_RDONLY, dir_fd=folder_fd)
                except OSError as err:
                    raise _source_error(err, prefix + key) from err
                try:
                    st = fstat(fd)
                    if st.st_size != info.size or st.st_mtime_ns != info.mtime_ns:
                        raise ObjectChanged(f"{prefix + key} changed since it was listed", "run lading pack again")
                    add(key, fd, info.size, prefix + key)
                finally:
                    close(fd)
        finally:
            if folder_fd is not None:
                close(folder_fd)

    def close(self) -> None:
        """Nothing to release."""


def _source_error(err: OSError, path: str) -> Exception:
    if isinstance(err, FileNotFoundError):
        return ObjectChanged(f"{path} disappeared since it was listed", "run lading pack again")
    if isinstance(err, PermissionError):
        return AccessDenied(f"permission denied: {path}")
    return TransientError(f"I/O error reading {path}: {err.strerror or err}")


class StoreSource:
    """Objects of a Store, fetched ``workers`` at a time ahead of the writer.

    Small objects come back as bytes (at most ``window`` bytes held at once); objects larger
    than SMALL_FILE are downloaded to a temporary file first. Each read is pinned to the
    listed version, so an object replaced mid-pack fails with ObjectChanged.
    """

    def __init__(self, store: Store, workers: int = 16, window: int = 128 << 20) -> None:
        self.store = store
        self.window = window
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lading-pack-read")
        self._workers = workers
        self._tmp = tempfile.TemporaryDirectory(prefix="lading-pack-")

    def _fetch(self, member: Member) -> bytes | Path:
        info = member.info
        if info.size > SMALL_FILE:
            dest = Path(self._tmp.name) / f"{abs(hash(info.key))}.part"
            self.store.download(info.key, dest, info.version)  # stores retry transient errors
            return dest
        if info.size == 0:
            return b""
        return self.store.read_range(info.key, 0, info.size, info.version)

    def _prefetched(self, members: Iterable[Member]) -> Iterator[tuple[Member, Future]]:
        pending: deque[tuple[Member, Future]] = deque()
        in_flight = 0
        for member in members:
            while pending and (len(pending) >= 4 * self._workers or in_flight + member.info.size > self.window):
                done = pending.popleft()
                in_flight -= min(done[0].info.size, SMALL_FILE)
                yield done
            pending.append((member, self._pool.submit(self._fetch, member)))
            in_flight += min(member.info.size, SMALL_FILE)
        yield from pending

    def write_members(self, members: Iterable[Member], writer: ShardWriter) -> None:
        """Append each object, in order, as soon as its fetch completes."""
        for member, future in self._prefetched(members):
            payload = future.result()
            if isinstance(payload, bytes):
                if len(payload) != member.info.size:
                    raise ObjectChanged(
                        f"{self.store.url}/{member.info.key} has {len(payload)} bytes, "
                        f"not the {member.info.size} listed"
                    )
                writer.add_bytes(member.info.key, payload)
                continue
            try:
                with open(payload, "rb") as handle:
                    writer.add_file(
                        member.info.key, handle.fileno(), member.info.size, f"{self.store.url}/{member.info.key}"
                    )
            finally:
                payload.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop fetching and remove temporary files."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._tmp.cleanup()


class LocalFile(NamedTuple):
    """A listed local file with ObjectInfo's fields, built about five times faster (one per
    file): the version string is made only when asked for; LocalSource compares the numbers."""

    key: str
    size: int
    mtime_ns: int

    @property
    def version(self) -> str:
        """The version LocalStore would list: ``MTIME_NS-SIZE``."""
        return f"{self.mtime_ns}-{self.size}"

    @property
    def mtime(self) -> float:
        """Modification time in seconds."""
        return self.mtime_ns / 1e9

    @property
    def md5(self) -> None:
        """Not known without reading the file."""
        return None

    @property
    def crc32c(self) -> None:
        """Not known without reading the file."""
        return None


def list_local(root: Path) -> list[LocalFile]:
    """Every regular file under ``root`` as LocalStore would list it (same keys and versions),
    with one stat per file: symlinks to files count, directory symlinks are not followed.
    The order is unspecified. (Listing on threads was measured slower: the GIL, not the stats,
    is the limit.)"""
    if not root.is_dir():
        if root.exists():
            raise UsageError(f"SOURCE {root} is a file", "SOURCE is a directory or a bucket prefix")
        raise NotFound(f"no such directory: {root}")
    files = _walk((str(root), ""))
    # a directory lading sync filled holds its state files at the top: they are not data
    return [file for file in files if not is_sync_bookkeeping(file.key)]


def _walk(start: tuple[str, str]) -> list:
    found: list = []
    pending = [start]
    while pending:
        files, subdirectories = _scan(*pending.pop())
        found += files
        pending += subdirectories
    return found


def _scan(directory: str, rel: str) -> tuple[list, list[tuple[str, str]]]:
    """The regular files directly in ``directory`` and its subdirectories (not symlinks to them)."""
    try:
        entries = list(os.scandir(directory))
        names = [entry.name for entry in entries if entry.is_file(follow_symlinks=False)]
        files = _plain_files(directory, rel, names) if names else []
    except OSError as err:
        raise _source_error(err, directory) from err
    if files is None:  # one of them changed since the directory was read: go entry by entry
        files, others = [], entries
    elif len(names) == len(entries):
        return files, []
    else:
        others = [entry for entry in entries if not entry.is_file(follow_symlinks=False)]
    subdirectories = []
    for entry in others:
        if entry.is_dir(follow_symlinks=False):
            subdirectories.append((entry.path, f"{rel}{entry.name}/"))
            continue
        try:
            st = entry.stat()
        except OSError:
            continue  # a broken symlink
        if stat.S_ISREG(st.st_mode):
            files.append(LocalFile(rel + entry.name, st.st_size, st.st_mtime_ns))
    return files, subdirectories


_STAT_CHUNK = 4096  # stat results are big: hold a few thousand at a time


def _plain_files(directory: str, rel: str, names: list[str]) -> list[LocalFile] | None:
    """LocalFile entries for ``names``, regular files in ``directory``, stat'ed relative to the open
    directory (the kernel looks up one name, not the whole path, which cut the listing's system
    time by 40%); None when one of them is gone or no longer a regular file."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    files: list[LocalFile] = []
    new_file = tuple.__new__  # LocalFile(...) without the generated __new__'s Python frame
    is_regular, stat_at = stat.S_ISREG, os.stat
    try:
        for start in range(0, len(names), _STAT_CHUNK):
            chunk = names[start : start + _STAT_CHUNK]
            infos = [stat_at(name, dir_fd=fd) for name in chunk]
            if not all(map(is_regular, [info.st_mode for info in infos])):
                return None
            files += [
                new_file(LocalFile, (rel + name, info.st_size, info.st_mtime_ns)) for name, info in zip(chunk, infos)
            ]
    except OSError:  # removed or replaced meanwhile: the caller looks at each entry again
        return None
    finally:
        os.close(fd)
    return files
