"""Apply a :class:`~lading.sync.plan.SyncPlan`: delete, fetch, record, summarise.

Order: first ``--delete`` removals (only files lading tracks in the state record, so files the
user or the training job put into DEST are never touched), then the fetches through
:func:`lading.transfer.fetch_all` (or another fetcher with the same signature, e.g. the node
cache's hard-linker), fed from the plan's sorted runs :data:`FETCH_BATCH` objects at a time,
so memory stays bounded however many objects the plan holds. Each object is read from the plan and
its folders made as the fetcher asks for it (on the fetcher's thread), so the first GET waits for
one object's preparation, not a batch's. Each completed file is journaled
(:mod:`lading.sync.state`, in batches), so a sync killed mid-way resumes where it stopped. Nothing is written outside DEST: parent
directories are created one level at a time and an existing symlink or file in their place
fails that key.
"""

from __future__ import annotations

import logging
import os
import stat as stat_mode
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Protocol

from lading.core.errors import LadingError, UnsafeKey
from lading.core.keys import key_parts
from lading.stores.base import ObjectInfo, Store
from lading.sync.plan import PlannedFetch, SyncPlan
from lading.sync.state import Entry, SyncState
from lading.transfer import TransferItem, TransferOptions, TransferResult, fetch_all
from lading.transfer.types import TransferEvents
from lading.transfer.files import temporaries_of

log = logging.getLogger(__name__)

#: Objects handed to the fetcher at a time (the plan is read from disk batch by batch).
FETCH_BATCH = 8192

#: The plan's reasons to fetch that mean it found no file at the key's path (see ``_classify``).
NO_FILE_REASONS = frozenset({"new", "missing"})

#: ``fetcher(items, options, events) -> results``: how the bytes get there. ``items`` is an
#: iterator that prepares each item as it is taken: take them one at a time, as work frees up.
Fetcher = Callable[[Iterable[TransferItem], TransferOptions, TransferEvents], list[TransferResult]]


class SyncEvents(Protocol):
    """Progress callbacks (a :class:`~lading.transfer.TransferEvents` plus phases)."""

    def on_phase(self, phase: str, plan: SyncPlan | None) -> None:
        """A phase starts: ``download`` (store -> DEST or node cache) or ``link`` (cache -> DEST).

        With ``plan`` None, ``phase`` is a notice (e.g. waiting for another rank's download).
        """
        ...

    def on_bytes(self, nbytes: int) -> None:
        """Bytes arrived (negative when a retry discards a partial read)."""
        ...

    def on_done(self, result: TransferResult) -> None:
        """One file finished, successfully or not."""
        ...


class NoSyncEvents:
    """SyncEvents that ignore everything."""

    def on_phase(self, phase: str, plan: SyncPlan | None) -> None:
        """Ignore."""

    def on_bytes(self, nbytes: int) -> None:
        """Ignore."""

    def on_done(self, result: TransferResult) -> None:
        """Ignore."""


class FailedKey:
    """A key that could not be synced, with the one-line reason, its exit code and what to do.
    A plain class, as :class:`SyncSummary`: a dataclass costs about 1 ms of start-up to create,
    and none is compared, hashed or copied."""

    __slots__ = ("key", "error", "exit_code", "hint")

    def __init__(self, key: str, error: str, exit_code: int, hint: str | None = None) -> None:
        self.key, self.error, self.exit_code, self.hint = key, error, exit_code, hint

    def __repr__(self) -> str:
        return f"FailedKey({self.key!r}, {self.error!r}, {self.exit_code!r}, {self.hint!r})"


def common_hint(failed: list[FailedKey]) -> str | None:
    """The hint every failure shares (``take a new snapshot`` for objects changed since a
    snapshot, where a rerun cannot help), or None when they differ or have none."""
    hints = {f.hint for f in failed}
    return hints.pop() if len(hints) == 1 else None


class SyncSummary:
    """What a sync did. ``files``/``bytes`` were placed in DEST; ``downloaded_bytes`` came from
    the store in this process (less than ``bytes`` when the node cache already had them);
    ``reused`` names the packed datasets (name, version, index) taken from the node cache as is."""

    __slots__ = (
        "source",
        "dest",
        "files",
        "bytes",
        "downloaded_bytes",
        "skipped",
        "deleted",
        "failed",
        "seconds",
        "cache",
        "reused",
    )

    def __init__(self, source: str, dest: str, skipped: int = 0) -> None:
        self.source, self.dest = source, dest
        self.files = self.bytes = self.downloaded_bytes = self.deleted = 0
        self.skipped = skipped
        self.failed: list[FailedKey] = []
        self.seconds = 0.0
        self.cache: str | None = None
        self.reused: list[dict[str, str | None]] = []

    @property
    def throughput(self) -> float:
        """Bytes per second placed in DEST."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, object]:
        """The JSON shape of ``lading sync --json``."""
        return {
            "source": self.source,
            "dest": self.dest,
            "files": self.files,
            "bytes": self.bytes,
            "downloaded_bytes": self.downloaded_bytes,
            "skipped": self.skipped,
            "deleted": self.deleted,
            "failed": [{"key": f.key, "error": f.error} for f in self.failed],
            "seconds": round(self.seconds, 3),
            "throughput_bytes_per_s": round(self.throughput, 1),
            "cache": self.cache,
            "reused": self.reused,
        }


def store_fetcher(store: Store) -> Fetcher:
    """The default fetcher: the transfer engine reading from ``store``."""

    def fetch(items: Iterable[TransferItem], options: TransferOptions, events: TransferEvents) -> list[TransferResult]:
        return fetch_all(store, items, options, events)

    return fetch


def prepare_parent(root: Path, key: str, made: dict[str, Path], existed: bool = True) -> Path:
    """Create the directories of ``key`` under ``root`` and return its final path.

    Raises :class:`UnsafeKey` when a component exists as a symlink or a file: following it could
    write outside ``root``. ``made`` maps each key folder already checked in this run to its path
    (one join a key after the first of its folder). ``existed`` False says the plan saw no file at
    the final path (under DEST's lock): no directory can be in the way, so it is not looked at again.
    """
    folder, _, name = key.rpartition("/")
    parent = made.get(folder)
    if parent is None:
        parent = root
        for part in folder.split("/") if folder else ():
            parent = parent / part
            try:
                os.mkdir(parent)
            except FileExistsError:
                st = os.lstat(parent)
                if not stat_mode.S_ISDIR(st.st_mode):
                    kind = "a symlink" if stat_mode.S_ISLNK(st.st_mode) else "not a directory"
                    raise UnsafeKey(
                        f"{key}: local path {parent} is {kind}",
                        "remove it, or sync with --delete if lading put it there",
                    ) from None
        made[folder] = parent
    final = parent / name
    if existed:
        try:
            if stat_mode.S_ISDIR(os.lstat(final).st_mode):
                raise UnsafeKey(f"{key}: a local directory {final} is in the way")
        except FileNotFoundError:
            pass
    return final


def _reachable_without_links(dest: Path, key: str) -> Path | None:
    """``dest/key`` if none of its directories under ``dest`` is a symlink or a non-directory."""
    current = dest
    parts = key.split("/")
    for part in parts[:-1]:
        current = current / part
        try:
            if not stat_mode.S_ISDIR(os.lstat(current).st_mode):
                return None
        except OSError:
            return None
    return current / parts[-1]


def unlink_key(root: Path, key: str) -> bool:
    """Remove the file ``root/key`` if it is one, for a key read back from a record anyone could
    edit: the key must pass the key-safety check and no directory on the way may be a symlink,
    so nothing outside ``root`` is ever removed. True when a file was removed."""
    try:
        key_parts(key)
    except UnsafeKey:
        log.warning("%s: ignoring unsafe key %r from a record", root, key)
        return False
    path = _reachable_without_links(root, key)
    if path is None:
        return False
    try:
        if stat_mode.S_ISDIR(os.lstat(path).st_mode):
            return False
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def delete_tracked(dest: Path, keys: Iterable[str], state: SyncState) -> int:
    """Remove files lading tracks under ``dest`` and prune directories left empty.

    Never follows a symlinked directory, so nothing outside ``dest`` is removed.
    """
    deleted = 0
    parents: set[Path] = set()
    for key in keys:
        state.forget([key])
        path = _reachable_without_links(dest, key)
        if path is None:
            continue
        try:
            if not stat_mode.S_ISDIR(os.lstat(path).st_mode):
                path.unlink()
                deleted += 1
        except FileNotFoundError:
            pass
        parents.update(p for p in path.parents if p != dest and dest in p.parents)
    for directory in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        try:
            directory.rmdir()
        except OSError:
            pass  # not empty, or not ours to judge: keep it
    return deleted


class _Recorder:
    """Wraps the caller's events: journals each completed file and collects the results."""

    def __init__(self, infos: Mapping[str, ObjectInfo], state: SyncState, events: SyncEvents) -> None:
        self.infos = infos
        self.state = state
        self.events = events
        self.lock = threading.Lock()
        self.ok_files = 0
        self.ok_bytes = 0
        self.failed: list[FailedKey] = []

    def on_bytes(self, nbytes: int) -> None:
        self.events.on_bytes(nbytes)

    def on_done(self, result: TransferResult) -> None:
        if result.ok:
            result = self._record(result)
        with self.lock:
            if result.ok:
                self.ok_files += 1
                self.ok_bytes += self.infos[result.key].size
            else:
                error = result.error or LadingError("failed")
                self.failed.append(FailedKey(result.key, error.message, error.exit_code, error.hint))
        self.events.on_done(result)

    def _record(self, result: TransferResult) -> TransferResult:
        info = self.infos[result.key]
        local = result.local
        if local is None:
            try:
                st = os.lstat(result.dest)
            except OSError as err:
                return TransferResult(result.key, result.dest, False, error=LadingError(f"{result.dest}: {err}"))
            local = st.st_mtime_ns, st.st_size
        self.state.record(Entry(info.key, info.size, info.version, *local))
        return result


def apply_plan(
    plan: SyncPlan,
    state: SyncState,
    fetcher: Fetcher,
    options: TransferOptions = TransferOptions(),
    events: SyncEvents = NoSyncEvents(),
    phase: str = "download",
    skip_keys: frozenset[str] = frozenset(),
) -> SyncSummary:
    """Run the plan against DEST (the caller holds DEST's lock) and save the state record.
    ``skip_keys`` are left out of the fetches."""
    started = time.monotonic()
    dest = Path(plan.dest)
    summary = SyncSummary(plan.source, plan.dest, skipped=plan.up_to_date_files)
    summary.deleted = delete_tracked(dest, plan.to_delete(), state) if plan.delete_files else 0
    events.on_phase(phase, plan)
    try:
        for batch in _batches(plan, dest, skip_keys, summary.failed):
            _fetch_batch(batch, state, fetcher, options, events, summary)
    finally:
        state.save(durable=options.durable)
    summary.failed.sort(key=lambda f: f.key)
    summary.seconds = time.monotonic() - started
    return summary


class _Batch:
    """Up to :data:`FETCH_BATCH` of the plan's fetches, each read from the plan and its key's
    folders made under DEST when the fetcher takes it (a key that cannot be placed safely goes
    to ``failed``); ``infos`` holds the objects handed out so far, by key."""

    def __init__(
        self, fetches: Iterator[PlannedFetch], dest: Path, made: dict[str, Path], failed: list[FailedKey]
    ) -> None:
        self._fetches, self._dest, self._made, self._failed = fetches, dest, made, failed
        self.infos: dict[str, ObjectInfo] = {}
        self._first = self._next()

    def _next(self) -> TransferItem | None:
        """The next fetch that can be placed, its folders made; None once the plan has no more."""
        for planned in self._fetches:
            info = planned.info
            try:
                final = prepare_parent(self._dest, info.key, self._made, planned.reason not in NO_FILE_REASONS)
            except (UnsafeKey, OSError) as err:
                message = err.message if isinstance(err, LadingError) else f"{info.key}: {err}"
                self._failed.append(FailedKey(info.key, message, 1))
                continue
            self.infos[info.key] = info
            return TransferItem(info, final)
        return None

    @property
    def empty(self) -> bool:
        """Whether the plan had no fetch left to place."""
        return self._first is None

    def __iter__(self) -> Iterator[TransferItem]:
        item, self._first = self._first, None
        while item is not None:
            yield item
            if len(self.infos) >= FETCH_BATCH:
                return
            item = self._next()


def _batches(plan: SyncPlan, dest: Path, skip_keys: frozenset[str], failed: list[FailedKey]) -> Iterator[_Batch]:
    """The plan's fetches, :data:`FETCH_BATCH` at a time, each batch prepared lazily (:class:`_Batch`)."""
    fetches = plan.to_fetch(skip_keys)
    made: dict[str, Path] = {}
    while not (batch := _Batch(fetches, dest, made, failed)).empty:
        yield batch


def _fetch_batch(
    batch: _Batch,
    state: SyncState,
    fetcher: Fetcher,
    options: TransferOptions,
    events: SyncEvents,
    summary: SyncSummary,
) -> None:
    recorder = _Recorder(batch.infos, state, events)
    fetcher(iter(batch), options, recorder)
    summary.files += recorder.ok_files
    summary.bytes += recorder.ok_bytes
    summary.failed.extend(recorder.failed)


def sweep_temporaries(dest: Path, markers: tuple[str, ...], keep: Iterable[Path] = ()) -> int:
    """Remove leftover temporaries (names containing one of ``markers``) of a killed run under ``dest``,
    except those of the final paths in ``keep`` (:func:`~lading.transfer.files.temporaries_of`).

    Only called while holding DEST's lock, so no live writer owns them.
    """
    kept = {temporary for path in keep for temporary in temporaries_of(path)}
    removed = 0
    stack = [dest]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif any(marker in entry.name for marker in markers) and Path(entry.path) not in kept:
                try:
                    os.unlink(entry.path)
                    removed += 1
                except OSError as err:
                    log.debug("could not remove the leftover temporary %s: %s", entry.path, err)
    if removed:
        log.info("removed %d temporary file(s) left by an interrupted run under %s", removed, dest)
    return removed
