"""Mount lifecycle: ready on return, clean unmount by command and by signal, automatic unmount
when the daemon dies, foreground mode, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_mount_support import REPO, alive, cli, force_unmount, mounted, put_objects, wait_for

BUCKET = "mount-life"
OBJECTS = {"a.txt": b"alpha\n", "d/b.bin": bytes(range(256)) * 400}


@pytest.fixture(scope="module")
def bucket(moto_server) -> dict[str, str]:
    put_objects(moto_server.env, BUCKET, OBJECTS)
    return moto_server.env


def _stats_lines(log: Path) -> list[dict]:
    return [json.loads(line.split(" stats ", 1)[1]) for line in log.read_text().splitlines() if " stats " in line]


def test_mount_is_ready_on_return_and_unmount_leaves_nothing(bucket, tmp_path: Path) -> None:
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", env=bucket) as mnt:
        assert (mnt.path / "a.txt").read_bytes() == b"alpha\n"
        assert alive(mnt.pid)
        mnt.unmount()
        assert not os.path.ismount(mnt.path) and os.listdir(mnt.path) == []
        final = _stats_lines(mnt.log)[-1]  # dumped at unmount
        assert final["bytes_served"] == len(b"alpha\n") and final["opens"] == 1


def test_sigusr1_dumps_stats(bucket, tmp_path: Path) -> None:
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", env=bucket) as mnt:
        (mnt.path / "d/b.bin").read_bytes()
        stats = mnt.stats()
        assert stats["requests"] == 1 and stats["bytes_fetched"] == len(OBJECTS["d/b.bin"])
        assert stats["ttfb_ms"]["n"] == 1 and alive(mnt.pid)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_unmount_cleanly(bucket, tmp_path: Path, signum: int) -> None:
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", env=bucket) as mnt:
        os.kill(mnt.pid, signum)
        wait_for(lambda: not os.path.ismount(mnt.path), 15, "the mount to go away")
        wait_for(lambda: not alive(mnt.pid), 15, "the daemon to exit")
        assert "unmounted" in mnt.log.read_text()


def test_killed_daemon_is_unmounted_automatically(bucket, tmp_path: Path) -> None:
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", env=bucket) as mnt:
        os.kill(mnt.pid, signal.SIGKILL)
        wait_for(lambda: not os.path.ismount(mnt.path), 15, "auto_unmount after SIGKILL")
        assert os.listdir(mnt.path) == []  # no "Transport endpoint is not connected"


def test_foreground_stays_attached_until_ctrl_c(bucket, tmp_path: Path) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    env = {**os.environ, **bucket}
    log = tmp_path / "fg.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lading",
            "mount",
            f"s3://{BUCKET}",
            str(mountpoint),
            "--foreground",
            "--log-file",
            str(log),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: os.path.ismount(mountpoint) or proc.poll() is not None, 30, "the foreground mount")
        assert proc.poll() is None
        assert (mountpoint / "a.txt").read_bytes() == b"alpha\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "mounted s3://mount-life at" in err
        assert _stats_lines(log)[-1]["bytes_served"] == len(b"alpha\n")  # dumped at unmount
        assert not os.path.ismount(mountpoint)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        force_unmount(mountpoint)


def test_local_directory_source(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "x/y").mkdir(parents=True)
    (src / "x/y/z.txt").write_text("zed")
    with mounted(str(src), tmp_path / "mnt") as mnt:
        assert (mnt.path / "x/y/z.txt").read_text() == "zed"


def test_bad_input_is_a_one_line_error_and_nothing_is_mounted(bucket, tmp_path: Path) -> None:
    target = tmp_path / "mnt"
    target.mkdir()
    (tmp_path / "file").write_text("not a directory")
    cases = [
        (["mount", f"s3://{BUCKET}", str(tmp_path / "missing")], 3, "does not exist"),
        (["mount", "s3://no-such-bucket-here", str(target), "--timeout", "2"], 3, "no-such-bucket-here"),
        (["mount", "ftp://x/y", str(target)], 2, "unsupported scheme"),
        (["mount", f"s3://{BUCKET}", str(target), "--max-memory", "12Q"], 2, "invalid size"),
        (
            ["mount", f"s3://{BUCKET}", str(target), "--distribution", "sharded", "--rank", "3", "--world-size", "2"],
            2,
            "rank",
        ),
        (
            ["mount", f"s3://{BUCKET}", str(target), "--cache-dir", str(tmp_path / "file" / "cache")],
            2,
            "as the disk cache",
        ),
        (["mount", f"s3://{BUCKET}", str(target), "--log-file", str(tmp_path / "file" / "log")], 2, "log file"),
        (["mount", f"s3://{BUCKET}", str(target), "-f", "--log-file", str(tmp_path / "file" / "log")], 2, "log file"),
        (["unmount", str(target)], 3, "not a mount point"),
    ]
    for args, code, text in cases:
        result = cli(*args, env=bucket)
        assert result.returncode == code, (args, result.stderr)
        assert text in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
        assert not os.path.ismount(target)


def test_a_cache_dir_on_a_read_only_file_system_is_exit_4(bucket, tmp_path: Path, read_only_mount: Path) -> None:
    # As everywhere else (README: "a destination you may not write (a read-only file system too)").
    # It was exit 2 for a new folder there and exit 4 for the mount's root itself.
    target = tmp_path / "mnt"
    target.mkdir()
    for cache in (read_only_mount / "cache", read_only_mount):
        result = cli("mount", f"s3://{BUCKET}", str(target), "--cache-dir", str(cache), env=bucket)
        assert result.returncode == 4, (cache, result.stderr)
        assert len(result.stderr.splitlines()) == 1 and str(cache) in result.stderr, result.stderr
        assert not os.path.ismount(target)


def test_unmount_refuses_a_mount_that_is_not_fuse(read_only_mount: Path) -> None:
    # As root, fusermount3 -u unmounts anything: `lading unmount /data` took away a tmpfs (or an
    # NFS share, a bind mount), and `lading unmount /proc` tried. Non-root fusermount refuses it.
    result = cli("unmount", str(read_only_mount))
    assert result.returncode == 2, result.stderr
    assert "not a FUSE mount" in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert os.path.ismount(read_only_mount)
    assert "2 a mount that is not" in cli("unmount", "--help").stdout


def test_a_mount_point_given_through_a_symlink(tmp_path: Path) -> None:
    # /mnt/data -> /scratch/data: the kernel mounts on the link's target, and lading waited for
    # the link itself to become a mount point ("did not appear as a mount point within 10s", exit 1).
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("alpha")
    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    try:
        result = cli("mount", str(src), str(link), timeout=60)
        assert result.returncode == 0, result.stderr
        assert os.path.ismount(tmp_path / "real") and (link / "a.txt").read_text() == "alpha"
        result = cli("unmount", str(link))
        assert result.returncode == 0, result.stderr
        assert not os.path.ismount(tmp_path / "real")
    finally:
        force_unmount(tmp_path / "real")


def test_mounting_twice_is_refused(bucket, tmp_path: Path) -> None:
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", env=bucket) as mnt:
        result = cli("mount", f"s3://{BUCKET}", str(mnt.path), env=bucket)
        assert result.returncode == 2 and "already a mount point" in result.stderr
        assert (mnt.path / "a.txt").read_bytes() == b"alpha\n"


def test_busy_mount_is_refused_with_a_hint_then_unmounts(bucket, tmp_path: Path) -> None:
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", env=bucket) as mnt:
        with open(mnt.path / "a.txt", "rb") as handle:
            result = cli("unmount", str(mnt.path))
            assert result.returncode == 1 and "--lazy" in result.stderr
            assert os.path.ismount(mnt.path) and handle.read() == b"alpha\n"
        mnt.unmount()


def test_memory_budget_bounds_buffers(bucket, tmp_path: Path, moto_server) -> None:
    big = bytes(range(256)) * (6 * 4096)  # 6 MiB: sequential prefetch path
    put_objects(moto_server.env, "mount-budget", {"big.bin": big})
    with mounted("s3://mount-budget", tmp_path / "mnt", "--max-memory", "2MiB", env=bucket) as mnt:
        assert (mnt.path / "big.bin").read_bytes() == big
        stats = mnt.stats()
        # A budget smaller than the daemon itself: file data still gets the minimum, and keeps to it.
        assert stats["memory_budget"] == 2 << 20 and stats["memory_buffers"] == 16 << 20
        assert stats["memory_held"] <= stats["memory_buffers"]


def test_the_mount_device_is_found_without_a_request_to_the_mount(bucket, tmp_path: Path) -> None:
    """The daemon tunes its mount's readahead from /proc/self/mountinfo, not by stat-ing its own
    mount point: a daemon killed while such a stat waited on its own FUSE loop left a thread asleep
    in the kernel forever, holding the dead mount's connection open (seen once as a mount test that
    hung). Here the daemon is stopped, so nothing could answer a request to the mount."""
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", env=bucket) as mnt:
        st = os.stat(mnt.path)
        os.kill(mnt.pid, signal.SIGSTOP)
        try:
            code = (
                "import sys; from pathlib import Path; from lading.mounts.lifecycle import mount_device;"
                "print(mount_device(Path(sys.argv[1])), mount_device(Path(sys.argv[2])))"
            )
            probe = subprocess.run(
                [sys.executable, "-c", code, str(mnt.path), str(tmp_path)],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=REPO,
            )
        finally:
            os.kill(mnt.pid, signal.SIGCONT)
        assert probe.returncode == 0, probe.stderr
        assert probe.stdout.split() == [f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", "None"]


def test_the_kernel_readahead_is_raised_before_the_mount_is_reported_ready(bucket, tmp_path: Path) -> None:
    """A file opened right after ``lading mount`` returns gets the raised readahead (the kernel
    copies it into each file at open): set on a thread after the ready report, it lost that race
    in one of two cold 1 GiB reads at load 15, read as 8,192 FUSE reads of 128 KiB."""
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", env=bucket) as mnt:
        st = os.stat(mnt.path)
        knob = Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb")
        assert knob.read_text().strip() == "4096"
