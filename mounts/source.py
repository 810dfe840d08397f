"""Where the reader's bytes come from: the Store protocol, or S3's lean GET path when present.

botocore costs milliseconds of CPU per request under the GIL, which caps small-file reads;
:mod:`lading.stores.s3.fast` signs and sends the same version-guarded ranged GET for about a
tenth of that, and streams the body, so the reader can serve the first blocks of a large GET
before its last byte arrives. Both raise :mod:`lading.core.errors` exceptions (ObjectChanged when
the object has a new version). One call is one attempt: the reader retries what is missing.
"""

from __future__ import annotations

from typing import Callable

from lading.stores import Store, TransientError

#: Told of each piece of the body once it is in place, in order: a view of the target buffer.
Sink = Callable[[memoryview], None]
#: ``stream(key, start, end, version, into, sink)``: one attempt at GET bytes ``[start, end)``,
#: placed in ``into`` from its start (a body longer than ``into`` is a TransientError).
RangeStream = Callable[[str, int, int, str, memoryview, Sink], None]


def range_streamer(store: Store) -> RangeStream:
    """The cheapest version-guarded, streaming ranged read this store offers."""
    if getattr(getattr(store, "uri", None), "scheme", None) == "s3":
        from lading.stores.s3.fast import fast_client_for

        fast = fast_client_for(store)
        if fast is not None:
            def lean(key: str, start: int, end: int, version: str, into: memoryview, sink: Sink) -> None:
                fast.get(key, sink, version, start, end, into=into)  # received straight into ``into``

            return lean

    def generic(key: str, start: int, end: int, version: str, into: memoryview, sink: Sink) -> None:
        data = store.read_range(key, start, end, version)
        if len(data) > len(into):
            raise TransientError(f"{key}: the store sent more bytes than asked for")
        into[:len(data)] = data
        sink(into[:len(data)])

    return generic
