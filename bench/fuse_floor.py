#!/usr/bin/env python3
"""FUSE's own cost on this machine: a read-only mount that serves one file from memory, no network.

    .venv/bin/python bench/fuse_floor.py --rounds 3 [--size-mib 1024]

The file system (mfusepy's high-level API over libfuse 3, as ``lading mount``) holds one file of
``--size-mib`` MiB whose bytes come from one 8 MiB buffer in memory, copied straight into FUSE's
buffer with ``memmove`` (``lading mount``'s read path once a part has arrived), with the mount's
options (read-only, ``kernel_cache``, ``default_permissions``). Each round drops the page cache,
reads the file once in 1 MiB reads (as bench_mount.py's ``seq`` case does) and prints the wall
time, the daemon's CPU, the reading process's CPU and their sum.

Nothing here talks to a server, so the sum is the least CPU any mount served through this binding
adds to a direct download of the same bytes: a lower bound for ``lading mount``'s cost per GiB
beside bench_mount.py's ``direct`` row.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import os
import resource
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BLOCK = 8 << 20
NAME = "floor.bin"


def serve(mountpoint: str, size: int) -> None:
    """Run the file system in this process until unmounted."""
    import mfusepy

    source = ctypes.create_string_buffer(b"\x5a" * BLOCK, BLOCK)
    base = ctypes.addressof(source)

    class Floor(mfusepy.Operations):
        use_ns = True

        def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
            if path == "/":
                return {"st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2}
            if path == "/" + NAME:
                return {"st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": size}
            raise mfusepy.FuseOSError(errno.ENOENT)

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", NAME]

        def open(self, path: str, flags: int) -> int:
            return 0

        def read(self, path: str, length: int, offset: int, fh: int) -> bytes:
            raise AssertionError("FloorFUSE.read serves reads")  # mfusepy wires reads only when defined

        def read_into(self, dest: int, length: int, offset: int) -> int:
            count = max(0, min(length, size - offset))
            done = 0
            while done < count:
                at = (offset + done) % BLOCK
                piece = min(count - done, BLOCK - at)
                ctypes.memmove(dest + done, base + at, piece)
                done += piece
            return count

    class FloorFUSE(mfusepy.FUSE):
        def read(self, path: bytes | None, buf: object, length: int, offset: int, fip: object) -> int:
            return self.operations.read_into(ctypes.cast(buf, ctypes.c_void_p).value, length, offset)

    FloorFUSE(Floor(), mountpoint, foreground=True, ro=True, kernel_cache=True, default_permissions=True)


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def drop_caches() -> None:
    os.sync()
    with contextlib.suppress(OSError), open("/proc/sys/vm/drop_caches", "w") as handle:
        handle.write("3\n")


def one_round(path: Path, pid: int, size: int) -> tuple[float, float, float]:
    """Wall seconds, daemon CPU and reader CPU of one cold read of the file in 1 MiB reads."""
    drop_caches()
    daemon, reader, began = cpu_of(pid), own_cpu(), time.perf_counter()
    total = 0
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(1 << 20):
            total += len(chunk)
    assert total == size, total
    return time.perf_counter() - began, cpu_of(pid) - daemon, own_cpu() - reader


def main() -> None:
    """Mount, measure the rounds, unmount, print the medians."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--serve", metavar="MOUNTPOINT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = args.size_mib << 20
    if args.serve:
        serve(args.serve, size)
        return
    mountpoint = Path(tempfile.mkdtemp(prefix="fuse-floor-"))
    daemon = subprocess.Popen([sys.executable, __file__, "--serve", str(mountpoint), "--size-mib", str(args.size_mib)])
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mountpoint):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the floor mount did not come up")
            time.sleep(0.05)
        rounds = [one_round(mountpoint / NAME, daemon.pid, size) for _ in range(args.rounds)]
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
        daemon.wait(timeout=30)
        mountpoint.rmdir()
    for wall, dcpu, rcpu in rounds:
        print(f"wall {wall:6.3f} s  daemon CPU {dcpu:5.2f} s  reader CPU {rcpu:5.2f} s  sum {dcpu + rcpu:5.2f} s")
    per_gib = (1 << 30) / size
    print(
        f"median per GiB: wall {statistics.median(r[0] for r in rounds) * per_gib:.3f} s, "
        f"daemon {statistics.median(r[1] for r in rounds) * per_gib:.2f} CPU-s, "
        f"reader {statistics.median(r[2] for r in rounds) * per_gib:.2f} CPU-s, "
        f"sum {statistics.median(r[1] + r[2] for r in rounds) * per_gib:.2f} CPU-s"
    )


if __name__ == "__main__":
    main()
