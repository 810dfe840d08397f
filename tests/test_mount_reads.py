"""Reads through a real mount of a moto bucket are byte-identical, however they are made."""

from __future__ import annotations

import errno
import mmap
import multiprocessing
import os
import random
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_mount_support import mounted, put_objects

BUCKET = "mount-reads"


def _bytes(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


OBJECTS: dict[str, bytes] = {
    "empty.bin": b"",
    "one.txt": b"x",
    "small/a.bin": _bytes(1, 100_000),
    "small/b.bin": _bytes(2, 70_000),
    "large/seq.bin": _bytes(3, 5 * 1024 * 1024 + 123),  # beyond the small-file size: prefetch path
    "large/other.bin": _bytes(4, 3 * 1024 * 1024 + 7),
    "deep/x/y/z/leaf.txt": b"leaf\n",
    "empty-dir/": b"",  # a zero-byte marker alone: hidden (the store skips markers)
    "marked/": b"",
    "marked/inside.txt": b"inside\n",
    "clash": b"file that is also a prefix",  # hidden: the directory wins
    "clash/child.txt": b"child\n",
}
OBJECTS.update({f"many/{i:03d}.bin": _bytes(100 + i, 4096 + i) for i in range(40)})
VISIBLE = {k: v for k, v in OBJECTS.items() if not k.endswith("/") and k != "clash"}


@pytest.fixture(scope="module")
def mnt(moto_server, tmp_path_factory) -> Path:
    put_objects(moto_server.env, BUCKET, OBJECTS)
    root = tmp_path_factory.mktemp("reads") / "mnt"
    with mounted(f"s3://{BUCKET}", root, env=moto_server.env) as handle:
        yield handle.path


def test_whole_files_are_byte_identical(mnt: Path) -> None:
    for key, body in VISIBLE.items():
        assert (mnt / key).read_bytes() == body, key


def test_stat_sizes_modes_and_listing(mnt: Path) -> None:
    for key, body in VISIBLE.items():
        st = os.stat(mnt / key)
        assert st.st_size == len(body) and stat.S_ISREG(st.st_mode), key
    assert sorted(os.listdir(mnt)) == ["clash", "deep", "empty.bin", "large", "many", "marked", "one.txt", "small"]
    assert os.listdir(mnt / "marked") == ["inside.txt"]
    assert (mnt / "clash").is_dir() and os.listdir(mnt / "clash") == ["child.txt"]
    assert (mnt / "deep/x/y/z").is_dir()
    assert len(os.listdir(mnt / "many")) == 40
    walked = {str(Path(d, f).relative_to(mnt)) for d, _, files in os.walk(mnt) for f in files}
    assert walked == set(VISIBLE)


def test_ranged_and_random_offset_reads(mnt: Path) -> None:
    body = OBJECTS["large/seq.bin"]
    rng = random.Random(7)
    fd = os.open(mnt / "large/seq.bin", os.O_RDONLY)
    try:
        for _ in range(60):
            offset = rng.randrange(0, len(body) + 10)
            size = rng.choice([1, 17, 4096, 65536, 300_000, 1 << 20])
            assert os.pread(fd, size, offset) == body[offset : offset + size], (offset, size)
        assert os.pread(fd, 100, len(body) - 10) == body[-10:]
        assert os.pread(fd, 100, len(body) + 5) == b""
    finally:
        os.close(fd)


def test_small_reads_through_a_file(mnt: Path) -> None:
    body = OBJECTS["large/other.bin"]
    chunks = []
    with open(mnt / "large/other.bin", "rb", buffering=0) as handle:
        while block := handle.read(12_345):
            chunks.append(block)
    assert b"".join(chunks) == body


def test_concurrent_threads(mnt: Path) -> None:
    keys = [k for k in VISIBLE if k.startswith(("many/", "large/", "small/"))] * 3
    random.Random(3).shuffle(keys)
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda k: (mnt / k).read_bytes() == VISIBLE[k], keys))
    assert all(results)


def _read_and_check(args: tuple[str, str]) -> tuple[str, bool]:
    root, key = args
    with open(os.path.join(root, key), "rb") as handle:
        data = handle.read()
    return key, data == VISIBLE[key]


def test_dataloader_pattern_many_worker_processes(mnt: Path) -> None:
    """Like torch DataLoader(num_workers=6): forked workers each open and read whole samples."""
    keys = sorted(k for k in VISIBLE if k.startswith(("many/", "small/")))
    epoch = [(str(mnt), k) for k in keys]
    with multiprocessing.get_context("fork").Pool(6) as pool:
        for _ in range(2):  # two epochs: the second is served by the kernel page cache
            results = dict(pool.map(_read_and_check, epoch, chunksize=3))
            assert results == {k: True for k in keys}


def test_mmap_reads(mnt: Path) -> None:
    body = OBJECTS["large/other.bin"]
    with open(mnt / "large/other.bin", "rb") as handle:
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            assert len(view) == len(body)
            assert view[:4096] == body[:4096]
            assert view[2_000_000:2_100_000] == body[2_000_000:2_100_000]
            assert view[-5:] == body[-5:]
            assert hashlib_digest(view[:]) == hashlib_digest(body)


def hashlib_digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    "operation",
    [
        lambda m: open(m / "new.txt", "w"),
        lambda m: open(m / "one.txt", "r+b"),
        lambda m: open(m / "one.txt", "ab"),
        lambda m: os.unlink(m / "one.txt"),
        lambda m: os.mkdir(m / "newdir"),
        lambda m: os.rmdir(m / "deep/x/y/z"),
        lambda m: os.rename(m / "one.txt", m / "two.txt"),
        lambda m: os.truncate(m / "one.txt", 0),
        lambda m: os.chmod(m / "one.txt", 0o777),
        lambda m: os.symlink("one.txt", m / "link"),
    ],
    ids=["create", "open-rw", "append", "unlink", "mkdir", "rmdir", "rename", "truncate", "chmod", "symlink"],
)
def test_writes_fail_with_erofs(mnt: Path, operation) -> None:
    with pytest.raises(OSError) as caught:
        operation(mnt)
    assert caught.value.errno == errno.EROFS
    assert (mnt / "one.txt").read_bytes() == b"x"


def test_missing_paths_are_enoent(mnt: Path) -> None:
    for path in ("nope", "small/nope.bin", "deep/x/nope/deeper", "empty-dir", "marked/x"):
        with pytest.raises(FileNotFoundError):
            os.stat(mnt / path)
    with pytest.raises(FileNotFoundError):
        open(mnt / "nope.txt", "rb")
    with pytest.raises(NotADirectoryError):
        os.listdir(mnt / "one.txt")
