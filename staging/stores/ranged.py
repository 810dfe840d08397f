"""One version-checked ranged read, on the calling thread.

For callers that wait for the bytes on a thread of their own (the mount's FUSE threads and GET
threads). Through obstore the GET is obstore's blocking call (:meth:`ObstoreReader.read_here`), made
on the calling thread with the GIL released: no hop to the I/O core's loop and back, retried under
the one retry routine (:mod:`lading.core.retry`), the answer's version checked, the bytes a
zero-copy view of obstore's buffer. A store that does not read through obstore (a local directory;
GCS before its route is chosen; a forked child on the SDK) reads through its ``read_range``.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from lading.core.errors import NotFound, ObjectChanged
from lading.stores.base import RangeRequest, Store
from lading.stores.obstore_reads import ObstoreReader

#: ``read(request)``: the bytes of ``[start, end)`` (fewer at the end of the object, none past it).
RangeRead = Callable[[RangeRequest], memoryview]
_T = TypeVar("_T")


def range_reader(store: Store) -> RangeRead:
    """A function that reads one range of ``store`` on the calling thread, pinned to the request's
    version (transient failures retried under the store's policy)."""

    def attempt(request: RangeRequest) -> memoryview:
        reads = store.coroutine_reads(request.key)
        if isinstance(reads, ObstoreReader):
            return reads.read_here(request)
        end = request.end if request.end is not None else 1 << 62
        return memoryview(store.read_range(request.key, request.start, end, request.version))

    return lambda request: _pinned(store, request, attempt)


def attempt_reader(store: Store) -> Callable[[RangeRequest], memoryview | None]:
    """A function that tries one range of ``store`` once on the calling thread, pinned as
    :func:`range_reader`'s: no retry and no hop to another thread, so that the store client's
    connect and read timeouts bound it (a caller that must answer within a deadline can wait on
    its own thread). None when this store's read cannot be bounded so (not through obstore, or a
    read that needs the I/O core's loop): read it with :func:`range_reader`."""

    def attempt(request: RangeRequest) -> memoryview | None:
        reads = store.coroutine_reads(request.key)
        return reads.attempt_here(request) if isinstance(reads, ObstoreReader) else None

    return lambda request: _pinned(store, request, attempt)


def _pinned(store: Store, request: RangeRequest, attempt: Callable[[RangeRequest], _T]) -> _T:
    """``attempt(request)``, a pinned version that is gone said as ObjectChanged."""
    try:
        return attempt(request)
    except NotFound as err:
        if not request.version:
            raise
        # The version asked for is gone: GCS answers a replaced generation with 404, S3 a
        # deleted object's If-Match.
        raise ObjectChanged(
            f"{store.url.rstrip('/')}/{request.key} was replaced or removed since version {request.version} was listed",
            "the object changed; list it again",
        ) from err


__all__ = ["RangeRead", "RangeRequest", "attempt_reader", "range_reader"]
