#!/usr/bin/env python3
"""Start-up: how long ``lading cat`` / ``lading sync`` take from exec to their first request.

A TCP forwarder in front of the S3 server (RGW at 127.0.0.1:7480 by default) notes when the
command's first connection arrives; the time from ``Popen`` to that moment is the start-up, and
the command's total wall time and CPU (user + system of the child) are recorded beside it. Each
checkout runs as ``python -m lading`` from a tree of symlinks with the installed layout
(staging/ is ``lading``, cli/ and mounts/ inside it), so a baseline needs no virtualenv of its own.

    python bench/bench_startup.py --baseline /tmp/lading-base --rounds 10
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import boto3

REPO = Path(__file__).resolve().parent.parent
BUCKET = "bench-contract-startup"


def layout(root: Path) -> Path:
    """A directory whose ``lading`` package is ``root``'s code, as installed."""
    view = Path(tempfile.mkdtemp(prefix="lading-startup-"))
    (view / "lading").mkdir()
    for entry in (root / "staging").iterdir():
        (view / "lading" / entry.name).symlink_to(entry)
    (view / "lading" / "cli").symlink_to(root / "cli")
    (view / "lading" / "mounts").symlink_to(root / "mounts")
    return view


class FirstConnection:
    """Forwards TCP to ``upstream`` and notes when the first connection of a round arrives."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.first: float | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.server.accept()
            if self.first is None:
                self.first = time.monotonic()
            upstream = socket.create_connection(self.upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def run(view: Path, args: list[str], proxy: FirstConnection, env: dict[str, str]) -> tuple[float, float, float]:
    """(seconds to the first connection, wall seconds, CPU seconds) of one command."""
    proxy.first = None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "lading", *args],
        env=dict(env, PYTHONPATH=str(view)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd="/",
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"lading {' '.join(args)} failed: {done.stderr.decode()[-500:]}")
    first = (proxy.first - started) if proxy.first is not None else float("nan")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return first, wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="an older checkout")
    parser.add_argument("--endpoint", default="127.0.0.1:7480")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--bucket", default=BUCKET)
    options = parser.parse_args()
    bucket = options.bucket
    host, port = options.endpoint.split(":")
    keys = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    s3 = boto3.client(
        "s3",
        endpoint_url=f"http://{options.endpoint}",
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    for i in range(20):
        s3.put_object(Bucket=bucket, Key=f"data/{i:02d}.bin", Body=os.urandom(64 << 10))
    proxy = FirstConnection((host, int(port)))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        **keys,
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}",
    }
    for root in (options.baseline, REPO):  # as pip installs a wheel (this machine sets PYTHONDONTWRITEBYTECODE)
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(root / "staging"), str(root / "cli"), str(root / "mounts")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    views = {"baseline": layout(options.baseline), "new": layout(REPO)}
    dest = Path(tempfile.mkdtemp(prefix="lading-startup-dest-"))
    commands = {"cat": ["cat", f"s3://{bucket}/data/00.bin"], "sync": ["sync", f"s3://{bucket}/data", str(dest)]}
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for _ in range(options.rounds):  # alternating: both checkouts see the same machine load
        for command, args in commands.items():
            for name, view in views.items():
                if command == "sync":
                    subprocess.run(["rm", "-rf", str(dest)], check=True)
                results.setdefault((command, name), []).append(run(view, args, proxy, env))
    print(f"load average: {os.getloadavg()}")
    for (command, name), rows in results.items():
        first, wall, cpu = (statistics.median(column) for column in zip(*rows))
        print(
            f"lading {command:4} {name:8}: first request {first * 1000:6.0f} ms, wall {wall * 1000:6.0f} ms, "
            f"CPU {cpu * 1000:6.0f} ms (medians of {len(rows)})"
        )
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": f"data/{i:02d}.bin"} for i in range(20)]})


if __name__ == "__main__":
    main()
