"""Object reads through a backend's SDK (boto3, google-cloud-storage): the path for a process
where obstore cannot run (forked after its runtime started in the parent), for a dataset's
construction (:func:`lading.stores.process.control_plane`), and for keys obstore cannot name.

Same guarantees as the obstore path: pinned and checked versions, translated errors, retries of
transient failures per request, and a cut body resumed from the bytes received.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Protocol, Sequence

from lading.stores.base import Fetched, ObjectInfo, ProgressCallback
from lading.stores.process import ProcessLocal

from lading.stores.obstore_reads import RangeRequest, ReadsOwner
from lading.stores.resume import resume_into


class SdkOwner(ReadsOwner, Protocol):
    """A store with SDK reads (the S3 and GCS backends)."""

    def _sdk_stat(self, key: str) -> ObjectInfo: ...
    def _sdk_stream(self, key: str, sink: Callable[[memoryview], None], version: str | None, start: int,
                    end: int | None, on_version: Callable[[str], None] | None) -> Fetched: ...

#: Concurrent SDK requests of one :meth:`SdkReader.read_many` batch.
SDK_THREADS = 8


class SdkReader:
    """The SDK half of a store's reads; the owning store supplies ``_sdk_stat`` and ``_sdk_stream``."""

    def __init__(self, owner: SdkOwner) -> None:
        self.owner = owner
        self._pool: ProcessLocal[ThreadPoolExecutor] = ProcessLocal(_new_pool)

    def stat(self, key: str) -> ObjectInfo:
        """HEAD through the SDK (retried)."""
        return self.owner._sdk_stat(key)

    def stream(self, key: str, sink: Callable[[memoryview], None], version: str | None, start: int = 0,
               end: int | None = None, on_version: Callable[[str], None] | None = None) -> Fetched:
        """One GET through the SDK (no retry; the caller resumes)."""
        return self.owner._sdk_stream(key, sink, version, start, end, on_version)

    def read(self, request: RangeRequest) -> memoryview:
        """One range, resumed after a cut body and retried, pinned to its version."""
        if request.end is not None and request.end <= request.start:
            return memoryview(b"")
        out = bytearray()
        owner = self.owner

        def stream(key: str, sink: Callable[[memoryview], None], version: str | None, start: int,
                   on_version: Callable[[str], None] | None = None) -> Fetched:
            fetched = self.stream(key, sink, version, request.start + start, request.end, on_version)
            stop = fetched.size if request.end is None else min(request.end, fetched.size)
            return Fetched(fetched.nbytes, max(stop - request.start, 0), fetched.version)

        resume_into(stream, owner._where(request.key), owner.config.retry, request.key, out.extend,
                    request.version, None)
        return memoryview(out)

    def read_many(self, requests: Sequence[RangeRequest]) -> list[memoryview]:
        """Each range, on a few SDK threads at once."""
        if len(requests) == 1:
            return [self.read(requests[0])]
        return list(self._pool.get().map(self.read, requests))

    def read_each(self, requests: Sequence[RangeRequest]) -> list[memoryview | BaseException]:
        """Each range, or the exception its read ended with."""
        def one(request: RangeRequest) -> memoryview | BaseException:
            try:
                return self.read(request)
            except Exception as err:  # noqa: BLE001 - handed back to the caller, per request
                return err

        return list(self._pool.get().map(one, requests))

    def download(self, key: str, dest: Path, version: str | None = None,
                 progress: ProgressCallback | None = None) -> None:
        """The whole object into ``dest`` as one stream, resumed from the bytes written."""
        with open(dest, "wb") as out:
            resume_into(self.stream, self.owner._where(key), self.owner.config.retry, key, out.write,
                        version, progress)


def _new_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=SDK_THREADS, thread_name_prefix="lading-sdk")


__all__ = ["SDK_THREADS", "SdkReader"]
