"""Sorted key runs on disk: rows written in any order, read back in key order, in bounded memory.

A :class:`SortedRuns` takes rows (tuples of plain values whose first item is the key) and keeps
at most :data:`CHUNK_ROWS` of them in memory. A full chunk is sorted and appended to the current
run file when it continues that run (its first key is not below the run's last), else it starts
a new run. Reading merges the runs (:func:`heapq.merge`, stable: for equal keys, rows added
earlier come first). A listing that arrives in key order, as every store lists, is one run that
is read back as written.

Runs are anonymous temporary files (removed by the OS when closed, even after a kill) in
``tempfile.gettempdir()``; rows are stored with :mod:`marshal` in blocks, since nothing but this
process reads them. Fewer rows than a chunk make no file: once finished, they are kept in memory.
"""

from __future__ import annotations

import heapq
import marshal
import os
from itertools import islice
from operator import itemgetter
from typing import IO, Iterable, Iterator

#: Rows held in memory before a chunk is sorted and written out.
CHUNK_ROWS = 50_000
#: Rows per marshal block on disk.
_BLOCK = 1024


class _Run:
    """One run file: sorted blocks of rows, each ``length (8 bytes) + marshal data``, read with
    ``pread`` so several readers (and the writer) never share a file position."""

    def __init__(self) -> None:
        import tempfile  # with shutil and random: loaded only by a selection larger than a chunk

        self.file: IO[bytes] = tempfile.TemporaryFile(prefix="lading-runs-")
        self.last: object = None

    def write(self, rows: list[tuple]) -> None:
        for start in range(0, len(rows), _BLOCK):
            data = marshal.dumps(rows[start : start + _BLOCK])
            self.file.write(len(data).to_bytes(8, "little") + data)
        self.last = rows[-1][0]

    def rows(self) -> Iterator[tuple]:
        self.file.flush()
        fd, offset = self.file.fileno(), 0
        while True:
            head = os.pread(fd, 8, offset)
            if len(head) < 8:
                return
            length = int.from_bytes(head, "little")
            yield from marshal.loads(os.pread(fd, length, offset + 8))
            offset += 8 + length


class SortedRuns:
    """Rows in, rows out in key order (see the module docstring). Iterate as often as needed
    once :meth:`finish` was called; :meth:`close` removes the files (also a context manager)."""

    def __init__(self) -> None:
        self._runs: list[_Run] = []
        self._chunk: list[tuple] = []
        self._held: list[tuple] | None = None  # finished rows that never filled a chunk
        self.count = 0

    def add(self, row: tuple) -> None:
        """Add a row (first item: the key)."""
        self._chunk.append(row)
        self.count += 1
        if len(self._chunk) >= CHUNK_ROWS:
            self._flush()

    def extend(self, rows: Iterable[tuple]) -> None:
        """Add rows (a chunk at a time: no call per row)."""
        rows = iter(rows)
        while True:
            room = CHUNK_ROWS - len(self._chunk)
            before = len(self._chunk)
            self._chunk.extend(islice(rows, room))
            added = len(self._chunk) - before
            self.count += added
            if added < room:
                return
            self._flush()

    def _flush(self) -> None:
        if not self._chunk:
            return
        self._chunk.sort(key=_first)
        if not self._runs or self._runs[-1].last > self._chunk[0][0]:
            self._runs.append(_Run())
        self._runs[-1].write(self._chunk)
        self._chunk = []

    def finish(self) -> "SortedRuns":
        """Write out the last chunk; the rows can now be read. Fewer rows than a chunk stay in
        memory, sorted, and no file is made."""
        if not self._runs:
            self._chunk.sort(key=_first)
            self._held, self._chunk = self._chunk, []
        self._flush()
        return self

    def __iter__(self) -> Iterator[tuple]:
        if self._chunk:
            raise RuntimeError("SortedRuns read before finish()")
        if self._held is not None:
            return iter(self._held)
        if len(self._runs) == 1:
            return self._runs[0].rows()
        return heapq.merge(*(run.rows() for run in self._runs), key=_first)

    def close(self) -> None:
        """Remove the run files."""
        for run in self._runs:
            run.file.close()
        self._runs = []
        self._chunk = []
        self._held = None

    def __enter__(self) -> "SortedRuns":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: A row's key (C's itemgetter: the sort key of every row, so no Python call per row).
_first = itemgetter(0)


__all__ = ["CHUNK_ROWS", "SortedRuns"]
