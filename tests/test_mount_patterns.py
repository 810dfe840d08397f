"""What the mount fetches for each way of reading, counted at a proxy in front of the store: random
reads cost a small multiple of what they read, neighbouring misses are one GET, sequential reads run ahead in parallel, a small
file is one GET, and the daemon's memory stays within its budget however many files are read."""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from proxies import FaultProxy
from test_mount_support import mounted, put_objects, wait_for

BUCKET = "mount-patterns"
MiB = 1 << 20
BIG = 16 * MiB
READERS, EACH = 16, 12 * MiB


def _bytes(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


OBJECTS = {
    "big.bin": _bytes(1, BIG),
    "seq.bin": _bytes(2, 24 * MiB),
    "small.bin": _bytes(3, 64 << 10),
    **{f"walk/{i:03d}.bin": _bytes(100 + i, 20_000 + i) for i in range(40)},
    **{f"many/{i:02d}.bin": _bytes(200 + i, EACH) for i in range(READERS)},
}


@pytest.fixture(scope="module")
def bucket(moto_server) -> dict[str, str]:
    put_objects(moto_server.env, BUCKET, OBJECTS)
    return moto_server.env


@pytest.fixture
def proxy(moto_server, bucket):
    with FaultProxy(moto_server.url, latency=0.01) as proxy:
        yield proxy


def _mount(proxy: FaultProxy, tmp_path: Path, env: dict[str, str], *options: str):
    return mounted(f"s3://{BUCKET}", tmp_path / "mnt", "--endpoint-url", proxy.url, *options, env=env)


def _gets(proxy: FaultProxy, key: str) -> int:
    return proxy.count("GET", where=lambda seen: seen.path == f"/{BUCKET}/{key}")


def test_random_reads_fetch_at_most_four_times_what_they_read(proxy, bucket, tmp_path: Path) -> None:
    body = OBJECTS["big.bin"]
    rng = random.Random(5)
    offsets = [rng.randrange(BIG // 4096) * 4096 for _ in range(200)]
    with _mount(proxy, tmp_path, bucket) as mnt:
        proxy.reset_counts()
        fd = os.open(mnt.path / "big.bin", os.O_RDONLY)
        try:
            for offset in offsets:
                assert os.pread(fd, 4096, offset) == body[offset : offset + 4096]
        finally:
            os.close(fd)
        fetched = proxy.body_bytes[f"/{BUCKET}/big.bin"]
        assert 0 < fetched <= 4 * 4096 * len(offsets), fetched


def test_misses_a_small_gap_apart_are_one_get(proxy, bucket, tmp_path: Path) -> None:
    body, at = OBJECTS["big.bin"], 4 * MiB
    with _mount(proxy, tmp_path, bucket) as mnt:
        fd = os.open(mnt.path / "big.bin", os.O_RDONLY)
        try:
            # The daemon fetches the 16 KiB block around this 4 KiB and keeps the rest of it ...
            assert os.pread(fd, 4096, at + 16384) == body[at + 16384 : at + 20480]
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # ... which the kernel no longer has
            proxy.reset_counts()
            # Two misses with that block between them: one GET, not two.
            assert os.pread(fd, 49152, at) == body[at : at + 49152]
        finally:
            os.close(fd)
        assert _gets(proxy, "big.bin") == 1


def test_a_random_miss_never_waits_for_a_get_thread(proxy, bucket, tmp_path: Path) -> None:
    # One GET thread (--workers 1), held by another file's GET at the proxy: a random reader's miss
    # is fetched on the FUSE thread that asks for it, so it reaches the store meanwhile.
    body = OBJECTS["big.bin"]
    with _mount(proxy, tmp_path, bucket, "--workers", "1") as mnt, ThreadPoolExecutor(1) as pool:
        gate = proxy.gather(2, timeout=10.0)
        small = pool.submit((mnt.path / "small.bin").read_bytes)
        wait_for(lambda: gate.waiting == 1, 10, "the small file's GET to be held")
        fd = os.open(mnt.path / "big.bin", os.O_RDONLY)
        try:
            offset = 5 * MiB + 8192
            assert os.pread(fd, 4096, offset) == body[offset : offset + 4096]
        finally:
            os.close(fd)
        assert small.result() == OBJECTS["small.bin"]
        assert gate.together == 2  # both GETs were at the store at once


def test_a_random_miss_that_fails_once_is_asked_again(proxy, bucket, tmp_path: Path) -> None:
    body = OBJECTS["big.bin"]
    with _mount(proxy, tmp_path, bucket) as mnt:
        fd = os.open(mnt.path / "big.bin", os.O_RDONLY)
        try:
            proxy.reset_counts()
            proxy.add_fault("reset", first=1, method="GET")
            offset = 3 * MiB + 4096
            assert os.pread(fd, 4096, offset) == body[offset : offset + 4096]
        finally:
            os.close(fd)
        assert proxy.injected["reset"] == 1
        assert _gets(proxy, "big.bin") == 2


def test_a_sequential_reader_runs_ahead_in_parallel(proxy, bucket, tmp_path: Path) -> None:
    body = OBJECTS["seq.bin"]
    with _mount(proxy, tmp_path, bucket) as mnt:
        proxy.reset_counts()
        got = bytearray()
        with open(mnt.path / "seq.bin", "rb", buffering=0) as handle:
            while block := handle.read(MiB):
                got += block
        assert got == body
        # Several GETs at once (each held 10 ms by the proxy), none of them fetching a byte twice.
        assert proxy.peak_in_flight >= 3
        assert proxy.body_bytes[f"/{BUCKET}/seq.bin"] == len(body)
        assert _gets(proxy, "seq.bin") < len(body) // MiB  # parts larger than the reads


def _ranges(proxy: FaultProxy, key: str) -> list[tuple[int, int]]:
    """The byte ranges ``[start, end)`` of the GETs of ``key``, in order."""
    found = []
    for seen in list(proxy.requests):
        value = seen.headers.get("Range") if seen.method == "GET" and seen.path == f"/{BUCKET}/{key}" else None
        if value:
            first, last = value.removeprefix("bytes=").split("-")
            found.append((int(first), int(last) + 1))
    return sorted(found)


def test_a_sequential_readers_parts_are_whole(proxy, bucket, tmp_path: Path) -> None:
    # Once a reader streams, its readahead is topped up after each read: in whole parts on part
    # boundaries, not a short GET for whatever the window moved since the last top-up.
    body = OBJECTS["seq.bin"]
    with _mount(proxy, tmp_path, bucket) as mnt:
        proxy.reset_counts()
        with open(mnt.path / "seq.bin", "rb", buffering=0) as handle:
            assert b"".join(iter(lambda: handle.read(MiB), b"")) == body
        ranges = _ranges(proxy, "seq.bin")
    assert ranges[0][0] == 0 and ranges[-1][1] == len(body)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # every byte once
    # Once the window has grown (past the first 8 MiB), the GETs are parts of one size, each on a
    # multiple of it (the file's last one excepted).
    steady = [(s, e) for s, e in ranges if s >= 8 * MiB and e != len(body)]
    sizes = {e - s for s, e in steady}
    assert len(sizes) == 1 and all(s % (e - s) == 0 for s, e in steady), [(s / MiB, (e - s) / MiB) for s, e in ranges]


def test_a_small_file_is_one_get(proxy, bucket, tmp_path: Path) -> None:
    with _mount(proxy, tmp_path, bucket) as mnt:
        proxy.reset_counts()
        with open(mnt.path / "small.bin", "rb", buffering=0) as handle:
            assert handle.read(4096) == OBJECTS["small.bin"][:4096]  # the rest is fetched already
            assert handle.read() == OBJECTS["small.bin"][4096:]
        assert _gets(proxy, "small.bin") == 1
        assert proxy.count() == 1


def test_a_directory_walk_fetches_each_file_once(proxy, bucket, tmp_path: Path) -> None:
    walk = sorted(key for key in OBJECTS if key.startswith("walk/"))
    with _mount(proxy, tmp_path, bucket) as mnt:
        proxy.reset_counts()
        for key in walk:
            assert (mnt.path / key).read_bytes() == OBJECTS[key]
        assert [_gets(proxy, key) for key in walk] == [1] * len(walk)
        assert proxy.count() == len(walk)


def test_rss_stays_within_the_budget_with_sixteen_readers(proxy, bucket, tmp_path: Path) -> None:
    keys = sorted(key for key in OBJECTS if key.startswith("many/"))
    budget = 128 * MiB

    def read(key: str) -> bool:
        with open(mnt.path / key, "rb", buffering=0) as handle:
            return b"".join(iter(lambda: handle.read(MiB), b"")) == OBJECTS[key]

    with _mount(proxy, tmp_path, bucket, "--max-memory", "128MiB") as mnt:
        with ThreadPoolExecutor(READERS) as pool:
            assert all(pool.map(read, keys))
        stats = mnt.stats()
        peak = _peak_rss(mnt.pid)
    assert READERS * EACH > budget  # more than the budget was read at once
    assert stats["memory_held"] <= stats["memory_buffers"] < budget
    assert peak <= budget, f"daemon peak RSS {peak / MiB:.0f} MiB"


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")
