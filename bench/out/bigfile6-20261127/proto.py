"""Prototype variants of one ranged 1 GiB download into a file, bare obstore; one variant per process.

    proto.py VARIANT DEST
Prints a JSON line: variant, wall, cpu (user+sys of the download only), faults, maxrss.
"""

import asyncio
import ctypes
import json
import os
import resource
import sys
import threading
import time
from datetime import timedelta

libc = ctypes.CDLL(None)
libc.mallopt(-3, int(os.environ.get("MMAP_MIB","16")) << 20)
libc.mallopt(-1, 128 << 20)
if os.environ.get("ARENAS", "1") != "0":
    libc.mallopt(-8, int(os.environ.get("ARENAS", "1")))

if os.environ.get("THP") == "1":
    libc.malloc.restype = ctypes.c_void_p
    libc.sbrk.restype = ctypes.c_void_p
    pad = int(os.environ.get("THP_MIB", "96")) << 20
    libc.mallopt(-2, pad)  # M_TOP_PAD
    p = libc.malloc(15 << 20)
    libc.free(ctypes.c_void_p(p))
    top = libc.sbrk(0)
    start = (p + (2 << 20) - 1) & ~((2 << 20) - 1)
    rc = libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t((top - start) & ~((2 << 20) - 1)), 14)
    print("thp", hex(p), hex(top), (top - start) >> 20, rc, file=sys.stderr)
    libc.mallopt(-2, 128 << 10)
import obstore  # noqa: E402
from obstore.store import S3Store  # noqa: E402

BUCKET = os.environ.get("BUCKET", "bench-bigfile6-a")
KEY = "big/blob.bin"
SLICE = int(os.environ.get("SLICE_KIB", "256")) << 10


def store() -> S3Store:
    return S3Store(
        BUCKET,
        endpoint="http://127.0.0.1:7480",
        region="us-east-1",
        access_key_id="test",
        secret_access_key="test",
        virtual_hosted_style_request=False,
        client_options={"allow_http": True, "timeout": timedelta(minutes=10)},
    )


def pwrite_all(fd, data, offset, slice_=SLICE):
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view[:slice_], offset)
        view, offset = view[n:], offset + n


def parse(variant):
    # kind-partMiB-conc[-chunkKiB]
    parts = variant.split("-")
    kind = parts[0]
    part = int(parts[1]) << 20
    conc = int(parts[2])
    chunk = int(parts[3]) << 10 if len(parts) > 3 else 0
    return kind, part, conc, chunk


async def run_async(st, kind, part, conc, chunk, fd, size, etag):
    slots = asyncio.Semaphore(conc)

    async def one(start):
        end = min(size, start + part)
        async with slots:
            if kind == "collect":
                res = await obstore.get_async(st, KEY, options={"range": (start, end), "if_match": etag})
                data = await res.bytes_async()
                pwrite_all(fd, data, start)
            elif kind == "collectw":  # one pwrite per part
                res = await obstore.get_async(st, KEY, options={"range": (start, end), "if_match": etag})
                data = await res.bytes_async()
                pwrite_all(fd, data, start, 1 << 30)
            elif kind == "range":
                data = await obstore.get_range_async(st, KEY, start=start, end=end)
                pwrite_all(fd, data, start)
            elif kind == "stream":
                res = await obstore.get_async(st, KEY, options={"range": (start, end), "if_match": etag})
                pos = start
                async for piece in res.stream(min_chunk_size=chunk):
                    n = len(piece)
                    pwrite_all(fd, piece, pos)
                    pos += n
                assert pos == end
            elif kind == "collectt":  # write in a thread
                res = await obstore.get_async(st, KEY, options={"range": (start, end), "if_match": etag})
                data = await res.bytes_async()
                await asyncio.to_thread(pwrite_all, fd, data, start)

    await asyncio.gather(*(one(s) for s in range(0, size, part)))


def run_threads(st, kind, part, conc, fd, size, etag):
    starts = list(range(0, size, part))
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if not starts:
                    return
                start = starts.pop(0)
            end = min(size, start + part)
            res = obstore.get(st, KEY, options={"range": (start, end), "if_match": etag})
            data = res.bytes()
            pwrite_all(fd, data, start)

    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main():
    variant, dest = sys.argv[1], sys.argv[2]
    kind, part, conc, chunk = parse(variant)
    st = store()
    head = obstore.head(st, KEY)
    size, etag = head["size"], head["e_tag"]
    # warm: one small GET (connection + client), like a CLI's listing
    obstore.get_range(st, KEY, start=0, end=1)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, size)
    if os.environ.get("FALLOC", "1") == "1":
        os.posix_fallocate(fd, 0, size)
    if kind == "threads":
        run_threads(st, kind, part, conc, fd, size, etag)
    else:
        asyncio.run(run_async(st, kind, part, conc, chunk, fd, size, etag))
    os.close(fd)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "variant": variant,
                "wall": round(wall, 3),
                "cpu": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 3),
                "user": round(r1.ru_utime - r0.ru_utime, 3),
                "sys": round(r1.ru_stime - r0.ru_stime, 3),
                "faults": r1.ru_minflt + r1.ru_majflt - r0.ru_minflt - r0.ru_majflt,
                "rss": r1.ru_maxrss >> 10,
            }
        )
    )


main()
