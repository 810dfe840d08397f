#!/usr/bin/env python3
"""The floor for lading's sync: a bare obstore asyncio loop, no lading code (bench_sync.py's
``obstore`` tool).

    bare_obstore.py copy ENDPOINT BUCKET PREFIX DEST      # every object under PREFIX to DEST/<name>
    bare_obstore.py copy-verified ENDPOINT BUCKET PREFIX DEST   # the same, checked and renamed into place
    bare_obstore.py big ENDPOINT BUCKET KEY DEST_FILE     # one object in ranged parts
    bare_obstore.py big-pinned ...                        # the same as lading fetches a part
    bare_obstore.py big-streamed ...                      # the same, each piece written as it arrives
    bare_obstore.py big-streamed-threads ...              # the same, a thread per part, no loop hop

copy: 64 concurrent ``get_async`` + ``bytes_async``, each body written to its file (the key's path
under PREFIX; directories made first). copy-verified adds sync's per-file guarantees in their
barest form: the body's MD5 compared with its single-part ETag, written to a temporary name and
renamed over the final one.
big: parts of 8 MiB, 8 at a time, each one ``get_range_async`` (collected whole, unpinned: one hop
fewer than a pinned ``get_async``) written with ``pwrite`` in slices of 256 KiB into a preallocated
file, with the CLI's allocator settings (one arena, part buffers below the mmap threshold): the
cheapest recipe of the variants measured in bench/RESULTS.md (session 9). Until session 9 it took
16 MiB parts, 16 at a time, without those settings: every part buffer was a fresh mapping
(130,000-150,000 page faults and about 1 CPU-s more per GiB), slower than lading itself.
big-pinned: each part a ``get_async`` with its range and ``If-Match`` of the HEAD's ETag, collected
with ``bytes_async`` (lading's attempt for a part: two hops from obstore's runtime to the loop).
big-streamed: the same pinned GET, its body read with ``stream(min_chunk_size=0)`` (hyper's own
chunks, each copied once into a Python ``bytes``, none coalesced) and each piece ``pwrite``n at
its offset straight away, while it is still in the CPU cache; one hop to the loop per piece.
big-streamed-threads: as big-streamed, but each part read with the stream's blocking ``__next__`` in
a thread of its own (the piece handed over by ``block_on``, no hop through the asyncio loop).
The big variants take an optional sixth argument PxN or PxNsS: parts of P MiB, N at once, written
in ``pwrite`` slices of at most S KiB (default 8x8s256; session 12, big9).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from datetime import timedelta

import obstore
from obstore.store import S3Store

CONCURRENCY = 64
PART = 8 << 20
PARTS_AT_ONCE = 8
SLICE = 256 << 10


def _store(endpoint: str, bucket: str) -> S3Store:
    return S3Store(
        bucket,
        endpoint=endpoint,
        region="us-east-1",
        access_key_id="test",
        secret_access_key="test",
        virtual_hosted_style_request=False,
        client_options={"allow_http": True, "timeout": timedelta(minutes=10)},
    )


async def copy(store: S3Store, prefix: str, dest: str, verified: bool = False) -> None:
    metas = [meta for page in obstore.list(store, prefix, chunk_size=1000) for meta in page]
    keys = [meta["path"] for meta in metas]
    etags = {meta["path"]: (meta["e_tag"] or "").strip('"') for meta in metas}
    slots = asyncio.Semaphore(CONCURRENCY)

    root = prefix.rstrip("/") + "/"
    for directory in {os.path.dirname(key[len(root) :]) for key in keys}:
        os.makedirs(os.path.join(dest, directory), exist_ok=True)

    async def one(key: str) -> None:
        async with slots:
            body = await (await obstore.get_async(store, key)).bytes_async()
        final = os.path.join(dest, key[len(root) :])
        path = os.path.join(os.path.dirname(final), "." + os.path.basename(final) + ".part") if verified else final
        if verified and hashlib.md5(memoryview(body), usedforsecurity=False).hexdigest() != etags[key]:
            raise SystemExit(f"{key}: MD5 mismatch")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, memoryview(body))
        finally:
            os.close(fd)
        if verified:
            os.rename(path, final)

    await asyncio.gather(*(one(key) for key in keys))


def _pwrite(fd: int, body: memoryview, at: int) -> None:
    for offset in range(0, len(body), SLICE):
        os.pwrite(fd, body[offset : offset + SLICE], at + offset)


async def big(store: S3Store, key: str, dest: str, how: str = "big") -> None:
    head = await obstore.head_async(store, key)
    size, etag = head["size"], head["e_tag"]
    fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, size)
    os.posix_fallocate(fd, 0, size)
    slots = asyncio.Semaphore(PARTS_AT_ONCE)

    def pinned(start: int, end: int) -> dict:
        return {"range": (start, end), "if_match": etag}

    async def part(start: int) -> None:
        async with slots:
            end = min(size, start + PART)
            if how == "big":
                _pwrite(fd, memoryview(await obstore.get_range_async(store, key, start=start, end=end)), start)
                return
            result = await obstore.get_async(store, key, options=pinned(start, end))  # type: ignore[arg-type]
            if how == "big-pinned":
                body = memoryview(await result.bytes_async())
                if len(body) != end - start:
                    raise SystemExit(f"part at {start}: {len(body)} of {end - start} bytes")
                _pwrite(fd, body, start)
                return
            at = start
            async for piece in result.stream(min_chunk_size=0):
                _pwrite(fd, memoryview(piece), at)
                at += len(piece)
            if at != end:
                raise SystemExit(f"part at {start}: ended at {at} of {end}")

    def part_in_thread(start: int) -> None:
        end = min(size, start + PART)
        result = obstore.get(store, key, options=pinned(start, end))  # type: ignore[arg-type]
        at = start
        for piece in result.stream(min_chunk_size=0):
            _pwrite(fd, memoryview(piece), at)
            at += len(piece)
        if at != end:
            raise SystemExit(f"part at {start}: ended at {at} of {end}")

    try:
        if how == "big-streamed-threads":
            import concurrent.futures

            with concurrent.futures.ThreadPoolExecutor(PARTS_AT_ONCE) as pool:
                list(pool.map(part_in_thread, range(0, size, PART)))
        else:
            await asyncio.gather(*(part(start) for start in range(0, size, PART)))
    finally:
        os.close(fd)


def _allocator_as_the_cli() -> None:
    """glibc settings as lading's CLI makes them (lading.cli.main): part buffers reused from one heap."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.mallopt(-3, 16 << 20)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 128 << 20)  # M_TRIM_THRESHOLD
    libc.mallopt(-8, 1)  # M_ARENA_MAX


def main() -> None:
    global PART, PARTS_AT_ONCE, SLICE
    mode, endpoint, bucket, name, dest = sys.argv[1:6]
    if len(sys.argv) > 6:
        layout, _, kib = sys.argv[6].partition("s")
        mib, at_once = layout.split("x")
        PART, PARTS_AT_ONCE, SLICE = int(mib) << 20, int(at_once), int(kib or 256) << 10
    if mode.startswith("big"):
        _allocator_as_the_cli()
    store = _store(endpoint, bucket)
    if mode.startswith("big"):
        asyncio.run(big(store, name, dest, mode))
    else:
        asyncio.run(copy(store, name, dest, mode == "copy-verified"))


if __name__ == "__main__":
    main()
