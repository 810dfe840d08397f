"""How the engine reads from a store: a lean streaming path when the store has one, else the
Store protocol's ``download`` / ``read_range``.

Both readers deliver bytes the same way, so the engine's temporaries, verification and
resume logic are one code path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Protocol

from lading.core.retry import RetryPolicy
from lading.stores.base import ObjectInfo, Store
from lading.transfer.verify import Verifier

#: Receives each chunk of content in order (raises to abort).
Sink = Callable[[memoryview], None]
#: Receives a byte count for progress.
Progress = Callable[[int], None]

_NO_RETRY = RetryPolicy(attempts=1)


class Reader(Protocol):
    """What the engine needs from a store."""

    #: Retries the engine adds around each call (the Store protocol retries on its own).
    retry_policy: RetryPolicy

    def fetch_whole(self, info: ObjectInfo, tmp: Path, verifier: Verifier, progress: Progress,
                    checkpoint: Callable[[], None]) -> int:
        """Write the whole object to ``tmp`` (truncating it), feeding ``verifier``; return its size."""
        ...

    def read_part(self, info: ObjectInfo, start: int, end: int, sink: Sink) -> bool:
        """Deliver bytes ``[start, end)`` of the object's ``info.version`` to ``sink``; return
        False when the server says the listed MD5 is not the content's (SSE-KMS, SSE-C)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def _version(info: ObjectInfo) -> str | None:
    return info.version or None  # some servers list an empty ETag; then nothing to guard with


class StreamingReader:
    """Reads through a store's lean GET path (see :mod:`lading.stores.s3.fast`)."""

    def __init__(self, client: object, retry_policy: RetryPolicy) -> None:
        self._client = client
        self.retry_policy = retry_policy

    def fetch_whole(self, info: ObjectInfo, tmp: Path, verifier: Verifier, progress: Progress,
                    checkpoint: Callable[[], None]) -> int:
        """Stream the body to ``tmp``, hashing on the way."""
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        written = 0
        try:
            def sink(chunk: memoryview) -> None:
                nonlocal written
                checkpoint()
                view = chunk
                while view:
                    view = view[os.write(fd, view):]
                verifier.update(chunk)
                written += len(chunk)
                progress(len(chunk))

            try:
                result = self._client.get(info.key, sink, _version(info))  # type: ignore[attr-defined]
            except BaseException:
                progress(-written)
                raise
            if not result.etag_is_md5:
                verifier.skip_md5()
            return written
        finally:
            os.close(fd)

    def read_part(self, info: ObjectInfo, start: int, end: int, sink: Sink) -> bool:
        """One ranged GET guarded by If-Match."""
        return self._client.get(info.key, sink, _version(info), start, end).etag_is_md5  # type: ignore[attr-defined]

    def close(self) -> None:
        """Close pooled connections."""
        self._client.close()  # type: ignore[attr-defined]


class StoreReader:
    """Reads through the Store protocol (local, GCS, and S3 without the lean path)."""

    retry_policy = _NO_RETRY

    def __init__(self, store: Store) -> None:
        self._store = store

    def fetch_whole(self, info: ObjectInfo, tmp: Path, verifier: Verifier, progress: Progress,
                    checkpoint: Callable[[], None]) -> int:
        """``store.download`` to ``tmp``, then hash the file if a checksum is known."""
        received = 0

        def counted(nbytes: int) -> None:
            nonlocal received
            checkpoint()
            received += nbytes
            progress(nbytes)

        try:
            self._store.download(info.key, tmp, _version(info), counted)
        except BaseException:
            progress(-received)
            raise
        size = tmp.stat().st_size
        if received < size:  # a backend that reports no progress
            progress(size - received)
        if verifier.needs_content:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                verifier.update_from_file(fd, 0, size)
            finally:
                os.close(fd)
        return size

    def read_part(self, info: ObjectInfo, start: int, end: int, sink: Sink) -> bool:
        """``store.read_range`` guarded by the version."""
        sink(memoryview(self._store.read_range(info.key, start, end, _version(info))))
        return True

    def close(self) -> None:
        """Nothing to release."""


def open_reader(store: Store, use_fast_path: bool, retry_policy: RetryPolicy) -> Reader:
    """The lean reader when the store offers one (and it is allowed), else the Store protocol."""
    if use_fast_path:
        from lading.stores.s3.fast import fast_client_for

        client = fast_client_for(store)
        if client is not None:
            return StreamingReader(client, retry_policy)
    return StoreReader(store)
