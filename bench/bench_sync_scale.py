"""Sync at ImageNet scale (issue 27): a first sync and a no-op re-sync of many empty files, lading
against rclone and s5cmd, wall time, CPU seconds and peak RSS of each command (GNU time).

Two sources, each synced into a fresh DEST by every tool, then re-synced with nothing changed:

  local   N empty files (default 1,280,000, ImageNet's train set) in 1,000 folders on the
          filesystem of --work (ext4 under /tmp here); local -> local, so only listing,
          planning and bookkeeping count. s5cmd copies only to or from a bucket: not in this row.
  rgw     M empty objects (default 200,000) in 200 folders in the bucket --bucket on the shared
          Ceph RGW (seeded once from a local tree of the same shape, with s5cmd, or rclone without it).

Commands (W = --workers, 64 = lading's default):
  lading  python -m lading sync SRC DEST --no-cache --json   (twice)
  rclone  rclone copy SRC DEST --transfers W --checkers W      (twice; env -u AWS_CA_BUNDLE)
  s5cmd   s5cmd --numworkers W cp 's3://B/P/*' DEST/ then s5cmd --numworkers W sync ... (no-op)

Everything it creates is removed at the end (the trees, the DESTs and the bucket), unless --keep.
With --keep, one tool per hold of the bench lock (session 6's way, trees and bucket made once):

    flock /work/bench.lock .venv/bin/python bench/bench_sync_scale.py --only prepare,local,rgw --keep
    flock /work/bench.lock .venv/bin/python bench/bench_sync_scale.py --only local --tools lading --keep
    flock /work/bench.lock .venv/bin/python bench/bench_sync_scale.py --only local --tools rclone --keep
    flock /work/bench.lock .venv/bin/python bench/bench_sync_scale.py --only rgw --keep

No-op re-syncs only, N alternating rounds (lading, rclone; then rclone, lading; ...) into DESTs
kept in --work (dest-lading, dest-rclone: each made once by its tool's first sync):

    flock /work/bench.lock .venv/bin/python bench/bench_sync_scale.py --only local --tools lading,rclone \
        --keep --noop-rounds 2
    .venv/bin/python bench/bench_sync_scale.py --only local,rgw --tools none     (removes it all)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchtools import (
    DEFAULT_PEERS_VENV,
    Log,
    lading_state,
    load,
    machine_lines,
    new_lading,
    peer_env,
    peer_path,
    versions,
)

log = Log(None)


class Run:
    """Wall seconds, CPU seconds (user + system), peak RSS (MiB) of one command."""

    def __init__(self, wall: float, cpu: float, rss_mib: float) -> None:
        self.wall, self.cpu, self.rss = wall, cpu, rss_mib


def timed(argv: list[str], cwd: Path | None = None) -> Run:
    """Run under GNU time (a small C parent, so the RSS is the command's own); exit != 0 raises."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
        start = time.perf_counter()
        proc = subprocess.run(
            ["/usr/bin/time", "-f", "%M %U %S", "-o", out.name, *argv], cwd=cwd, env=peer_env(), capture_output=True
        )
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{argv[0]}: exit {proc.returncode}: {proc.stderr.decode()[-1500:]}")
        rss, user, system = out.read().strip().splitlines()[-1].split()
    return Run(wall, float(user) + float(system), int(rss) / 1024)


def make_tree(root: Path, count: int, folders: int) -> None:
    """``count`` empty files in ``folders`` folders, once (a marker file says it is complete)."""
    marker = root.with_name(root.name + ".done")
    if marker.exists():
        return
    shutil.rmtree(root, ignore_errors=True)
    log(f"creating {count:,} empty files in {folders} folders under {root} ...")
    per = -(-count // folders)
    made = 0
    for f in range(folders):
        folder = root / f"n{f:08d}"
        folder.mkdir(parents=True)
        for i in range(min(per, count - made)):
            os.close(os.open(folder / f"n{f:08d}_{i:06d}.JPEG", os.O_CREAT | os.O_WRONLY, 0o644))
        made += min(per, count - made)
    marker.write_text("")


def count_files(root: Path) -> int:
    return sum(1 for _, _, names in os.walk(root) for name in names if not name.startswith(".lading"))


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.work)
        self.lading = new_lading()
        self.rclone = peer_path("rclone", args.peers_venv)
        self.s5cmd = peer_path("s5cmd", args.peers_venv)
        self.rows: list[str] = []
        self.conf = self.work / "rclone.conf"

    def record(self, source: str, tool: str, phase: str, run: Run, files: int) -> None:
        row = f"| {source} | {tool} | {phase} | {run.wall:.1f} | {run.cpu:.1f} | {run.rss:.0f} | {files:,} | {load()} |"
        log(row)
        self.rows.append(row)

    def pair(
        self, source: str, tool: str, first: list[str], noop: list[str], dest: Path, want: int, cwd: Path | None = None
    ) -> None:
        """First sync into an empty DEST, then the no-op re-sync; DEST removed afterwards."""
        shutil.rmtree(dest, ignore_errors=True)
        try:
            run = timed(first, cwd)
            got = count_files(dest)
            self.record(source, tool, "first sync", run, got)
            if got != want:
                raise SystemExit(f"{tool}: {got} files in {dest}, expected {want}")
            self.record(source, tool, "no-op re-sync", timed(noop, cwd), count_files(dest))
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    def lading_argv(self, source: str, dest: Path, *extra: str) -> list[str]:
        return self.lading.argv(
            "sync", source, str(dest), "--no-cache", "--json", "--workers", str(self.args.workers), *extra
        )

    def rclone_argv(self, source: str, dest: Path) -> list[str]:
        return [
            self.rclone,
            "--config",
            str(self.conf),
            "copy",
            source,
            str(dest),
            "--transfers",
            str(self.args.workers),
            "--checkers",
            str(self.args.workers),
        ]

    def local(self) -> None:
        count = self.args.local_keys
        source = self.work / f"src-{count}"
        make_tree(source, count, 1000)
        if "prepare" in self.args.only:
            return
        if self.args.noop_rounds:
            self.noop_rounds(source, count)
            return
        dest = self.work / "dest"
        tools = self.args.tools.split(",")
        if "lading" in tools:
            argv = self.lading_argv(str(source), dest)
            self.pair(f"local {count:,}", "lading", argv, argv, dest, count, self.lading.root)
        if "rclone" in tools and self.rclone:
            argv = self.rclone_argv(str(source), dest)
            self.pair(f"local {count:,}", "rclone", argv, argv, dest, count)

    def noop_rounds(self, source: Path, count: int) -> None:
        """No-op re-syncs only, into DESTs kept in --work (``dest-lading``, ``dest-rclone``; each
        made once by its tool's first sync, a marker file says it is complete), in alternating
        rounds: lading first in odd rounds, rclone first in even ones."""
        name = f"local {count:,}"
        tools = [tool for tool in self.args.tools.split(",") if tool == "lading" or (tool == "rclone" and self.rclone)]
        argv: dict[str, list[str]] = {}
        for tool in tools:
            dest = self.work / f"dest-{tool}"
            if tool == "lading":
                argv[tool] = self.lading_argv(str(source), dest)
            else:
                argv[tool] = self.rclone_argv(str(source), dest)
            marker = dest.with_name(dest.name + ".done")
            if not marker.exists():
                shutil.rmtree(dest, ignore_errors=True)
                self.record(name, tool, "first sync", timed(argv[tool], self.lading.root), count_files(dest))
                marker.write_text("")
        for round in range(1, self.args.noop_rounds + 1):
            for tool in tools if round % 2 else tools[::-1]:
                run = timed(argv[tool], self.lading.root)
                self.record(name, tool, f"no-op, round {round}", run, count_files(self.work / f"dest-{tool}"))

    def rgw(self) -> None:
        count, bucket, endpoint = self.args.rgw_keys, self.args.bucket, self.args.endpoint
        self.seed_rgw()
        if "prepare" in self.args.only:
            return
        dest = self.work / "dest"
        tools = self.args.tools.split(",")
        name = f"RGW {count:,}"
        remote = f"rgw:{bucket}/scale"
        if "lading" in tools:
            argv = self.lading_argv(f"s3://{bucket}/scale", dest, "--endpoint-url", endpoint)
            self.pair(name, "lading", argv, argv, dest, count, self.lading.root)
        if "rclone" in tools and self.rclone:
            argv = self.rclone_argv(remote, dest)
            self.pair(name, "rclone", argv, argv, dest, count)
        if "s5cmd" in tools and self.s5cmd:
            base = [self.s5cmd, "--endpoint-url", endpoint, "--numworkers", str(self.args.workers)]
            self.pair(
                name,
                "s5cmd",
                base + ["cp", f"s3://{bucket}/scale/*", f"{dest}/"],
                base + ["sync", f"s3://{bucket}/scale/*", f"{dest}/"],
                dest,
                count,
            )

    def seed_rgw(self) -> None:
        """``--rgw-keys`` empty objects in 200 folders under s3://BUCKET/scale/, once (a marker file
        in --work says the bucket is seeded): with s5cmd (128 workers) if present, else rclone."""
        count, bucket = self.args.rgw_keys, self.args.bucket
        marker = self.work / f"seeded-{bucket}-{count}"
        if marker.exists():
            return
        seed = self.work / f"seed-{count}"
        make_tree(seed, count, 200)
        subprocess.run([self.rclone, "--config", str(self.conf), "mkdir", f"rgw:{bucket}"], env=peer_env(), check=True)
        log(f"seeding {count:,} empty objects into s3://{bucket}/scale/ ...")
        if self.s5cmd:
            argv = [self.s5cmd, "--endpoint-url", self.args.endpoint, "--numworkers", "128", "cp"]
            run = timed([*argv, f"{seed}/*", f"s3://{bucket}/scale/"])
        else:
            argv = [self.rclone, "--config", str(self.conf), "copy", "--transfers", "64", "--checkers", "64"]
            run = timed([*argv, str(seed), f"rgw:{bucket}/scale"])
        log(f"seeded in {run.wall:.0f} s")
        marker.write_text("")

    def remove_bucket(self) -> None:
        log(f"removing the bucket {self.args.bucket} ...")
        subprocess.run(
            [self.rclone, "--config", str(self.conf), "purge", f"rgw:{self.args.bucket}", "--checkers", "64"],
            env=peer_env(),
            check=False,
        )


def main() -> None:
    global log
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--only",
        default="local,rgw",
        help="local, rgw or both (default %(default)s); with prepare: create the trees and seed the bucket only",
    )
    parser.add_argument("--tools", default="lading,rclone,s5cmd")
    parser.add_argument("--local-keys", type=int, default=1_280_000)
    parser.add_argument("--rgw-keys", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--work", default="/tmp/bench-syncscale")
    parser.add_argument("--endpoint", default="http://127.0.0.1:7480")
    parser.add_argument("--bucket", default="bench-syncscale")
    parser.add_argument("--peers-venv", default=DEFAULT_PEERS_VENV)
    parser.add_argument("--keep", action="store_true", help="keep the source trees (and the bucket)")
    parser.add_argument(
        "--noop-rounds",
        type=int,
        default=0,
        help="local only: N alternating rounds of no-op re-syncs into DESTs kept in --work (with --keep)",
    )
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log = Log(work / "out")
    bench = Bench(args)
    bench.conf.write_text(
        "[rgw]\ntype = s3\nprovider = Ceph\naccess_key_id = test\nsecret_access_key = test\n"
        f"endpoint = {args.endpoint}\n"
    )
    for line in (
        machine_lines()
        + versions({k: v for k, v in (("rclone", bench.rclone), ("s5cmd", bench.s5cmd)) if v})
        + [f"lading: {lading_state(bench.lading)}"]
    ):
        log(line)
    log("| source | tool | run | wall s | CPU s | peak RSS MiB | files in DEST | load average |")
    log("| --- | --- | --- | --- | --- | --- | --- | --- |")
    try:
        if "local" in args.only:
            bench.local()
        if "rgw" in args.only:
            bench.rgw()
    finally:
        if not args.keep:
            if "rgw" in args.only and bench.rclone:
                bench.remove_bucket()
            log(f"removing {work} ...")
            for dest in work.glob("dest*"):
                if dest.is_dir():
                    shutil.rmtree(dest, ignore_errors=True)
                else:
                    dest.unlink(missing_ok=True)
            for path in work.glob("s*-*"):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
                path.with_name(path.name + ".done").unlink(missing_ok=True)
    log("\n".join(bench.rows))
    sys.exit(0)


if __name__ == "__main__":
    main()
