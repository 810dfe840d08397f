"""The write path's fast paths: tasks interleaved across shard files, tar headers filled in
place in the write buffer, write buffers reused between tasks, byte counts from workers, and
the listing's change check on (size, mtime_ns)."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

import pytest
from lading.core.errors import ObjectChanged, ProblemFound
from lading.pack import PackOptions, execute, plan_pack, run_pack, writer
from lading.pack.execute import WriteTask, interleave, split_tasks, write_shards
from lading.pack.grouping import group_samples
from lading.pack.sources import LocalSource
from lading.pack.tarformat import BLOCK, END_OF_ARCHIVE, RECORD, member_header
from lading.pack.upload import LocalPublisher
from lading.stores.base import ObjectInfo


def make_source(root: Path, count: int = 60) -> None:
    for i in range(count):
        folder = root / f"d{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:04d}.jpg").write_bytes(bytes([i % 251]) * (700 + 13 * i))
        (folder / f"{i:04d}.cls").write_bytes(str(i).encode())


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.glob("*.tar"))}


def test_interleave_takes_one_task_of_each_shard_in_turn():
    tasks = [
        WriteTask(shard, start, start + 1, 0, False)
        for shard, count in ((0, 3), (1, 1), (2, 2))
        for start in range(count)
    ]
    order = interleave(tasks)
    assert sorted(order) == list(range(len(tasks)))
    assert [(tasks[i].shard, tasks[i].start) for i in order] == [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1), (0, 2)]
    assert interleave([]) == []


def test_interleaved_write_reports_shards_in_order_and_every_byte(tmp_path, monkeypatch):
    source = tmp_path / "src"
    make_source(source)
    monkeypatch.setattr(execute, "TASK_BYTES", 4000)  # several tasks per shard
    plan = plan_pack(str(source), str(tmp_path / "a"), PackOptions("ds", shard_size=20_000))
    tasks = split_tasks(plan, execute.TASK_BYTES)
    assert len(plan.shards) >= 3 and len(tasks) > 2 * len(plan.shards)
    assert interleave(tasks) != list(range(len(tasks)))  # the order really changes
    out = tmp_path / "interleaved"
    out.mkdir()
    paths = [out / shard.name for shard in plan.shards]
    done, counted = [], []
    write_shards(plan, LocalSource(source), paths, counted.append, done.append)  # processes
    assert done == list(range(len(plan.shards)))
    assert sum(counted) == plan.input_bytes
    sequential = tmp_path / "sequential"
    sequential.mkdir()
    write_shards(
        plan,
        LocalSource(source),
        [sequential / s.name for s in plan.shards],
        lambda n: None,
        lambda n: None,
        processes_allowed=False,
        shards_ahead=1,
    )
    assert digests(out) == digests(sequential)


def test_threaded_write_counts_every_byte(tmp_path, monkeypatch):
    source = tmp_path / "src"
    make_source(source, 30)
    monkeypatch.setattr(execute, "TASK_BYTES", 3000)
    plan = plan_pack(str(source), str(tmp_path / "a"), PackOptions("ds", shard_size=15_000))
    out = tmp_path / "out"
    out.mkdir()
    counted: list[int] = []
    write_shards(
        plan,
        LocalSource(source),
        [out / s.name for s in plan.shards],
        counted.append,
        lambda n: None,
        processes_allowed=False,
    )
    assert sum(counted) == plan.input_bytes
    assert writer._SPARE_BUFFERS == []  # released once the pack is written


NAMES = [
    "a.txt",  # plain
    "d" * 96 + ".bin",  # exactly 100 bytes: the last name that fits the name field
    "p" * 60 + "/" + "q" * 60 + ".txt",  # 125 bytes: ustar prefix + name
    "x" * 140 + "/" + "y" * 120 + ".txt",  # no ustar split: pax path record
    "unicodé/ñame.txt",  # not ASCII: pax path record
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 5000])
def test_headers_filled_in_place_equal_member_header(tmp_path, name, size):
    data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    source = tmp_path / "member"
    source.write_bytes(data)
    shard = tmp_path / "shard.tar"
    fd = os.open(shard, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        with open(source, "rb") as handle:
            shard_writer = writer.ShardWriter(fd)
            shard_writer.add_file(name, handle.fileno(), size, str(source))
            end = shard_writer.finish()
    finally:
        os.close(fd)
    expected = member_header(name, size) + data + bytes(-size % BLOCK) + END_OF_ARCHIVE
    expected += bytes(-len(expected) % RECORD)
    assert shard.read_bytes() == expected and end == len(expected)
    with tarfile.open(shard) as archive:
        [member] = archive.getmembers()
        assert (member.name, archive.extractfile(member).read()) == (name, data)


def test_reused_buffer_carries_no_stale_bytes(tmp_path):
    noisy, quiet = tmp_path / "noisy", tmp_path / "quiet"
    noisy.write_bytes(b"\xff" * 300_000)
    quiet.write_bytes(b"q" * 700)
    writer.drop_spare_buffers()
    outputs = []
    buffers = []
    for source, count in ((noisy, 3), (quiet, 5)):
        shard = tmp_path / f"{source.name}.tar"
        fd = os.open(shard, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            shard_writer = writer.ShardWriter(fd)
            buffers.append(shard_writer._buffer)
            for i in range(count):
                with open(source, "rb") as handle:
                    shard_writer.add_file(f"m{i}.bin", handle.fileno(), source.stat().st_size, str(source))
            shard_writer.finish()
        finally:
            os.close(fd)
        outputs.append(shard.read_bytes())
    writer.drop_spare_buffers()
    assert buffers[0] is buffers[1]  # the second writer got the first one's buffer back
    expected = b"".join(member_header(f"m{i}.bin", 700) + b"q" * 700 + bytes(-700 % BLOCK) for i in range(5))
    expected += END_OF_ARCHIVE
    expected += bytes(-len(expected) % RECORD)
    assert outputs[1] == expected


def test_file_rewritten_with_the_same_size_is_refused(tmp_path):
    source, dest = tmp_path / "src", tmp_path / "out"
    make_source(source, 6)
    plan = plan_pack(str(source), str(dest), PackOptions("ds"))
    target = source / "d1" / "0004.jpg"
    size, mtime_ns = target.stat().st_size, target.stat().st_mtime_ns
    target.write_bytes(b"z" * size)  # same size, new content
    os.utime(target, ns=(mtime_ns + 7_000_000, mtime_ns + 7_000_000))
    with pytest.raises(ObjectChanged, match="0004.jpg changed"):
        run_pack(plan, str(source), str(dest))
    assert not (dest / "ds.index.json").exists()


def test_local_publisher_gets_interleaved_shards_complete(tmp_path, monkeypatch):
    source, dest = tmp_path / "src", tmp_path / "out"
    make_source(source)
    monkeypatch.setattr(execute, "TASK_BYTES", 5000)
    plan = plan_pack(str(source), str(dest), PackOptions("ds", shard_size=25_000))
    publisher = LocalPublisher(dest, plan)
    write_shards(
        plan,
        LocalSource(source),
        [publisher.shard_path(s) for s in plan.shards],
        lambda n: None,
        lambda number: publisher.commit_shard(plan.shards[number], publisher.shard_path(plan.shards[number])),
    )
    assert [shard.name for shard, _ in publisher._done] == [shard.name for shard in plan.shards]
    publisher.abort()


def test_three_members_two_in_one_field_are_refused():
    infos = [ObjectInfo(key, 1, "v") for key in ("a.jpg", "a.txt", "a.JPG")]
    with pytest.raises(ProblemFound, match="same field 'jpg'"):
        group_samples(infos)
    [sample] = group_samples([ObjectInfo(key, 1, "v") for key in ("a.txt", "a.Seg.png", "a.cls")])
    assert [member.ext for member in sample.members] == ["cls", "Seg.png", "txt"]


def test_listing_falls_back_entry_by_entry_when_a_stat_fails(tmp_path, monkeypatch):
    from lading.pack import sources
    from lading.stores.local import LocalStore

    source = tmp_path / "src"
    make_source(source, 9)
    (source / "d0" / "link.txt").symlink_to(source / "d1" / "0001.jpg")
    real_stat = os.stat
    failed: list[str] = []

    def stat_failing_once(path, *args, **kwargs):
        if kwargs.get("dir_fd") is not None and not failed:
            failed.append(path)
            raise FileNotFoundError(path)  # as if removed and re-created between scandir and stat
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(sources.os, "stat", stat_failing_once)
    listed = sorted((i.key, i.size, i.version) for i in sources.list_local(source))
    monkeypatch.undo()
    assert failed, "the fast path was not taken"
    assert listed == sorted((i.key, i.size, i.version) for i in LocalStore(source).list())


def test_file_removed_mid_directory_is_refused(tmp_path):
    source, dest = tmp_path / "src", tmp_path / "out"
    make_source(source, 12)
    plan = plan_pack(str(source), str(dest), PackOptions("ds"))
    (source / "d2" / "0008.jpg").unlink()  # not the first file of its directory's run
    with pytest.raises(ObjectChanged, match="0008.jpg disappeared"):
        run_pack(plan, str(source), str(dest))
    assert not (dest / "ds.index.json").exists()
