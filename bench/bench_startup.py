#!/usr/bin/env python3
"""Start-up: how long ``lading cat`` / ``lading sync`` take from exec to their first request.

A TCP forwarder in front of the S3 server (RGW at 127.0.0.1:7480 by default) notes when the
command's first connection arrives; the time from ``Popen`` to that moment is the start-up, and
the command's total wall time and CPU (user + system of the child) are recorded beside it. Each
checkout runs as ``python -m lading`` from a tree of symlinks with the installed layout
(staging/ is ``lading``, cli/ and mounts/ inside it), in a virtualenv that sees the dependencies
as a wheel install would, so a baseline needs no virtualenv of its own. The "deps only" row is
the floor: a script that imports what the CLI cannot do without (click, asyncio, hashlib,
obstore) and makes the same GET.

    python bench/bench_startup.py --baseline /tmp/lading-base --rounds 10
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import venv
from pathlib import Path

import boto3

REPO = Path(__file__).resolve().parent.parent
#: A bucket of this run's own (several people may run the bench against one RGW at once).
BUCKET = f"bench-startup-{os.getpid()}"


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


def installed_python() -> str:
    """A virtualenv's python that sees this interpreter's packages as a wheel install would: the
    site-packages directories on ``sys.path``, without the ``.pth`` hooks of a development install
    (an editable install's finder alone costs 20-25 ms of start-up here)."""
    root = Path(tempfile.mkdtemp(prefix="lading-startup-venv-"))
    venv.create(root, with_pip=False)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(root), "platbase": str(root)}))
    packages = [entry for entry in sys.path if entry.endswith("site-packages") and Path(entry).is_dir()]
    (purelib / "lading-bench-deps.pth").write_text("\n".join(packages) + "\n")
    return str(root / "bin" / "python")


#: The floor: what lading's dependencies alone cost before the same GET (click and asyncio
#: imported as the CLI does, hashlib for the check, an obstore client built from the environment).
FLOOR = """
import sys, asyncio, hashlib, click, obstore
from obstore.store import S3Store
store = S3Store(sys.argv[1], endpoint=sys.argv[2], region="us-east-1", virtual_hosted_style_request=False, client_options={"allow_http": True})
sys.stdout.buffer.write(bytes(obstore.get(store, sys.argv[3]).bytes()))
"""


def run(argv: list[str], view: Path, proxy: FirstConnection, env: dict[str, str]) -> tuple[float, float, float]:
    """(seconds to the first connection, wall seconds, CPU seconds) of one command."""
    proxy.first = None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(
        argv,
        env=dict(env, PYTHONPATH=str(view)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd="/",
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode()[-500:]}")
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
    python = installed_python()
    dest = Path(tempfile.mkdtemp(prefix="lading-startup-dest-"))
    try:
        measure(options, bucket, views, python, dest, proxy, env)
    finally:  # nothing left behind: the views, the virtualenv, the destination, the bucket
        for path in (*views.values(), Path(python).parent.parent, dest):
            shutil.rmtree(path, ignore_errors=True)
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": f"data/{i:02d}.bin"} for i in range(20)]})
        s3.delete_bucket(Bucket=bucket)


def measure(
    options: argparse.Namespace,
    bucket: str,
    views: dict[str, Path],
    python: str,
    dest: Path,
    proxy: FirstConnection,
    env: dict[str, str],
) -> None:
    """The alternating rounds, and their medians printed."""
    commands = {"cat": ["cat", f"s3://{bucket}/data/00.bin"], "sync": ["sync", f"s3://{bucket}/data", str(dest)]}
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for _ in range(options.rounds):  # alternating: both checkouts see the same machine load
        for command, args in commands.items():
            for name, view in views.items():
                if command == "sync":
                    subprocess.run(["rm", "-rf", str(dest)], check=True)
                results.setdefault((command, name), []).append(run([python, "-m", "lading", *args], view, proxy, env))
        floor = [python, "-c", FLOOR, bucket, env["AWS_ENDPOINT_URL"], "data/00.bin"]
        results.setdefault(("cat", "deps only"), []).append(run(floor, views["new"], proxy, env))
    print(f"load average: {os.getloadavg()}")
    for (command, name), rows in results.items():
        first, wall, cpu = (statistics.median(column) for column in zip(*rows))
        print(
            f"lading {command:4} {name:8}: first request {first * 1000:6.0f} ms, wall {wall * 1000:6.0f} ms, "
            f"CPU {cpu * 1000:6.0f} ms (medians of {len(rows)})"
        )


if __name__ == "__main__":
    main()
