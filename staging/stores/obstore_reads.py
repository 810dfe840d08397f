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

import asyncio
import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from lading.core.errors import LadingError, ObjectChanged, TransientError
from lading.core.keys import key_parts
from lading.core.retry import RetryPolicy, note_answer, with_retries, with_retries_async
from lading.stores.base import Fetched, ObjectInfo, OnPiece, ProgressCallback, RangeRequest
from lading.stores.download import PART_SIZE, download_file
from lading.stores.iocore import io_core
from lading.stores.obstore_errors import FromResponse, status_and_code, translate


class ObstoreTarget:
    """What a store hands its obstore reader, once per process: the client and how the backend
    names, pins and describes its objects. Everything here is a value or a pure function of the
    backend's module; the reader calls nothing of the store's per GET.

    ``relocate`` (S3) is called, in a pool thread and at most once per reader, when the server
    says the bucket lives elsewhere (another region): it resolves the new place and returns the
    client for it, or None when nothing changed. A plain class, as :class:`_Answer`: a dataclass
    costs about 1 ms of start-up to create, and none is compared, hashed or copied."""

    __slots__ = (
        "client",
        "where",
        "root",
        "retry",
        "pin",
        "version_of",
        "info_of",
        "from_response",
        "url",
        "moved",
        "relocate",
    )

    def __init__(
        self,
        client: Any,
        where: str,
        root: str,
        retry: RetryPolicy,
        pin: Callable[[str], dict[str, Any]],
        version_of: Callable[[Mapping[str, Any]], str],
        info_of: Callable[[str, Mapping[str, Any]], ObjectInfo],
        from_response: FromResponse,
        url: str = "",
        moved: Callable[[BaseException], bool] | None = None,
        relocate: Callable[[], Any] | None = None,
    ) -> None:
        self.client = client
        self.where = where  # "s3://bucket/root/": a key's location in messages is this plus the key
        self.root = root  # the object path of a key is this plus the key
        self.retry = retry
        self.pin = pin  # GetOptions asking for exactly that version
        self.version_of = version_of  # the version in obstore's ObjectMeta
        self.info_of = info_of  # ObjectInfo of a key from its ObjectMeta
        self.from_response = from_response
        self.url = url
        self.moved = moved  # whether an error says "the bucket is elsewhere"
        self.relocate = relocate


log = logging.getLogger(__name__)

#: A body up to this size is collected whole in one hop; a larger one is streamed in pieces.
WHOLE_LIMIT = 2 << 20
#: A streamed body arrives in pieces of an eighth of its length, within these bounds: a cut body
#: loses only the piece in flight, so smaller pieces resume closer to where it broke, larger ones
#: cost fewer hops per byte. A download's pieces (:meth:`ObstoreReader.attempt`) are about
#: DOWNLOAD_PIECE: below the CLI's mmap threshold (reused heap memory rather than a fresh mapping),
#: written in ``pwrite`` calls of at most :data:`~lading.stores.download.SLICE`.
_MIN_PIECE, _MAX_PIECE = 64 << 10, 4 << 20
#: Each piece is one hop from obstore's runtime to the loop (tens of us of CPU): 1 MiB pieces make
#: a 16 MiB part 16 hops instead of 64 (bench/RESULTS.md, session 6).
DOWNLOAD_PIECE = 1 << 20
#: A download's bounded range up to this size (a part) is collected whole: obstore fills one buffer
#: off the GIL and hands it over without a copy, where each streamed piece costs a zeroed Python
#: ``bytes`` and a copy into it under the GIL (0.3-0.5 CPU-s per GiB more, bench/RESULTS.md session 7).
DOWNLOAD_WHOLE = PART_SIZE


#: What :meth:`ObstoreReader._refused` says of a failed GET: the range is past the end; the
#: server ignores ranges (read the whole object and slice it).
_EMPTY, _WHOLE = object(), object()


def piece_size(length: int) -> int:
    """The streaming piece size for a body of ``length`` bytes."""
    return max(_MIN_PIECE, min(_MAX_PIECE, length // 8))


class _Answer:
    """One GET's answer: the version and size the server reported, and the body when it was
    collected (else the open result, to stream)."""

    __slots__ = ("version", "size", "data", "result", "empty", "length")

    def __init__(
        self, version: str, size: int, data: Any = None, result: Any = None, empty: bool = False, length: int = 0
    ) -> None:
        self.version, self.size, self.data, self.result = version, size, data, result
        self.empty = empty  # a range at or past the end of the object
        self.length = length  # of the body asked for


class ObstoreReader:
    """The obstore half of a store's reads, over what the store handed it once (:class:`ObstoreTarget`)."""

    def __init__(self, target: ObstoreTarget) -> None:
        self.target = target
        self.client = target.client
        self._ranges_ignored = False  # set once a server answers a ranged GET with a whole object
        self._relocated = False

    def _where(self, key: str) -> str:
        return self.target.where + key

    def _path(self, key: str) -> str:
        """The object path of ``key``; UnsafeKey for a key that could escape or alias the root."""
        key_parts(key)
        return self.target.root + key

    async def _mapped(self, err: BaseException, where: str) -> BaseException:
        """An obstore exception as a project error (anything else unchanged). An answer that the
        bucket lives elsewhere moves this reader there once (resolved in a pool thread, never on
        the loop) and comes out as a transient error, so the request is tried again there."""
        target = self.target
        mapped = translate(err, where, target.from_response)
        if (
            self._relocated
            or target.moved is None
            or target.relocate is None
            or not isinstance(mapped, LadingError)
            or not target.moved(err)
        ):
            return mapped
        self._relocated = True
        client = await asyncio.to_thread(target.relocate)
        if client is None:
            return mapped
        self.client = client
        return TransientError(f"{where}: the bucket is elsewhere; asking there")

    def _check_version(self, meta: Mapping[str, Any], version: str | None, key: str) -> str:
        got = self.target.version_of(meta)
        if version and got and got != version:
            raise ObjectChanged(
                f"{self._where(key)} changed while lading read it (asked for version {version}, the server sent {got})",
                "the object was replaced; run again",
            )
        return got

    # -- coroutines (run on the I/O core) ---------------------------------------------------------

    async def _attempt(self, request: RangeRequest, collect: bool | None) -> _Answer:
        """One GET; its body collected when ``collect`` (or, when None, when it is small), else
        left open to stream."""
        import obstore

        ranged = bool(request.start) or request.end is not None
        if ranged and self._ranges_ignored:
            return await self._attempt_sliced(request)
        try:
            result = await obstore.get_async(
                self.client,
                self._path(request.key),
                options=self._get_options(request, ranged),  # type: ignore[arg-type]
            )
        except Exception as err:
            refused = self._refused(err, ranged)
            if refused is _EMPTY:
                return _Answer(request.version or "", request.start, empty=True)
            if refused is _WHOLE:
                return await self._attempt_sliced(request)
            raise await self._mapped(err, self._where(request.key)) from err
        answer = self._opened(result, request)
        if collect or (collect is None and answer.length <= WHOLE_LIMIT):
            answer.data = await self._collect(result, request.key, answer.length)
        else:
            answer.result = result
        return answer

    def _get_options(self, request: RangeRequest, ranged: bool) -> dict[str, Any]:
        """A GET's options: pinned to the request's version, and its range when it has one."""
        options: dict[str, Any] = self.target.pin(request.version) if request.version else {}
        if ranged:
            options["range"] = (request.start, request.end) if request.end is not None else {"offset": request.start}
        return options

    def _refused(self, err: BaseException, ranged: bool) -> object:
        """What a GET that raised ``err`` means, before translation: :data:`_EMPTY` for a range
        at or past the end (416), :data:`_WHOLE` for a server that answers ranges with whole
        objects (from then on, every ranged read of this reader is sliced), else None."""
        status = _status(err)
        if status:
            note_answer(self.target.retry.endpoint)
        if status == 416:
            return _EMPTY
        if ranged and "non-partial response" in str(err):
            if not self._ranges_ignored:
                log.warning(
                    "%s answers range requests with whole objects; reading whole objects and "
                    "keeping the ranges asked for (slower)",
                    self.target.url,
                )
            self._ranges_ignored = True
            return _WHOLE
        return None

    def _opened(self, result: Any, request: RangeRequest) -> _Answer:
        """The answer of an open GET (its body not read yet), its version checked."""
        note_answer(self.target.retry.endpoint)
        meta = result.meta
        got = self._check_version(meta, request.version, request.key)
        first, last = result.range
        return _Answer(got, int(meta["size"]), length=last - first)

    def _whole(self, data: Any, key: str, length: int) -> Any:
        """``data``, a collected body, unless it is shorter than its answer said."""
        if len(data) != length:
            raise TransientError(f"{self._where(key)}: the body ended after {len(data)} of {length} bytes")
        return data

    async def _collect(self, result: Any, key: str, length: int) -> Any:
        try:
            data = await result.bytes_async()
        except Exception as err:
            raise await self._mapped(err, self._where(key)) from err
        return self._whole(data, key, length)

    async def _attempt_sliced(self, request: RangeRequest) -> _Answer:
        """For a server that ignores Range: the whole (pinned, checked) object, sliced."""
        whole = await self._attempt(RangeRequest(request.key, 0, None, request.version), True)
        stop = whole.size if request.end is None else min(request.end, whole.size)
        if request.start >= whole.size:
            return _Answer(whole.version, whole.size, empty=True)
        return _Answer(
            whole.version, whole.size, data=memoryview(whole.data)[request.start : stop], length=stop - request.start
        )

    async def read(self, request: RangeRequest, policy: RetryPolicy | None = None) -> memoryview:
        """One range, collected whole (a zero-copy view), retried under ``policy`` (the store's).
        An unpinned bounded range is one call (``get_range_async``: one hop from obstore's runtime
        to the loop instead of two, about 170 us of CPU per small GET, bench/RESULTS.md session 6)."""
        if request.version is None and request.end is not None and not self._ranges_ignored:
            if request.end <= request.start:
                return memoryview(b"")
            end = request.end
            return await with_retries_async(lambda: self._range_once(request, end), policy or self.target.retry)
        answer = await with_retries_async(lambda: self._attempt(request, True), policy or self.target.retry)
        return memoryview(b"") if answer.empty else memoryview(answer.data)

    async def _range_once(self, request: RangeRequest, end: int) -> memoryview:
        """One unpinned GET of ``[request.start, end)`` collected whole (fewer bytes at the end of
        the object, none past it)."""
        import obstore

        try:
            data = await obstore.get_range_async(self.client, self._path(request.key), start=request.start, end=end)
        except Exception as err:
            if _status(err):
                note_answer(self.target.retry.endpoint)
            if _status(err) == 416:
                return memoryview(b"")
            if "non-partial response" in str(err):  # a server that ignores Range: as _attempt does
                return memoryview((await self._attempt(request, True)).data or b"")
            raise await self._mapped(err, self._where(request.key)) from err
        note_answer(self.target.retry.endpoint)
        return memoryview(data)

    async def attempt(
        self,
        key: str,
        start: int,
        end: int | None,
        version: str | None,
        sink: Callable[[memoryview], None],
        on_version: Callable[[str], None],
    ) -> Fetched:
        """One GET of bytes ``[start, end)``, no retry (a :class:`lading.stores.download.RangeAttempt`):
        a range of at most :data:`DOWNLOAD_WHOLE` bytes (a part) in one piece, collected whole (a cut
        body delivers nothing: the range is asked for again); a longer or open-ended one in pieces of
        about :data:`DOWNLOAD_PIECE` bytes as they arrive (what arrived before a break is delivered,
        so the caller resumes after it)."""
        if end is not None and end <= start:
            return Fetched(0, start, version or "")
        whole = end is not None and end - start <= DOWNLOAD_WHOLE
        answer = await self._attempt(RangeRequest(key, start, end, version), whole)
        if answer.empty:
            return Fetched(0, start, version or "")
        on_version(answer.version)
        if answer.data is not None:
            sink(memoryview(answer.data))
            return Fetched(len(answer.data), answer.size, answer.version)
        delivered = 0
        try:
            async for piece in answer.result.stream(min_chunk_size=min(DOWNLOAD_PIECE, piece_size(answer.length))):
                sink(memoryview(piece))
                delivered += len(piece)
        except Exception as err:
            mapped = await self._mapped(err, self._where(key))
            if mapped is err:
                raise
            raise mapped from err
        if delivered != answer.length:
            raise TransientError(f"{self._where(key)}: the body ended after {delivered} of {answer.length} bytes")
        return Fetched(delivered, answer.size, answer.version)

    # -- the caller's side ------------------------------------------------------------------------

    def stat(self, key: str) -> ObjectInfo:
        """HEAD one object."""
        import obstore

        where, path = self._where(key), self._path(key)

        async def head() -> Any:
            try:
                return await obstore.head_async(self.client, path)
            except Exception as err:
                raise await self._mapped(err, where) from err

        return self.target.info_of(key, with_retries(lambda: io_core().run(head()), self.target.retry))

    def read_here(self, request: RangeRequest) -> memoryview:
        """One range collected whole on the calling thread: obstore's blocking call (the GIL
        released while it waits), pinned, checked and retried as :meth:`read` is. No hop to the
        I/O core's loop and back: a third of :meth:`read`'s CPU per small GET (RGW, 2026-11-26),
        for a thread that would only wait for the bytes (the mount's FUSE thread serving a miss).
        A server that ignores ranges or a bucket elsewhere is left to :meth:`read`."""
        if self._ranges_ignored or self._relocated:
            return io_core().run(self.read(request))
        return with_retries(lambda: self._attempt_here(request), self.target.retry)

    def attempt_here(self, request: RangeRequest) -> memoryview | None:
        """One try of :meth:`read_here`: no retry and no hop to the loop, so the client's connect
        and read timeouts bound it. None when the read needs the loop (a server that ignores
        ranges, a bucket elsewhere): ask :meth:`read_here`."""
        if self._ranges_ignored or self._relocated:
            return None
        data: memoryview | None = self._attempt_here(request, on_loop=False)
        return data

    def _attempt_here(self, request: RangeRequest, on_loop: bool = True) -> Any:
        """:meth:`_attempt` (collected) with obstore's blocking calls; what :meth:`_attempt` would
        do on the loop (slice whole objects, move to the bucket's region) goes to :meth:`read`
        (or, unless ``on_loop``, comes back as None)."""
        import obstore

        target = self.target
        try:
            result = obstore.get(self.client, self._path(request.key), options=self._get_options(request, True))  # type: ignore[arg-type]
            answer = self._opened(result, request)
            data = result.bytes()
        except LadingError:
            raise
        except Exception as err:
            refused = self._refused(err, ranged=True)
            if refused is _EMPTY:
                return memoryview(b"")
            if refused is _WHOLE or (target.moved is not None and target.moved(err)):
                return io_core().run(self.read(request)) if on_loop else None
            raise translate(err, self._where(request.key), target.from_response) from err
        return memoryview(self._whole(data, request.key, answer.length))

    def read_many(self, requests: Sequence[RangeRequest]) -> list[memoryview]:
        """Each request's bytes (zero-copy views), fetched concurrently in one hop; retried per
        request. A range past the end of an object is empty."""
        return io_core().run_all([self.read(request) for request in requests])

    def read_each(self, requests: Sequence[RangeRequest]) -> list[memoryview | BaseException]:
        """As :meth:`read_many`, but each request's failure (after its retries) comes back in its
        place instead of failing the batch."""
        return [outcome[0] for outcome in io_core().run_all([_outcome(self.read(request)) for request in requests])]

    def stream(
        self,
        key: str,
        sink: Callable[[memoryview], None],
        version: str | None,
        start: int = 0,
        end: int | None = None,
        on_version: Callable[[str], None] | None = None,
    ) -> Fetched:
        """One GET (no retry: the caller resumes from what ``sink`` got), as
        :meth:`lading.stores.base.Store.stream`. A small body comes back in one hop with
        every piece that arrived, also when it broke off; a large one a piece per hop."""
        if end is not None and end <= start:
            return Fetched(0, start, version or "")
        core = io_core()
        where = self._where(key)
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

    async def _open_and_gather(
        self, request: RangeRequest, where: str
    ) -> tuple[_Answer, list[Any], BaseException | None]:
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
            return answer, pieces, await self._mapped(err, where)
        return answer, pieces, None

    async def _next_piece(self, pieces: Any, where: str) -> Any:
        try:
            return await pieces.__anext__()
        except StopAsyncIteration:
            return None
        except Exception as err:
            raise await self._mapped(err, where) from err

    def download(
        self,
        key: str,
        dest: Path,
        version: str | None = None,
        progress: ProgressCallback | None = None,
        size: int | None = None,
        on_piece: OnPiece | None = None,
    ) -> None:
        """The object into ``dest`` through the one downloader: ranged parts when its ``size`` is
        known and larger than a part, else one stream; a cut body resumes from the bytes received."""
        io_core().run(
            download_file(
                self.attempt,
                self.target.retry,
                self._where(key),
                key,
                dest,
                version,
                size,
                progress,
                PART_SIZE,
                on_piece,
            )
        )


async def _outcome(work: Any) -> tuple[Any]:
    """``(work's result,)``, or ``(the exception it raised,)``: a batch's requests fail one by one
    (boxed, so the batch itself does not fail)."""
    try:
        return (await work,)
    except Exception as err:  # noqa: BLE001 - handed back to the caller, per request
        return (err,)


def _status(err: BaseException) -> int:
    return status_and_code(err)[0]


__all__ = ["ObstoreReader", "ObstoreTarget", "PART_SIZE", "RangeRequest", "WHOLE_LIMIT"]
