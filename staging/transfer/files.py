"""On-disk conventions of the transfer engine: temporary names, the resume sidecar, publishing.

A download of ``dir/name`` is written to ``dir/.name.lading-part`` (shortened with a hash when that
would exceed NAME_MAX: :func:`lading.core.names.hidden_sibling`) and renamed over
``dir/name`` only once complete and verified. A large (ranged) download also keeps
``dir/.name.lading-part.json``, listing the parts already on disk and the object version
they belong to, so an interrupted run resumes instead of starting over.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from lading.core.atomic import write_atomically
from lading.core.errors import LadingError, local_error
from lading.core.names import hidden_sibling

PART_SUFFIX = ".lading-part"
SIDECAR_SUFFIX = ".lading-part.json"


def temporary_path(dest: Path) -> Path:
    """Where ``dest`` is written before it is complete (a name within NAME_MAX, however long ``dest``'s)."""
    return dest.with_name(hidden_sibling(dest.name, PART_SUFFIX))  # no parse of the whole path


def temporary_name(dest: str | Path) -> str:
    """:func:`temporary_path` as a string: no ``Path`` made and formatted per object (pathlib
    costs tens of us per object on the loop thread)."""
    head, name = os.path.split(dest)
    return os.path.join(head, hidden_sibling(name, PART_SUFFIX))


def sidecar_path(dest: Path) -> Path:
    """The resume record of a ranged download of ``dest`` (room left for its ``.tmp``)."""
    return dest.with_name(hidden_sibling(dest.name, SIDECAR_SUFFIX, reserve=len(".tmp")))


def temporaries_of(dest: Path) -> tuple[Path, ...]:
    """Every temporary the engine may leave for ``dest`` (part, sidecar, the sidecar's temporary)."""
    sidecar = sidecar_path(dest)
    return temporary_path(dest), sidecar, sidecar.with_name(sidecar.name + ".tmp")


def is_temporary(name: str) -> bool:
    """Whether a file name is one of the engine's temporaries (for cleaning and ``--delete``)."""
    return name.startswith(".") and name.endswith((PART_SUFFIX, SIDECAR_SUFFIX, SIDECAR_SUFFIX + ".tmp"))


def remove_temporaries(dest: Path) -> None:
    """Remove the temporary and sidecar of ``dest``, if any (best effort: never raises)."""
    for path in temporaries_of(dest):
        try:
            path.unlink()
        except OSError:
            pass


def write_file(path: str | Path, data: memoryview) -> os.stat_result:
    """Create (or truncate) ``path`` holding ``data``; return its ``fstat`` once written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = data
        while view:
            view = view[os.write(fd, view) :]
        return os.fstat(fd)
    finally:
        os.close(fd)


def publish(tmp: str | Path, dest: Path, fd: int | None = None, durable: bool = False) -> None:
    """Rename a complete, verified temporary into place (fsync'ing first when ``durable``)."""
    if durable:
        if fd is None:
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        else:
            os.fsync(fd)
    os.replace(tmp, dest)
    if durable:
        _fsync_directory(dest.parent)


def create_empty(dest: Path, durable: bool = False) -> os.stat_result | None:
    """Create ``dest`` as an empty file when no file is there, and return its ``fstat``; None
    when something is (the caller writes a temporary and renames it over). An empty file is
    complete the moment it appears: no temporary and no rename are needed to publish it
    atomically, and a file system creates one name instead of two."""
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except FileExistsError:
        return None
    try:
        if durable:
            os.fsync(fd)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if durable:
        _fsync_directory(dest.parent)
    return st


def _fsync_directory(path: Path) -> None:
    """Make a rename or a new name in ``path`` survive a power loss."""
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def as_lading_error(error: BaseException, dest: Path) -> LadingError:
    """Local I/O errors become one-line project errors; store errors pass through."""
    if isinstance(error, LadingError):
        return error
    if isinstance(error, OSError):
        return local_error(error, f"write {error.filename or dest}")  # exit 4, 6, ...
    return LadingError(f"{dest}: {error}")


class DirectoryMaker:
    """``mkdir -p`` that remembers what it already created (one syscall per directory)."""

    def __init__(self) -> None:
        self._made: set[str] = set()  # by name: hashing a str is cheap, a Path's hash parses it again
        self._lock = threading.Lock()

    def ensure_parent(self, path: Path) -> None:
        """Create the directory holding ``path``, and its parents, if needed. A bare name
        (``data.csv``) lies in the working directory, which exists: ``makedirs('')`` would fail."""
        directory = os.path.dirname(path)
        if directory in self._made:
            return
        if directory:
            os.makedirs(directory, exist_ok=True)
        with self._lock:
            self._made.add(directory)


class ResumeRecord:
    """Which parts of a ranged download are on disk, for which object version.

    On disk: one JSON line (key, version, size, part size, the parts done when it was written),
    then one line per part that landed since (:meth:`add`: an append, no rename per part), so a
    kill -9 loses at most the line being written. A plain class: a dataclass costs about 1 ms of
    start-up to create, and none is compared, hashed or copied (:meth:`matches` compares)."""

    __slots__ = ("key", "version", "size", "part_size", "done")

    def __init__(self, key: str, version: str, size: int, part_size: int, done: set[int] | None = None) -> None:
        self.key, self.version, self.size, self.part_size = key, version, size, part_size
        self.done: set[int] = set() if done is None else done

    def matches(self, key: str, version: str, size: int, part_size: int) -> bool:
        """Whether the parts on disk belong to this very object and layout."""
        return (self.key, self.version, self.size, self.part_size) == (key, version, size, part_size)

    def save(self, path: Path) -> None:
        """Write atomically (temporary name, then rename)."""
        payload = {
            "key": self.key,
            "version": self.version,
            "size": self.size,
            "part_size": self.part_size,
            "done": sorted(self.done),
        }
        write_atomically(path, json.dumps(payload) + "\n", tmp=path.with_name(path.name + ".tmp"))

    def add(self, path: Path, index: int) -> None:
        """Part ``index`` landed: remember it, and append it to the record at ``path``."""
        self.done.add(index)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, f"{index}\n".encode())
        finally:
            os.close(fd)

    @classmethod
    def load(cls, path: Path) -> ResumeRecord | None:
        """The record at ``path``, or None when missing or unreadable (a torn last line is ignored)."""
        try:
            head, _, rest = path.read_text().partition("\n")
            data = json.loads(head)
            record = cls(
                str(data["key"]),
                str(data["version"]),
                int(data["size"]),
                int(data["part_size"]),
                {int(i) for i in data["done"]},
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        for line in rest.split("\n")[:-1]:  # only whole lines: the last piece has no newline yet
            if line.isdigit():
                record.done.add(int(line))
        return record
