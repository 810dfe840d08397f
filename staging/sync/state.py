"""The state record a sync keeps in its destination: what lading put there, and from which version.

Two files in DEST, both reserved names a source key may not use:

- ``.lading-sync.json``: a snapshot, replaced atomically (temporary file, fsync, rename);
- ``.lading-sync.journal``: JSON lines appended as files complete, so a sync killed with -9
  loses at most the line being written. Loading replays it over the snapshot (a torn last
  line is ignored); :meth:`SyncState.save` folds it into a new snapshot and removes it.

An entry says: key ``key`` was fetched at source ``version`` (ETag / generation) with ``size``
bytes, and the local file then had ``mtime_ns``/``local_size``. A file counts as up to date only
when the source still reports that version and size and the local file still has that mtime and
size; anything else (changed object, file edited or deleted locally) is fetched again.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable

from lading.core.atomic import write_atomically
from lading.core.errors import AccessDenied, LadingError, UnsafeKey
from lading.core.keys import key_parts
from lading.core.names import SYNC_JOURNAL_NAME, SYNC_LOCK_NAME, SYNC_STATE_NAME

STATE_NAME, JOURNAL_NAME, LOCK_NAME = SYNC_STATE_NAME, SYNC_JOURNAL_NAME, SYNC_LOCK_NAME
RESERVED_NAMES = frozenset({STATE_NAME, JOURNAL_NAME, LOCK_NAME})
FORMAT = 1


@dataclass(frozen=True)
class Entry:
    """One file lading wrote into DEST."""

    key: str
    size: int
    version: str
    mtime_ns: int
    local_size: int

    def to_row(self) -> dict[str, object]:
        """The JSON row, built directly: the dataclasses helper deep-copies, ~20 us an entry."""
        return {"key": self.key, "size": self.size, "version": self.version,
                "mtime_ns": self.mtime_ns, "local_size": self.local_size}

    def matches_local(self, st: os.stat_result) -> bool:
        """True when the local file is still exactly what lading wrote."""
        return st.st_mtime_ns == self.mtime_ns and st.st_size == self.local_size


class SyncState:
    """The entries of one destination, loaded from and saved to DEST. Thread-safe ``record``."""

    def __init__(self, dest: Path, entries: dict[str, Entry] | None = None, source: str = "") -> None:
        self.dest = Path(dest)
        self.entries: dict[str, Entry] = entries or {}
        self.source = source
        self._lock = threading.Lock()
        self._journal: IO[str] | None = None
        self._dirty = False

    @classmethod
    def load(cls, dest: Path) -> "SyncState":
        """Read the snapshot and replay the journal; a missing or unreadable record is empty."""
        dest = Path(dest)
        state = cls(dest)
        try:
            data = json.loads((dest / STATE_NAME).read_text(encoding="utf-8"))
            if data.get("format") == FORMAT:
                state.source = str(data.get("source", ""))
                for row in data.get("files", []):
                    entry = _entry(row)
                    if entry is not None:
                        state.entries[entry.key] = entry
        except (OSError, ValueError, AttributeError):
            pass  # no record (first sync) or a damaged one: every file is fetched again
        state._replay(dest / JOURNAL_NAME)
        return state

    def _replay(self, journal: Path) -> None:
        try:
            lines = journal.read_text(encoding="utf-8").splitlines()
        except OSError:
            return
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue  # torn line from a killed run
            if isinstance(row, dict) and row.get("deleted"):
                self.entries.pop(str(row.get("key")), None)
                continue
            entry = _entry(row)
            if entry is not None:
                self.entries[entry.key] = entry

    def begin(self) -> None:
        """Create the journal before writing anything: while it exists, a run is (or was) under way."""
        with self._lock:
            if self._journal is None:
                self._journal = open(self.dest / JOURNAL_NAME, "a", encoding="utf-8")
                self._journal.flush()
            self._dirty = True

    def record(self, entry: Entry) -> None:
        """Remember a completed file, durably against a kill (journal line, flushed)."""
        self._append(entry.to_row())
        with self._lock:
            self.entries[entry.key] = entry

    def forget(self, keys: Iterable[str]) -> None:
        """Drop entries (files deleted locally by ``--delete``)."""
        for key in keys:
            self._append({"key": key, "deleted": True})
            with self._lock:
                self.entries.pop(key, None)

    def _append(self, row: dict[str, object]) -> None:
        line = json.dumps(row, separators=(",", ":")) + "\n"
        with self._lock:
            if self._journal is None:
                self._journal = open(self.dest / JOURNAL_NAME, "a", encoding="utf-8")
            self._journal.write(line)
            self._journal.flush()
            self._dirty = True

    def save(self) -> None:
        """Write the snapshot atomically, then drop the journal it now contains.

        Does nothing when no entry changed and the snapshot exists (a no-op sync rewrites nothing).
        """
        with self._lock:
            journal = self.dest / JOURNAL_NAME
            if not self._dirty and (self.dest / STATE_NAME).exists() and not journal.exists():
                return
            rows = [entry.to_row() for _, entry in sorted(self.entries.items())]
            payload = {"format": FORMAT, "source": self.source, "files": rows}
            try:
                write_atomically(self.dest / STATE_NAME, json.dumps(payload, separators=(",", ":")), durable=True)
            except OSError as err:  # the journal still holds every entry: nothing is lost
                kind = AccessDenied if isinstance(err, PermissionError) else LadingError
                raise kind(f"cannot write {self.dest / STATE_NAME}: {err.strerror or err}") from None
            if self._journal is not None:
                self._journal.close()
                self._journal = None
            journal.unlink(missing_ok=True)
            self._dirty = False

    def close(self) -> None:
        """Close the journal without writing a snapshot (the journal stays valid)."""
        with self._lock:
            if self._journal is not None:
                self._journal.close()
                self._journal = None


def _entry(row: object) -> Entry | None:
    """An entry from a JSON row; None if malformed or if its key is unsafe (the record lives in
    DEST and anyone may edit it, and ``--delete`` acts on these keys)."""
    if not isinstance(row, dict):
        return None
    try:
        entry = Entry(str(row["key"]), int(row["size"]), str(row["version"]), int(row["mtime_ns"]),
                      int(row["local_size"]))
        key_parts(entry.key)
    except (KeyError, TypeError, ValueError, UnsafeKey):
        return None
    return entry
