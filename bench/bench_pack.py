"""Benchmark `lading pack` and the streaming datasets.

    .venv/bin/python bench/bench_pack.py                 # both parts; data under bench/out/pack
    .venv/bin/python bench/bench_pack.py --part pack     # only packing vs tar cf
    .venv/bin/python bench/bench_pack.py --part read --endpoint http://127.0.0.1:7480
    .venv/bin/python bench/bench_pack.py --part pack --baseline /tmp/old-checkout   # before/after

Part "pack": 50,000 files of 16 KiB (25,000 samples of two files) on local disk, packed by
`lading pack` (the CLI, start-up included) and archived by `tar cf` into the same directory
(--out), several rounds, alternating which goes first, `sync` before each run; page cache warm
for both. Prints median and best times, CPU seconds, and the rate ratios.

Part "read": the same kind of files (a subset, --read-files) in an S3 bucket (Ceph RGW from
bench/rgw.sh when it answers, else a moto server started here), read
  (a) one object at a time: StoreDataset with no prefetch, one GET per file, in order;
  (b) StoreDataset with its prefetch pool (8 ahead);
  (c) ShardDataset over the shards `lading pack` wrote into the bucket.
Prints samples/s and the speedup of (c) over (a).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out" / "pack"
FILE_SIZE = 16 << 10
sys.path.insert(0, str(REPO))


def make_files(root: Path, count: int) -> None:
    """``count`` files of 16 KiB: sample NNNNN has a .jpg and a .cls, 500 per directory."""
    marker = root.parent / f".{root.name}-complete-{count}"  # outside: pack refuses dot files
    if marker.exists():
        return
    shutil.rmtree(root, ignore_errors=True)
    for i in range(count // 2):
        folder = root / f"d{i // 500:03d}"
        if i % 500 == 0:
            folder.mkdir(parents=True)
        for ext in ("jpg", "cls"):
            (folder / f"{i:06d}.{ext}").write_bytes(os.urandom(FILE_SIZE))
    marker.touch()


def timed(argv: list[str], cwd: Path | None = None) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system, the process and its children) and stdout of a command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, check=True, cwd=cwd, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.stdout


def bench_pack(files: int, rounds: int, out: Path, baseline: Path | None = None) -> dict:
    src = OUT / f"src-{files}"
    make_files(src, files)
    nbytes = files * FILE_SIZE
    lading = [str(REPO / ".venv" / "bin" / "lading"), "pack", str(src), "--json"]
    timed(["tar", "cf", str(OUT / "warm.tar"), "."], cwd=src)  # warm the page cache
    (OUT / "warm.tar").unlink()
    runs: dict[str, list[tuple[float, float]]] = {"tar": [], "lading": []}
    writing: list[float] = []  # lading's own timer around writing + publishing (after planning)
    out.mkdir(parents=True, exist_ok=True)
    commands = {
        "tar": (["tar", "cf", str(out / "tar.tar"), "."], src),
        "lading": ([*lading, str(out / "shards"), "--name", "bench"], None),
    }
    if baseline is not None:  # another checkout's code (e.g. `git worktree`), same venv, same start-up path
        runs["baseline"] = []
        commands["baseline"] = (
            [sys.executable, "-m", "cli", *lading[1:], str(out / "shards"), "--name", "bench"],
            baseline,
        )
    order = list(runs)
    for round_number in range(rounds):
        for tool in order if round_number % 2 == 0 else order[::-1]:  # alternate who goes first
            shutil.rmtree(out / "shards", ignore_errors=True)
            (out / "tar.tar").unlink(missing_ok=True)  # one output at a time (out may be RAM)
            subprocess.run(["sync"], check=True)  # neither run pays for the other's dirty pages
            wall_s, cpu_s, stdout = timed(*commands[tool])
            runs[tool].append((wall_s, cpu_s))
            if tool == "lading":
                writing.append(json.loads(stdout)["seconds"])
            shutil.rmtree(out / "shards", ignore_errors=True)
    shutil.rmtree(out / "shards", ignore_errors=True)
    (out / "tar.tar").unlink(missing_ok=True)
    wall = {tool: statistics.median(w for w, _ in times) for tool, times in runs.items()}
    best = {tool: min(w for w, _ in times) for tool, times in runs.items()}
    cpu = {tool: statistics.median(c for _, c in times) for tool, times in runs.items()}
    # each round runs both tools back to back, so the per-round ratio sees the same machine load
    paired = statistics.median(t[0] / lad[0] for t, lad in zip(runs["tar"], runs["lading"]))
    result = {
        "files": files,
        "bytes": nbytes,
        "rounds": rounds,
        "out": str(out),
        "runs_wall_cpu_s": runs,
        "tar_MBps": nbytes / wall["tar"] / 1e6,
        "lading_MBps": nbytes / wall["lading"] / 1e6,
        "rate_ratio_of_medians": wall["tar"] / wall["lading"],
        "rate_ratio_paired_median": paired,
        "rate_ratio_best": best["tar"] / best["lading"],
        "tar_cpu_s": cpu["tar"],
        "lading_cpu_s": cpu["lading"],
        "load_average": os.getloadavg(),
        "lading_write_s": writing,
        "lading_write_median_s": statistics.median(writing),
    }
    print(
        f"pack {files:,} x 16 KiB, {rounds} rounds: tar cf median {wall['tar']:.2f} s "
        f"({result['tar_MBps']:.0f} MB/s, best {best['tar']:.2f} s, cpu {cpu['tar']:.2f} s); "
        f"lading pack median {wall['lading']:.2f} s ({result['lading_MBps']:.0f} MB/s, best {best['lading']:.2f} s, "
        f"cpu {cpu['lading']:.2f} s; of which writing median {statistics.median(writing):.2f} s, best {min(writing):.2f} s)"
    )
    print(
        f"lading rate / tar rate: {paired:.2f} (median of per-round ratios), "
        f"{result['rate_ratio_of_medians']:.2f} (of medians), {result['rate_ratio_best']:.2f} (best runs); "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    if baseline is not None:
        result["baseline_rate_ratio_paired_median"] = statistics.median(
            t[0] / b[0] for t, b in zip(runs["tar"], runs["baseline"])
        )
        result["lading_vs_baseline_time_paired_median"] = statistics.median(
            lad[0] / b[0] for lad, b in zip(runs["lading"], runs["baseline"])
        )
        print(
            f"baseline ({baseline}) median {wall['baseline']:.2f} s (best {best['baseline']:.2f} s, "
            f"cpu {cpu['baseline']:.2f} s); baseline rate / tar rate {result['baseline_rate_ratio_paired_median']:.2f}; "
            f"lading time / baseline time {result['lading_vs_baseline_time_paired_median']:.2f} (median of rounds)"
        )
    return result


def rgw_up(endpoint: str) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(endpoint, timeout=2).close()
        return True
    except Exception as err:  # noqa: BLE001 - any answer (even 403) means up
        return hasattr(err, "code")


def start_moto() -> tuple[str, object]:
    sys.path.insert(0, str(REPO / "tests"))
    from servers import start_moto as start

    OUT.mkdir(parents=True, exist_ok=True)
    server = start(OUT)
    return server.url, server


def bench_read(endpoint: str | None, files: int) -> dict:
    import boto3
    from lading.datasets import ShardDataset, StoreDataset
    from lading.pack import PackOptions, plan_pack, run_pack
    from lading.stores import StoreConfig, open_store

    server = None
    backend = "rgw"
    if endpoint is None or not rgw_up(endpoint):
        endpoint, server = start_moto()
        backend = "moto"
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    try:
        bucket = "lading-bench-pack"
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        config = StoreConfig(endpoint_url=endpoint, region="us-east-1")
        src = OUT / f"read-src-{files}"
        make_files(src, files)
        raw = f"s3://{bucket}/raw-{files}"
        store = open_store(raw, config)
        existing = sum(1 for _ in store.list())
        if existing != files:
            paths = sorted(p for p in src.rglob("*") if p.is_file())
            with ThreadPoolExecutor(32) as pool:
                list(pool.map(lambda p: store.upload(p, p.relative_to(src).as_posix()), paths))
        packed = f"s3://{bucket}/packed-{files}"
        index = f"{packed}/bench.index.json"
        try:
            open_store(packed, config).stat("bench.index.json")
        except Exception:  # noqa: BLE001 - not packed yet
            plan = plan_pack(raw, packed, PackOptions("bench", shard_size=16_000_000), config)
            run_pack(plan, raw, packed, config)

        def files_per_s(label: str, run) -> float:
            started = time.perf_counter()
            count = run()
            seconds = time.perf_counter() - started
            print(
                f"read {label}: {count:,} files in {seconds:.2f} s = {count / seconds:,.0f} files/s "
                f"({count * FILE_SIZE / seconds / 1e6:.0f} MB/s)"
            )
            return count / seconds

        one_by_one = StoreDataset(raw, config=config, prefetch=0)
        prefetching = StoreDataset(raw, config=config, prefetch=8)
        shards = ShardDataset(index, config=config)  # listing / index reads (and torch import) not timed
        result = {
            "backend": backend,
            "files": files,
            "one_at_a_time_files_per_s": files_per_s(
                "one object at a time (StoreDataset, prefetch=0)",
                lambda: sum(1 for i in range(len(one_by_one)) if one_by_one[i]),
            ),
            "prefetch8_files_per_s": files_per_s(
                "StoreDataset, prefetch=8", lambda: sum(1 for i in range(len(prefetching)) if prefetching[i])
            ),
            "shards_files_per_s": files_per_s(
                "ShardDataset over packed shards", lambda: sum(len(sample) - 1 for sample in shards)
            ),
        }
        result["speedup_vs_one_at_a_time"] = result["shards_files_per_s"] / result["one_at_a_time_files_per_s"]
        result["speedup_vs_prefetch8"] = result["shards_files_per_s"] / result["prefetch8_files_per_s"]
        print(
            f"shards vs one object at a time: {result['speedup_vs_one_at_a_time']:.1f}x; "
            f"vs StoreDataset prefetch=8: {result['speedup_vs_prefetch8']:.1f}x ({backend})"
        )
        return result
    finally:
        if server is not None:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("pack", "read", "all"), default="all")
    parser.add_argument("--files", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--read-files", type=int, default=10_000)
    parser.add_argument(
        "--out",
        default=str(OUT / "written"),
        help="where both tools write (e.g. /dev/shm/x to take disk writeback out of the timing)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="also run `python -m cli pack` from this checkout (e.g. a git worktree of an "
        "older commit) in every round, for before/after comparisons",
    )
    parser.add_argument("--endpoint", default="http://127.0.0.1:7480", help="RGW endpoint (moto if it does not answer)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    results = {"date": time.strftime("%Y-%m-%d"), "nproc": os.cpu_count()}
    if args.part in ("pack", "all"):
        results["pack"] = bench_pack(args.files, args.rounds, Path(args.out), args.baseline)
    if args.part in ("read", "all"):
        results["read"] = bench_read(args.endpoint, args.read_files)
    (OUT / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
