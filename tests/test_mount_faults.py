"""Faults under a mount: a dead or hung server gives EIO within --timeout, then the mount
recovers; an object replaced after mounting gives EIO, never mixed bytes."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from servers import start_moto
from test_mount_support import REPO, alive, mounted, put_objects, s3_client, wait_for

BUCKET = "mount-faults"
TIMEOUT = 3.0


def _objects() -> dict[str, bytes]:
    rng = random.Random(11)
    return {f"f{i}.bin": rng.randbytes(50_000 + i) for i in range(6)} | {"big.bin": rng.randbytes(3 << 20)}


def _pread_errno(path: Path, offset: int) -> int | None:
    """The errno of one 4 KiB read at ``offset`` (a random reader's: the file's first read is not at 0)."""
    try:
        with open(path, "rb", buffering=0) as handle:
            os.pread(handle.fileno(), 4096, offset)
    except OSError as err:
        return err.errno
    return None


def _read_errno(path: Path) -> int | None:
    try:
        path.read_bytes()
    except OSError as err:
        return err.errno
    return None


@pytest.fixture
def own_moto(tmp_path: Path):
    """A moto server for this test only: the test stops and restarts it."""
    server = start_moto(tmp_path)
    yield server
    server.stop()


def test_dead_server_gives_eio_within_timeout_then_recovers(own_moto, tmp_path: Path) -> None:
    objects = _objects()
    put_objects(own_moto.env, BUCKET, objects)
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", "--timeout", str(TIMEOUT), env=own_moto.env) as mnt:
        assert (mnt.path / "f0.bin").read_bytes() == objects["f0.bin"]
        port = own_moto.port
        own_moto.stop()

        started = time.monotonic()
        assert _read_errno(mnt.path / "f1.bin") == errno.EIO
        elapsed = time.monotonic() - started
        assert elapsed < TIMEOUT + 5, f"EIO after {elapsed:.1f} s (--timeout {TIMEOUT})"
        assert (mnt.path / "f0.bin").read_bytes() == objects["f0.bin"]  # cached data still serves
        assert sorted(os.listdir(mnt.path))[:2] == ["big.bin", "f0.bin"]  # so does the tree

        restarted = start_moto(tmp_path, port=port)
        try:
            put_objects(restarted.env, BUCKET, objects)  # same bytes, so the same ETags
            assert (mnt.path / "f1.bin").read_bytes() == objects["f1.bin"]
            assert (mnt.path / "big.bin").read_bytes() == objects["big.bin"]
            stats = mnt.stats()
            assert stats["request_errors"] >= 1 and stats["requests"] > stats["request_errors"]
        finally:
            restarted.stop()


def test_hung_server_gives_eio_within_timeout_then_recovers(own_moto, tmp_path: Path) -> None:
    objects = _objects()
    put_objects(own_moto.env, BUCKET, objects)
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", "--timeout", str(TIMEOUT), env=own_moto.env) as mnt:
        os.killpg(own_moto.proc.pid, signal.SIGSTOP)  # accepts connections, never answers
        try:
            started = time.monotonic()
            assert _read_errno(mnt.path / "f2.bin") == errno.EIO
            elapsed = time.monotonic() - started
            assert TIMEOUT - 0.5 <= elapsed < TIMEOUT + 3, elapsed
            # A random reader's miss (fetched on the FUSE thread that asked) times out the same way.
            started = time.monotonic()
            assert _pread_errno(mnt.path / "big.bin", 2 << 20) == errno.EIO
            assert TIMEOUT - 0.5 <= time.monotonic() - started < TIMEOUT + 3
        finally:
            os.killpg(own_moto.proc.pid, signal.SIGCONT)
        wait_for(lambda: _read_errno(mnt.path / "f2.bin") is None, 20, "reads to work again")
        assert (mnt.path / "f2.bin").read_bytes() == objects["f2.bin"]
        wait_for(lambda: _pread_errno(mnt.path / "big.bin", 2 << 20) is None, 20, "random reads to work again")
        with open(mnt.path / "big.bin", "rb", buffering=0) as handle:
            assert os.pread(handle.fileno(), 4096, 2 << 20) == objects["big.bin"][2 << 20 : (2 << 20) + 4096]
        assert mnt.stats()["read_timeouts"] >= 1


def test_object_replaced_after_mount_gives_eio_not_mixed_bytes(moto_server, tmp_path: Path) -> None:
    bucket = "mount-changed"
    objects = _objects()
    put_objects(moto_server.env, bucket, objects)
    client = s3_client(moto_server.env)
    with mounted(f"s3://{bucket}", tmp_path / "mnt", env=moto_server.env) as mnt:
        big = objects["big.bin"]
        fd = os.open(mnt.path / "big.bin", os.O_RDONLY)
        try:
            assert os.pread(fd, 4096, 0) == big[:4096]  # the start is now cached
            client.put_object(Bucket=bucket, Key="big.bin", Body=b"Z" * len(big))
            client.put_object(Bucket=bucket, Key="f3.bin", Body=b"new contents")
            with pytest.raises(OSError) as caught:
                os.pread(fd, 4096, len(big) - 4096)  # not cached: a guarded GET fails
            assert caught.value.errno == errno.EIO
            assert os.pread(fd, 4096, 0) == big[:4096]  # what was read is still the old version
        finally:
            os.close(fd)
        assert _read_errno(mnt.path / "f3.bin") == errno.EIO
        assert os.stat(mnt.path / "f3.bin").st_size == len(objects["f3.bin"])  # the listing is immutable


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline and alive(int(entry)):
                found.append(int(entry))
    return found


def test_ctrl_c_while_listing_leaves_no_daemon_and_no_mount(own_moto, tmp_path: Path) -> None:
    put_objects(own_moto.env, BUCKET, {"x.bin": b"x"})
    mountpoint = tmp_path / "mnt-interrupted"
    mountpoint.mkdir()
    os.killpg(own_moto.proc.pid, signal.SIGSTOP)  # the listing hangs
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lading", "mount", f"s3://{BUCKET}", str(mountpoint)],
            cwd=REPO,
            env={**os.environ, **own_moto.env},
            stderr=subprocess.PIPE,
            text=True,
        )
        # the command and its daemon (a forked copy with the same command line) are both up
        wait_for(lambda: len(_processes_mentioning(str(mountpoint))) >= 2, 20, "the daemon to start")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 130 and "interrupted" in err
        wait_for(lambda: not _processes_mentioning(str(mountpoint)), 20, "the daemon to be stopped")
        assert not os.path.ismount(mountpoint)
    finally:
        os.killpg(own_moto.proc.pid, signal.SIGCONT)
