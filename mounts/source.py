"""Where the reader's bytes come from: the Store protocol, or S3's lean GET path when present.

botocore costs milliseconds of CPU per request under the GIL, which caps small-file reads;
:mod:`staging.stores.s3_fast` signs and sends the same version-guarded ranged GET for about a
tenth of that, and streams the body, so the reader can serve the first blocks of a large GET
before its last byte arrives. Both raise :mod:`staging.errors` exceptions (ObjectChanged when
the object has a new version). One call is one attempt: the reader retries what is missing.
"""

from __future__ import annotations

from typing import Callable

from staging.stores.base import Store

#: Receives the body of a GET in order, in pieces of any size.
Sink = Callable[[memoryview], None]
#: ``stream(key, start, end, version, sink)``: one attempt at GET bytes ``[start, end)``.
RangeStream = Callable[[str, int, int, str, Sink], None]


def range_streamer(store: Store) -> RangeStream:
    """The cheapest version-guarded, streaming ranged read this store offers."""
    if getattr(getattr(store, "uri", None), "scheme", None) == "s3":
        from staging.stores.s3_fast import fast_client_for

        fast = fast_client_for(store)
        if fast is not None:
            def lean(key: str, start: int, end: int, version: str, sink: Sink) -> None:
                fast.get(key, sink, version, start, end)

            return lean

    def generic(key: str, start: int, end: int, version: str, sink: Sink) -> None:
        sink(memoryview(store.read_range(key, start, end, version)))

    return generic
