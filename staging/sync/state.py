"""The state record a sync keeps in its destination: what lading put there, and from which version.

Two files in DEST, both reserved names a source key may not use:

- ``.lading-sync.json``: the index, replaced atomically (temporary file, rename; fsync'd first
  only for a durable sync, like the files it lists). JSON
  lines: a header ``{"format": 2, "source": ...}``, then one row per file,
  ``[key, size, version, mtime_ns, local_size]``, in ascending key order, so a sync reads it as
  a stream beside the (sorted) listing and never holds it whole;
- ``.lading-sync.journal``: JSON lines appended as files complete (``[key, size, version,
  mtime_ns, local_size]``, or ``{"key": ..., "deleted": true}``), written in batches: at most
  :data:`JOURNAL_BATCH` lines or :data:`JOURNAL_SECONDS` seconds wait in memory, so a sync
  killed with -9 fetches again only the files of that last batch. Reading replays it over the
  index (a torn last line is ignored; the journal is sorted in bounded memory,
  :mod:`lading.selection.runs`); :meth:`SyncState.save` folds it into a new index and removes it.

An entry says: key ``key`` was fetched at source ``version`` (ETag / generation) with ``size``
bytes, and the local file then had ``mtime_ns``/``local_size``. A file counts as up to date only
when the source still reports that version and size and the local file still has that mtime and
size; anything else (changed object, file edited or deleted locally) is fetched again. A row out
of key order or unreadable (the record lives in DEST, anyone may edit it) is dropped: its file
is fetched again. An index written by lading before format 2 (one JSON document) is read once
and rewritten in the new format by the next sync that changes something.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import re
import threading
import time
from itertools import islice
from json.decoder import scanstring  # type: ignore[attr-defined]  # (typeshed lacks it; the C scanner)
from operator import itemgetter
from pathlib import Path
from typing import IO, Generator, Iterable, Iterator, NamedTuple

from lading.core.atomic import write_atomically
from lading.core.errors import AccessDenied, LadingError, UnsafeKey
from lading.core.keys import is_safe_key, key_parts
from lading.core.names import SYNC_JOURNAL_NAME, SYNC_LOCK_NAME, SYNC_STATE_NAME
from lading.selection.runs import SortedRuns

log = logging.getLogger(__name__)

STATE_NAME, JOURNAL_NAME, LOCK_NAME = SYNC_STATE_NAME, SYNC_JOURNAL_NAME, SYNC_LOCK_NAME
RESERVED_NAMES = frozenset({STATE_NAME, JOURNAL_NAME, LOCK_NAME})
FORMAT = 2
#: Journal lines held in memory before they are written out (one ``write`` for the batch) ...
JOURNAL_BATCH = 256
#: ... or seconds since the last write, whichever comes first.
JOURNAL_SECONDS = 0.2
#: Lines parsed per ``json.loads`` call when reading the index or the journal.
_PARSE_BATCH = 2048
#: Journal lines of this run kept in memory, by key, so that :meth:`SyncState.save` need not
#: read back and re-check a journal it wrote alone (more, and it reads the file as it must after
#: a killed run's lines).
OWN_LINES = 50_000


class Entry(NamedTuple):
    """One file lading wrote into DEST."""

    key: str
    size: int
    version: str
    mtime_ns: int
    local_size: int

    def matches_local(self, st: os.stat_result) -> bool:
        """True when the local file is still exactly what lading wrote."""
        return st.st_mtime_ns == self.mtime_ns and st.st_size == self.local_size


class SyncState:
    """The record of one destination: its index read as a stream (:meth:`rows`), completed
    files journaled as they come (thread-safe :meth:`record`), folded by :meth:`save`."""

    def __init__(self, dest: Path, source: str = "") -> None:
        self.dest = Path(dest)
        self.source = source
        self._lock = threading.Lock()
        self._journal: IO[str] | None = None
        self._pending: list[str] = []
        self._written = time.monotonic()
        self._dirty = False
        #: ``(key, line)`` of every journal line this object wrote (``line`` None: a deletion)
        #: while it alone wrote the journal (it was empty when opened); else None.
        self._own: list[tuple[str, str | None]] | None = None

    @classmethod
    def load(cls, dest: Path) -> "SyncState":
        """The record of ``dest`` (only the index's header is read here; a missing or
        unreadable record is empty)."""
        state = cls(dest)
        header = _read_header(state.dest / STATE_NAME)
        state.source = str(header.get("source", "")) if header else ""
        return state

    def rows(self, checked: bool = True) -> Generator[Entry, None, None]:
        """Every entry in ascending key order: the index with the journal replayed over it.

        ``checked=False`` leaves the index rows' keys unchecked (the journal's are always
        checked): for a caller that uses a row only when its key equals a key it checked itself,
        or checks the key before acting on it (:func:`lading.sync.plan.plan_sync`)."""
        for entry in _entries(_parsed_lines(line for _, line in self._merged(checked)), checked=False):
            if entry is not None:
                yield entry

    def _merged(self, checked: bool) -> Iterator[tuple[str, str]]:
        """``(key, line)`` of every entry in ascending key order, the index's lines with the
        journal's replayed over them, as lines: checked by shape (:data:`_ROW_LINE`), never
        parsed whole. A journal this object wrote alone is taken from memory, not read back."""
        index = _index_lines_keyed(self.dest / STATE_NAME, checked)
        journal = _own_runs(self._own) if self._own is not None else _journal_runs(self.dest / JOURNAL_NAME)
        if journal is None:
            yield from index
            return
        with journal:
            tagged = heapq.merge(
                ((key, 0, line) for key, line in index),
                ((key, 1, line) for key, line in journal),
                key=itemgetter(0),
            )
            pending: tuple[str, str] | None = None
            for key, _origin, line in tagged:
                if pending is not None and pending[0] != key:
                    yield pending
                pending = None if line is None else (key, line)  # a later line replaces; None: deleted
            if pending is not None:
                yield pending

    def lines(self) -> Iterator[str]:
        """Every entry as its index line (:func:`_dumps`), in key order as far as the index
        is: the index's own lines unread when there is no journal to replay (the common case),
        else the lines merged with the journal's. For a caller that compares each line with the
        one it would write (equal: the entry is that one) and parses only the others
        (:func:`parse_line`), dropping lines that are malformed or out of key order, as
        :meth:`rows` does; keys unchecked, as ``rows(checked=False)``."""
        path = self.index_alone()
        if path is not None:
            try:
                handle = open(path, encoding="utf-8")
            except OSError:
                return
            with handle:
                handle.readline()  # the header
                yield from handle
                return
        for _, line in self._merged(checked=False):
            yield line

    def index_alone(self) -> Path | None:
        """The index file when it alone is the record, in the current format (no journal to
        replay over it): then :meth:`lines` are its lines after the header, as they are."""
        path = self.dest / STATE_NAME
        if (self.dest / JOURNAL_NAME).exists():
            return None
        try:
            with open(path, encoding="utf-8") as handle:
                header = _read_header_line(handle.readline())
        except (OSError, ValueError):
            return None
        return path if header is not None and header.get("format") == FORMAT else None

    def entry_map(self) -> dict[str, Entry]:
        """All entries by key, in memory: for small records and tests only."""
        return {entry.key: entry for entry in self.rows()}

    def begin(self) -> None:
        """Create the journal before writing anything: while it exists, a run is (or was) under way."""
        with self._lock:
            if self._journal is None:
                self._open_journal()
            self._dirty = True

    def record(self, entry: Entry) -> None:
        """Remember a completed file (a journal line, written with its batch)."""
        line = _dumps(entry) + "\n"
        self._append(entry.key, line, line)

    def forget(self, keys: Iterable[str]) -> None:
        """Drop entries (files deleted locally by ``--delete``)."""
        for key in keys:
            self._append(key, f'{{"key":{_string(key)},"deleted":true}}\n', None)

    def _append(self, key: str, line: str, row: str | None) -> None:
        """Journal ``line``; ``row`` is the index line it stands for (None: a deletion)."""
        with self._lock:
            if self._journal is None:
                self._open_journal()
            self._pending.append(line)
            own = self._own
            if own is not None:
                if len(own) < OWN_LINES:
                    own.append((key, row))
                else:
                    self._own = None  # too many to hold: save reads the journal back
            self._dirty = True
            if len(self._pending) >= JOURNAL_BATCH or time.monotonic() - self._written >= JOURNAL_SECONDS:
                self._write_pending()

    def _open_journal(self) -> None:
        """Open the journal for appending (the caller holds the lock); this object's own lines
        are kept in memory only when it found the journal empty (no killed run's lines)."""
        self._journal = open(self.dest / JOURNAL_NAME, "a", encoding="utf-8")
        self._journal.flush()
        self._own = [] if self._journal.tell() == 0 else None

    def _write_pending(self) -> None:
        """Append the pending lines to the journal in one write (the caller holds the lock)."""
        if self._journal is None:
            self._open_journal()
        assert self._journal is not None
        if self._pending:
            self._journal.write("".join(self._pending))
            self._pending = []
        self._journal.flush()
        self._written = time.monotonic()

    def save(self, durable: bool = False) -> None:
        """Write the index atomically, streaming, then drop the journal it now contains.

        Does nothing when no entry changed and the index exists (a no-op sync rewrites nothing).
        ``durable`` fsyncs it before the rename, for a sync whose files are fsync'd too: a kill
        loses nothing either way, and on ext4 an fsync right after a large download waits for
        its data to reach the disk (0.16-0.34 s after a 1 GiB download, measured).
        """
        with self._lock:
            journal = self.dest / JOURNAL_NAME
            if not self._dirty and (self.dest / STATE_NAME).exists() and not journal.exists():
                return
            if self._journal is not None or self._pending:
                self._write_pending()
            try:
                write_atomically(self.dest / STATE_NAME, self._index_lines(), durable=durable)
            except OSError as err:  # the journal still holds every entry: nothing is lost
                kind = AccessDenied if isinstance(err, PermissionError) else LadingError
                raise kind(f"cannot write {self.dest / STATE_NAME}: {err.strerror or err}") from None
            if self._journal is not None:
                self._journal.close()
                self._journal = None
            journal.unlink(missing_ok=True)
            self._own = None
            self._dirty = False

    def _index_lines(self) -> Iterator[str]:
        yield json.dumps({"format": FORMAT, "source": self.source}, separators=(",", ":")) + "\n"
        for _, line in self._merged(checked=True):
            yield line

    def close(self) -> None:
        """Write the pending journal lines and close the journal without writing a snapshot
        (the journal stays valid)."""
        with self._lock:
            if self._pending:
                self._write_pending()
            if self._journal is not None:
                self._journal.close()
                self._journal = None


_string = json.encoder.encode_basestring_ascii


def _dumps(entry: Entry) -> str:
    """``[key, size, version, mtime_ns, local_size]`` as compact JSON."""
    return f"[{_string(entry.key)},{entry.size:d},{_string(entry.version)},{entry.mtime_ns:d},{entry.local_size:d}]"


def parse_line(line: str) -> Entry | None:
    """The entry of an index line, or None when it is malformed (its key unchecked)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return next(_entries((row,), checked=False))


def _read_header_line(line: str) -> dict[str, object] | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _read_header(path: Path) -> dict[str, object] | None:
    """The index's header (format 2), or the whole legacy document (format 1), or None."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.loads(handle.readline())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") in (1, FORMAT) else None


def _index_lines_keyed(path: Path, checked: bool = True) -> Iterator[tuple[str, str]]:
    """``(key, line)`` of the index's rows in strictly ascending key order: rows out of order,
    malformed or (when ``checked``) with unsafe keys are dropped."""
    try:
        handle = open(path, encoding="utf-8")
    except OSError:
        return
    with handle:
        try:
            header = json.loads(handle.readline())
        except ValueError:
            return
        if not isinstance(header, dict):
            return
        if header.get("format") == 1:  # the whole legacy document was that one line
            entries = sorted(filter(None, map(_entry, header.get("files") or [])))
            rows: Iterable[tuple[str, str] | None] = ((e.key, _dumps(e) + "\n") for e in entries)
        elif header.get("format") == FORMAT:
            rows = map(_keyed, handle)
        else:
            return
        last: str | None = None
        for row in rows:
            if row is None or (checked and not is_safe_key(row[0])):
                continue
            if last is not None and row[0] <= last:
                log.warning("%s: dropping row %r out of key order", path, row[0])
                continue
            last = row[0]
            yield row


#: An index or journal row as :func:`_dumps` writes it: ``[key, size, version, mtime_ns,
#: local_size]`` with JSON strings and integers (checked by shape, without parsing it).
_ROW_LINE = re.compile(r'\["(?:[^"\\\x00-\x1f]|\\.)*",-?\d+,"(?:[^"\\\x00-\x1f]|\\.)*",-?\d+,-?\d+\]\n')


def _keyed(line: str) -> tuple[str, str] | None:
    """``(key, line)`` of a row line of the expected shape (newline added to a last line
    without one), else of the entry it parses to; None when it is neither."""
    if not line.endswith("\n"):
        line += "\n"
    if _ROW_LINE.fullmatch(line) is not None:
        try:
            return scanstring(line, 2)[0], line
        except ValueError:
            return None
    entry = parse_line(line)
    return None if entry is None else (entry.key, _dumps(entry) + "\n")


def _parsed_lines(handle: Iterator[str]) -> Iterator[object]:
    """Each line's JSON value, parsed :data:`_PARSE_BATCH` lines per ``json.loads`` call (a
    damaged line is dropped: its batch is parsed again line by line)."""
    loads = json.loads
    while lines := list(islice(handle, _PARSE_BATCH)):
        try:
            values = loads(f"[{','.join(lines)}]")
        except ValueError:
            values = None
        if values is None or len(values) != len(lines):  # a damaged line, or lines that only parse together
            values = []
            for line in lines:
                try:
                    values.append(loads(line))
                except ValueError:
                    continue  # a line damaged by hand
        yield from values


def _entries(rows: Iterable[object], checked: bool = True) -> Iterator[Entry | None]:
    """:func:`_entry` of each row, with a fast path for well-formed array rows (whose key is
    checked only when ``checked``)."""
    make = Entry._make
    for row in rows:
        if (
            type(row) is list
            and len(row) == 5
            and type(row[0]) is str
            and type(row[1]) is int
            and type(row[2]) is str
            and type(row[3]) is int
            and type(row[4]) is int
        ):
            yield make(row) if not checked or is_safe_key(row[0]) else None
        else:
            yield _entry(row)


def _journal_runs(path: Path) -> SortedRuns | None:
    """The journal's rows sorted by key (stable: later lines after earlier ones for a key), as
    ``(key, line)``, ``(key, None)`` for a deletion; None when there is no journal. Keys are
    checked (a row with an unsafe key is dropped); a torn or damaged line is dropped."""
    try:
        handle = open(path, encoding="utf-8")
    except OSError:
        return None
    runs = SortedRuns()
    with handle:
        runs.extend(filter(None, map(_journal_row, handle)))
    return runs.finish()


def _own_runs(own: list[tuple[str, str | None]]) -> SortedRuns:
    """This run's journal lines from memory, as :func:`_journal_runs` reads them back: sorted by
    key (stable), rows with unsafe keys dropped."""
    runs = SortedRuns()
    runs.extend(row for row in own if is_safe_key(row[0]))
    return runs.finish()


def _journal_row(line: str) -> tuple[str, str | None] | None:
    if line.startswith("{"):
        try:
            row = json.loads(line)
        except ValueError:
            return None
        if isinstance(row, dict) and row.get("deleted"):
            return str(row.get("key")), None
        entry = _entry(row)
        return None if entry is None else (entry.key, _dumps(entry) + "\n")
    if not line.endswith("\n"):
        return None  # torn: the run was killed while writing it
    keyed = _keyed(line)
    return keyed if keyed is not None and is_safe_key(keyed[0]) else None


def _entry(row: object) -> Entry | None:
    """An entry from a JSON row (object or array); None if malformed or if its key is unsafe
    (the record lives in DEST and anyone may edit it, and ``--delete`` acts on these keys)."""
    try:
        if isinstance(row, list):
            key, size, version, mtime_ns, local_size = row
        elif isinstance(row, dict):
            key, size, version = row["key"], row["size"], row["version"]
            mtime_ns, local_size = row["mtime_ns"], row["local_size"]
        else:
            return None
        entry = Entry(str(key), int(size), str(version), int(mtime_ns), int(local_size))
        key_parts(entry.key)
    except (KeyError, TypeError, ValueError, UnsafeKey):
        return None
    return entry
