"""The transfer engine: :func:`fetch_all` fetches a batch of objects into final paths, safely.

Every object is one coroutine on the I/O core (:mod:`lading.stores.iocore`): at most ``workers``
at once, GET, write, verify, publish and the caller's ``on_done`` (sync journals it there) in a
row on the loop, with no thread hop per object. A small object is collected whole and written
in one call; a larger one is streamed to its temporary, hashed as it arrives; a large one is
fetched as ranged parts by the one downloader (:mod:`lading.stores.download`), at most
``part_concurrency`` parts at once across all downloads, each part recorded in a sidecar as it
lands so a killed run resumes with the parts still missing. Blocking store calls of a plain Store
(local directories) and checksums of parts already on disk run in the loop's thread pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Iterable

from lading.core.errors import LadingError, ObjectChanged
from lading.stores.base import Store
from lading.stores.download import Layout, download_parts, preallocate
from lading.stores.iocore import io_core
from lading.transfer.files import (
    DirectoryMaker,
    ResumeRecord,
    as_lading_error,
    publish,
    remove_temporaries,
    sidecar_path,
    temporary_path,
    write_file,
)
from lading.transfer.readers import Source, open_source, version_of
from lading.transfer.types import NoEvents, TransferEvents, TransferItem, TransferOptions, TransferResult
from lading.transfer.verify import IntegrityError, Verifier

#: How long an interrupted transfer waits for its coroutines to end.
_CANCEL_GRACE = 2.0
#: Objects up to this size are collected whole (one piece) and written in one call; a body cut
#: short costs at most this much again (larger ones stream and resume from the bytes received).
SMALL_OBJECT = 256 << 10


def fetch_all(
    store: Store,
    items: Iterable[TransferItem],
    options: TransferOptions = TransferOptions(),
    events: TransferEvents = NoEvents(),
) -> list[TransferResult]:
    """Fetch every item; return one result per item, in completion order.

    See :mod:`lading.transfer` for the contract.
    """
    policy = options.retry or store.config.retry
    engine = _Engine(open_source(store, policy), options, events)
    future = io_core().spawn(engine.run(items))
    try:
        while True:  # wake now and then: an interrupt raised without a signal (interrupt_main) lands too
            try:
                return future.result(timeout=0.25)
            except concurrent.futures.TimeoutError:
                continue
    except BaseException:
        # Interrupted (Ctrl-C): cancel the transfer, and let its coroutines end (the sidecars say
        # what is on disk) before the caller goes on, so nothing of this run writes after it returned.
        future.cancel()
        engine.stopped.wait(_CANCEL_GRACE)
        raise


class _Engine:
    """One coroutine per object, bounded by ``workers``; parts bounded by ``part_concurrency``."""

    def __init__(self, source: Source, options: TransferOptions, events: TransferEvents) -> None:
        self.source = source
        self.options = options
        self.events = events
        self.results: list[TransferResult] = []
        self._dirs = DirectoryMaker()
        self._parts: asyncio.Semaphore | None = None
        self.stopped = threading.Event()  # set once :meth:`run` ended, however

    async def run(self, items: Iterable[TransferItem]) -> list[TransferResult]:
        """Start a coroutine per item as slots free up; return the results once all ended. An
        unexpected error (a bug) or a cancellation stops the others and is raised."""
        slots = asyncio.Semaphore(max(1, self.options.workers))
        self._parts = asyncio.Semaphore(max(1, min(self.options.workers, self.options.part_concurrency)))
        running: set[asyncio.Task[None]] = set()
        failure: list[BaseException] = []

        def ended(task: asyncio.Task[None]) -> None:
            running.discard(task)
            slots.release()
            if not task.cancelled() and task.exception() is not None and not failure:
                failure.append(task.exception())  # type: ignore[arg-type]

        try:
            for item in items:
                await slots.acquire()
                if failure:
                    break
                task = asyncio.ensure_future(self._one(item))
                running.add(task)
                task.add_done_callback(ended)
            while running and not failure:
                await asyncio.wait(set(running), return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in list(running):
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            self.stopped.set()
        if failure:
            raise failure[0]
        return self.results

    async def _one(self, item: TransferItem) -> None:
        large = self._is_large(item)
        try:
            self._dirs.ensure_parent(item.dest)
            if large:
                await self._large(item)
                return
            nbytes = await self._whole(item)
        except asyncio.CancelledError:
            if not large:
                remove_temporaries(item.dest)
            raise
        except (LadingError, OSError) as err:
            if not large:
                remove_temporaries(item.dest)
            self._finish(TransferResult(item.info.key, item.dest, False, 0, as_lading_error(err, item.dest)))
            return
        self._finish(TransferResult(item.info.key, item.dest, True, nbytes))

    def _is_large(self, item: TransferItem) -> bool:
        size = item.info.size
        return size >= self.options.multipart_threshold and size > self.options.part_size

    def _finish(self, result: TransferResult) -> None:
        self.results.append(result)
        self.events.on_done(result)

    async def _whole(self, item: TransferItem) -> int:
        """One object into its temporary, verified, then published; a checksum mismatch is fetched
        once more, then reported."""
        tmp = temporary_path(item.dest)
        for attempt in (1, 2):
            verifier = Verifier(item.info, checksums=self.options.verify)
            data = await self.source.read_small(item.info) if item.info.size <= SMALL_OBJECT else None
            if data is not None:
                write_file(tmp, data)
                verifier.update(data)
                nbytes = len(data)
                self.events.on_bytes(nbytes)
            else:
                nbytes = await self.source.fetch_whole(item.info, tmp, verifier, self.events.on_bytes)
            try:
                await self._check(verifier, item, nbytes)
                break
            except IntegrityError:
                self.events.on_bytes(-nbytes)
                if attempt == 2:
                    raise
        publish(tmp, item.dest, durable=self.options.durable)
        return nbytes

    async def _check(self, verifier: Verifier, item: TransferItem, size: int) -> None:
        """Size and checksum; an MD5 the server says is not the content's (SSE-KMS, SSE-C) is skipped."""
        if verifier.md5_mismatch(size) and not await asyncio.to_thread(self.source.etag_is_md5, item.info.key):
            verifier.skip_md5()
        verifier.check(size)

    async def _large(self, item: TransferItem) -> None:
        """Ranged parts into a preallocated temporary, recorded in the sidecar part by part and
        hashed in order as they land; then verified and published."""
        info, tmp, sidecar = item.info, temporary_path(item.dest), sidecar_path(item.dest)
        layout = Layout(info.size, self.options.part_size)
        record, fd = self._open_large(item, layout)
        verifier = Verifier(info, checksums=self.options.verify)
        hashed = 0  # parts fed to the verifier, in order
        hashing = asyncio.Lock()

        async def advance_hash() -> None:
            nonlocal hashed
            if not verifier.needs_content:
                return
            async with hashing:
                while hashed in record.done:
                    start, end = layout.bounds(hashed)
                    await asyncio.to_thread(verifier.update_from_file, fd, start, end)
                    hashed += 1

        async def landed(index: int) -> None:
            record.add(sidecar, index)  # a kill -9 from here on refetches only the parts not recorded
            await advance_hash()

        error: BaseException | None = None
        try:
            todo = [index for index in range(layout.count) if index not in record.done]
            await advance_hash()
            await download_parts(
                await self.source.attempt_for(info.key),
                self.source.policy,
                info.key,
                info.key,
                fd,
                layout,
                version_of(info),
                todo,
                self.events.on_bytes,
                landed,
                self.options.part_concurrency,
                self._parts,
            )
            await advance_hash()
            await self._check(verifier, item, os.fstat(fd).st_size)
            publish(tmp, item.dest, fd, self.options.durable)
            sidecar.unlink(missing_ok=True)
        except (LadingError, OSError) as err:
            error = err
        finally:
            os.close(fd)
        if error is None:
            self._finish(TransferResult(info.key, item.dest, True, info.size))
            return
        if isinstance(error, (ObjectChanged, IntegrityError)):  # the parts on disk are of no use
            remove_temporaries(item.dest)
        self._finish(TransferResult(info.key, item.dest, False, 0, as_lading_error(error, item.dest)))

    def _open_large(self, item: TransferItem, layout: Layout) -> tuple[ResumeRecord, int]:
        """The temporary and its record: resumed when both belong to this object and layout, else new."""
        info, tmp, sidecar = item.info, temporary_path(item.dest), sidecar_path(item.dest)
        previous = ResumeRecord.load(sidecar)
        if (
            previous is not None
            and previous.matches(info.key, info.version, info.size, layout.part_size)
            and tmp.exists()
            and tmp.stat().st_size == info.size
        ):
            self.events.on_bytes(sum(end - start for start, end in map(layout.bounds, previous.done)))
            return previous, os.open(tmp, os.O_RDWR)
        remove_temporaries(item.dest)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            preallocate(fd, info.size)
            record = ResumeRecord(info.key, info.version, info.size, layout.part_size)
            record.save(sidecar)
        except BaseException:
            os.close(fd)
            raise
        return record, fd
