"""Helpers shared by the mount tests: real mounts through the CLI, always cleaned up."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent


def wait_for(condition: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll ``condition`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    """Whether a process exists (and is not a zombie we could reap)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``lading`` in a subprocess."""
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "lading", *args], capture_output=True, text=True, env=full, cwd=REPO, timeout=timeout
    )


def force_unmount(mountpoint: Path) -> None:
    """Unmount whatever is mounted at ``mountpoint`` (teardown only)."""
    if os.path.ismount(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
    wait_for(lambda: not os.path.ismount(mountpoint), 10, f"{mountpoint} to be unmounted")


@dataclass
class Mounted:
    """A live mount made by ``lading mount`` (daemon mode)."""

    path: Path
    pid: int
    log: Path

    def unmount(self) -> None:
        """``lading unmount``, then wait for the daemon to exit."""
        result = cli("unmount", str(self.path))
        assert result.returncode == 0, result.stderr
        assert not os.path.ismount(self.path)
        wait_for(lambda: not alive(self.pid), 20, "the mount daemon to exit")

    def stats(self) -> dict:
        """Ask the daemon for its stats (SIGUSR1) and return the newest dump from the log."""
        before = self.log.read_text().count(" stats ")
        os.kill(self.pid, 10)
        wait_for(lambda: self.log.read_text().count(" stats ") > before, 10, "a stats dump")
        line = [ln for ln in self.log.read_text().splitlines() if " stats " in ln][-1]
        return json.loads(line.split(" stats ", 1)[1])


@contextlib.contextmanager
def mounted(uri: str, mountpoint: Path, *options: str, env: dict[str, str] | None = None) -> Iterator[Mounted]:
    """Mount ``uri`` at ``mountpoint`` for the block; always unmount and check nothing is left."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    log = mountpoint.parent / f"{mountpoint.name}.log"
    result = cli("mount", uri, str(mountpoint), "--json", "--log-file", str(log), *options, env=env)
    try:
        assert result.returncode == 0, f"mount failed: {result.stderr}\n{log.read_text() if log.exists() else ''}"
        # The command returns only once the mount is ready: no polling needed here.
        assert os.path.ismount(mountpoint)
        info = json.loads(result.stdout)
        handle = Mounted(mountpoint, info["pid"], log)
        yield handle
    finally:
        force_unmount(mountpoint)
    if result.returncode == 0:
        wait_for(lambda: not alive(handle.pid), 20, "the mount daemon to exit")
    assert not os.path.ismount(mountpoint)


def s3_client(env: dict[str, str]):
    """A boto3 client for the test server (test set-up only)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def put_objects(env: dict[str, str], bucket: str, objects: dict[str, bytes]) -> None:
    """Create ``bucket`` and upload ``objects``."""
    client = s3_client(env)
    client.create_bucket(Bucket=bucket)
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
