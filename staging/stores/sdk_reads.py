"""Object reads through a backend's SDK (boto3, google-cloud-storage): the path for a process
where obstore cannot run (forked after its runtime started in the parent), for a dataset's
construction (:func:`lading.stores.process.control_plane`), and for keys obstore cannot name.

Same guarantees as the obstore path: pinned and checked versions, translated errors, retries of
transient failures per request, and a cut body resumed from the bytes received.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

from lading.core.retry import RetryPolicy
from lading.stores.base import Fetched, ObjectInfo, OnPiece, ProgressCallback, RangeRequest
from lading.stores.download import download_file, fetch_range
from lading.stores.iocore import io_core
from lading.stores.obstore_reads import _outcome


class SdkStream(Protocol):
    """One GET through a backend's SDK, as :meth:`lading.stores.base.Store.stream` (no retry)."""

    def __call__(
        self,
        key: str,
        sink: Callable[[memoryview], None],
        version: str | None,
        start: int,
        end: int | None,
        on_version: Callable[[str], None] | None,
    ) -> Fetched: ...


@dataclass(frozen=True)
class SdkTarget:
    """What a store hands its SDK reader, once: where its keys live, its retry policy, and its
    two SDK requests (a HEAD, retried; one GET, not retried)."""

    where: str  # a key's location in messages is this plus the key
    retry: RetryPolicy
    stat: Callable[[str], ObjectInfo]
    stream: SdkStream


class SdkReader:
    """The SDK half of a store's reads, over what the store handed it (:class:`SdkTarget`).
    Each blocking SDK request runs in the I/O core's thread pool; retries and resumes are the
    same coroutines as obstore's (:mod:`lading.stores.download`)."""

    def __init__(self, target: SdkTarget) -> None:
        self.target = target

    def stat(self, key: str) -> ObjectInfo:
        """HEAD through the SDK (retried)."""
        return self.target.stat(key)

    def stream(
        self,
        key: str,
        sink: Callable[[memoryview], None],
        version: str | None,
        start: int = 0,
        end: int | None = None,
        on_version: Callable[[str], None] | None = None,
    ) -> Fetched:
        """One GET through the SDK (no retry; the caller resumes)."""
        return self.target.stream(key, sink, version, start, end, on_version)

    async def attempt(
        self,
        key: str,
        start: int,
        end: int | None,
        version: str | None,
        sink: Callable[[memoryview], None],
        on_version: Callable[[str], None],
    ) -> Fetched:
        """:meth:`stream` in a pool thread (a :class:`lading.stores.download.RangeAttempt`)."""
        return await asyncio.to_thread(self.stream, key, sink, version, start, end, on_version)

    async def read(self, request: RangeRequest, policy: RetryPolicy | None = None) -> memoryview:
        """One range, resumed after a cut body and retried (``policy``: the store's), pinned to its version."""
        if request.end is not None and request.end <= request.start:
            return memoryview(b"")
        out = bytearray()
        await fetch_range(
            self.attempt,
            policy or self.target.retry,
            self.target.where + request.key,
            request.key,
            request.start,
            request.end,
            request.version,
            lambda piece, _offset: out.extend(piece),
        )
        return memoryview(out)

    def read_many(self, requests: Sequence[RangeRequest]) -> list[memoryview]:
        """Each range, a few SDK requests at once."""
        return io_core().run_all([self.read(request) for request in requests])

    def read_each(self, requests: Sequence[RangeRequest]) -> list[memoryview | BaseException]:
        """Each range, or the exception its read ended with."""
        return [outcome[0] for outcome in io_core().run_all([_outcome(self.read(request)) for request in requests])]

    def download(
        self,
        key: str,
        dest: Path,
        version: str | None = None,
        progress: ProgressCallback | None = None,
        on_piece: OnPiece | None = None,
    ) -> None:
        """The whole object into ``dest`` as one stream, resumed from the bytes written."""
        io_core().run(
            download_file(
                self.attempt,
                self.target.retry,
                self.target.where + key,
                key,
                dest,
                version,
                None,
                progress,
                on_piece=on_piece,
            )
        )


__all__ = ["SdkReader", "SdkStream", "SdkTarget"]
