"""Object reads through obstore's async API, on this process's I/O core.

Each request is one coroutine on the core's loop (:mod:`lading.stores.iocore`): ``get_async``,
the version in the answer checked against the one asked for, the body collected with
``bytes_async`` into a zero-copy :class:`obstore.Bytes`, errors translated and transient ones
retried inside the loop. A batch (:meth:`ObstoreReader.read_many`) is one hop from the
caller's thread, its requests concurrent. Small bodies arrive whole; a large one is streamed
in pieces (:meth:`ObstoreReader.attempt`, resumed by :func:`lading.stores.download.fetch_range`)
or downloaded by the one ranged downloader (:func:`lading.stores.download.download_file`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from lading.core.errors import TransientError
from lading.core.retry import RetryPolicy, note_answer, with_retries_async
from lading.stores.base import Fetched, ObjectInfo, ProgressCallback, RangeRequest
from lading.stores.config import StoreConfig
from lading.stores.download import PART_SIZE, SLICE, download_file
from lading.stores.iocore import io_core
from lading.stores.obstore_errors import status_and_code



class ReadsOwner(Protocol):
    """What a reader needs from the store it reads for (:class:`lading.stores.objstore.ObstoreReads`)."""

    url: str
    config: StoreConfig
    _ranges_ignored: bool

    def _where(self, key: str = "") -> str: ...
    def _path(self, key: str) -> str: ...
    def _pin(self, version: str) -> dict[str, Any]: ...
    def _obstore_store(self) -> Any: ...
    def _translate(self, err: BaseException, what: str) -> BaseException: ...
    def _check_version(self, meta: Mapping[str, Any], version: str | None, key: str) -> str: ...
    def _info(self, key: str, meta: Mapping[str, Any]) -> ObjectInfo: ...
    def _retrying(self, operation: Callable[[], Any]) -> Any: ...

log = logging.getLogger(__name__)

#: A body up to this size is collected whole in one hop; a larger one is streamed in pieces.
WHOLE_LIMIT = 2 << 20
#: A streamed body arrives in pieces of an eighth of its length, within these bounds: a cut body
#: loses only the piece in flight, so smaller pieces resume closer to where it broke, larger ones
#: cost fewer hops per byte. A download's pieces (:meth:`ObstoreReader.attempt`) are at most SLICE:
#: each is one ``pwrite``, and reused heap memory rather than a fresh mapping.
_MIN_PIECE, _MAX_PIECE = 64 << 10, 4 << 20


def piece_size(length: int) -> int:
    """The streaming piece size for a body of ``length`` bytes."""
    return max(_MIN_PIECE, min(_MAX_PIECE, length // 8))


@dataclass
class _Answer:
    """One GET's answer: the version and size the server reported, and the body when it was
    collected (else the open result, to stream)."""

    version: str
    size: int
    data: Any = None
    result: Any = None
    empty: bool = False  # a range at or past the end of the object
    length: int = 0  # of the body asked for


class ObstoreReader:
    """The obstore half of a store's reads (the owner supplies paths, pins and translation)."""

    def __init__(self, owner: ReadsOwner) -> None:
        self.owner = owner

    # -- coroutines (run on the I/O core) ---------------------------------------------------------

    async def _attempt(self, request: RangeRequest, collect: bool | None) -> _Answer:
        """One GET; its body collected when ``collect`` (or, when None, when it is small), else
        left open to stream."""
        import obstore

        owner = self.owner
        where = owner._where(request.key)
        path = owner._path(request.key)
        ranged = bool(request.start) or request.end is not None
        if ranged and owner._ranges_ignored:
            return await self._attempt_sliced(request)
        options: dict[str, Any] = owner._pin(request.version) if request.version else {}
        if ranged:
            options["range"] = ((request.start, request.end) if request.end is not None
                                else {"offset": request.start})
        try:
            result = await obstore.get_async(owner._obstore_store(), path, options=options)  # type: ignore[arg-type]
        except Exception as err:
            mapped = owner._translate(err, where)
            if _status(err):
                note_answer(owner.config.retry.endpoint)
            if _status(err) == 416:
                return _Answer(request.version or "", request.start, empty=True)
            if ranged and "non-partial response" in str(err):
                log.warning("%s answers range requests with whole objects; reading whole objects and "
                            "keeping the ranges asked for (slower)", owner.url)
                owner._ranges_ignored = True
                return await self._attempt_sliced(request)
            raise mapped from err
        note_answer(owner.config.retry.endpoint)
        meta = result.meta
        got = owner._check_version(meta, request.version, request.key)
        first, last = result.range
        answer = _Answer(got, int(meta["size"]), length=last - first)
        if collect or (collect is None and last - first <= WHOLE_LIMIT):
            answer.data = await self._collect(result, where, last - first)
        else:
            answer.result = result
        return answer

    async def _collect(self, result: Any, where: str, length: int) -> Any:
        try:
            data = await result.bytes_async()
        except Exception as err:
            raise self.owner._translate(err, where) from err
        if len(data) != length:
            raise TransientError(f"{where}: the body ended after {len(data)} of {length} bytes")
        return data

    async def _attempt_sliced(self, request: RangeRequest) -> _Answer:
        """For a server that ignores Range: the whole (pinned, checked) object, sliced."""
        whole = await self._attempt(RangeRequest(request.key, 0, None, request.version), True)
        stop = whole.size if request.end is None else min(request.end, whole.size)
        if request.start >= whole.size:
            return _Answer(whole.version, whole.size, empty=True)
        return _Answer(whole.version, whole.size, data=memoryview(whole.data)[request.start:stop],
                       length=stop - request.start)

    async def read(self, request: RangeRequest, policy: RetryPolicy | None = None) -> memoryview:
        """One range, collected whole (a zero-copy view), retried under ``policy`` (the store's)."""
        answer = await with_retries_async(lambda: self._attempt(request, True), policy or self.owner.config.retry)
        return memoryview(b"") if answer.empty else memoryview(answer.data)

    async def attempt(self, key: str, start: int, end: int | None, version: str | None,
                      sink: Callable[[memoryview], None], on_version: Callable[[str], None]) -> Fetched:
        """One GET of bytes ``[start, end)``, no retry (a :class:`lading.stores.download.RangeAttempt`):
        the body in pieces of about :data:`SLICE` bytes as they arrive (what arrived before a break
        is delivered, so the caller resumes after it)."""
        if end is not None and end <= start:
            return Fetched(0, start, version or "")
        where = self.owner._where(key)
        answer = await self._attempt(RangeRequest(key, start, end, version), False)
        if answer.empty:
            return Fetched(0, start, version or "")
        on_version(answer.version)
        if answer.data is not None:
            sink(memoryview(answer.data))
            return Fetched(len(answer.data), answer.size, answer.version)
        delivered = 0
        try:
            async for piece in answer.result.stream(min_chunk_size=min(SLICE, piece_size(answer.length))):
                sink(memoryview(piece))
                delivered += len(piece)
        except Exception as err:
            mapped = self.owner._translate(err, where)
            if mapped is err:
                raise
            raise mapped from err
        if delivered != answer.length:
            raise TransientError(f"{where}: the body ended after {delivered} of {answer.length} bytes")
        return Fetched(delivered, answer.size, answer.version)

    # -- the caller's side ------------------------------------------------------------------------

    def stat(self, key: str) -> ObjectInfo:
        """HEAD one object."""
        import obstore

        owner = self.owner
        where, path = owner._where(key), owner._path(key)

        async def head() -> Any:
            try:
                return await obstore.head_async(owner._obstore_store(), path)
            except Exception as err:
                raise owner._translate(err, where) from err

        return owner._info(key, owner._retrying(lambda: io_core().run(head())))

    def read_many(self, requests: Sequence[RangeRequest]) -> list[memoryview]:
        """Each request's bytes (zero-copy views), fetched concurrently in one hop; retried per
        request. A range past the end of an object is empty."""
        return io_core().run_all([self.read(request) for request in requests])

    def read_each(self, requests: Sequence[RangeRequest]) -> list[memoryview | BaseException]:
        """As :meth:`read_many`, but each request's failure (after its retries) comes back in its
        place instead of failing the batch."""
        return [outcome[0] for outcome in io_core().run_all([_outcome(self.read(request)) for request in requests])]

    def stream(self, key: str, sink: Callable[[memoryview], None], version: str | None, start: int = 0,
               end: int | None = None, on_version: Callable[[str], None] | None = None) -> Fetched:
        """One GET (no retry: the caller resumes from what ``sink`` got), as
        :meth:`lading.stores.base.Store.stream`. A small body comes back in one hop with
        every piece that arrived, also when it broke off; a large one a piece per hop."""
        if end is not None and end <= start:
            return Fetched(0, start, version or "")
        core = io_core()
        where = self.owner._where(key)
        answer, pieces, cut = core.run(self._open_and_gather(RangeRequest(key, start, end, version), where))
        if answer.empty:
            return Fetched(0, start, version or "")
        if on_version is not None:
            on_version(answer.version)
        delivered = 0
        for piece in pieces:
            sink(memoryview(piece))
            delivered += len(piece)
        if cut is not None:
            raise cut
        if answer.result is not None:
            stream = answer.result.stream(min_chunk_size=piece_size(answer.length))
            while (piece := core.run(self._next_piece(stream, where))) is not None:
                sink(memoryview(piece))
                delivered += len(piece)
        if delivered != answer.length:
            raise TransientError(f"{where}: the body ended after {delivered} of {answer.length} bytes")
        return Fetched(delivered, answer.size, answer.version)

    async def _open_and_gather(self, request: RangeRequest,
                               where: str) -> tuple[_Answer, list[Any], BaseException | None]:
        """Open a GET; a small body is read to its end here, in pieces, keeping what arrived
        before a break (returned as the third element) so the caller can resume after it."""
        answer = await self._attempt(request, False)
        pieces: list[Any] = []
        if answer.data is not None:
            return answer, [answer.data], None
        if answer.empty or answer.length > WHOLE_LIMIT:
            return answer, pieces, None
        result, answer.result = answer.result, None
        try:
            async for piece in result.stream(min_chunk_size=piece_size(answer.length)):
                pieces.append(piece)
        except Exception as err:
            return answer, pieces, self.owner._translate(err, where)
        return answer, pieces, None

    async def _next_piece(self, pieces: Any, where: str) -> Any:
        try:
            return await pieces.__anext__()
        except StopAsyncIteration:
            return None
        except Exception as err:
            raise self.owner._translate(err, where) from err

    def download(self, key: str, dest: Path, version: str | None = None,
                 progress: ProgressCallback | None = None, size: int | None = None) -> None:
        """The object into ``dest`` through the one downloader: ranged parts when its ``size`` is
        known and larger than a part, else one stream; a cut body resumes from the bytes received."""
        io_core().run(download_file(self.attempt, self.owner.config.retry, self.owner._where(key), key, dest,
                                    version, size, progress, PART_SIZE))


async def _outcome(work: Any) -> tuple[Any]:
    """``(work's result,)``, or ``(the exception it raised,)``: a batch's requests fail one by one
    (boxed, so the batch itself does not fail)."""
    try:
        return (await work,)
    except Exception as err:  # noqa: BLE001 - handed back to the caller, per request
        return (err,)


def _status(err: BaseException) -> int:
    return status_and_code(err)[0]


__all__ = ["ObstoreReader", "PART_SIZE", "RangeRequest", "ReadsOwner", "WHOLE_LIMIT"]
