"""The Store protocol every backend implements, and the types it speaks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol, runtime_checkable

from lading.stores.config import StoreConfig

#: Called with a number of bytes just transferred.
ProgressCallback = Callable[[int], None]


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


@runtime_checkable
class Store(Protocol):
    """A bucket prefix or a local directory, seen as a flat set of keys."""

    url: str

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield objects under ``prefix`` page by page, in ascending key order."""
        ...

    def stat(self, key: str) -> ObjectInfo:
        """Return one object's metadata; raise :class:`~lading.core.errors.NotFound`."""
        ...

    def read_range(self, key: str, start: int, end: int, version: str | None = None) -> bytes:
        """Return bytes ``[start, end)``; raise ObjectChanged if ``version`` no longer matches."""
        ...

    def download(
        self,
        key: str,
        dest: Path,
        version: str | None = None,
        progress: ProgressCallback | None = None,
    ) -> None:
        """Write the whole object to ``dest`` (the caller picks a temporary name)."""
        ...

    def upload(self, src: Path, key: str, progress: ProgressCallback | None = None) -> ObjectInfo:
        """Upload a local file (multipart or resumable when large) and return its metadata."""
        ...


@dataclass(frozen=True)
class Fetched:
    """What one streamed GET delivered: its byte count, and the object's size and version as
    the store answered (see :class:`StreamingStore`)."""

    nbytes: int
    size: int
    version: str


@runtime_checkable
class StreamingStore(Store, Protocol):
    """A store that streams version-checked ranged GETs (S3 and GCS)."""

    config: StoreConfig

    def stream(self, key: str, sink: Callable[[memoryview], None], version: str | None, start: int = 0,
               end: int | None = None, on_version: Callable[[str], None] | None = None) -> Fetched:
        """One GET of bytes ``[start, end)`` pinned to ``version``, each piece handed to ``sink``;
        raise ObjectChanged when the answer is of another version. ``on_version`` hears the
        answer's version before the first piece (to pin a resumed request to it)."""
        ...
