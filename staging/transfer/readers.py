"""How the engine reads from a store: the store's version-checked streaming GET for object
stores, a copy (the Store contract's ``download`` / ``read_range``) for local directories.

Both readers deliver bytes the same way, so the engine's temporaries, verification and
resume logic are one code path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Protocol, Sequence

from lading.core.errors import TransientError
from lading.core.retry import RetryPolicy, with_retries
from lading.stores.base import ObjectInfo, RangeRequest, Store
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

    def etag_is_md5(self, key: str) -> bool:
        """Whether the listed MD5 really is the content's (asked only after a mismatch: an
        SSE-KMS or SSE-C object's ETag is not its MD5)."""
        ...

    def fetch_small_many(self, infos: Sequence[ObjectInfo]) -> list[memoryview | BaseException] | None:
        """Whole small objects at their listed versions in one batch (each retried on its own),
        each failure in its place; None when this reader has no batched reads."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def _version(info: ObjectInfo) -> str | None:
    return info.version or None  # some servers list an empty ETag; then nothing to guard with


class StreamingReader:
    """Reads through a store's version-checked streaming GET (S3 and GCS on obstore).

    A body cut short is resumed, not restarted: the next attempt is a Range request from the
    bytes already written, pinned to the version of the first answer, and the checksum goes on
    from where it was.
    """

    def __init__(self, store: Store, retry_policy: RetryPolicy) -> None:
        self._store = store
        #: For the engine's ranged parts; whole objects are retried (and resumed) in here.
        self.retry_policy = retry_policy

    def fetch_whole(self, info: ObjectInfo, tmp: Path, verifier: Verifier, progress: Progress,
                    checkpoint: Callable[[], None]) -> int:
        """Stream the body to ``tmp``, hashing on the way."""
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        written = 0

        def sink(chunk: memoryview) -> None:
            nonlocal written
            checkpoint()
            view = chunk
            while view:
                view = view[os.write(fd, view):]
            verifier.update(chunk)
            written += len(chunk)
            progress(len(chunk))

        version = _version(info)

        def pin(answered: str) -> None:
            nonlocal version
            version = version or answered or None  # a resumed body must be of the same version

        def attempt() -> None:
            if written >= info.size and written:
                return
            fetched = self._store.stream(info.key, sink, version, written, on_version=pin)
            if written < fetched.size:
                raise TransientError(f"{info.key}: got {written} of {fetched.size} bytes")

        try:
            with_retries(attempt, self.retry_policy)
        except BaseException:
            progress(-written)
            raise
        finally:
            os.close(fd)
        if verifier.md5_mismatch(written) and not self.etag_is_md5(info.key):
            verifier.skip_md5()
        return written

    def read_part(self, info: ObjectInfo, start: int, end: int, sink: Sink) -> bool:
        """One ranged GET pinned to the version; False when the listed MD5 is not the content's."""
        self._store.stream(info.key, sink, _version(info), start, end)
        return True

    def fetch_small_many(self, infos: Sequence[ObjectInfo]) -> list[memoryview | BaseException] | None:
        """One batched read on the I/O core (the GETs concurrent, one hop for all)."""
        return self._store.read_each([RangeRequest(info.key, 0, None, _version(info)) for info in infos])

    def etag_is_md5(self, key: str) -> bool:
        """Ask the store (S3 answers with a HEAD through boto3)."""
        return self._store.etag_is_md5(key)

    def close(self) -> None:
        """Connections belong to the store."""


class StoreReader:
    """Reads local directories: a file copy (``download``) or a ranged read."""

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

    def etag_is_md5(self, key: str) -> bool:
        """Local files and GCS objects have no such ETags."""
        return True

    def fetch_small_many(self, infos: Sequence[ObjectInfo]) -> None:
        """Local files are copied one by one."""
        return None

    def close(self) -> None:
        """Nothing to release."""


def open_reader(store: Store, retry_policy: RetryPolicy) -> Reader:
    """The streaming reader for object stores (S3, GCS), the copying one for local directories."""
    if store.scheme == "file":
        return StoreReader(store)
    return StreamingReader(store, retry_policy)
