"""The transfer engine's data types: items, options, results and progress callbacks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lading.core.errors import LadingError
from lading.core.retry import RetryPolicy
from lading.stores.base import ObjectInfo
from lading.stores.download import PART_CONCURRENCY, PART_SIZE


@dataclass(frozen=True)
class TransferItem:
    """One object to fetch to ``dest``, a final path already validated to lie inside DEST."""

    info: ObjectInfo
    dest: Path


@dataclass(frozen=True)
class TransferResult:
    """What happened to one item."""

    key: str
    dest: Path
    ok: bool
    nbytes: int = 0
    error: LadingError | None = None
    #: ``(st_mtime_ns, st_size)`` of the published file, when the fetcher stat'ed it anyway (a
    #: rename keeps both), so that a journal needs no ``lstat`` of its own.
    local: tuple[int, int] | None = None


class TransferOptions:
    """Tuning; the defaults suit a 2-core VM talking to a nearby object store.

    ``verify`` checks checksums (the size is always checked). ``durable`` fsyncs each file and
    its directory before and after the rename (survives power loss, costs a disk flush per
    file; an interrupted or killed process is safe either way). ``retry`` overrides the
    store's retry policy.
    ``part_size`` and ``part_concurrency`` (ranged reads in flight, across all downloads; idle
    workers take small objects meanwhile) default to the one downloader's
    (:mod:`lading.stores.download`). A plain class (read-only by convention): a dataclass costs
    about 1 ms of start-up to create, and none is compared, hashed or copied.
    """

    __slots__ = ("workers", "part_size", "multipart_threshold", "verify", "durable", "retry", "part_concurrency")

    def __init__(
        self,
        workers: int = 64,
        part_size: int = PART_SIZE,
        multipart_threshold: int = 64 << 20,
        verify: bool = True,
        durable: bool = False,
        retry: RetryPolicy | None = None,
        part_concurrency: int = PART_CONCURRENCY,
    ) -> None:
        self.workers, self.part_size, self.multipart_threshold = workers, part_size, multipart_threshold
        self.verify, self.durable, self.retry, self.part_concurrency = verify, durable, retry, part_concurrency


class TransferEvents(Protocol):
    """Callbacks the CLI (or a test) provides. Called on the I/O core's loop (``on_bytes`` of a
    plain Store's copy from a pool thread): keep them cheap."""

    def on_bytes(self, nbytes: int) -> None:
        """Some bytes arrived (may be negative when a retry discards a partial read)."""
        ...

    def on_done(self, result: TransferResult) -> None:
        """One item finished, successfully or not."""
        ...


class NoEvents:
    """TransferEvents that ignore everything."""

    def on_bytes(self, nbytes: int) -> None:
        """Ignore."""

    def on_done(self, result: TransferResult) -> None:
        """Ignore."""
