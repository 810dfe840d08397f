"""One version-checked ranged read, on the calling thread.

For callers that wait for the bytes on a thread of their own (the mount's FUSE threads and GET
threads). Through obstore the GET is obstore's blocking call (:meth:`ObstoreReader.read_here`), made
on the calling thread with the GIL released: no hop to the I/O core's loop and back, retried under
the one retry routine (:mod:`lading.core.retry`), the answer's version checked, the bytes a
zero-copy view of obstore's buffer. A store that does not read through obstore (a local directory;
GCS before its route is chosen; a forked child on the SDK) reads through its ``read_range``.
"""

from __future__ import annotations

from typing import Callable

from lading.core.errors import NotFound, ObjectChanged
from lading.stores.base import RangeRequest, Store
from lading.stores.obstore_reads import ObstoreReader

#: ``read(request)``: the bytes of ``[start, end)`` (fewer at the end of the object, none past it).
RangeRead = Callable[[RangeRequest], memoryview]


def range_reader(store: Store) -> RangeRead:
    """A function that reads one range of ``store`` on the calling thread, pinned to the request's
    version (transient failures retried under the store's policy)."""

    def attempt(request: RangeRequest) -> memoryview:
        reads = store.coroutine_reads(request.key)
        if isinstance(reads, ObstoreReader):
            return reads.read_here(request)
        end = request.end if request.end is not None else 1 << 62
        return memoryview(store.read_range(request.key, request.start, end, request.version))

    def read(request: RangeRequest) -> memoryview:
        try:
            return attempt(request)
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


__all__ = ["RangeRead", "RangeRequest", "range_reader"]
