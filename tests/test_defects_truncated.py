"""Issue 26, items 1 and 2: a truncated local shard and a truncated snapshot are errors that name
the file, never empty samples, a raw EOFError or "interrupted". Each test failed before its fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from lading.core.errors import ObjectChanged
from lading.datasets import PackedDataset, ShardDataset
from lading.pack import PackOptions, plan_pack, run_pack

# --- 1: a local shard cut short -------------------------------------------------------------------


@pytest.fixture
def pack_of_four(tmp_path: Path) -> Path:
    """A local pack of 24 samples in four shards; returns its index."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(24):
        (src / f"s{i:03d}.bin").write_bytes(bytes([i]) * 3000)
        (src / f"s{i:03d}.json").write_text(json.dumps({"i": i}))
    plan = plan_pack(str(src), str(tmp_path / "out"), PackOptions("ds", shard_size=20_000))
    run_pack(plan, str(src), str(tmp_path / "out"))
    index = tmp_path / "out" / "ds.index.json"
    assert len(json.loads(index.read_text())["shardlist"]) >= 4
    return index


def truncate_second_shard(index: Path) -> Path:
    shard = index.parent / json.loads(index.read_text())["shardlist"][1]["url"]
    os.truncate(shard, 5000)
    return shard


def test_shard_dataset_refuses_a_truncated_local_shard(pack_of_four):
    shard = truncate_second_shard(pack_of_four)
    with pytest.raises(ObjectChanged) as caught:
        list(ShardDataset(str(pack_of_four)))
    assert str(shard) in caught.value.message and "5000 bytes" in caught.value.message
    assert "re-pack" in caught.value.hint


def test_packed_dataset_refuses_a_truncated_local_shard(pack_of_four):
    shard = truncate_second_shard(pack_of_four)
    dataset = PackedDataset(str(pack_of_four))
    counts = [entry["nsamples"] for entry in json.loads(pack_of_four.read_text())["shardlist"]]
    assert dataset[0]["bin"] == bytes([0]) * 3000  # the first shard is whole
    with pytest.raises(ObjectChanged) as caught:
        dataset[counts[0] + counts[1] - 1]  # the last sample of the cut shard
    assert str(shard) in caught.value.message
    with pytest.raises(ObjectChanged):
        dataset.__getitems__([0, counts[0]])


def test_a_whole_copied_pack_still_reads(pack_of_four, tmp_path):
    """Only the size is compared: a copy with new modification times is the same pack."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in pack_of_four.parent.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    index = copy / pack_of_four.name
    assert len(list(ShardDataset(str(index)))) == 24
    assert PackedDataset(str(index))[23]["bin"] == bytes([23]) * 3000


# --- 2: a snapshot file cut short -----------------------------------------------------------------


@pytest.fixture
def cut_snapshot(tmp_path: Path, lading) -> tuple[Path, Path, Path]:
    """A snapshot of 2,000 local files, gzipped, whole and cut to half its bytes:
    (source, whole, cut)."""
    source = tmp_path / "many"
    source.mkdir()
    for i in range(2000):
        (source / f"object-with-a-longish-name-{i:05d}.txt").write_text(str(i))
    whole = tmp_path / "whole.snap.jsonl.gz"
    assert lading("snapshot", str(source), "-o", str(whole)).returncode == 0
    cut = tmp_path / "cut.snap.jsonl.gz"
    data = whole.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    return source, whole, cut


def one_line(result, code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lading: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["sync", "sync --snapshot", "cat", "snapshot diff"])
def test_a_truncated_snapshot_is_exit_2_naming_the_file(cut_snapshot, lading, tmp_path, command):
    source, whole, cut = cut_snapshot
    args = {
        "sync": ["sync", str(cut), str(tmp_path / "dest")],
        "sync --snapshot": ["sync", str(source), str(tmp_path / "dest"), "--snapshot", str(cut)],
        "cat": ["cat", str(cut)],
        "snapshot diff": ["snapshot", "diff", str(whole), str(cut)],
    }[command]
    line = one_line(lading(*args), 2)
    assert str(cut) in line and "truncated" in line
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("keep", [5, 30])
def test_a_snapshot_cut_within_its_first_line_is_still_read_as_one(cut_snapshot, lading, tmp_path, keep):
    """Named like a snapshot: not taken for a local file to copy (sync) or print (cat)."""
    _source, whole, cut = cut_snapshot
    cut.write_bytes(whole.read_bytes()[:keep])
    for args in (["sync", str(cut), str(tmp_path / "dest")], ["cat", str(cut)]):
        line = one_line(lading(*args), 2)
        assert str(cut) in line and "truncated" in line
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("command", ["cat", "sync --snapshot"])
def test_a_damaged_snapshot_is_exit_2_naming_the_file(cut_snapshot, lading, tmp_path, command):
    """The damage is found at the file's end; sync acts on no record before it (its selection
    reads the whole listing before the first transfer)."""
    source, whole, cut = cut_snapshot
    data = bytearray(whole.read_bytes())
    # The gzip trailer's CRC-32, flipped: damage found for certain. (A byte flipped inside the
    # deflate stream may still inflate, to records that differ; the file holds its time taken, so
    # which happens changed from run to run.)
    data[-8] ^= 0xFF
    cut.write_bytes(bytes(data))
    args = {
        "cat": ["cat", str(cut)],
        "sync --snapshot": ["sync", str(source), str(tmp_path / "dest"), "--snapshot", str(cut)],
    }[command]
    assert str(cut) in one_line(lading(*args), 2)
    assert not (tmp_path / "dest").exists()


def test_store_dataset_over_a_truncated_snapshot_is_a_usage_error(cut_snapshot):
    from lading.core.errors import UsageError
    from lading.datasets import StoreDataset

    _source, _whole, cut = cut_snapshot
    with pytest.raises(UsageError) as caught:
        StoreDataset(str(cut))
    assert str(cut) in caught.value.message
