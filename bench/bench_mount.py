"""Benchmark `lading mount` against s3fs and `rclone mount` on the same S3 server (Ceph RGW).

    bash bench/rgw.sh start                       # S3 at http://127.0.0.1:7480, keys test/test
    .venv/bin/python bench/bench_mount.py         # all cases; --only seq,small,ls,ready
    .venv/bin/python bench/bench_mount.py --only seq --peers s3fs --rounds 5

Cases (each tool mounts the same bucket fresh; "cold" drops the page cache first, "warm"
repeats the read on the same mount, i.e. a second epoch):
  seq    one 1 GiB object read sequentially (1 MiB reads), vs direct parallel ranged GETs
  small  2,000 objects of 64 KiB read whole by 8 concurrent readers
  ls     `ls -lR` and `find` over 10,000 keys in 100 directories (fresh mount each)
  ready  mount-ready time and daemon RSS for 100,000 keys (lading only)
Prints one line per measurement and ratios; --json FILE writes them all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
LADING = [sys.executable, "-m", "lading"]
BUCKET = "lading-bench-mount"
BIG = "seq/1GiB.bin"
BIG_SIZE = 1 << 30
SMALL_COUNT, SMALL_SIZE = 2000, 64 * 1024
TREE_DIRS, TREE_PER_DIR = 100, 100
MANY = 100_000

results: list[dict] = []


def record(case: str, tool: str, metric: str, value: float, unit: str, **extra: object) -> None:
    """Print and keep one measurement."""
    row = {"case": case, "tool": tool, "metric": metric, "value": round(value, 3), "unit": unit, **extra}
    results.append(row)
    print(f"{case:6} {tool:14} {metric:28} {value:10.2f} {unit}", flush=True)


# -- the S3 server and data ---------------------------------------------------------------------

def s3(endpoint: str):
    """A boto3 client for set-up and the direct-GET baseline."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                        aws_secret_access_key="test", config=Config(max_pool_connections=64,
                                                                    s3={"addressing_style": "path"}))


def count_keys(client, prefix: str) -> int:
    """How many keys exist under ``prefix``."""
    total = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        total += page.get("KeyCount", 0)
    return total


def put_many(client, keys: list[str], body_for: Callable[[int], bytes]) -> None:
    """Upload many small objects on 32 threads."""
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda ik: client.put_object(Bucket=BUCKET, Key=ik[1], Body=body_for(ik[0])),
                      enumerate(keys)))


def ensure_data(endpoint: str, cases: set[str]) -> None:
    """Create the bucket and whatever objects the selected cases need (idempotent)."""
    client = s3(endpoint)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
        client.create_bucket(Bucket=BUCKET)
    if "seq" in cases and count_keys(client, "seq/") == 0:
        with tempfile.NamedTemporaryFile(dir="/var/tmp") as handle:
            block = os.urandom(1 << 20)
            for i in range(BIG_SIZE >> 20):
                handle.write(block[i % 7:] + block[:i % 7])
            handle.flush()
            client.upload_file(handle.name, BUCKET, BIG)
    if "small" in cases and count_keys(client, "small/") < SMALL_COUNT:
        put_many(client, [f"small/{i:04d}.bin" for i in range(SMALL_COUNT)],
                 lambda i: i.to_bytes(4, "big") * (SMALL_SIZE // 4))
    if "ls" in cases and count_keys(client, "tree/") < TREE_DIRS * TREE_PER_DIR:
        put_many(client, [f"tree/d{d:03d}/f{f:03d}.txt" for d in range(TREE_DIRS) for f in range(TREE_PER_DIR)],
                 lambda i: b"%d\n" % i)
    if "ready" in cases and count_keys(client, "many/") < MANY:
        put_many(client, [f"many/{i // 1000:03d}/{i:06d}.bin" for i in range(MANY)], lambda i: b"")


def drop_caches() -> None:
    """Empty the page cache (root only) so the next read is cold."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


# -- the tools ------------------------------------------------------------------------------------

def wait_mounted(path: Path, timeout: float = 60) -> None:
    """Poll until ``path`` is a mount point."""
    deadline = time.monotonic() + timeout
    while not os.path.ismount(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} not mounted after {timeout}s")
        time.sleep(0.01)


def unmount(path: Path) -> None:
    """fusermount -u, lazily if it stays busy."""
    if os.path.ismount(path):
        tool = "fusermount3" if shutil.which("fusermount3") else "fusermount"
        subprocess.run([tool, "-u", str(path)], check=False)
        deadline = time.monotonic() + 20
        while os.path.ismount(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.path.ismount(path):
            subprocess.run([tool, "-u", "-z", str(path)], check=False)


@contextlib.contextmanager
def mount_lading(endpoint: str, path: Path, prefix: str = "", *extra: str) -> Iterator[int]:
    """`lading mount` for the block; yields the daemon pid."""
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
    log = path.parent / f"{path.name}.lading.log"
    out = subprocess.run([*LADING, "mount", f"s3://{BUCKET}/{prefix}", str(path), "--endpoint-url", endpoint,
                          "--json", "--log-file", str(log), *extra], cwd=REPO, env=env, capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"lading mount failed: {out.stderr}")
    try:
        yield json.loads(out.stdout)["pid"]
    finally:
        unmount(path)


@contextlib.contextmanager
def mount_s3fs(endpoint: str, path: Path, prefix: str = "") -> Iterator[int]:
    """s3fs for the block."""
    passwd = path.parent / "s3fs.passwd"
    passwd.write_text("test:test\n")
    passwd.chmod(0o600)
    source = f"{BUCKET}:/{prefix.rstrip('/')}" if prefix else BUCKET
    subprocess.run(["s3fs", source, str(path), "-o", f"url={endpoint},use_path_request_style,"
                    f"passwd_file={passwd},ro,parallel_count=16,multireq_max=32"], check=True)
    wait_mounted(path)
    try:
        yield 0
    finally:
        unmount(path)


@contextlib.contextmanager
def mount_rclone(endpoint: str, path: Path, prefix: str = "") -> Iterator[int]:
    """`rclone mount` for the block; yields its pid."""
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    log = path.parent / "rclone.log"
    proc = subprocess.Popen(["rclone", "mount", f":s3:{BUCKET}/{prefix}", str(path), "--read-only",
                             "--s3-provider", "Ceph", "--s3-endpoint", endpoint, "--s3-access-key-id", "test",
                             "--s3-secret-access-key", "test", "--s3-force-path-style", "--log-file", str(log),
                             "--dir-cache-time", "1h"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_mounted(path)
        yield proc.pid
    finally:
        unmount(path)
        proc.terminate()
        proc.wait(timeout=30)


# -- the cases ------------------------------------------------------------------------------------

def read_file(path: Path, block: int = 1 << 20) -> int:
    """Read a file sequentially in ``block`` reads; return its size."""
    total = 0
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(block):
            total += len(chunk)
    return total


def direct_ranged_gets(endpoint: str, workers: int = 16, part: int = 8 << 20) -> float:
    """MB/s of the 1 GiB object fetched as parallel ranged GETs (the limit)."""
    client = s3(endpoint)
    started = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        sizes = pool.map(lambda start: len(client.get_object(
            Bucket=BUCKET, Key=BIG, Range=f"bytes={start}-{start + part - 1}")["Body"].read()),
            range(0, BIG_SIZE, part))
        assert sum(sizes) == BIG_SIZE
    return BIG_SIZE / (time.monotonic() - started) / 1e6


def case_seq(endpoint: str, tools: dict, root: Path, rounds: int = 3) -> None:
    """Best of ``rounds`` for each tool, interleaved, since this machine's speed drifts; also the
    median over rounds of each cold read's ratio to the direct GETs of the same round (paired,
    so less sensitive to the drift than best-of)."""
    best: dict[str, float] = {}
    paired: dict[str, list[float]] = {}

    def keep(name: str, value: float) -> None:
        best[name] = max(best.get(name, 0.0), value)

    for _ in range(rounds):
        direct = direct_ranged_gets(endpoint)
        keep("direct", direct)
        for name, mounter in tools.items():
            path = root / f"seq-{name}"
            path.mkdir(exist_ok=True)
            drop_caches()
            with mounter(endpoint, path, "seq/"):
                for label in ("cold", "warm"):
                    started = time.monotonic()
                    assert read_file(path / "1GiB.bin") == BIG_SIZE
                    rate = BIG_SIZE / (time.monotonic() - started) / 1e6
                    keep(f"{name} {label}", rate)
                    if label == "cold":
                        paired.setdefault(name, []).append(rate / direct)
    record("seq", "direct-GETs", "1GiB MB/s", best["direct"], "MB/s", note="boto3, 16 threads x 8 MiB ranges")
    for name in tools:
        for label in ("cold", "warm"):
            rate = best[f"{name} {label}"]
            record("seq", name, f"1GiB {label} MB/s", rate, "MB/s", ratio_to_direct=round(rate / best["direct"], 3))
        record("seq", name, "cold/direct median of rounds", statistics.median(paired[name]), "x",
               rounds=[round(r, 3) for r in paired[name]])


def case_small(endpoint: str, tools: dict, root: Path) -> None:
    """2,000 x 64 KiB read whole by 8 threads, cold then warm."""
    names = [f"{i:04d}.bin" for i in range(SMALL_COUNT)]
    for name, mounter in tools.items():
        path = root / f"small-{name}"
        path.mkdir(exist_ok=True)
        drop_caches()
        with mounter(endpoint, path, "small/"):
            for label in ("cold", "warm"):
                started = time.monotonic()
                with ThreadPoolExecutor(8) as pool:
                    total = sum(pool.map(lambda n: len((path / n).read_bytes()), names))
                assert total == SMALL_COUNT * SMALL_SIZE
                rate = SMALL_COUNT / (time.monotonic() - started)
                record("small", name, f"2000x64KiB {label} files/s", rate, "files/s")


def case_ls(endpoint: str, tools: dict, root: Path) -> None:
    """`ls -lR` and `find` over 10,000 keys, each on a fresh mount."""
    for name, mounter in tools.items():
        for command in (["ls", "-lR"], ["find"]):
            path = root / f"ls-{name}"
            path.mkdir(exist_ok=True)
            drop_caches()
            started = time.monotonic()
            with mounter(endpoint, path, "tree/"):
                mounted = time.monotonic()
                out = subprocess.run([*command, str(path)], capture_output=True, text=True, check=True).stdout
                walked = time.monotonic()
                assert out.count(".txt") == TREE_DIRS * TREE_PER_DIR
            record("ls", name, f"{command[0]} 10k keys s", walked - mounted, "s",
                   with_mount_s=round(walked - started, 3))


def rss_mb(pid: int) -> float:
    """Resident set size of a process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def case_ready(endpoint: str, tools: dict, root: Path) -> None:
    """Mount-ready time, RSS and per-lookup cost for 100,000 keys."""
    path = root / "ready"
    path.mkdir(exist_ok=True)
    started = time.monotonic()
    with mount_lading(endpoint, path, "many/") as pid:
        record("ready", "lading", "mount-ready 100k keys s", time.monotonic() - started, "s")
        record("ready", "lading", "daemon RSS 100k keys MB", rss_mb(pid), "MB")
        began = time.monotonic()
        count = sum(len(files) for _, _, files in os.walk(path))
        assert count == MANY, count
        record("ready", "lading", "walk 100k keys s", time.monotonic() - began, "s")
        began = time.monotonic()
        for directory, _, files in os.walk(path):
            for name in files:
                os.stat(os.path.join(directory, name))
        elapsed = time.monotonic() - began
        record("ready", "lading", "stat 100k files s", elapsed, "s", us_per_lookup=round(elapsed / MANY * 1e6, 1))
        record("ready", "lading", "daemon RSS after stat MB", rss_mb(pid), "MB")


CASES = {"seq": case_seq, "small": case_small, "ls": case_ls, "ready": case_ready}
PEERS = {"s3fs": mount_s3fs, "rclone": mount_rclone}


def main() -> None:
    """Parse options, create the data, run the cases, print ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", default="http://127.0.0.1:7480")
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated cases")
    parser.add_argument("--peers", default="s3fs,rclone", help="comma-separated peers ('' for none)")
    parser.add_argument("--json", type=Path, help="write all measurements here")
    parser.add_argument("--rounds", type=int, default=3, help="seq: interleaved rounds per tool (default 3)")
    args = parser.parse_args()
    cases = [c for c in args.only.split(",") if c]
    tools: dict = {"lading": mount_lading}
    tools.update({p: PEERS[p] for p in args.peers.split(",") if p and shutil.which(p)})
    ensure_data(args.endpoint, set(cases))
    with tempfile.TemporaryDirectory(prefix="bench-mount-") as tmp:
        for case in cases:
            if case == "seq":
                case_seq(args.endpoint, tools, Path(tmp), args.rounds)
            else:
                CASES[case](args.endpoint, tools, Path(tmp))
    by = {(r["case"], r["tool"], r["metric"]): r["value"] for r in results}
    for (case, tool, metric), value in sorted(by.items()):
        base = by.get((case, "lading", metric))
        if tool != "lading" and base:
            better = value / base if metric.endswith(" s") else base / value
            print(f"ratio  lading vs {tool:7} {metric:28} {better:6.2f}x (>1: lading better)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
