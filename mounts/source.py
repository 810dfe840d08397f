"""Where the reader's bytes come from: the Store protocol, or S3's lean GET path when present.

botocore costs milliseconds of CPU per request under the GIL, which caps small-file reads;
:mod:`staging.stores.s3_fast` signs and sends the same version-guarded ranged GET for about a
tenth of that. Both raise :mod:`staging.errors` exceptions (ObjectChanged on a new version).
"""

from __future__ import annotations

from typing import Callable

from staging.retry import DEFAULT_POLICY, with_retries
from staging.stores.base import Store

#: ``read(key, start, end, version)`` -> the bytes ``[start, end)`` (a bytes-like object).
RangeRead = Callable[[str, int, int, str], "bytes | bytearray"]


def range_reader(store: Store) -> RangeRead:
    """The cheapest version-guarded ranged read this store offers."""
    if getattr(getattr(store, "uri", None), "scheme", None) == "s3":
        from staging.stores.s3_fast import fast_client_for

        fast = fast_client_for(store)
        if fast is not None:
            policy = getattr(getattr(store, "config", None), "retry", DEFAULT_POLICY)
            return _lean_reader(fast, policy)
    return store.read_range


def _lean_reader(fast: object, policy: object) -> RangeRead:
    def read(key: str, start: int, end: int, version: str) -> bytearray:
        def attempt() -> bytearray:
            buffer = bytearray(end - start)
            filled = 0

            def sink(chunk: memoryview) -> None:
                nonlocal filled
                size = len(chunk)
                buffer[filled:filled + size] = chunk
                filled += size

            fast.get(key, sink, version, start, end)  # type: ignore[attr-defined]
            return buffer if filled == len(buffer) else buffer[:filled]

        return with_retries(attempt, policy)  # type: ignore[arg-type]

    return read
