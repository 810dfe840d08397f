"""One version-checked ranged read as a coroutine on this process's I/O core.

For callers that already live on the I/O core's loop (the mount's reader schedules its GETs
there) and must not block it: where the store reads through obstore, the GET itself runs on the
loop (``get_async`` + ``bytes_async``, retried there, the answer's version checked) and the bytes
come back as a zero-copy view of obstore's buffer; any other store (a local directory, the SDK
fallback of a forked child) runs its blocking ``read_range`` in a worker thread, and so does a
store's first read (choosing how reads reach a custom GCS endpoint, building the client and
discovering the region are blocking work that must not run on the loop).
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from lading.core.errors import NotFound, ObjectChanged
from lading.stores.base import Store
from lading.stores.obstore_reads import ObstoreReader, RangeRequest

#: ``read(request)``: the bytes of ``[start, end)`` (fewer at the end of the object, none past it).
AsyncRangeRead = Callable[[RangeRequest], Awaitable[memoryview]]


def async_range_reader(store: Store) -> AsyncRangeRead:
    """A coroutine function that reads one range of ``store``, pinned to the request's version
    (transient failures retried under the store's policy)."""
    from lading.stores.objstore import ObstoreReads
    from lading.stores.snapshot import SnapshotStore

    inner: Store = store.inner if isinstance(store, SnapshotStore) else store
    settled = False  # the store's first read decided its route and built its client (off the loop)

    async def in_thread(request: RangeRequest) -> memoryview:
        end = request.end if request.end is not None else 1 << 62
        return memoryview(await asyncio.to_thread(store.read_range, request.key, request.start, end, request.version))

    async def attempt(request: RangeRequest) -> memoryview:
        nonlocal settled
        if not (settled and isinstance(inner, ObstoreReads) and request.version):
            data = await in_thread(request)
            settled = True
            return data
        reader = inner._reads(request.key)
        if not isinstance(reader, ObstoreReader):
            return await in_thread(request)
        return await reader.read(request)

    async def read(request: RangeRequest) -> memoryview:
        try:
            return await attempt(request)
        except NotFound as err:
            if not request.version:
                raise
            # The version asked for is gone: GCS answers a replaced generation with 404, S3 a
            # deleted object's If-Match.
            raise ObjectChanged(f"{store.url.rstrip('/')}/{request.key} was replaced or removed since version "
                                f"{request.version} was listed", "the object changed; list it again") from err

    return read


__all__ = ["AsyncRangeRead", "RangeRequest", "async_range_reader"]
