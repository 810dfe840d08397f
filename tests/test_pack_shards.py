"""lading pack, local to local: shards read back with tarfile to exactly the input, samples stay
together, output is deterministic, the index/manifest are right, bad names are refused."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tarfile
from pathlib import Path

import google_crc32c
import pytest
from lading.core.errors import ProblemFound, UnsafeKey, UsageError
from lading.pack import PackOptions, plan_pack, run_pack
from lading.pack.grouping import group_samples, split_name
from lading.pack.plan import cut_balanced
from lading.stores.base import ObjectInfo


def crc32c_of(data: bytes) -> str:
    """The CRC32C as an index records it (base64, big-endian), computed here independently."""
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def make_tree(root: Path) -> dict[str, bytes]:
    """A small dataset with the awkward cases: several members per sample, a big file (kernel copy
    path), an empty file, names over 100 bytes (ustar prefix / pax), non-ASCII names, dotted dirs."""
    files: dict[str, bytes] = {}
    for i in range(40):
        files[f"train/s{i:03d}.jpg"] = os.urandom(100 + 37 * i)
        files[f"train/s{i:03d}.cls"] = str(i % 7).encode()
        if i % 5 == 0:
            files[f"train/s{i:03d}.seg.png"] = os.urandom(900)
    files["train/big.bin"] = os.urandom(3 << 20)
    files["train/empty.txt"] = b""
    files["deep/" + "d" * 90 + "/" + "n" * 60 + ".json"] = b'{"long": 1}'
    files["x" * 140 + "/" + "y" * 120 + ".txt"] = b"pax path"
    files["unicodé/ñame.txt"] = "ü".encode()
    files["v1.2/img.jpg"] = b"dotted directory"
    for key, data in files.items():
        path = root.joinpath(*key.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def read_shards(directory: Path, name: str) -> list[list[tarfile.TarInfo]]:
    shards = sorted(directory.glob(f"{name}-*.tar"))
    result = []
    for shard in shards:
        with tarfile.open(shard) as archive:
            result.append(archive.getmembers())
    return result


def shard_contents(directory: Path, name: str) -> dict[str, bytes]:
    contents: dict[str, bytes] = {}
    for shard in sorted(directory.glob(f"{name}-*.tar")):
        with tarfile.open(shard) as archive:
            for member in archive.getmembers():
                assert member.name not in contents, f"{member.name} packed twice"
                contents[member.name] = archive.extractfile(member).read()
    return contents


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    source = tmp_path / "src"
    return source, make_tree(source)


def pack(source: Path, dest: Path, **options) -> dict:
    options.setdefault("name", "ds")
    plan = plan_pack(str(source), str(dest), PackOptions(**options))
    return run_pack(plan, str(source), str(dest)).summary()


def test_shards_read_back_to_exactly_the_input(tree, tmp_path):
    source, files = tree
    dest = tmp_path / "out"
    summary = pack(source, dest, shard_size=256 << 10)
    assert shard_contents(dest, "ds") == files
    assert len(summary["shards"]) == 3  # the 3 MiB file is a shard of its own
    for members in read_shards(dest, "ds"):
        for member in members:
            assert (member.mtime, member.uid, member.gid, member.mode) == (0, 0, 0, 0o644)
            assert member.isfile()


def test_members_of_a_sample_are_contiguous_in_one_shard(tree, tmp_path):
    source, _ = tree
    dest = tmp_path / "out"
    pack(source, dest, shard_size=64 << 10, shuffle=True, seed=3)
    seen_keys: set[str] = set()
    for members in read_shards(dest, "ds"):
        keys = [split_name(member.name)[0] for member in members]
        runs = [key for i, key in enumerate(keys) if i == 0 or keys[i - 1] != key]
        assert len(runs) == len(set(runs)), "a sample's members are interleaved with another's"
        assert not seen_keys & set(runs), "a sample is split across shards"
        seen_keys |= set(runs)
    assert "train/s005" in seen_keys


def test_index_and_manifest(tree, tmp_path):
    source, files = tree
    dest = tmp_path / "out"
    summary = pack(source, dest, shard_size=256 << 10, version="v2")
    folder = dest / "ds" / "v2"
    index = json.loads((folder / "ds.index.json").read_text())
    assert index["__kind__"] == "wids-shard-index-v1" and index["wids_version"] == 1
    assert index["name"] == "ds" and index["lading"]["version"] == "v2"
    urls = [shard["url"] for shard in index["shardlist"]]
    assert urls == [f"ds-{n:06d}.tar" for n in range(len(urls))]
    for shard in index["shardlist"]:
        path = folder / shard["url"]
        assert shard["filesize"] == path.stat().st_size
        assert shard["crc32c"] == crc32c_of(path.read_bytes())
        with tarfile.open(path) as archive:
            keys = {split_name(member.name)[0] for member in archive.getmembers()}
        assert shard["nsamples"] == len(keys)
    assert sum(shard["nsamples"] for shard in index["shardlist"]) == summary["samples"]
    assert summary["files"] == len(files)
    manifest = json.loads((folder / "ds.manifest.json").read_text())
    assert manifest[0] == {"prefix": str(folder) + "/"}
    offsets = index["lading"]["offsets"]
    assert offsets["crc32c"] == crc32c_of((folder / offsets["url"]).read_bytes())
    assert manifest[1:] == urls
    assert not list(folder.glob(".*")), "staging directory left behind"


def digests(directory: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.glob("*.tar"))}


def test_same_input_same_bytes(tree, tmp_path):
    source, _ = tree
    pack(source, tmp_path / "a", shard_size=128 << 10)
    os.utime(source / "train" / "s001.jpg", (1, 1))  # mtimes of the input don't matter
    pack(source, tmp_path / "b", shard_size=128 << 10)
    assert digests(tmp_path / "a") == digests(tmp_path / "b")
    assert len(digests(tmp_path / "a")) > 1


def test_seeded_shuffle_is_reproducible_and_seed_dependent(tree, tmp_path):
    source, files = tree
    pack(source, tmp_path / "s1", shard_size=128 << 10, shuffle=True, seed=1)
    pack(source, tmp_path / "s1again", shard_size=128 << 10, shuffle=True, seed=1)
    pack(source, tmp_path / "s2", shard_size=128 << 10, shuffle=True, seed=2)
    pack(source, tmp_path / "sorted", shard_size=128 << 10)
    assert digests(tmp_path / "s1") == digests(tmp_path / "s1again")
    assert digests(tmp_path / "s1") != digests(tmp_path / "s2")
    order = [m.name for members in read_shards(tmp_path / "s1", "ds") for m in members]
    assert order != [m.name for members in read_shards(tmp_path / "sorted", "ds") for m in members]
    assert shard_contents(tmp_path / "s2", "ds") == files


def test_shards_are_balanced_by_bytes(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    sizes = [(i * 7919) % 20_000 + 100 for i in range(300)]
    for i, size in enumerate(sizes):
        (source / f"f{i:04d}.bin").write_bytes(b"x" * size)
    summary = pack(source, tmp_path / "out", shard_size=600_000)
    shard_bytes = [shard["bytes"] for shard in summary["shards"]]
    assert len(shard_bytes) == -(-sum(shard_bytes) // 600_000)
    assert max(shard_bytes) - min(shard_bytes) < 40_000  # about two samples, not a leftover runt


def test_cut_balanced_never_splits_and_keeps_order():
    assert cut_balanced([10] * 10, 30) == [0, 2, 5, 7]  # 4 shards of 20-30, not 30/30/30/10
    assert cut_balanced([100, 1, 1, 1], 50) == [0, 1]  # one huge sample: its own shard, no runts
    assert cut_balanced([5], 1) == [0]
    assert cut_balanced([1] * 7, 100) == [0]


# --- grouping edge cases --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("a.jpg", ("a", "jpg")),
        ("dir/cat.0001.jpg", ("dir/cat", "0001.jpg")),
        ("v1.2/img.seg.png", ("v1.2/img", "seg.png")),
        ("a/b/c.tar.gz", ("a/b/c", "tar.gz")),
    ],
)
def test_split_name_follows_webdataset(name, expected):
    assert split_name(name) == expected


@pytest.mark.parametrize(
    "name, words",
    [
        (".DS_Store", "starts with a dot"),
        ("dir/.hidden.txt", "starts with a dot"),
        ("README", "no extension"),
        ("dir/Makefile", "no extension"),
        ("a.", "empty part"),
        ("a..b", "empty part"),
        ("a.jpg.", "empty part"),
        ("a.__key__", "starts with '__'"),
    ],
)
def test_refused_names(name, words):
    with pytest.raises(UsageError) as err:
        group_samples([ObjectInfo(name, 1, "v")])
    assert words in err.value.message and name in err.value.message


def info(key: str) -> ObjectInfo:
    return ObjectInfo(key, 1, "v")


def test_extensions_equal_but_for_case_are_refused():
    with pytest.raises(ProblemFound, match="same field 'jpg'"):
        group_samples([info("a.jpg"), info("a.JPG")])


def test_file_that_is_also_a_directory_is_refused():
    with pytest.raises(ProblemFound, match="also the directory"):
        group_samples([info("a.jpg"), info("a.jpg/b.txt")])


@pytest.mark.parametrize("key", ["../x.jpg", "a/../../x.jpg", "/etc/passwd.txt", "a//b.txt", "a\\b.txt"])
def test_escaping_names_are_refused(key):
    with pytest.raises(UnsafeKey):
        group_samples([info(key)])


def test_grouping_sorts_samples_and_members():
    samples = group_samples([info("b.txt"), info("a.txt"), info("a.JPG"), info("a.cls"), info("a-1.jpg")])
    assert [sample.key for sample in samples] == ["a", "a-1", "b"]
    assert [member.ext for member in samples[0].members] == ["cls", "JPG", "txt"]


def test_local_listing_matches_local_store(tree, tmp_path):
    from lading.pack.sources import list_local
    from lading.stores.local import LocalStore

    source, _ = tree
    (source / "link.txt").symlink_to(source / "train" / "s001.jpg")  # a link to a file counts
    (source / "linkdir").symlink_to(source / "train")  # a link to a directory is not followed
    (source / "broken.txt").symlink_to(tmp_path / "missing")
    expected = sorted((i.key, i.size, i.version) for i in LocalStore(source).list())
    assert sorted((i.key, i.size, i.version) for i in list_local(source)) == expected
    assert "link.txt" in {key for key, _, _ in expected}


def test_shards_written_in_many_pieces_are_identical(tree, tmp_path, monkeypatch):
    from lading.pack import execute

    source, files = tree
    pack(source, tmp_path / "whole", shard_size=256 << 10)
    monkeypatch.setattr(execute, "TASK_BYTES", 3000)  # several writers fill each shard
    plan = plan_pack(str(source), str(tmp_path / "pieces"), PackOptions("ds", shard_size=256 << 10))
    assert len(execute.split_tasks(plan, execute.TASK_BYTES)) > 3 * len(plan.shards)
    run_pack(plan, str(source), str(tmp_path / "pieces"))
    assert digests(tmp_path / "whole") == digests(tmp_path / "pieces")
    assert shard_contents(tmp_path / "pieces", "ds") == files


def test_name_that_is_not_utf8_is_refused(tmp_path, lading):
    source = tmp_path / "src"
    source.mkdir()
    (source / "good.txt").write_text("fine")
    with open(os.path.join(os.fsencode(source), b"bad\xff.txt"), "wb") as handle:
        handle.write(b"latin-1 name")
    result = lading("pack", str(source), str(tmp_path / "out"))
    assert result.returncode == 2
    assert "not valid UTF-8" in result.stderr and "Traceback" not in result.stderr


def test_member_over_8_gib_gets_a_pax_size(tmp_path):
    from lading.pack.tarformat import END_OF_ARCHIVE, member_header, padding

    size = (8 << 30) + 5  # more than the 11 octal digits of a ustar size field hold
    header = member_header("huge.bin", size)
    assert len(header) == 3 * 512  # pax header block, its record, then the ustar header
    path = tmp_path / "sparse.tar"
    with open(path, "wb") as handle:
        handle.write(header)
        handle.seek(len(header) + size + padding(size))  # a sparse file: nothing is written
        handle.write(END_OF_ARCHIVE)
    with tarfile.open(path) as archive:
        [member] = archive.getmembers()
    assert (member.name, member.size) == ("huge.bin", size)
