"""The node cache's index of cached files (``datasets/.lading-entries``): appended lines read
incrementally by every process of the node, compacted so that it does not grow with the number
of downloads and removals over a long run, and never losing an appended line to a compaction."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from lading.core.atomic import write_atomically
from lading.sync.cache import EntryIndex


def empty_index(folder: Path) -> EntryIndex:
    index = EntryIndex(folder)
    assert index.current() == {}  # built from the records: none yet
    return index


def line_count(index: EntryIndex) -> int:
    return index.file.read_bytes().count(b"\n")


def test_churn_keeps_the_index_small_and_its_view_exact(tmp_path: Path) -> None:
    index, model = empty_index(tmp_path), {}
    for n in range(5_000):  # a long run: every shard downloaded, later evicted
        path = tmp_path / "loc" / f"shard-{n:05d}.tar"
        index.added(path, n)
        model[path] = n
        if n >= 8:
            old = tmp_path / "loc" / f"shard-{n - 8:05d}.tar"
            index.removed(old)
            del model[old]
        assert index.current() == model
    assert line_count(index) <= 2 * len(model) + EntryIndex.COMPACT_SLACK + 2
    assert EntryIndex(tmp_path).current() == model  # a process started now reads the compacted file


def test_a_process_reading_an_old_copy_sees_the_compacted_one_and_later_lines(tmp_path: Path) -> None:
    writer, reader = empty_index(tmp_path), EntryIndex(tmp_path)
    writer.added(tmp_path / "loc" / "keep", 7)
    assert reader.current() == {tmp_path / "loc" / "keep": 7}
    for n in range(EntryIndex.COMPACT_SLACK):
        writer.added(tmp_path / "loc" / f"gone-{n}", 1)
        writer.removed(tmp_path / "loc" / f"gone-{n}")
    before = os.stat(writer.file).st_ino
    writer.current()  # compacts
    assert os.stat(writer.file).st_ino != before and line_count(writer) == 1
    writer.added(tmp_path / "loc" / "new", 3)
    assert reader.current() == {tmp_path / "loc" / "keep": 7, tmp_path / "loc" / "new": 3}


def test_a_line_appended_while_the_index_is_replaced_lands_in_the_new_file(tmp_path: Path) -> None:
    index = empty_index(tmp_path)
    index.added(tmp_path / "loc" / "a", 1)
    old = os.open(index.file, os.O_RDONLY)
    fcntl.flock(old, fcntl.LOCK_EX)  # what a compaction holds while it rewrites the file
    appender = threading.Thread(target=index.added, args=(tmp_path / "loc" / "b", 2))
    appender.start()
    appender.join(0.2)  # the appender waits for the lock (not a synchronisation: it must still be waiting)
    assert appender.is_alive()
    write_atomically(index.file, "+ loc/a\t1\n")  # the compaction's rename
    fcntl.flock(old, fcntl.LOCK_UN)
    os.close(old)
    appender.join(10)
    assert not appender.is_alive()
    assert EntryIndex(tmp_path).current() == {tmp_path / "loc" / "a": 1, tmp_path / "loc" / "b": 2}
