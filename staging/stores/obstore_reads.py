"""Object reads through obstore's async API, on this process's I/O core.

Each request is one coroutine on the core's loop (:mod:`lading.stores.iocore`): ``get_async``,
the version in the answer checked against the one asked for, the body collected with
``bytes_async`` into a zero-copy :class:`obstore.Bytes`, errors translated and transient ones
retried inside the loop. A batch (:meth:`ObstoreReader.read_many`) is one hop from the
caller's thread, its requests concurrent. Small bodies arrive whole; a large one is streamed
in pieces (:meth:`ObstoreReader.stream`, resumable by the caller from the bytes it got) or
downloaded as parallel ranged parts written in place with ``os.pwrite``
(:meth:`ObstoreReader.download`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from lading.core.errors import LadingError, TransientError
from lading.stores.base import Fetched, ObjectInfo, ProgressCallback, RangeRequest
from lading.stores.config import StoreConfig
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
#: Part size of a parallel download; objects larger than one part are fetched in parts.
PART_SIZE = 16 << 20
#: A streamed body arrives in pieces of an eighth of its length, within these bounds: a cut body
#: loses only the piece in flight, so smaller pieces resume closer to where it broke, larger ones
#: cost fewer hops per byte.
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
            if _status(err) == 416:
                return _Answer(request.version or "", request.start, empty=True)
            if ranged and "non-partial response" in str(err):
                log.warning("%s answers range requests with whole objects; reading whole objects and "
                            "keeping the ranges asked for (slower)", owner.url)
                owner._ranges_ignored = True
                return await self._attempt_sliced(request)
            raise mapped from err
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

    async def _with_retries(self, request: RangeRequest, collect: bool = True) -> _Answer:
        """:meth:`_attempt` with the store's retry policy for transient failures."""
        policy = self.owner.config.retry
        attempt = 1
        while True:
            try:
                return await self._attempt(request, collect)
            except TransientError as err:
                if attempt >= policy.attempts:
                    raise
                log.info("retrying %s after a transient error (attempt %d of %d): %s",
                         self.owner._where(request.key), attempt, policy.attempts, err)
                await asyncio.sleep(policy.delay(attempt))
                attempt += 1

    async def _read(self, request: RangeRequest) -> memoryview:
        answer = await self._with_retries(request)
        return memoryview(b"") if answer.empty else memoryview(answer.data)

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
        return io_core().run_all([self._read(request) for request in requests])

    def read_each(self, requests: Sequence[RangeRequest]) -> list[memoryview | BaseException]:
        """As :meth:`read_many`, but each request's failure (after its retries) comes back in its
        place instead of failing the batch."""
        return [outcome[0] for outcome in io_core().run_all([_outcome(self._read(request)) for request in requests])]

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
        """The object into ``dest``. When its ``size`` is known and larger than a part, the parts
        are fetched concurrently, pinned to ``version`` (or to the first part's answer), each
        written in place as it arrives; otherwise one GET streams it. A cut body resumes from the
        bytes received."""
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            io_core().run(self._download(key, fd, version, progress, size))
        finally:
            os.close(fd)

    async def _download(self, key: str, fd: int, version: str | None, progress: ProgressCallback | None,
                        size: int | None) -> None:
        if size is None or size <= PART_SIZE:
            await self._fetch_part(fd, RangeRequest(key, 0, None, version), progress)
            return
        os.ftruncate(fd, size)
        size, pinned = await self._fetch_part(fd, RangeRequest(key, 0, PART_SIZE, version), progress)
        parts = [self._fetch_part(fd, RangeRequest(key, start, min(start + PART_SIZE, size), pinned), progress)
                 for start in range(PART_SIZE, size, PART_SIZE)]
        await io_core()._gather(parts)

    async def _fetch_part(self, fd: int, request: RangeRequest,
                          progress: ProgressCallback | None) -> tuple[int, str]:
        """Bytes ``[start, end)`` written at their offsets in ``fd``, streamed; a transient failure
        resumes after the bytes already written (pinned to the version first answered), within the
        retry policy. Returns the object's size and version."""
        policy = self.owner.config.retry
        where = self.owner._where(request.key)
        position, version = request.start, request.version
        failures = 0
        while True:
            try:
                answer = await self._attempt(RangeRequest(request.key, position, request.end, version), False)
                if answer.empty:
                    return answer.size if position else 0, answer.version
                version = version or answer.version or None
                if answer.data is not None:
                    await _write_at(fd, answer.data, position, progress)
                    return answer.size, answer.version
                first, last = answer.result.range
                async for piece in answer.result.stream(min_chunk_size=piece_size(last - first)):
                    await _write_at(fd, piece, position, progress)
                    position += len(piece)
                stop = answer.size if request.end is None else min(request.end, answer.size)
                if position != stop:
                    raise TransientError(f"{where}: the body ended at byte {position} of {stop}")
                return answer.size, answer.version
            except TransientError as err:
                failures += 1
                if failures >= policy.attempts:
                    raise
                log.info("resuming %s at byte %d after a transient error: %s", where, position, err)
                await asyncio.sleep(policy.delay(failures))
            except LadingError:
                raise
            except Exception as err:  # the body broke off mid-stream: obstore's error
                mapped = self.owner._translate(err, where)
                if not isinstance(mapped, TransientError):
                    raise mapped from err
                failures += 1
                if failures >= policy.attempts:
                    raise mapped from err
                log.info("resuming %s at byte %d after a transient error: %s", where, position, mapped)
                await asyncio.sleep(policy.delay(failures))


async def _write_at(fd: int, data: Any, offset: int, progress: ProgressCallback | None) -> None:
    """Write a body at ``offset`` off the loop's thread (disk writes must not stall other reads)."""
    view = memoryview(data)

    def write() -> None:
        position = offset
        rest = view
        while rest:
            written = os.pwrite(fd, rest, position)
            rest, position = rest[written:], position + written

    await asyncio.to_thread(write)
    if progress is not None:
        progress(len(view))


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
