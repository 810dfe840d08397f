#!/usr/bin/env python3
"""`lading sync` against `aws s3 sync` / `aws s3 cp`, `rclone copy` and plain parallel ranged
GETs, in one run, on the same data, against a local Ceph RGW (bench/rgw.sh start).

    bench/rgw.sh start
    .venv/bin/python bench/bench_sync.py                    # everything, 3 repeats
    .venv/bin/python bench/bench_sync.py --only small,noop --repeat 5

Scenarios (each tool starts cold: empty destination, page cache dropped when allowed):
  small   5,000 x 64 KiB objects: objects/s
  noop    re-sync of those 5,000 with nothing changed: seconds
  big     one 1 GiB object: MB/s; the ceiling is N threads of boto3 ranged GETs discarding data
  latency 2,000 x 64 KiB behind a 20 ms RTT proxy (bench/latproxy.py): objects/s
  plan    peak RSS of `lading sync --dry-run` over 200,000 keys (local sparse files, so the
          object sizes can be made huge without disk use: memory must not depend on them)

Prints per-run numbers, min/median/max per tool and the ratios the issue asks for.
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
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LADING = REPO / ".venv" / "bin" / "lading"
BUCKET = "lading-bench"
CREDS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


def log(message: str) -> None:
    print(message, flush=True)


def tool_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(CREDS)
    return env


def drop_caches() -> bool:
    """Drop the page cache (root only); False when not allowed."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


LAST_STDOUT = [b""]


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    """Run a command; return (wall seconds, peak RSS in KiB). Fails loudly on a non-zero exit.
    The command's stdout is kept in LAST_STDOUT.

    Peak RSS comes from GNU time, a small C parent: a child forked from this (large) Python
    process would report at least this process's RSS, because Linux keeps the high-water mark
    of the forked address space across exec.
    """
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss_file:
        start = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss_file.name, *argv], env=env or tool_env(),
                              capture_output=True)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{argv[0]} failed ({proc.returncode}): "
                             f"{proc.stderr.decode()[-2000:] or proc.stdout.decode()[-2000:]}")
        LAST_STDOUT[0] = proc.stdout
        rss = int(rss_file.read().strip().splitlines()[-1] or 0)
    return elapsed, rss


def s3_client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                        region_name="us-east-1", config=Config(max_pool_connections=64))


# -- seeding ------------------------------------------------------------------------------------

def seed(endpoint: str, prefix: str, count: int, size: int) -> None:
    """Put ``count`` random objects of ``size`` bytes under ``prefix`` unless already there."""
    client = s3_client(endpoint)
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.ClientError:
        pass
    present = sum(page.get("KeyCount", 0) for page in
                  client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix))
    if present == count:
        return
    log(f"seeding {count} x {size} bytes under s3://{BUCKET}/{prefix} ...")
    if size >= 64 << 20:
        from boto3.s3.transfer import TransferConfig

        path = Path("/tmp/lading-bench-seed.bin")
        with open(path, "wb") as out:
            for _ in range(size // (64 << 20)):
                out.write(os.urandom(64 << 20))
        client.upload_file(str(path), BUCKET, f"{prefix}blob.bin",
                           Config=TransferConfig(multipart_chunksize=16 << 20, max_concurrency=8))
        path.unlink()
        return

    def put(i: int) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}d{i % 50:02d}/f{i:06d}.bin", Body=os.urandom(size))

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        list(pool.map(put, range(count)))


# -- tools ----------------------------------------------------------------------------------------

def rclone_conf(workdir: Path, endpoint: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "rclone.conf"
    conf.write_text(f"[rgw]\ntype = s3\nprovider = Ceph\naccess_key_id = test\nsecret_access_key = test\n"
                    f"endpoint = {endpoint}\n")
    return conf


def run_aws_sync(endpoint: str, prefix: str, dest: Path) -> tuple[float, int]:
    return timed(["aws", "--endpoint-url", endpoint, "s3", "sync", f"s3://{BUCKET}/{prefix}", str(dest),
                  "--only-show-errors"])


def run_aws_cp(endpoint: str, key: str, dest: Path) -> tuple[float, int]:
    return timed(["aws", "--endpoint-url", endpoint, "s3", "cp", f"s3://{BUCKET}/{key}", str(dest),
                  "--only-show-errors"])


def run_rclone(conf: Path, prefix: str, dest: Path) -> tuple[float, int]:
    env = tool_env()
    env.pop("AWS_CA_BUNDLE", None)  # this environment's CA bundle variable breaks rclone
    return timed(["rclone", "--config", str(conf), "copy", f"rgw:{BUCKET}/{prefix}", str(dest),
                  "--transfers", "32", "--checkers", "32"], env)


def run_rclone_up(conf: Path, source: Path, prefix: str) -> tuple[float, int]:
    env = tool_env()
    env.pop("AWS_CA_BUNDLE", None)
    return timed(["rclone", "--config", str(conf), "copy", str(source), f"rgw:{BUCKET}/{prefix}",
                  "--transfers", "64", "--checkers", "64"], env)


def run_lading(endpoint: str, prefix: str, dest: Path, *extra: str) -> tuple[float, int]:
    return timed([str(LADING), "sync", f"s3://{BUCKET}/{prefix}", str(dest), "--endpoint-url", endpoint,
                  "--no-cache", "--json", *extra])


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


# -- checks ---------------------------------------------------------------------------------------

def tree_digest(root: Path) -> str:
    """A digest of (relative path, size, md5) of every regular file, skipping lading's state."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".lading")):
        digest.update(f"{path.relative_to(root)}\0{path.stat().st_size}\0".encode())
        digest.update(hashlib.md5(path.read_bytes()).digest() if path.stat().st_size < 1 << 26 else b"big")
    return digest.hexdigest()


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


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} (min {min(values):.1f}, max {max(values):.1f})"


# -- scenarios ------------------------------------------------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.endpoint = args.endpoint
        self.work = Path(args.workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.conf = rclone_conf(self.work, self.endpoint)
        self.results: dict[str, dict[str, list[float]]] = {}

    def record(self, scenario: str, tool: str, value: float, unit: str, rss: int | None = None) -> None:
        self.results.setdefault(scenario, {}).setdefault(tool, []).append(value)
        extra = f"  peak RSS {rss // 1024} MiB" if rss else ""
        log(f"  {scenario:8s} {tool:24s} {value:10.1f} {unit}{extra}")

    def cold(self) -> None:
        if not drop_caches() and not getattr(self, "_warned", False):
            log("  (cannot drop the page cache here: runs are warm on the client side)")
            self._warned = True

    def small(self, prefix: str = "small/", count: int = 0, scenario: str = "small", endpoint: str = "",
              tools: tuple[str, ...] = ("aws s3 sync", "rclone copy", "lading sync")) -> None:
        count = count or self.args.small_count
        endpoint = endpoint or self.endpoint
        conf = self.conf if endpoint == self.endpoint else rclone_conf(self.work / "lat", endpoint)
        reference = None
        for tool in tools:
            dest = fresh(self.work / scenario / tool.split()[0] / tool.replace(" ", "_"))
            self.cold()
            if tool.startswith("aws"):
                seconds, rss = run_aws_sync(endpoint, prefix, dest)
            elif tool.startswith("rclone"):
                seconds, rss = run_rclone(conf, prefix, dest)
            elif tool == "lading sync --workers 64":
                seconds, rss = run_lading(endpoint, prefix, dest, "--workers", "64")
            else:
                seconds, rss = run_lading(endpoint, prefix, dest)
            digest = tree_digest(dest)
            if reference is None:
                reference = digest
            elif digest != reference:
                raise SystemExit(f"{tool} produced a different tree than aws s3 sync in {scenario}")
            self.record(scenario, tool, count / seconds, "objects/s", rss)

    def noop(self) -> None:
        """Re-sync the trees the 'small' scenario left (runs it first if needed)."""
        for tool in ("aws s3 sync", "rclone copy", "lading sync"):
            dest = self.work / "small" / tool.split()[0] / tool.replace(" ", "_")
            if not dest.exists():
                self.small()
            if tool.startswith("aws"):
                seconds, _ = run_aws_sync(self.endpoint, "small/", dest)
            elif tool.startswith("rclone"):
                seconds, _ = run_rclone(self.conf, "small/", dest)
            else:
                seconds, _ = run_lading(self.endpoint, "small/", dest)
            self.record("noop", tool, seconds, "s")

    def big(self) -> None:
        size = self.args.big_mib << 20
        key = "big/blob.bin"
        mb = size / 1e6
        for threads in (8, 16):
            self.record("big", f"ranged GETs x{threads}", mb / ranged_get_ceiling(self.endpoint, key, size, threads),
                        "MB/s")
        for tool in ("aws s3 cp", "rclone copy", "lading sync"):
            dest = fresh(self.work / "big" / tool.split()[0])
            dest.mkdir()
            self.cold()
            if tool.startswith("aws"):
                seconds, rss = run_aws_cp(self.endpoint, key, dest / "blob.bin")
            elif tool.startswith("rclone"):
                seconds, rss = run_rclone(self.conf, "big/", dest)
            else:
                seconds, rss = run_lading(self.endpoint, "big/", dest)
            if (dest / "blob.bin").stat().st_size != size:
                raise SystemExit(f"{tool} wrote a wrong size")
            self.record("big", tool, mb / seconds, "MB/s", rss)
            if tool.startswith("lading"):
                fetch_seconds = json.loads(LAST_STDOUT[0])["seconds"]
                if fetch_seconds:
                    self.record("big", "lading (transfer phase)", mb / fetch_seconds, "MB/s")
            shutil.rmtree(dest)

    def latency(self) -> None:
        port = free_port()
        proxy = subprocess.Popen([sys.executable, str(HERE / "latproxy.py"), "--listen", f"127.0.0.1:{port}",
                                  "--upstream", self.endpoint.split("//", 1)[1], "--delay-ms", "10"],
                                 stdout=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_port(port)
            self.small("lat/", self.args.lat_count, "latency", f"http://127.0.0.1:{port}",
                       ("aws s3 sync", "rclone copy", "lading sync", "lading sync --workers 64"))
        finally:
            proxy.terminate()
            proxy.wait(10)

    def plan(self) -> None:
        """Peak RSS of `lading sync --dry-run --json` over N keys: local sparse files of 0 B and
        of 1 GiB each (memory must not depend on object sizes), and N 0-byte S3 objects."""
        count = self.args.plan_keys
        for label, size in (("local, 0 B objects", 0), ("local, 1 GiB objects", 1 << 30)):
            source = self.work / f"plan-src-{size}"
            marker = self.work / f"plan-src-{size}.done"
            if not marker.exists():
                shutil.rmtree(source, ignore_errors=True)
                log(f"creating {count} sparse files of {size} bytes ...")
                for i in range(count):
                    path = source / f"d{i % 200:03d}" / f"f{i:07d}"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with open(path, "wb") as out:
                        out.truncate(size)
                marker.write_text("")
            seconds, rss = timed([str(LADING), "sync", str(source), str(fresh(self.work / "plan-dst")),
                                  "--dry-run", "--json", "--no-cache"])
            self.record("plan", f"lading {label}", rss / 1024, f"MiB peak RSS ({seconds:.1f} s)")
        if self.args.plan_s3:
            local = self.work / "plan-src-0"
            present = sum(1 for _ in s3_client(self.endpoint).get_paginator("list_objects_v2").paginate(
                Bucket=BUCKET, Prefix="plan/")) * 1000
            if present < count:
                log(f"seeding {count} empty objects under plan/ with rclone ...")
                run_rclone_up(self.conf, local, "plan/")
            seconds, rss = timed([str(LADING), "sync", f"s3://{BUCKET}/plan", str(fresh(self.work / "plan-dst")),
                                  "--endpoint-url", self.endpoint, "--dry-run", "--json", "--no-cache"])
            self.record("plan", "lading S3, 0 B objects", rss / 1024, f"MiB peak RSS ({seconds:.1f} s)")

    def report(self) -> None:
        log("\n== summary (median, min, max over runs) ==")
        for scenario, tools in self.results.items():
            for tool, values in tools.items():
                log(f"{scenario:8s} {tool:24s} {summary(values)}")
        log("\n== ratios (medians) ==")
        med = {s: {t: statistics.median(v) for t, v in tools.items()} for s, tools in self.results.items()}
        for scenario in ("small", "latency"):
            if scenario in med:
                m = med[scenario]
                for variant in (t for t in m if t.startswith("lading")):
                    log(f"{scenario}: {variant}: /aws = {m[variant] / m['aws s3 sync']:.2f}x, "
                        f"/rclone = {m[variant] / m['rclone copy']:.2f}x")
        if "noop" in med:
            m = med["noop"]
            log(f"noop: aws/lading = {m['aws s3 sync'] / m['lading sync']:.2f}x faster, "
                f"rclone/lading = {m['rclone copy'] / m['lading sync']:.2f}x")
        if "big" in med:
            m = med["big"]
            ceiling = max(v for t, v in m.items() if t.startswith("ranged"))
            log(f"big: lading/aws cp = {m['lading sync'] / m['aws s3 cp']:.2f}x, "
                f"lading/ranged-GET ceiling = {m['lading sync'] / ceiling:.0%} "
                f"(transfer phase only: {m.get('lading (transfer phase)', 0) / ceiling:.0%}), "
                f"lading/rclone = {m['lading sync'] / m['rclone copy']:.2f}x")
        (self.work / "results.json").write_text(json.dumps(self.results, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default="http://127.0.0.1:7480")
    parser.add_argument("--workdir", default="/tmp/lading-bench")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="small,noop,big,latency,plan")
    parser.add_argument("--small-count", type=int, default=5000)
    parser.add_argument("--lat-count", type=int, default=2000)
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--plan-keys", type=int, default=200_000)
    parser.add_argument("--plan-s3", action="store_true", help="also plan N objects listed from S3 (seeds them)")
    args = parser.parse_args()
    try:
        urllib.request.urlopen(args.endpoint, timeout=3).close()
    except urllib.error.HTTPError:
        pass
    except OSError as err:
        raise SystemExit(f"no S3 server at {args.endpoint} ({err}); run bench/rgw.sh start") from err
    only = args.only.split(",")
    if "small" in only or "noop" in only:
        seed(args.endpoint, "small/", args.small_count, 64 << 10)
    if "latency" in only:
        seed(args.endpoint, "lat/", args.lat_count, 64 << 10)
    if "big" in only:
        seed(args.endpoint, "big/", 1, args.big_mib << 20)
    bench = Bench(args)
    log(f"lading sync benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f}")
    for run in range(args.repeat):
        log(f"-- run {run + 1}/{args.repeat}")
        for scenario in ("small", "noop", "big", "latency", "plan"):
            if scenario in only and not (scenario == "plan" and run > 0):
                if scenario == "small":
                    bench.small(tools=("aws s3 sync", "rclone copy", "lading sync", "lading sync --workers 64"))
                else:
                    getattr(bench, scenario)()
    bench.report()


if __name__ == "__main__":
    main()
