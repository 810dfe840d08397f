"""One version-checked ranged read as a coroutine on this process's I/O core.

For callers that already live on the I/O core's loop (the mount's reader schedules its GETs
there) and must not block it. The read goes through the store's coroutine reads
(:meth:`lading.stores.base.Store.coroutine_reads`): through obstore the GET runs on the loop,
retried there under the one retry routine (:mod:`lading.core.retry`), the answer's version
checked, and the bytes come back as a zero-copy view of obstore's buffer. A store with no
coroutine reads (a local directory; GCS before its route is chosen) runs its blocking
``read_range`` in a worker thread, and so does a store's first read: choosing how reads reach a
custom endpoint, building the client and discovering the region are blocking work that must not
run on the loop.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from lading.core.errors import NotFound, ObjectChanged
from lading.stores.base import CoroutineReads, RangeRequest, Store

#: ``read(request)``: the bytes of ``[start, end)`` (fewer at the end of the object, none past it).
AsyncRangeRead = Callable[[RangeRequest], Awaitable[memoryview]]


def async_range_reader(store: Store) -> AsyncRangeRead:
    """A coroutine function that reads one range of ``store``, pinned to the request's version
    (transient failures retried under the store's policy)."""
    settled = False  # the store answered coroutine_reads once, off the loop: it no longer blocks

    async def in_thread(request: RangeRequest) -> memoryview:
        end = request.end if request.end is not None else 1 << 62
        return memoryview(await asyncio.to_thread(store.read_range, request.key, request.start, end, request.version))

    async def attempt(request: RangeRequest) -> memoryview:
        nonlocal settled
        reads: CoroutineReads | None
        if settled:
            reads = store.coroutine_reads(request.key)
        else:
            reads = await asyncio.to_thread(store.coroutine_reads, request.key)
            settled = reads is not None
        if reads is None:
            return await in_thread(request)
        return await reads.read(request)

    async def read(request: RangeRequest) -> memoryview:
        try:
            return await attempt(request)
        except NotFound as err:
            if not request.version:
                raise
            # The version asked for is gone: GCS answers a replaced generation with 404, S3 a
            # deleted object's If-Match.
            raise ObjectChanged(
                f"{store.url.rstrip('/')}/{request.key} was replaced or removed since version "
                f"{request.version} was listed",
                "the object changed; list it again",
            ) from err

    return read


__all__ = ["AsyncRangeRead", "RangeRequest", "async_range_reader"]
