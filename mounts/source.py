"""Where the reader's bytes come from: the store's streaming GET when it has one (S3 and GCS on
obstore), else the Store protocol's ``read_range``.

The streaming GET is version-guarded and checked (a replaced object raises ObjectChanged) and
hands the body over as it arrives, so the reader can serve the first blocks of a large GET
before its last byte arrives. One call is one attempt: the reader retries what is missing.
"""

from __future__ import annotations

from typing import Callable

from lading.stores import Store, TransientError
from lading.stores.base import StreamingStore

#: Told of each piece of the body once it is in place, in order: a view of the target buffer.
Sink = Callable[[memoryview], None]
#: ``stream(key, start, end, version, into, sink)``: one attempt at GET bytes ``[start, end)``,
#: placed in ``into`` from its start (a body longer than ``into`` is a TransientError).
RangeStream = Callable[[str, int, int, str, memoryview, Sink], None]


def range_streamer(store: Store) -> RangeStream:
    """The cheapest version-guarded, streaming ranged read this store offers."""
    if isinstance(store, StreamingStore):
        def streaming(key: str, start: int, end: int, version: str, into: memoryview, sink: Sink) -> None:
            filled = 0

            def place(chunk: memoryview) -> None:
                nonlocal filled
                size = len(chunk)
                if filled + size > len(into):
                    raise TransientError(f"{key}: the store sent more bytes than asked for")
                into[filled:filled + size] = chunk
                sink(into[filled:filled + size])
                filled += size

            store.stream(key, place, version or None, start, end)

        return streaming

    def generic(key: str, start: int, end: int, version: str, into: memoryview, sink: Sink) -> None:
        data = store.read_range(key, start, end, version)
        if len(data) > len(into):
            raise TransientError(f"{key}: the store sent more bytes than asked for")
        into[:len(data)] = data
        sink(into[:len(data)])

    return generic
