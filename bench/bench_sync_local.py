#!/usr/bin/env python3
"""A first sync of a tree of (empty or small) files into a fresh local DEST: lading, optionally other
lading checkouts, and rclone, in alternating rounds (the order rotates). SRC is a local tree, or
a bucket prefix with --lading-arg=--endpoint-url=... and --rclone-src (rclone's spelling of it,
with --rclone-arg for its remote's options). Wall
seconds, CPU seconds (user + system, GNU time) and peak RSS of each command, the 1-minute load
average beside each row. Run it under the bench lock:

    flock /work/bench.lock .venv/bin/python bench/bench_sync_local.py /tmp/tree --rounds 3 \
        --lading new=.venv/bin/python --lading main=/work/main/.venv/bin/python

The tree is the caller's (bench/bench_sync_scale.py makes one of empty files).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchtools import DEFAULT_PEERS_VENV, peer_path


def command(tool: str, python: str | None, src: str, dest: str, args: argparse.Namespace) -> list[str]:
    """The copy command of one tool."""
    if python is None:
        rclone = peer_path("rclone", DEFAULT_PEERS_VENV) or "rclone"
        workers = str(args.workers)
        return [
            rclone,
            "copy",
            args.rclone_src or src,
            dest,
            "--transfers",
            workers,
            "--checkers",
            workers,
            *args.rclone_arg,
        ]
    return [python, "-m", "lading", "sync", src, dest, "--no-cache", "--json", *args.lading_arg]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lading", action="append", default=[], help="NAME=PYTHON (default new=.venv/bin/python)")
    parser.add_argument("--no-rclone", action="store_true")
    parser.add_argument("--workers", type=int, default=64, help="rclone's --transfers/--checkers")
    parser.add_argument("--work", default="/tmp/bench-sync-local")
    parser.add_argument("--lading-arg", action="append", default=[], help="extra argument of lading sync")
    parser.add_argument("--rclone-src", help="rclone's spelling of SRC (default SRC)")
    parser.add_argument("--rclone-arg", action="append", default=[], help="extra argument of rclone copy")
    args = parser.parse_args()
    tools: dict[str, str | None] = dict(spec.split("=", 1) for spec in args.lading or ["new=.venv/bin/python"])
    if not args.no_rclone:
        tools["rclone"] = None
    names = list(tools)
    for round_ in range(args.rounds):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            dest = f"{args.work}/{name}"
            shutil.rmtree(dest, ignore_errors=True)
            load = os.getloadavg()[0]
            with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
                start = time.perf_counter()
                proc = subprocess.run(
                    [
                        "/usr/bin/time",
                        "-f",
                        "%M %U %S",
                        "-o",
                        out.name,
                        *command(name, tools[name], args.src, dest, args),
                    ],
                    capture_output=True,
                    cwd=Path(__file__).resolve().parent.parent,
                )
                wall = time.perf_counter() - start
                rss, user, system = out.read().split()[-3:]
            if proc.returncode != 0:
                raise SystemExit(f"{name}: exit {proc.returncode}: {proc.stderr.decode()[-1500:]}")
            files = sum(len(found) for _, _, found in os.walk(dest))
            shutil.rmtree(dest, ignore_errors=True)
            cpu = float(user) + float(system)
            print(
                f"round {round_ + 1} {name:8s} wall {wall:7.2f} s  CPU {cpu:7.2f} s (user {user}, system {system})"
                f"  peak RSS {int(rss) // 1024} MiB  files {files}  load {load:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
