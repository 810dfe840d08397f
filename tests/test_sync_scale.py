"""Sync at scale: the plan streams (memory flat in the key count), a re-sync moves only what
changed, and rank sharding over a streamed listing is the rule it always was."""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from lading.core.errors import UnsafeKey
from lading.stores.base import ObjectInfo
from lading.stores.local import LocalStore
from lading.sync import SyncRequest, plan_only, run_sync
from lading.sync.plan import select_objects
from sync_fixtures import ListedStore

# The assignment of _objects() computed by lading 0e1558f (before the plan streamed), for world
# sizes 1..5 and both balances: sha256 of the JSON of _reference_assignment. The reference below
# reproduces it, and the streamed selection must match the reference.
EXPECTED_DIGEST = "cf164f602ddece3d486c85a546096ea781204298758e5567ea80c59cd7eaa250"


def _objects(count: int = 3000, seed: int = 27) -> list[ObjectInfo]:
    """Keys in several folders (some sharing prefixes like ``a`` / ``a-b`` / ``a/b``), sizes with ties."""
    rng = random.Random(seed)
    keys = set()
    while len(keys) < count:
        folder = rng.choice(["a", "a-b", "a.b", "b", "b/c", "img", "img-x", "z"])
        keys.add(f"{folder}/{rng.randrange(10**6):06d}{rng.choice(['.jpg', '.png', '', '-x'])}")
    return [
        ObjectInfo(key, rng.choice([0, 1, 7, 100, 4096, rng.randrange(10**6)]), f"v{i}")
        for i, key in enumerate(sorted(keys))
    ]


def _reference_owner(objects: list[ObjectInfo], world: int, balance: str) -> dict[str, int]:
    """The rule as documented: count: key i in sorted order -> rank i mod world; bytes: largest
    first (ties in key order) to the least-loaded rank (ties: lowest rank)."""
    if balance == "count":
        return {key: i % world for i, key in enumerate(sorted(o.key for o in objects))}
    loads = [(0, rank) for rank in range(world)]
    owner = {}
    for obj in sorted(objects, key=lambda o: (-o.size, o.key)):
        load, rank = heapq.heappop(loads)
        owner[obj.key] = rank
        heapq.heappush(loads, (load + obj.size, rank))
    return owner


def _reference_assignment(objects: list[ObjectInfo]) -> dict[str, dict[str, int]]:
    return {
        f"{balance}/{world}": _reference_owner(objects, world, balance)
        for balance in ("count", "bytes")
        for world in range(1, 6)
    }


def test_reference_is_the_old_assignment():
    blob = json.dumps(_reference_assignment(_objects()), sort_keys=True).encode()
    assert hashlib.sha256(blob).hexdigest() == EXPECTED_DIGEST


@pytest.mark.parametrize("balance", ["count", "bytes"])
def test_streamed_sharding_equals_the_rule(balance, monkeypatch, tmp_path):
    from lading.selection import runs

    monkeypatch.setattr(runs, "CHUNK_ROWS", 256)  # many runs: the merge is exercised
    objects = _objects()
    shuffled = objects[:]
    random.Random(5).shuffle(shuffled)
    for world in range(1, 6):
        owner = _reference_owner(objects, world, balance)
        for rank in range(world):
            request = SyncRequest(
                "mem://", tmp_path, distribution="sharded", balance=balance, rank=rank, world_size=world
            )
            with select_objects(ListedStore(shuffled), request) as selection:
                got = [info.key for info in selection.objects()]
            assert got == sorted(key for key, r in owner.items() if r == rank)


_PLAN_SCRIPT = """
import resource, sys
from pathlib import Path
from lading.stores.base import ObjectInfo
from lading.sync import SyncRequest, plan_only

class Generated:
    url = "mem://"
    def list_pages(self, prefix=""):  # ImageNet-like keys, in key order, a folder at a time
        per = int(sys.argv[1]) // 200
        for f in range(200):
            page = []
            for i in range(per):
                info = ObjectInfo(f"train/n{f:08d}/n{f:08d}_{i:06d}.JPEG", 110_000 + i, f"etag-{f}-{i}")
                page.append((info.key, info.size, info.version, info.mtime, info.md5, info.crc32c))
            yield page

with open(sys.argv[3], "w") as out:
    plan = plan_only(Generated(), SyncRequest("mem://", Path(sys.argv[2])))
    plan.write_json(out)
    plan.close()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _empty_tree(root: Path, count: int, folders: int = 200) -> list[str]:
    keys = []
    per = count // folders
    for f in range(folders):
        folder = root / f"d{f:03d}"
        folder.mkdir(parents=True)
        for i in range(per):
            open(folder / f"f{i:06d}.jpg", "wb").close()
            keys.append(f"d{f:03d}/f{i:06d}.jpg")
    return keys


def _plan_peak_kb(tmp_path: Path, count: int) -> int:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _PLAN_SCRIPT,
            str(count),
            str(tmp_path / f"dest{count}"),
            str(tmp_path / f"plan{count}.json"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    plan = json.loads((tmp_path / f"plan{count}.json").read_text())
    assert plan["totals"]["fetch_files"] == count and len(plan["to_fetch"]) == count
    return int(out.stdout.strip())


def test_plan_memory_does_not_grow_with_the_key_count(tmp_path):
    small = _plan_peak_kb(tmp_path, 20_000)
    large = _plan_peak_kb(tmp_path, 200_000)
    # the old planner held ~1.8 KB a key: +320 MB for the 180,000 more keys
    assert large - small < 24 * 1024, (small, large)


def _inodes(dest: Path) -> dict[str, int]:
    found = {}
    for directory, _, names in os.walk(dest):
        for name in names:
            if not name.startswith(".lading"):
                path = Path(directory, name)
                found[str(path.relative_to(dest))] = os.lstat(path).st_ino
    return found


@pytest.mark.parametrize(
    "count",
    [
        20_000,
        pytest.param(
            200_000,
            marks=pytest.mark.skipif(
                not os.environ.get("LADING_BIG_TESTS"), reason="set LADING_BIG_TESTS=1 (about a minute)"
            ),
        ),
    ],
)
def test_resync_moves_exactly_the_changed_keys(tmp_path, count):
    src, dest = tmp_path / "src", tmp_path / "dest"
    keys = _empty_tree(src, count)
    store = LocalStore(src)
    first = run_sync(store, SyncRequest(str(src), dest))
    assert first.failed == [] and first.files == count
    before = _inodes(dest)
    changed = sorted(random.Random(10).sample(keys, 10))
    for key in changed:
        (src / key).write_bytes(b"new")
    run_sync(store, SyncRequest(str(src), dest))
    after = _inodes(dest)
    assert sorted(after) == sorted(keys)
    assert sorted(key for key in keys if after[key] != before[key]) == changed  # replaced files only
    assert all((dest / key).read_bytes() == b"new" for key in changed)


def test_a_format_1_record_is_read_and_rewritten_as_format_2(tmp_path):
    from lading.sync.state import STATE_NAME

    src, dest = tmp_path / "src", tmp_path / "dest"
    _empty_tree(src, 4, folders=2)
    store = LocalStore(src)
    run_sync(store, SyncRequest(str(src), dest))
    rows = [json.loads(line) for line in (dest / STATE_NAME).read_text().splitlines()]
    assert rows[0]["format"] == 2 and [row[0] for row in rows[1:]] == sorted(row[0] for row in rows[1:])
    files = [dict(zip(("key", "size", "version", "mtime_ns", "local_size"), row)) for row in rows[1:]]
    (dest / STATE_NAME).write_text(json.dumps({"format": 1, "source": str(src), "files": files[::-1]}))
    before = _inodes(dest)
    assert run_sync(store, SyncRequest(str(src), dest)).skipped == 4 and _inodes(dest) == before  # all current
    (src / "d000" / "f000000.jpg").write_bytes(b"x")
    assert run_sync(store, SyncRequest(str(src), dest)).files == 1
    assert json.loads((dest / STATE_NAME).read_text().splitlines()[0])["format"] == 2


def test_the_documented_windows_are_the_code():
    from lading.selection import runs
    from lading.sync import apply, state

    text = (Path(__file__).parent.parent / "docs" / "commands" / "sync.md").read_text()
    assert f"at most {runs.CHUNK_ROWS:,} keys in memory" in text
    assert f"transfer engine {apply.FETCH_BATCH:,} at a time" in text
    assert f"batches of at most {state.JOURNAL_BATCH}\nlines or {state.JOURNAL_SECONDS} seconds" in text


def test_cat_walks_a_listing_without_holding_it():
    from lading.selection.stream import StreamRequest, select_stream

    class Counting:
        url = "mem://"
        listed = 0

        def list(self, prefix: str = ""):
            for i in range(100_000):
                Counting.listed += 1
                yield ObjectInfo(f"k{i:06d}", 1, "v")

    objects = select_stream(Counting(), StreamRequest("mem://", distribution="sharded", rank=1, world_size=3))
    assert Counting.listed == 2  # only up to this rank's first object, then as the stream is read
    keys = [info.key for info in objects]
    assert keys == [f"k{i:06d}" for i in range(1, 100_000, 3)] and Counting.listed == 100_000


def test_a_resync_plans_in_one_pass_and_refuses_before_writing(tmp_path, monkeypatch):
    """Into an existing DEST, the listing goes straight to the comparison: no selection is
    written to disk and read back (no row added to a run for a no-op); the selection's
    refusals still come before anything is written."""
    from lading.selection.runs import SortedRuns
    from lading.sync.state import STATE_NAME

    src, dest = tmp_path / "src", tmp_path / "dest"
    keys = _empty_tree(src, 400, folders=4)
    store = LocalStore(src)
    assert run_sync(store, SyncRequest(str(src), dest)).files == 400
    added = []
    original = SortedRuns.add
    monkeypatch.setattr(SortedRuns, "add", lambda runs, row: (added.append(row[0]), original(runs, row))[1])
    assert run_sync(store, SyncRequest(str(src), dest)).skipped == 400 and added == []
    index = (dest / STATE_NAME).read_bytes()
    (src / "d000" / "new.jpg").write_bytes(b"n")
    (src / ".lading-sync.json").write_bytes(b"{}")  # a reserved name: the selection is refused
    with pytest.raises(UnsafeKey, match="reserved"):
        run_sync(store, SyncRequest(str(src), dest))
    assert (dest / STATE_NAME).read_bytes() == index and not (dest / "d000" / "new.jpg").exists()
    assert sorted(_inodes(dest)) == sorted(keys)


def test_index_lines_out_of_order_or_damaged_are_dropped_and_fetched_again(tmp_path):
    """A re-sync compares each index line with the one it would record, and parses the others:
    a damaged line or one out of key order is dropped (its file fetched again), as before."""
    from lading.sync.state import STATE_NAME

    src, dest = tmp_path / "src", tmp_path / "dest"
    keys = _empty_tree(src, 6, folders=1)
    store = LocalStore(src)
    run_sync(store, SyncRequest(str(src), dest))
    header, *rows = (dest / STATE_NAME).read_text().splitlines(keepends=True)
    rows[0], rows[1] = rows[1], rows[0]  # keys[0] now follows keys[1]: out of order
    rows[3] = rows[3][:-5] + "\n"  # keys[3]: damaged
    (dest / STATE_NAME).write_text(header + "".join(rows))
    plan = plan_only(store, SyncRequest(str(src), dest))
    assert {f.info.key: f.reason for f in plan.to_fetch()} == {keys[0]: "untracked", keys[3]: "untracked"}
    assert plan.up_to_date_files == 4
    delete = plan_only(store, SyncRequest(str(src), dest, delete=True))
    assert list(delete.to_delete()) == []


def test_a_listing_out_of_key_order_is_planned_in_two_passes(tmp_path):
    objects = [ObjectInfo(f"k{i:03d}", 1, "v") for i in range(50)]
    shuffled = objects[::-1]
    dest = tmp_path / "dest"
    dest.mkdir()
    plan = plan_only(ListedStore(shuffled), SyncRequest("mem://", dest, distribution="sharded", rank=1, world_size=3))
    assert [f.info.key for f in plan.to_fetch()] == [info.key for info in objects][1::3]
    assert plan.totals()["listed"] == 50 and plan.totals()["matched"] == 50


def test_the_lines_a_resync_expects_are_the_index_lines(tmp_path):
    """A re-sync takes a page as up to date when DEST's index lines, verified against DEST's
    files, start as a fetch of its rows would record them (``_line_starts``): the two must be
    written alike, or every re-sync parses."""
    from lading.sync.plan import _line_starts
    from lading.sync.state import STATE_NAME
    from lading.sync.verify import verified

    src, dest = tmp_path / "src", tmp_path / "dest"
    _empty_tree(src, 6, folders=2)
    (src / "d000" / 'q"uo\te é.jpg').write_bytes(b"xyz")
    store = LocalStore(src)
    run_sync(store, SyncRequest(str(src), dest))
    rows = [row for page in store.list_pages() for row in page]
    lines = (dest / STATE_NAME).read_text().splitlines(keepends=True)[1:]
    assert len(lines) == len(rows) == 7
    assert list(verified(str(dest), lines)) == _line_starts(rows)
    assert all(line.startswith(start[:-1]) for line, start in zip(lines, _line_starts(rows)))


def test_a_local_listing_comes_a_folder_at_a_time_in_key_order(tmp_path):
    """The planner checks a page at a time: a local listing's pages are the runs of one
    folder's files between its subfolders, in key order ("a-b" < "a/..." < "a0")."""
    for key in ("b", "a0", "a-b", "a/y/z", "a/x", "a/w"):
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_bytes(b"")
    pages = [[row[0] for row in page] for page in LocalStore(tmp_path).list_pages()]
    assert pages == [["a-b"], ["a/w", "a/x"], ["a/y/z"], ["a0", "b"]]


@pytest.mark.parametrize("per_page", [1, 2, 3, 5, 100])
def test_the_checks_of_a_page_are_the_checks_of_each_key(tmp_path, per_page):
    """Keys checked a page at a time are refused or kept exactly as when checked one by one,
    whichever page a clash's two keys fall in."""
    from sync_fixtures import pages_of

    class Paged(ListedStore):
        def list_pages(self, prefix: str = ""):
            return pages_of(self.objects, per_page)

    clean = ["a", "a-1", "a.b/c", "b", "c/d", "c0", "d/e/f", "d/e0"]
    objects = [ObjectInfo(key, 1, "v") for key in clean]
    with select_objects(Paged(objects), SyncRequest("mem://", tmp_path)) as selection:
        assert [info.key for info in selection.objects()] == clean
    clashing = sorted([*clean, "a/x", "c0/y", "dir/", "e/../f"])  # two clashes, a marker, an unsafe key
    with pytest.raises(UnsafeKey) as caught:
        select_objects(Paged([ObjectInfo(key, 0, "v") for key in clashing]), SyncRequest("mem://", tmp_path))
    assert caught.value.message.startswith("3 unsafe key(s)")
    for part in (
        "'e/../f'",
        "'a' is a file and also the directory of 'a/x'",
        "'c0' is a file and also the directory of 'c0/y'",
    ):
        assert part in caught.value.message


@pytest.fixture(params=["here", "helper"])
def verifier(request, monkeypatch):
    """DEST's index verified in the planner's thread (a small index), or by the helper process
    (any index, with the threshold at 0); yields the helpers started."""
    from lading.sync import plan

    started: list[str] = []
    if request.param == "helper":
        monkeypatch.setattr(plan, "_VERIFY_APART", 0)
        real = plan._start_verifier
        monkeypatch.setattr(plan, "_start_verifier", lambda path, root: started.append(root) or real(path, root))
    return request.param, started


def test_files_changed_in_dest_are_found_by_either_verifier(tmp_path, verifier):
    """Whoever checks DEST's files against the index (here or the helper process), a file
    changed, removed or replaced in DEST behind lading's back is fetched again with the same
    reason, an untracked file is not taken for lading's, and the rest is up to date."""
    from lading.sync.state import STATE_NAME

    src, dest = tmp_path / "src", tmp_path / "dest"
    keys = _empty_tree(src, 40, folders=4)
    store = LocalStore(src)
    assert run_sync(store, SyncRequest(str(src), dest)).files == 40
    (dest / keys[0]).write_bytes(b"edited")
    (dest / keys[1]).unlink()
    os.utime(dest / keys[2], ns=(1, 1))
    (dest / keys[3]).unlink()
    (dest / keys[3]).mkdir()
    (dest / keys[4]).unlink()
    (dest / keys[4]).symlink_to(dest / keys[5])
    (src / keys[6]).write_bytes(b"new")
    (src / "d001" / "extra.jpg").write_bytes(b"")  # in DEST too, put there by someone else
    (dest / "d001" / "extra.jpg").write_bytes(b"")
    header, *rows = (dest / STATE_NAME).read_text().splitlines(keepends=True)
    rows[7] = rows[7][:-5] + "\n"  # keys[7]: damaged
    (dest / STATE_NAME).write_text(header + "".join(rows))
    plan = plan_only(store, SyncRequest(str(src), dest))
    assert {f.info.key: f.reason for f in plan.to_fetch()} == {
        keys[0]: "modified",
        keys[1]: "missing",
        keys[2]: "modified",
        keys[3]: "modified",
        keys[4]: "modified",
        keys[6]: "changed",
        keys[7]: "untracked",
        "d001/extra.jpg": "untracked",
    }
    assert plan.up_to_date_files == 33
    assert verifier[1] == ([str(dest)] if verifier[0] == "helper" else [])


def test_a_helper_that_fails_stops_the_sync_before_it_writes(tmp_path, monkeypatch):
    """A helper process that dies before the index's end must not pass for an index that ended
    (every file after it would be fetched again as untracked): the sync stops, nothing written."""
    from lading.core.errors import LadingError
    from lading.sync import plan
    from lading.sync.state import STATE_NAME

    src, dest = tmp_path / "src", tmp_path / "dest"
    _empty_tree(src, 40, folders=4)
    store = LocalStore(src)
    run_sync(store, SyncRequest(str(src), dest))
    index = (dest / STATE_NAME).read_bytes()
    dying = "import sys; sys.stdin.readline(); sys.stdout.write(sys.stdin.readline()); sys.exit('it broke')"
    monkeypatch.setattr(plan, "_VERIFY_APART", 0)
    monkeypatch.setattr(plan, "_verifier_argv", lambda root: [sys.executable, "-c", dying])
    before = _inodes(dest)
    with pytest.raises(LadingError, match="exit 1: it broke"):
        run_sync(store, SyncRequest(str(src), dest))
    assert _inodes(dest) == before and (dest / STATE_NAME).read_bytes() == index


def test_a_no_op_resync_stats_nothing_beside_the_verifier(tmp_path, verifier, monkeypatch):
    """With nothing changed, every page is up to date from its verified lines: the planner makes
    no ``stat`` of its own (one per file in all, the verifier's)."""
    from lading.sync import plan

    src, dest = tmp_path / "src", tmp_path / "dest"
    _empty_tree(src, 40, folders=4)
    store = LocalStore(src)
    run_sync(store, SyncRequest(str(src), dest))
    pages: list[int] = []
    real = plan._stat_page
    monkeypatch.setattr(plan, "_stat_page", lambda root, page: pages.append(len(page)) or real(root, page))
    assert run_sync(store, SyncRequest(str(src), dest)).skipped == 40 and pages == []
    (src / "d002" / "f000003.jpg").write_bytes(b"x")
    assert run_sync(store, SyncRequest(str(src), dest)).files == 1 and pages == []  # its line verified


def test_a_helper_that_can_not_run_leaves_the_check_to_the_planner(tmp_path, monkeypatch, caplog):
    """A helper that fails before its first line (an interpreter that can't run the script)
    costs nothing but a warning: the planner verifies the index itself, with the same plan."""
    from lading.sync import plan

    src, dest = tmp_path / "src", tmp_path / "dest"
    keys = _empty_tree(src, 40, folders=4)
    store = LocalStore(src)
    run_sync(store, SyncRequest(str(src), dest))
    (src / keys[5]).write_bytes(b"x")
    monkeypatch.setattr(plan, "_VERIFY_APART", 0)
    monkeypatch.setattr(plan, "_verifier_argv", lambda root: [sys.executable, "-c", "raise SystemExit('no')"])
    with caplog.at_level("WARNING", logger="lading"):
        summary = run_sync(store, SyncRequest(str(src), dest))
    assert (summary.files, summary.skipped) == (1, 39)
    assert "its helper process failed (exit 1: no)" in caplog.text
