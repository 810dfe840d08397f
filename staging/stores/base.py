"""The Store contract every backend implements in full, and the types it speaks.

:class:`Store` is an abstract base class: a backend (S3, GCS, a local directory, a snapshot
pinned to recorded versions) implements every abstract method, so callers call the contract and
never probe a store for what it can do. What differs between backends is declared, not probed:
``scheme``, ``writable`` (a snapshot is read-only) and :meth:`Store.md5_of_version` /
:meth:`Store.etag_is_md5` (whether a version or a listed MD5 is a checksum of the content).

tests/test_store_conformance.py runs one suite for the whole contract against every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Callable, ClassVar, Iterator, Protocol, Sequence

from lading.core.errors import UsageError
from lading.core.retry import RetryPolicy
from lading.stores.config import StoreConfig

#: Called with a number of bytes just transferred.
ProgressCallback = Callable[[int], None]
#: Receives each piece of a body, in order.
Sink = Callable[[memoryview], None]
#: Sees each piece of a download as it is written, with the offset of its first byte (a ranged
#: download's parts interleave: in order within a part only). A checksum computed inline.
OnPiece = Callable[[memoryview, int], None]
#: What a batch of reads returns (named out here: inside a store, ``list`` is the listing method).
Views = list[memoryview]
#: What a batch of independent reads returns: each request's bytes or its failure.
Outcomes = list["memoryview | BaseException"]


#: An ObjectInfo's fields in order: ``(key, size, version, mtime, md5, crc32c)``.
Row = tuple[str, int, str, float, "str | None", "str | None"]
#: A page of :meth:`Store.list_pages`: rows in key order (named out here, as :data:`Views`).
Page = list[Row]
#: The most rows in a page of :meth:`Store.list_pages`.
PAGE_ROWS = 4096


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object, as listed or stat'ed.

    ``key`` is relative to the store's root prefix and uses ``/``. ``version`` is what guards
    a read against a concurrent replace: the S3 ETag (without quotes), the GCS generation,
    or ``"<mtime_ns>-<size>"`` for local files.
    """

    key: str
    size: int
    version: str
    mtime: float = 0.0
    md5: str | None = None  # hex digest, when the store knows it (single-part ETag, GCS md5Hash)
    crc32c: str | None = None  # base64 of the big-endian CRC32C, as GCS reports it


@dataclass(frozen=True)
class RangeRequest:
    """Bytes ``[start, end)`` of ``key`` at ``version`` (``end`` None: to the end)."""

    key: str
    start: int = 0
    end: int | None = None
    version: str | None = None


class Fetched:
    """What one streamed GET delivered: its byte count, and the object's size and version as
    the store answered (see :meth:`Store.stream`). A plain class: a dataclass costs about 1 ms of
    start-up to create, and none is compared, hashed or copied."""

    __slots__ = ("nbytes", "size", "version")

    def __init__(self, nbytes: int, size: int, version: str) -> None:
        self.nbytes, self.size, self.version = nbytes, size, version

    def __repr__(self) -> str:
        return f"Fetched({self.nbytes!r}, {self.size!r}, {self.version!r})"


class CoroutineReads(Protocol):
    """Reads of one store as coroutines on the I/O core (:meth:`Store.coroutine_reads`)."""

    async def read(self, request: RangeRequest, policy: RetryPolicy | None = None) -> memoryview:
        """The range collected whole, retried under ``policy`` (default: the store's)."""
        ...

    async def attempt(
        self, key: str, start: int, end: int | None, version: str | None, sink: Sink, on_version: Callable[[str], None]
    ) -> Fetched:
        """One GET, no retry (a :class:`lading.stores.download.RangeAttempt`)."""
        ...


class Store(ABC):
    """A bucket prefix or a local directory, seen as a flat set of keys.

    Every method that takes a key raises :class:`~lading.core.errors.UnsafeKey` for a key that
    could escape or alias the root, before anything is sent. Reads pinned to a ``version`` raise
    :class:`~lading.core.errors.ObjectChanged` when the object is no longer that version (also
    on servers that ignore the precondition: the answer's version is compared).
    """

    #: The URI scheme: ``"s3"``, ``"gs"`` or ``"file"`` (a snapshot's is its source's).
    scheme: str
    #: Whether the store takes writes (upload, put, delete); a snapshot does not.
    writable: ClassVar[bool] = True
    url: str
    config: StoreConfig

    # -- listing and metadata ---------------------------------------------------------------------

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield objects under ``prefix`` page by page, in ascending key order."""

    def list_pages(self, prefix: str = "") -> Iterator[Page]:
        """:meth:`list` as rows of ObjectInfo's fields in order, a page (a list of at most
        :data:`PAGE_ROWS` rows) at a time, for a caller that keeps rows and checks them a page at
        a time (sync's planner). A store listing many small entries (the local one) overrides it
        to make neither an :class:`ObjectInfo` nor a step of a generator per entry."""
        rows = ((i.key, i.size, i.version, i.mtime, i.md5, i.crc32c) for i in self.list(prefix))
        while page := list(islice(rows, PAGE_ROWS)):
            yield page

    def prefetch_listing(self) -> None:
        """A hint that the whole root is listed next: a store may start that listing now, in the
        background. By default nothing."""

    def connect(self) -> None:
        """Build this process's client for the store now, on the calling thread, instead of at
        the first request (for a caller that must know when that happens: see
        ``lading.cli.store_options.unused_roots_skipped``). Raises what that first request would
        for the client's settings (credentials, CA bundle). By default nothing."""

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Return one object's metadata; raise :class:`~lading.core.errors.NotFound`."""

    # -- reads ------------------------------------------------------------------------------------

    @abstractmethod
    def read_many(self, requests: Sequence[RangeRequest]) -> Views:
        """Each request's bytes, in order, read together (one hop to the I/O core where the store
        has one); a range past the end of an object is empty. The first failure fails the batch."""

    @abstractmethod
    def read_each(self, requests: Sequence[RangeRequest]) -> Outcomes:
        """As :meth:`read_many`, each request's failure returned in its place."""

    @abstractmethod
    def stream(
        self,
        key: str,
        sink: Sink,
        version: str | None,
        start: int = 0,
        end: int | None = None,
        on_version: Callable[[str], None] | None = None,
    ) -> Fetched:
        """One GET of bytes ``[start, end)`` (to the end when ``end`` is None) pinned to
        ``version``, each piece handed to ``sink`` as it arrives. ``on_version`` hears the
        answer's version before the first piece (to pin a resumed request to it). One attempt:
        a body cut short raises TransientError after the pieces already handed over."""

    @abstractmethod
    def download(
        self,
        key: str,
        dest: Path,
        version: str | None = None,
        progress: ProgressCallback | None = None,
        size: int | None = None,
        on_piece: OnPiece | None = None,
    ) -> None:
        """Write the whole object to ``dest`` (the caller picks a temporary name); a ``size``
        known from a listing lets large objects come in parallel ranged parts. ``on_piece`` sees
        every piece as it is written (each byte once)."""

    def coroutine_reads(self, key: str) -> CoroutineReads | None:
        """The reads of ``key`` as coroutines for the I/O core's loop (the transfer engine drives
        them, with no thread hop per object), or None when this store has none (its blocking reads
        then run in a pool thread). May block the first time (a client or route decided once):
        call it off the loop until it has answered once."""
        return None

    def read_range(self, key: str, start: int, end: int, version: str | None = None) -> bytes:
        """Bytes ``[start, end)`` (fewer at the end of the object) of ``version``."""
        if end <= start:
            return b""
        return bytes(self.read_many([RangeRequest(key, start, end, version)])[0])

    # -- checksums --------------------------------------------------------------------------------

    def md5_of_version(self, version: str) -> str | None:
        """The hex MD5 of the content that ``version`` stands for, or None (only a single-part S3
        ETag is one)."""
        return None

    def etag_is_md5(self, key: str) -> bool:
        """Whether the MD5 this store lists for ``key`` really is its content's (asked only after a
        mismatch: an S3 object encrypted with SSE-KMS or SSE-C has an ETag that is not)."""
        return True

    # -- writes -----------------------------------------------------------------------------------

    @abstractmethod
    def upload(self, src: Path, key: str, progress: ProgressCallback | None = None) -> ObjectInfo:
        """Upload a local file (multipart or resumable when large) and return its metadata."""

    @abstractmethod
    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_version: str | None = None) -> str:
        """Write ``data`` as ``key`` and return its version, as :meth:`read_object` reports it.

        Conditional writes (the claims protocol, :mod:`lading.stores.claims`): ``if_absent``
        writes only when no object has that name, ``if_version`` only when the object is still at
        that version; otherwise :class:`~lading.core.errors.ObjectChanged` (also for a write that
        raced another conditional write to the key) or NotFound (``if_version`` of a missing key)."""

    @abstractmethod
    def read_object(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and the version conditional writes compare, or None when it does not
        exist (one GET)."""

    @abstractmethod
    def delete(self, key: str, version: str | None = None) -> bool:
        """Delete ``key`` (only if still at ``version``, as :meth:`read_object` reports it, when
        given); False when it is gone already or at another version."""

    @abstractmethod
    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete these keys (missing ones are no error)."""


class ReadOnlyStore(Store):
    """A store that refuses every write with one clear error (a snapshot)."""

    writable: ClassVar[bool] = False

    def _refuse(self) -> UsageError:
        return UsageError(f"{self.url} is read-only", "write to the store itself")

    def upload(self, src: Path, key: str, progress: ProgressCallback | None = None) -> ObjectInfo:
        """Refused: read-only."""
        raise self._refuse()

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_version: str | None = None) -> str:
        """Refused: read-only."""
        raise self._refuse()

    def delete(self, key: str, version: str | None = None) -> bool:
        """Refused: read-only."""
        raise self._refuse()

    def delete_many(self, keys: Sequence[str]) -> None:
        """Refused: read-only."""
        raise self._refuse()


__all__ = [
    "Fetched",
    "ObjectInfo",
    "Outcomes",
    "ProgressCallback",
    "RangeRequest",
    "ReadOnlyStore",
    "Sink",
    "Store",
    "Views",
]
