"""Stage a dataset on this node, once: a prefix through ``lading sync``'s engine, one object here.

Every container of a trial on one host runs the startup hook at the same moment. They share
the work through a lock and a completion marker:

- a prefix is synced with :func:`lading.sync.into.sync_into`: DEST's lock, the state record in
  DEST as the marker, and removal of files lading put there that have left the source;
- one object (``lading fetch s3://b/data.csv /tmp/d/``) keeps one hidden file beside it, its
  marker ``.{name}.lading-staged.json``, and locks the directory itself (no lock file). A file
  already there without a marker is the user's: it is never replaced unless asked (``force``).

Either way the marker holds each object's source version (S3 ETag, GCS generation) and the
local file's size and mtime: a later run lists (or stats) the source, compares, and when
nothing changed it downloads nothing and writes nothing. Waiting processes block on the lock
with no timeout (the kernel frees it if the holder dies). Files are written by the transfer
engine (temporary name, verified, renamed).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat as stat_mode
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping, Protocol

from lading.core.atomic import write_atomically
from lading.core.errors import (
    NotFound,
    UsageError,
    error_for_exit_code,
    exit_code_for_failures,
    local_error,
)
from lading.core.keys import safe_join
from lading.core.locks import directory_lock
from lading.core.names import hidden_sibling
from lading.selection.runs import SortedRuns
from lading.stores.base import ObjectInfo, Store
from lading.sync.apply import FailedKey, common_hint, store_fetcher, unlink_key
from lading.sync.into import make_directory, sync_into
from lading.sync.plan import Selection, SyncPlan, SyncRequest, select_objects
from lading.transfer import TransferItem, TransferOptions, TransferResult, fetch_all

MARKER_FORMAT = 1
MARKER_SUFFIX = ".lading-staged.json"


@dataclass
class StageResult:
    """What one staging run did, and the keys it staged (for the views), streamed: a prefix's come
    from its selection on disk in key order (:meth:`keys`, as often as needed until :meth:`close`),
    never as one list in memory."""

    source: str
    dest: Path
    objects: int
    fetched: int = 0
    fetched_bytes: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: list[FailedKey] = field(default_factory=list)
    seconds: float = 0.0
    selection: Selection | None = None  # a prefix: its objects, in key order
    target: ObjectInfo | None = None  # one object, staged at ``dest``

    def keys(self) -> Iterator[str]:
        """The staged keys, in ascending order (a fresh iterator on each call)."""
        if self.selection is not None:
            return (info.key for info in self.selection.objects())
        return iter([self.target.key] if self.target is not None else [])

    def path_of(self, key: str) -> Path:
        """Where ``key`` was staged."""
        return self.dest if self.selection is None else safe_join(self.dest, key)

    def close(self) -> None:
        """Remove the selection's rows on disk (the result keeps its counts)."""
        if self.selection is not None:
            self.selection.close()

    def __enter__(self) -> "StageResult":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def to_json(self) -> dict[str, object]:
        """The summary with ``lading sync --json``'s field names (plus ``objects``, the source's count)."""
        rate = self.fetched_bytes / self.seconds if self.seconds > 0 else 0.0
        return {
            "source": self.source,
            "dest": str(self.dest),
            "objects": self.objects,
            "files": self.fetched,
            "bytes": self.fetched_bytes,
            "downloaded_bytes": self.fetched_bytes,
            "skipped": self.unchanged,
            "deleted": self.removed,
            "failed": [{"key": f.key, "error": f.error} for f in self.failed],
            "seconds": round(self.seconds, 3),
            "throughput_bytes_per_s": round(rate, 1),
            "cache": None,
            "reused": [],
        }


class StageEvents(Protocol):
    """Progress callbacks: sync's (``on_phase``), the transfer's, and ``on_wait``."""

    def on_wait(self, lock_path: Path) -> None:
        """Another process on this node holds the lock; we block until it is done."""
        ...

    def on_phase(self, phase: str, plan: SyncPlan | None) -> None:
        """A phase starts (``plan`` is None for the single-object path and for notices)."""
        ...

    def on_bytes(self, nbytes: int) -> None:
        """Some bytes arrived."""
        ...

    def on_done(self, result: TransferResult) -> None:
        """One object finished."""
        ...


class QuietStageEvents:
    """StageEvents that ignore everything."""

    def on_wait(self, lock_path: Path) -> None:
        """Ignore."""

    def on_phase(self, phase: str, plan: SyncPlan | None) -> None:
        """Ignore."""

    def on_bytes(self, nbytes: int) -> None:
        """Ignore."""

    def on_done(self, result: TransferResult) -> None:
        """Ignore."""


def stage_prefix(
    store: Store,
    source: str,
    root: Path,
    options: TransferOptions = TransferOptions(),
    events: StageEvents = QuietStageEvents(),
) -> StageResult:
    """Sync every object under ``source`` into ``root`` (a mirror: lading's own stale files go)."""
    request = SyncRequest(source=source, dest=root, delete=True, allow_empty=True)
    selection = select_objects(store, request, options.workers)
    try:
        if not selection.selected_files:
            raise NotFound(
                f"nothing at {source}: no object of that name and no keys under it",
                "check the bucket and prefix (keys are case-sensitive)",
            )
        summary = sync_into(store_fetcher(store), selection, request, options, events)
    except BaseException:
        selection.close()
        raise
    return StageResult(
        source,
        root,
        selection.selected_files,
        fetched=summary.files,
        fetched_bytes=summary.bytes,
        unchanged=summary.skipped,
        removed=summary.deleted,
        failed=list(summary.failed),
        seconds=summary.seconds,
        selection=selection,  # the views' keys; the caller closes the result
    )


def marker_path(target: Path) -> Path:
    """The single-object completion marker, a hidden sibling of ``target`` (within NAME_MAX)."""
    return target.parent / hidden_sibling(target.name, MARKER_SUFFIX)


def stage_object(
    store: Store,
    source: str,
    info: ObjectInfo,
    target: Path,
    options: TransferOptions = TransferOptions(),
    events: StageEvents = QuietStageEvents(),
    force: bool = False,
) -> StageResult:
    """Bring ``target`` up to date with one object, under its directory's lock, checked against
    its marker. A file at ``target`` that lading did not write (no marker beside it) is refused
    unless ``force``: a fetch never silently replaces the user's own file."""
    started = time.monotonic()
    result = StageResult(source, target, 1, target=info)
    make_directory(target.parent, "DEST")
    with directory_lock(target.parent, lambda: events.on_wait(target.parent)):
        marker = marker_path(target)
        current = _expected(info, target)
        if current is not None and _read_marker(marker, source) == current:
            result.unchanged, result.seconds = 1, time.monotonic() - started
            return result  # nothing changed: no GET, no write
        _refuse_foreign(target, marker, force)
        events.on_phase("download", None)
        outcomes = fetch_all(store, [TransferItem(info, target)], options, events)
        outcome = outcomes[0] if outcomes else None
        if outcome is None or not outcome.ok:
            error = outcome.error if outcome is not None and outcome.error is not None else None
            result.failed.append(
                FailedKey(
                    info.key,
                    error.message if error else "download failed",
                    error.exit_code if error else 1,
                    error.hint if error else None,
                )
            )
            return result
        result.fetched, result.fetched_bytes = 1, outcome.nbytes
        result.seconds = time.monotonic() - started
        try:
            _write_marker(marker, source, _expected(info, target))
        except OSError as err:
            raise local_error(
                err, f"write {marker}", f"{target} is complete; the next fetch downloads it again"
            ) from None
    return result


def _refuse_foreign(target: Path, marker: Path, force: bool) -> None:
    """Refuse to replace what lading did not put at ``target``: a directory always, a file
    without a marker unless ``force``."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    except OSError as err:
        raise local_error(err, f"inspect {target}") from None
    if stat_mode.S_ISDIR(st.st_mode):
        raise UsageError(f"{target} is a directory", "to fetch into it, end DEST with '/'")
    if not force and _read_marker(marker) is None:
        raise UsageError(
            f"{target} exists and was not written by lading; refusing to replace it",
            "pass --force to replace it, or choose another DEST",
        )


def _expected(info: ObjectInfo, target: Path) -> list | None:
    """The marker row for ``info`` as it is on disk now (None when the file is missing)."""
    try:
        st = target.stat()
    except OSError:
        return None
    return [info.key, info.size, info.version, st.st_size, st.st_mtime_ns]


def _read_marker(path: Path, source: str | None = None) -> list | None:
    """The object row of the marker at ``path`` (for ``source``, when given); None if there is none."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != MARKER_FORMAT:
        return None
    if source is not None and data.get("source") != source:
        return None
    row = data.get("object")
    return row if isinstance(row, list) else None


def _write_marker(path: Path, source: str, row: list | None) -> None:
    """Write the marker atomically and durably."""
    marker = {"format": MARKER_FORMAT, "source": source, "object": row}
    write_atomically(path, json.dumps(marker, separators=(",", ":")), durable=True)


def raise_for_failures(result: StageResult) -> None:
    """Turn failed objects into one error naming them; its exit code follows
    :func:`~lading.core.errors.exit_code_for_failures`, like ``lading sync``'s."""
    if not result.failed:
        return
    first = result.failed[0]
    names = ", ".join(f.key for f in result.failed[:5]) + (" ..." if len(result.failed) > 5 else "")
    message = f"{len(result.failed)} of {result.objects} object(s) from {result.source} failed ({names}): {first.error}"
    code = exit_code_for_failures((f.exit_code for f in result.failed), result.objects - len(result.failed))
    raise error_for_exit_code(code)(
        message, common_hint(result.failed) or "rerun: what already arrived is kept and skipped"
    )


def view_root(root: Path, index: int) -> Path:
    """The per-slot view of ``root``: ``{root}-rank{index}``."""
    return root.with_name(f"{root.name}-rank{index}")


VIEW_RECORD = ".lading-view.json"


def build_views(root: Path, path_of: Callable[[str], Path], views: Mapping[int, Callable[[], Iterator[str]]]) -> int:
    """Hard-link each view's keys under ``{root}-rank{i}`` (copy across filesystems).

    ``views`` maps a slot index to its keys (all of them, or its shard): a callable that returns
    them in ascending order, afresh on each call; ``path_of`` names each key's staged file. Links
    that already point at the staged file are left alone. Each view directory records the keys it
    was given (``.lading-view.json``, a JSON array, one key a line); a key that left the view (a
    shard reassigned, an object gone) is unlinked from it, and nothing else in the view is touched.
    The keys stream: the previous record is sorted on disk and walked beside them, so memory does
    not grow with the key count. Returns the number of links (or copies) made or removed.
    """
    changed = 0
    for index, keys in views.items():
        base = view_root(root, index)
        with _previous_keys(base / VIEW_RECORD) as previous:
            removals, tree = _Removals(base, previous), True
            for key in keys():
                staged = path_of(key)
                tree = tree and staged != root
                target = base / staged.relative_to(root) if staged != root else base
                if not _same_file(staged, target):
                    _link_atomically(staged, target)
                    changed += 1
                removals.keep(key)
            if tree:  # a directory view: it holds a record
                changed += removals.finish()
                if removals.differs:
                    base.mkdir(parents=True, exist_ok=True)
                    write_atomically(base / VIEW_RECORD, _record_lines(keys()))
    return changed


def _record_lines(keys: Iterator[str]) -> Iterator[str]:
    """A view record: a JSON array, ``[``, one key a line (``,`` between), ``]``."""
    yield "["
    sep = "\n"
    for key in keys:
        yield sep + json.dumps(key)
        sep = ",\n"
    yield "\n]\n"


@contextlib.contextmanager
def _previous_keys(record: Path) -> Iterator[Iterator[str]]:
    """The keys of a view record, in ascending order. The record lives in the view, where anyone
    may edit it: its keys are untrusted (non-strings are ignored here, unsafe keys by the unlink).
    One we wrote (one key a line, ascending) is read as it streams; any other is sorted on disk
    (a record of an older version, one key list on one line, is read whole with ``json.loads``)."""
    try:
        handle = open(record, encoding="utf-8")
    except OSError:
        yield iter(())
        return
    with handle, SortedRuns() as runs:
        try:
            ordered = _in_order(handle)
            handle.seek(0)
            data = None if ordered else json.load(handle)
        except (OSError, ValueError):
            ordered, data = False, None
        if ordered:
            yield _record_keys(handle)
            return
        runs.extend((key,) for key in (data if isinstance(data, list) else []) if isinstance(key, str))
        yield (row[0] for row in runs.finish())


def _record_keys(handle: IO[str]) -> Iterator[str]:
    """The keys of a record laid out as :func:`_record_lines` writes it (checked by :func:`_in_order`)."""
    handle.readline()
    for line in handle:
        if line == "]\n":
            return
        yield json.loads(line.rstrip("\n").removesuffix(","))


def _in_order(handle: IO[str]) -> bool:
    """Whether the record is laid out as :func:`_record_lines` writes it, its keys ascending."""
    if handle.readline() != "[\n":
        return False
    last = None
    for line in handle:
        if line == "]\n":
            return handle.read() == ""
        key = json.loads(line.rstrip("\n").removesuffix(","))
        if not isinstance(key, str) or (last is not None and key <= last):
            return False
        last = key
    return False


class _Removals:
    """The previous record's keys (sorted, duplicates skipped) walked beside the current keys
    (ascending): a previous key that the current ones pass by has left the view and is unlinked."""

    def __init__(self, base: Path, previous: Iterator[str]) -> None:
        self.base, self.previous = base, previous
        self.head: str | None = next(previous, None)
        self.removed, self.differs = 0, False

    def keep(self, key: str) -> None:
        """``key`` is in the view."""
        while self.head is not None and self.head < key:
            self._drop()
        if self.head == key:
            self._advance()
        else:
            self.differs = True

    def finish(self) -> int:
        """Unlink what is left of the previous keys; the number of files removed."""
        while self.head is not None:
            self._drop()
        return self.removed

    def _drop(self) -> None:
        assert self.head is not None  # callers loop while there is a head
        self.differs = True
        self.removed += unlink_key(self.base, self.head)
        self._advance()

    def _advance(self) -> None:
        current = self.head
        while self.head == current:
            self.head = next(self.previous, None)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _link_atomically(src: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(hidden_sibling(target.name, f".lading-link-{os.getpid()}"))
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(src, tmp)
    os.replace(tmp, target)
    # rename() between two links to one inode does nothing and leaves tmp (another process
    # built the same view at the same moment): drop it.
    tmp.unlink(missing_ok=True)
