"""How the engine reads from a store, as coroutines on the I/O core.

:class:`NativeSource` reads an object store through its coroutine reads
(:meth:`~lading.stores.base.Store.coroutine_reads`: obstore, or the SDK in a pool thread; a
snapshot of one through its source at the recorded versions). Every body goes through the one
resume routine (:func:`lading.stores.download.fetch_range`), written and hashed as its pieces
arrive. :class:`StoreSource` copies local directories, its blocking calls in a pool thread.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Callable, Protocol

from lading.core.errors import TransientError
from lading.core.retry import RetryPolicy
from lading.stores.base import CoroutineReads, Fetched, ObjectInfo, RangeRequest, Store
from lading.stores.download import RangeAttempt, fetch_range, pwrite_all
from lading.transfer.files import create_empty
from lading.transfer.verify import Verifier

#: Receives a byte count for progress.
Progress = Callable[[int], None]


class Source(Protocol):
    """What the engine needs from a store (on the I/O core's loop, but :meth:`fetch_here`)."""

    policy: RetryPolicy
    #: Its reads are blocking calls (a local directory): the engine copies its small objects in
    #: pool threads with :meth:`fetch_here`, many per hop, and publishes them there.
    blocking: bool

    async def attempt_for(self, key: str) -> RangeAttempt:
        """One ranged GET of ``key``, no retry (for :func:`lading.stores.download.fetch_range`)."""
        ...

    def pins_by_content(self, info: ObjectInfo) -> bool:
        """Whether the listed version of ``info`` is the MD5 of its content (a single-part S3
        ETag), so that the content's MD5 proves which version a read got."""
        ...

    async def read_small(self, info: ObjectInfo, by_content: bool = False) -> memoryview | None:
        """The whole (small) object at its listed version, retried; None when this source has no
        cheaper way than :meth:`fetch_whole`. ``by_content``: not pinned (one request with no
        precondition); the caller checks the content against the listed MD5 instead."""
        ...

    async def fetch_whole(self, info: ObjectInfo, tmp: Path, verifier: Verifier, progress: Progress) -> int:
        """The whole object into ``tmp`` (created or truncated), fed to ``verifier``; returns its size."""
        ...

    def fetch_here(self, info: ObjectInfo, tmp: Path, verifier: Verifier, progress: Progress) -> os.stat_result:
        """The whole object into ``tmp`` with the store's blocking calls, on the calling thread (a
        pool thread), fed to ``verifier``; returns the temporary's ``fstat``."""
        ...

    def empty_here(self, info: ObjectInfo, dest: Path, durable: bool) -> os.stat_result | None:
        """An object listed empty, created at ``dest`` directly (blocking, on the calling thread)
        once the store says it still is that version; None when a file is at ``dest`` already."""
        ...

    def etag_is_md5(self, key: str) -> bool:
        """Whether the listed MD5 really is the content's (blocking: run it in a thread)."""
        ...


def version_of(info: ObjectInfo) -> str | None:
    """The version to pin reads to (some servers list an empty ETag: nothing to guard with)."""
    return info.version or None


class NativeSource:
    """An object store: its coroutine reads (:meth:`~lading.stores.base.Store.coroutine_reads`),
    directly on the loop. A key the store cannot read that way yet (it first decides something
    with a blocking request) is read with its blocking ``stream`` in a pool thread. Until the store
    has handed out its coroutine reads once, it is asked in a pool thread: its first answer may
    build the client, its credentials and (S3) find the bucket's region, never on the loop."""

    blocking = False

    def __init__(self, store: Store, policy: RetryPolicy) -> None:
        self.store = store
        self.policy = policy
        self._settled = False  # the store handed out its coroutine reads once: asking no longer blocks

    async def _reads(self, key: str) -> CoroutineReads | None:
        if self._settled:
            return self.store.coroutine_reads(key)
        reads = await asyncio.to_thread(self.store.coroutine_reads, key)
        self._settled = reads is not None
        return reads

    async def attempt_for(self, key: str) -> RangeAttempt:
        """One ranged GET of ``key``: a coroutine of the store's, else its ``stream`` in a thread."""
        reads = await self._reads(key)
        if reads is not None:
            return reads.attempt
        store = self.store

        async def blocking(
            key: str,
            start: int,
            end: int | None,
            version: str | None,
            sink: Callable[[memoryview], None],
            on_version: Callable[[str], None],
        ) -> Fetched:
            return await asyncio.to_thread(store.stream, key, sink, version, start, end, on_version)

        return blocking

    def pins_by_content(self, info: ObjectInfo) -> bool:
        """An object whose listed version the store says is its content's MD5."""
        return info.md5 is not None and self.store.md5_of_version(info.version) == info.md5.lower()

    async def read_small(self, info: ObjectInfo, by_content: bool = False) -> memoryview | None:
        """One GET collected whole (zero-copy), retried; None when the store has no coroutine read
        for this key yet (then :meth:`fetch_whole` streams it). ``by_content``: the listed size,
        unpinned (obstore: one call instead of two); an empty object is not asked for (no bytes
        to read: the caller checks the listed MD5 against the MD5 of nothing)."""
        if by_content and info.size == 0:
            return memoryview(b"")
        reads = await self._reads(info.key)
        if reads is None:
            return None
        if by_content:
            return await reads.read(RangeRequest(info.key, 0, info.size, None), self.policy)
        return await reads.read(RangeRequest(info.key, 0, None, version_of(info)), self.policy)

    async def fetch_whole(self, info: ObjectInfo, tmp: Path, verifier: Verifier, progress: Progress) -> int:
        """One stream into ``tmp``, hashed in order, a cut body resumed from the bytes received."""
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        written = 0

        def write(piece: memoryview, offset: int) -> None:
            nonlocal written
            pwrite_all(fd, piece, offset)
            verifier.update(piece)
            written += len(piece)
            progress(len(piece))

        try:
            fetched = await fetch_range(
                await self.attempt_for(info.key),
                self.policy,
                f"{self.store.url}{info.key}",
                info.key,
                0,
                None,
                version_of(info),
                write,
            )
        except BaseException:
            progress(-written)
            raise
        finally:
            os.close(fd)
        return fetched.nbytes

    def fetch_here(self, info: ObjectInfo, tmp: Path, verifier: Verifier, progress: Progress) -> os.stat_result:
        """The store's blocking ``download``, on the calling thread."""
        return download_here(self.store, info, tmp, verifier, progress)

    def empty_here(self, info: ObjectInfo, dest: Path, durable: bool) -> os.stat_result | None:
        """The store's blocking ``read_range`` of no bytes (it checks the version), then ``dest``."""
        return empty_here(self.store, info, dest, durable)

    def etag_is_md5(self, key: str) -> bool:
        """Ask the store (S3 answers with a HEAD through boto3)."""
        return self.store.etag_is_md5(key)


class StoreSource:
    """Any other Store (local directories): ``download`` and ``read_range`` in pool threads."""

    blocking = True

    def __init__(self, store: Store, policy: RetryPolicy) -> None:
        self.store = store
        self.policy = policy

    async def attempt_for(self, key: str) -> RangeAttempt:
        """``read_range`` of a bounded range in a pool thread."""

        async def attempt(
            key: str,
            start: int,
            end: int | None,
            version: str | None,
            sink: Callable[[memoryview], None],
            on_version: Callable[[str], None],
        ) -> Fetched:
            if end is None:
                raise ValueError("a ranged read of a plain Store needs an end")
            data = await asyncio.to_thread(self.store.read_range, key, start, end, version)
            if len(data) < end - start:
                raise TransientError(f"{key}: short ranged read ({len(data)} of {end - start} bytes)")
            sink(memoryview(data))
            return Fetched(len(data), end, version or "")

        return attempt

    def pins_by_content(self, info: ObjectInfo) -> bool:
        """Never: a local file's version is its mtime and size."""
        return False

    async def read_small(self, info: ObjectInfo, by_content: bool = False) -> None:
        """Local files are copied by :meth:`fetch_whole`."""
        return None

    async def fetch_whole(self, info: ObjectInfo, tmp: Path, verifier: Verifier, progress: Progress) -> int:
        """:meth:`fetch_here` in a pool thread."""
        return (await asyncio.to_thread(self.fetch_here, info, tmp, verifier, progress)).st_size

    def fetch_here(self, info: ObjectInfo, tmp: Path, verifier: Verifier, progress: Progress) -> os.stat_result:
        """``store.download`` to ``tmp``, then the file hashed if a checksum is known."""
        return download_here(self.store, info, tmp, verifier, progress)

    def empty_here(self, info: ObjectInfo, dest: Path, durable: bool) -> os.stat_result | None:
        """The store's blocking ``read_range`` of no bytes (it checks the version), then ``dest``."""
        return empty_here(self.store, info, dest, durable)

    def etag_is_md5(self, key: str) -> bool:
        """As the store says."""
        return self.store.etag_is_md5(key)


def download_here(store: Store, info: ObjectInfo, tmp: Path, verifier: Verifier, progress: Progress) -> os.stat_result:
    """``store.download`` of ``info`` to ``tmp`` on this thread, then the file hashed if a
    checksum is known; returns the temporary's ``fstat``."""
    received = 0

    def counted(nbytes: int) -> None:
        nonlocal received
        received += nbytes
        progress(nbytes)

    try:
        store.download(info.key, tmp, version_of(info), counted)
    except BaseException:
        progress(-received)
        raise
    if not verifier.needs_content:
        st = os.stat(tmp)
    else:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            verifier.update_from_file(fd, 0, st.st_size)
        finally:
            os.close(fd)
    if received < st.st_size:  # a backend that reports no progress
        progress(st.st_size - received)
    return st


def empty_here(store: Store, info: ObjectInfo, dest: Path, durable: bool) -> os.stat_result | None:
    """See :meth:`Source.empty_here`: the object is read (no bytes, at its listed version) before
    anything is created, so one deleted or replaced since the listing fails as a copy would."""
    store.read_range(info.key, 0, 0, version_of(info))
    return create_empty(dest, durable)


def open_source(store: Store, policy: RetryPolicy) -> Source:
    """Coroutine reads for object stores (S3, GCS, snapshots of them), a copy in a pool thread
    for local directories."""
    if store.scheme == "file":
        return StoreSource(store, policy)
    return NativeSource(store, policy)


__all__ = ["NativeSource", "Progress", "Source", "StoreSource", "open_source", "version_of"]
