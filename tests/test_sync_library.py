"""The sync library in-process: state record and journal, plan reasons, safety, node-cache rules."""

from __future__ import annotations

import os
from itertools import chain
from pathlib import Path

import pytest
from lading.core.errors import UnsafeKey
from lading.stores.base import ObjectInfo
from lading.stores.local import LocalStore
from lading.sync import SyncRequest, plan_only, run_sync, use_node_cache
from lading.sync.nodecache import cache_entry_name
from lading.sync.plan import matches_filters, select_objects
from lading.sync.state import JOURNAL_NAME, STATE_NAME, Entry, SyncState
from lading.transfer import TransferOptions
from sync_fixtures import ListedStore, read_tree


def make_source(root: Path, files: dict[str, bytes]) -> None:
    for key, body in files.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)


def test_journal_survives_a_kill_and_a_torn_line(tmp_path):
    state = SyncState(tmp_path)
    state.begin()
    state.record(Entry("a", 1, "v1", 10, 1))
    state.record(Entry("b", 2, "v2", 20, 2))
    state.forget(["a"])
    state.close()  # as if killed: no snapshot
    with open(tmp_path / JOURNAL_NAME, "a") as handle:
        handle.write('{"key": "c", "si')  # torn last line
    loaded = SyncState.load(tmp_path).entry_map()
    assert set(loaded) == {"b"} and loaded["b"].version == "v2"
    SyncState.load(tmp_path).save()
    assert not (tmp_path / JOURNAL_NAME).exists()
    assert set(SyncState.load(tmp_path).entry_map()) == {"b"}


def test_save_takes_a_journal_it_wrote_alone_from_memory(tmp_path, monkeypatch):
    """A run's own journal lines are folded into the index from memory: the journal is not read
    back and re-checked line by line (18-25 ms for 2,000 files at load 8)."""
    from lading.sync import state as state_module

    state = SyncState(tmp_path, "s3://b/p/")
    state.begin()
    for key in ("b", "a", "c", "a"):
        state.record(Entry(key, 1, f"v-{key}", 10, 1))
    state.forget(["c"])

    def no_read_back(path):
        raise AssertionError(f"{path} read back")

    monkeypatch.setattr(state_module, "_journal_runs", no_read_back)
    state.save()
    assert not (tmp_path / JOURNAL_NAME).exists()
    monkeypatch.undo()
    assert SyncState.load(tmp_path).entry_map() == {"a": Entry("a", 1, "v-a", 10, 1), "b": Entry("b", 1, "v-b", 10, 1)}


@pytest.mark.parametrize("own_lines", [0, 2, 50_000])
def test_save_reads_the_journal_when_a_killed_run_left_lines_or_memory_would_not_hold_them(
    tmp_path, monkeypatch, own_lines
):
    from lading.sync import state as state_module

    killed = SyncState(tmp_path)
    killed.begin()
    killed.record(Entry("old", 1, "v0", 10, 1))
    killed.close()  # as if killed: its line is in the journal only
    monkeypatch.setattr(state_module, "OWN_LINES", own_lines)
    state = SyncState.load(tmp_path)
    state.begin()
    for key in ("x", "y", "z"):
        state.record(Entry(key, 1, "v", 10, 1))
    state.save()
    assert sorted(SyncState.load(tmp_path).entry_map()) == ["old", "x", "y", "z"]


def test_save_of_a_run_held_in_memory_drops_unsafe_keys_as_the_journal_would(tmp_path):
    state = SyncState(tmp_path)
    state.begin()
    state.record(Entry("../escape", 1, "v", 10, 1))
    state.record(Entry("ok", 1, "v", 10, 1))
    state.save()
    assert sorted(SyncState.load(tmp_path).entry_map()) == ["ok"]


def test_save_without_changes_rewrites_nothing(tmp_path):
    state = SyncState(tmp_path)
    state.record(Entry("a", 1, "v", 1, 1))
    state.save()
    before = os.stat(tmp_path / STATE_NAME).st_mtime_ns
    SyncState.load(tmp_path).save()
    assert os.stat(tmp_path / STATE_NAME).st_mtime_ns == before


def test_plan_reasons_and_local_source_sync(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    files = {"x/1": b"one", "x/2": b"two", "y": b"why"}
    make_source(src, files)
    store = LocalStore(src)
    request = SyncRequest(str(src), dest)
    assert {f.reason for f in plan_only(store, request).to_fetch()} == {"new"}
    summary = run_sync(store, request)
    assert (summary.files, summary.failed) == (3, []) and read_tree(dest) == files
    (dest / "x/1").write_bytes(b"ONE")
    (dest / "y").unlink()
    (src / "x/2").write_bytes(b"TWO!")
    plan = plan_only(store, request)
    assert {f.info.key: f.reason for f in plan.to_fetch()} == {"x/1": "modified", "x/2": "changed", "y": "missing"}
    run_sync(store, request)
    assert read_tree(dest) == {"x/1": b"one", "x/2": b"TWO!", "y": b"why"}
    assert list(plan_only(store, request).to_fetch()) == []


def test_each_fetch_is_prepared_when_the_fetcher_takes_it(tmp_path):
    """The first fetch waits for its own folder only, not for a whole batch's: the fetcher takes
    the plan's items one at a time, and when it holds the first, the later keys' folders are not
    made yet (a first sync of 2,000 objects in 50 folders waited about 85 ms for them, load 8)."""
    from lading.sync.apply import store_fetcher
    from lading.sync.into import sync_into

    src, dest = tmp_path / "src", tmp_path / "dest"
    files = {f"d{i}/f": bytes([i]) for i in range(3)}
    make_source(src, files)
    store = LocalStore(src)
    request = SyncRequest(str(src), dest)
    folders_at_first: list[list[str]] = []
    fetch = store_fetcher(store)

    def fetcher(items, options, events):
        items = iter(items)
        first = next(items)
        folders_at_first.append(sorted(path.name for path in dest.iterdir() if path.is_dir()))
        return fetch(chain([first], items), options, events)

    with select_objects(store, request) as selection:
        summary = sync_into(fetcher, selection, request)
    assert folders_at_first == [["d0"]]
    assert (summary.files, summary.failed) == (3, []) and read_tree(dest) == files
    assert SyncState.load(dest).entry_map().keys() == files.keys()


def test_only_a_durable_sync_fsyncs_its_state_record(tmp_path, monkeypatch):
    """A kill loses nothing without fsync (the journal, atomic renames), so a default sync calls
    none: on ext4 an fsync of the index right after a large download waits for the download's
    data to reach the disk. ``durable`` fsyncs the files, their directory and the index."""
    src = tmp_path / "src"
    make_source(src, {"a": b"one", "d/b": b"two"})
    synced: list[str] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    store = LocalStore(src)
    summary = run_sync(store, SyncRequest(str(src), tmp_path / "plain"))
    assert (summary.files, summary.failed, synced) == (2, [], [])
    assert set(SyncState.load(tmp_path / "plain").entry_map()) == {"a", "d/b"}

    durable = tmp_path / "durable"
    run_sync(store, SyncRequest(str(src), durable), TransferOptions(durable=True))
    names = {os.path.basename(path) for path in synced}
    assert any(name.startswith("." + STATE_NAME) for name in names), synced  # the index's temporary
    assert {".a.lading-part", ".b.lading-part", "durable", "d"} <= names, synced


def test_reserved_names_markers_and_collisions():
    request = SyncRequest("mem://", Path("/nonexistent"))
    store = ListedStore([ObjectInfo("dir/", 0, "m"), ObjectInfo("ok", 1, "v")])
    selection = select_objects(store, request)
    assert [o.key for o in selection.objects()] == ["ok"] and selection.markers == 1
    with pytest.raises(UnsafeKey, match="reserved"):
        select_objects(ListedStore([ObjectInfo(".lading-sync.json", 1, "v")]), request)
    with pytest.raises(UnsafeKey, match="NUL"):
        select_objects(ListedStore([ObjectInfo("a\x00b", 1, "v")]), request)
    many = [ObjectInfo(f"../k{i}", 1, "v") for i in range(8)]
    with pytest.raises(UnsafeKey, match=r"8 unsafe key\(s\).*and 3 more"):
        select_objects(ListedStore(many), request)


def test_filters():
    assert matches_filters("a/b/c.jpg", ["*.jpg"], [])
    assert not matches_filters("a/b/c.png", ["*.jpg"], [])
    assert not matches_filters("tmp/c.jpg", ["*.jpg"], ["tmp/*"])
    assert matches_filters("anything", [], [])


def test_node_cache_rule_and_entry_names(tmp_path):
    assert use_node_cache(4, False, False, False)
    assert not use_node_cache(1, False, False, False)
    assert use_node_cache(1, True, False, False)
    assert not use_node_cache(4, True, True, False)
    assert not use_node_cache(4, True, False, True)
    base = SyncRequest("s3://bkt/p", tmp_path / "a")
    same = SyncRequest("s3://bkt/p", tmp_path / "b", rank=1, world_size=2)  # replicated: same entry
    assert cache_entry_name(base) == cache_entry_name(same)
    assert cache_entry_name(base) != cache_entry_name(SyncRequest("s3://bkt/p", tmp_path, include=("*.x",)))
    shard0 = SyncRequest("s3://bkt/p", tmp_path, distribution="sharded", rank=0, world_size=2)
    shard1 = SyncRequest("s3://bkt/p", tmp_path, distribution="sharded", rank=1, world_size=2)
    assert cache_entry_name(shard0) != cache_entry_name(shard1)
    assert cache_entry_name(base).startswith("bkt_p-")


def test_delete_never_follows_symlinks_or_tampered_records(tmp_path):
    src, dest, outside = tmp_path / "src", tmp_path / "dest", tmp_path / "outside"
    make_source(src, {"a/x": b"1", "b": b"2"})
    outside.mkdir()
    (outside / "x").write_bytes(b"precious")
    (outside / "victim").write_bytes(b"precious")
    store = LocalStore(src)
    run_sync(store, SyncRequest(str(src), dest))
    # a tampered record naming files outside DEST (in the index and in the journal), and a
    # directory swapped for a symlink
    header, *rows = (dest / STATE_NAME).read_text().splitlines(keepends=True)
    (outside / "indexed").write_bytes(b"precious")
    tampered = '["../outside/indexed",1,"v",1,1]\n'  # sorts before "a/x": a row --delete walks past
    (dest / STATE_NAME).write_text(header + tampered + "".join(rows))
    with open(dest / JOURNAL_NAME, "a") as handle:
        handle.write('{"key": "../outside/victim", "size": 1, "version": "v", "mtime_ns": 1, "local_size": 1}\n')
    import shutil

    shutil.rmtree(dest / "a")
    (dest / "a").symlink_to(outside)
    (src / "a" / "x").unlink()
    summary = run_sync(store, SyncRequest(str(src), dest, delete=True))
    assert (outside / "x").read_bytes() == b"precious"
    assert (outside / "victim").read_bytes() == b"precious"
    assert (outside / "indexed").read_bytes() == b"precious"
    assert summary.failed == [] and (dest / "b").read_bytes() == b"2"
    assert "a/x" not in SyncState.load(dest).entry_map()


def test_snapshot_write_failure_is_one_line_and_leaves_no_temporary(tmp_path):
    import pytest
    from lading.core.errors import LadingError

    (tmp_path / STATE_NAME).mkdir()  # the rename onto it fails
    state = SyncState(tmp_path)
    state.record(Entry("a", 1, "v1", 5, 1))
    with pytest.raises(LadingError, match="cannot write"):
        state.save()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([STATE_NAME, JOURNAL_NAME])
    assert set(SyncState.load(tmp_path).entry_map()) == {"a"}  # still in the journal


def test_what_is_in_a_keys_way_fails_that_key_only(tmp_path):
    """A directory where a key's file goes, a file or a symlink where its folder goes: that key
    fails with a one-line reason, nothing is followed, and the other keys arrive."""
    src, dest, outside = tmp_path / "src", tmp_path / "dest", tmp_path / "outside"
    make_source(src, {"a/dir.bin": b"1", "b/x.bin": b"2", "c/y.bin": b"3", "d/ok.bin": b"4", "ok.bin": b"5"})
    (dest / "a" / "dir.bin").mkdir(parents=True)
    (dest / "b").write_bytes(b"mine")
    outside.mkdir()
    (dest / "c").symlink_to(outside)
    summary = run_sync(LocalStore(src), SyncRequest(str(src), dest))
    reasons = {failed.key: failed.error for failed in summary.failed}
    assert sorted(reasons) == ["a/dir.bin", "b/x.bin", "c/y.bin"]
    assert "a local directory" in reasons["a/dir.bin"] and "in the way" in reasons["a/dir.bin"]
    assert "not a directory" in reasons["b/x.bin"] and "a symlink" in reasons["c/y.bin"]
    assert list(outside.iterdir()) == [] and (dest / "b").read_bytes() == b"mine"
    assert (dest / "d" / "ok.bin").read_bytes() == b"4" and (dest / "ok.bin").read_bytes() == b"5"
