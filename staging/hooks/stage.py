"""Stage a planned set of objects into a destination, once per node.

Every container of a trial on one host runs the startup hook at the same moment. They share
the work through two files next to the destination (never inside it, so data loaders that
list the directory don't see them):

- ``.{name}.lading-lock``: an exclusive ``fcntl.flock``. The first container downloads; the
  others wait on the lock (no timeout: the holder either finishes or dies, which frees it).
- ``.{name}.lading-staged.json``: the completion marker. One record per object verified on
  disk: key, size, the source version (S3 ETag, GCS generation) and the local file's size and
  mtime. A later run lists the source, compares, and fetches only what changed; when nothing
  did it makes no object request and writes nothing.

Files are written by :func:`staging.transfer.fetch_all` (temporary name, verified, renamed).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol

from staging.errors import ProblemFound
from staging.stores.base import ObjectInfo, Store
from staging.transfer import NoEvents, TransferItem, TransferOptions, TransferResult, fetch_all

MARKER_FORMAT = 1


@dataclass(frozen=True)
class StagePlan:
    """What to stage: ``items`` land under ``root``; ``anchor`` names the marker and the lock."""

    source: str
    root: Path
    anchor: Path
    items: tuple[TransferItem, ...]

    @property
    def marker_path(self) -> Path:
        """The completion marker, a hidden sibling of ``anchor``."""
        return self.anchor.parent / f".{self.anchor.name}.lading-staged.json"

    @property
    def lock_path(self) -> Path:
        """The per-node lock file, a hidden sibling of ``anchor``."""
        return self.anchor.parent / f".{self.anchor.name}.lading-lock"

    @property
    def total_bytes(self) -> int:
        """Bytes in the source listing."""
        return sum(item.info.size for item in self.items)


@dataclass
class StageResult:
    """What one staging run did."""

    source: str
    dest: Path
    objects: int
    fetched: int = 0
    fetched_bytes: int = 0
    unchanged: int = 0
    removed: int = 0
    waited: bool = False
    failed: list[TransferResult] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        """The summary as JSON-ready data."""
        return {
            "source": self.source, "dest": str(self.dest), "objects": self.objects,
            "fetched": self.fetched, "fetched_bytes": self.fetched_bytes,
            "unchanged": self.unchanged, "removed": self.removed, "waited": self.waited,
            "failed": [{"key": r.key, "error": r.error.message if r.error else "failed"} for r in self.failed],
        }


class StageEvents(Protocol):
    """Progress callbacks (the transfer callbacks plus two staging moments)."""

    def on_wait(self, lock_path: Path) -> None:
        """Another process on this node holds the lock; we block until it is done."""
        ...

    def on_start(self, files: int, nbytes: int) -> None:
        """About to fetch ``files`` objects, ``nbytes`` in total."""
        ...

    def on_bytes(self, nbytes: int) -> None:
        """Some bytes arrived."""
        ...

    def on_done(self, result: TransferResult) -> None:
        """One object finished."""
        ...


class QuietStageEvents(NoEvents):
    """StageEvents that ignore everything."""

    def on_wait(self, lock_path: Path) -> None:
        """Ignore."""

    def on_start(self, files: int, nbytes: int) -> None:
        """Ignore."""


@contextlib.contextmanager
def node_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[bool]:
    """Hold an exclusive flock on ``path``; yields whether we had to wait for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        waited = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield waited
    finally:
        os.close(fd)  # closing releases the lock


def _read_marker(path: Path, source: str) -> dict[str, list]:
    """key -> [size, version, local_size, local_mtime_ns]; empty when absent, corrupt or for another source."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != MARKER_FORMAT or data.get("source") != source:
        return {}
    entries = data.get("objects")
    return {row[0]: row[1:] for row in entries if isinstance(row, list) and len(row) == 5} if isinstance(entries, list) else {}


def _write_marker(path: Path, source: str, records: dict[str, list]) -> None:
    """Write the marker atomically (temporary file, fsync, rename)."""
    body = {"format": MARKER_FORMAT, "source": source,
            "objects": [[key, *records[key]] for key in sorted(records)]}
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as handle:
        json.dump(body, handle, separators=(",", ":"))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _local_state(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def _is_current(item: TransferItem, record: list | None) -> bool:
    """Whether the marker says this exact object version is on disk, and the file agrees."""
    if record is None or record[0] != item.info.size or record[1] != item.info.version:
        return False
    return _local_state(item.dest) == (record[2], record[3])


def _record(info: ObjectInfo, dest: Path) -> list | None:
    local = _local_state(dest)
    return None if local is None else [info.size, info.version, local[0], local[1]]


def _remove_stale(plan: StagePlan, old: dict[str, list], keep: set[str]) -> int:
    """Delete files a previous run staged whose object left the source, if untouched since."""
    removed = 0
    for key, record in old.items():
        if key in keep:
            continue
        path = plan.root.joinpath(*key.split("/"))
        if _local_state(path) == (record[2], record[3]):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def stage(
    store: Store,
    plan: StagePlan,
    options: TransferOptions = TransferOptions(),
    events: StageEvents = QuietStageEvents(),
) -> StageResult:
    """Bring ``plan.root`` up to date with the source listing, once per node (see module doc)."""
    result = StageResult(plan.source, plan.root, len(plan.items))
    with node_lock(plan.lock_path, lambda: events.on_wait(plan.lock_path)) as waited:
        result.waited = waited
        old = _read_marker(plan.marker_path, plan.source)
        todo = [item for item in plan.items if not _is_current(item, old.get(item.info.key))]
        keys = {item.info.key for item in plan.items}
        records = {key: old[key] for key in keys if key in old}
        result.unchanged = len(plan.items) - len(todo)
        stale = set(old) - keys
        if not todo and not stale:
            return result  # nothing changed: no request beyond the listing, no write
        result.removed = _remove_stale(plan, old, keys)
        for key in stale:
            records.pop(key, None)
        for item in todo:
            records.pop(item.info.key, None)
            item.dest.parent.mkdir(parents=True, exist_ok=True)
        events.on_start(len(todo), sum(item.info.size for item in todo))
        for outcome in fetch_all(store, todo, options, events) if todo else []:
            if outcome.ok:
                result.fetched += 1
                result.fetched_bytes += outcome.nbytes
            else:
                result.failed.append(outcome)
        by_key = {item.info.key: item for item in todo}
        failed = {outcome.key for outcome in result.failed}
        for key, item in by_key.items():
            if key not in failed and (record := _record(item.info, item.dest)) is not None:
                records[key] = record
        _write_marker(plan.marker_path, plan.source, records)
    return result


def raise_for_failures(result: StageResult) -> None:
    """Turn failed objects into one ProblemFound naming them (the underlying error when single)."""
    if not result.failed:
        return
    first = result.failed[0]
    if len(result.failed) == 1 and first.error is not None:
        raise first.error
    names = ", ".join(r.key for r in result.failed[:5]) + (" ..." if len(result.failed) > 5 else "")
    detail = f": {first.error.message}" if first.error is not None else ""
    raise ProblemFound(f"{len(result.failed)} of {result.objects} objects from {result.source} "
                       f"failed ({names}){detail}", "rerun: what already arrived is kept and skipped")


def view_root(root: Path, index: int) -> Path:
    """The per-slot view of ``root``: ``{root}-rank{index}``."""
    return root.with_name(f"{root.name}-rank{index}")


def build_views(plan: StagePlan, views: dict[int, list[TransferItem]]) -> int:
    """Hard-link each view's items under ``{root}-rank{i}`` (copy across filesystems).

    ``views`` maps a slot index to the items it sees (all of them, or its shard). Links that
    already point at the staged file are left alone; nothing else in the view is touched.
    Returns the number of links (or copies) made.
    """
    made = 0
    for index, items in views.items():
        target_root = view_root(plan.root, index)
        for item in items:
            rel = item.dest.relative_to(plan.root) if item.dest != plan.root else None
            target = target_root.joinpath(rel) if rel is not None else target_root
            if _same_file(item.dest, target):
                continue
            _link_atomically(item.dest, target)
            made += 1
    return made


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _link_atomically(src: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.lading-link-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(src, tmp)
    os.replace(tmp, target)
