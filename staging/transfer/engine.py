"""The transfer engine: :func:`fetch_all` fetches a batch of objects into final paths, safely.

Every object is one coroutine on the I/O core (:mod:`lading.stores.iocore`): at most ``workers``
at once, GET, write, verify, publish and the caller's ``on_done`` (sync journals it there) in a
row on the loop, with no thread hop per object. A small object is collected whole and written
in one call (one whose listed ETag is its MD5 is read without a precondition, in one obstore call,
and published only when its bytes have that MD5: the listed version's bytes; else it is fetched
again pinned); a larger one is streamed to its temporary, hashed as it arrives; a large one is
fetched as ranged parts by the one downloader (:mod:`lading.stores.download`), at most
``part_concurrency`` parts at once across all downloads, each part recorded in a sidecar as it
lands so a killed run resumes with the parts still missing. A plain Store's (local directories)
small objects are copied, verified and published in a pool of :data:`COPY_THREADS` threads,
:data:`CHUNK` per hop; its other blocking calls and checksums of parts already on disk run there too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from pathlib import Path
from functools import partial
from typing import Awaitable, Callable, Iterable

from lading.core.errors import LadingError, ObjectChanged
from lading.stores.base import ObjectInfo, Store
from lading.stores.download import Layout, download_parts, preallocate
from lading.stores.iocore import io_core
from lading.transfer.files import (
    DirectoryMaker,
    ResumeRecord,
    as_lading_error,
    publish,
    remove_temporaries,
    sidecar_path,
    temporary_name,
    temporary_path,
    write_file,
)
from lading.transfer.readers import Source, open_source, version_of
from lading.transfer.types import NoEvents, TransferEvents, TransferItem, TransferOptions, TransferResult
from lading.transfer.verify import IntegrityError, Verifier, md5_is

#: How long an interrupted transfer waits for its coroutines to end.
_CANCEL_GRACE = 2.0
#: Objects of a blocking source (a local directory) copied per pool-thread hop.
CHUNK = 32
#: Threads copying a blocking source's small objects (one a core here). Creating and renaming
#: files is kernel work that more threads only contend for (in the file system, and for the GIL:
#: about 90 futex calls per file with the loop's 6 pool threads). 10,000 empty files on 2 cores,
#: three alternating rounds: 228-418 us of CPU each with 2 threads, 365-421 with 1, 359-664 with 6.
COPY_THREADS = 2
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
        # Pool threads copying a local source stop before their next object now, not when the
        # loop thread (perhaps busy) gets to the cancellation.
        engine.halt.set()
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
        self.halt = threading.Event()  # set: chunks in pool threads start no further object
        self._copier: concurrent.futures.ThreadPoolExecutor | None = None

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

        async def launch(work: Callable[[], Awaitable[None]]) -> bool:
            await slots.acquire()
            if failure:
                return False
            task = asyncio.ensure_future(work())
            running.add(task)
            task.add_done_callback(ended)
            return True

        try:
            chunk: list[TransferItem] = []
            for item in items:
                if not self.source.blocking or self._is_large(item):
                    if not await launch(partial(self._one, item)):
                        break
                    continue
                chunk.append(item)
                if len(chunk) >= CHUNK:
                    if not await launch(partial(self._chunk, chunk)):
                        break
                    chunk = []
            else:
                if chunk:
                    await launch(partial(self._chunk, chunk))
            while running and not failure:
                await asyncio.wait(set(running), return_when=asyncio.FIRST_EXCEPTION)
        finally:
            self.halt.set()  # chunks in pool threads start no further object
            for task in list(running):
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            if self._copier is not None:
                self._copier.shutdown(wait=False)  # idle: every chunk ended above
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
            nbytes, local = await self._whole(item)
        except asyncio.CancelledError:
            if not large:
                remove_temporaries(item.dest)
            raise
        except (LadingError, OSError) as err:
            if not large:
                remove_temporaries(item.dest)
            self._finish(TransferResult(item.info.key, item.dest, False, 0, as_lading_error(err, item.dest)))
            return
        self._finish(TransferResult(item.info.key, item.dest, True, nbytes, local=local))

    async def _chunk(self, items: list[TransferItem]) -> None:
        """Objects of a blocking source, copied, verified and published one after another in a
        pool thread (one hop for the chunk); their results reported here, on the loop. Cancelled,
        it waits for the object in progress (the thread starts no other)."""
        if self._copier is None:
            self._copier = concurrent.futures.ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="lading-copy")
        work = asyncio.get_running_loop().run_in_executor(self._copier, self._copy_all, items)
        try:
            results = await asyncio.shield(work)
        except asyncio.CancelledError:
            self.halt.set()
            await asyncio.wait([work])
            raise
        for result in results:
            self._finish(result)

    def _copy_all(self, items: list[TransferItem]) -> list[TransferResult]:
        results = []
        for item in items:
            if self.halt.is_set():
                break
            results.append(self._copy_here(item))
        return results

    def _copy_here(self, item: TransferItem) -> TransferResult:
        """One object of a blocking source into its temporary, verified, published (in a pool
        thread); a checksum mismatch is copied once more, then reported."""
        info, tmp = item.info, temporary_path(item.dest)
        try:
            self._dirs.ensure_parent(item.dest)
            if info.size == 0:
                created = self.source.empty_here(info, item.dest, self.options.durable)
                if created is not None:
                    return TransferResult(info.key, item.dest, True, 0, local=(created.st_mtime_ns, 0))
            for attempt in (1, 2):
                verifier = Verifier(info, checksums=self.options.verify)
                st = self.source.fetch_here(info, tmp, verifier, self.events.on_bytes)
                if verifier.md5_mismatch(st.st_size) and not self.source.etag_is_md5(info.key):
                    verifier.skip_md5()
                try:
                    verifier.check(st.st_size)
                    break
                except IntegrityError:
                    self.events.on_bytes(-st.st_size)
                    if attempt == 2:
                        raise
            publish(tmp, item.dest, durable=self.options.durable)
        except (LadingError, OSError) as err:
            remove_temporaries(item.dest)
            return TransferResult(info.key, item.dest, False, 0, as_lading_error(err, item.dest))
        return TransferResult(info.key, item.dest, True, st.st_size, local=(st.st_mtime_ns, st.st_size))

    def _is_large(self, item: TransferItem) -> bool:
        size = item.info.size
        return size >= self.options.multipart_threshold and size > self.options.part_size

    def _finish(self, result: TransferResult) -> None:
        self.results.append(result)
        self.events.on_done(result)

    async def _whole(self, item: TransferItem) -> tuple[int, tuple[int, int] | None]:
        """One object into its temporary, verified, then published; a checksum mismatch is fetched
        once more, then reported. Returns its size and, when known, the file's (mtime_ns, size)."""
        tmp = temporary_name(item.dest)
        if self._by_content(item.info):
            published = await self._small_by_content(item, tmp)
            if published is not None:
                return published
        local = None
        for attempt in (1, 2):
            verifier = Verifier(item.info, checksums=self.options.verify)
            data = await self.source.read_small(item.info) if item.info.size <= SMALL_OBJECT else None
            if data is not None:
                st = write_file(tmp, data)
                local = st.st_mtime_ns, st.st_size
                verifier.update(data)
                nbytes = len(data)
                self.events.on_bytes(nbytes)
            else:
                local = None
                nbytes = await self.source.fetch_whole(item.info, Path(tmp), verifier, self.events.on_bytes)
            try:
                await self._check(verifier, item, nbytes)
                break
            except IntegrityError:
                self.events.on_bytes(-nbytes)
                if attempt == 2:
                    raise
        publish(tmp, item.dest, durable=self.options.durable)
        return nbytes, local

    def _by_content(self, info: ObjectInfo) -> bool:
        """Whether a small object is read unpinned, its version proven by its content's MD5."""
        return self.options.verify and info.size <= SMALL_OBJECT and self.source.pins_by_content(info)

    async def _small_by_content(self, item: TransferItem, tmp: str) -> tuple[int, tuple[int, int]] | None:
        """The object read without a precondition, published only when its bytes have the listed
        size and MD5, i.e. are the listed version's (its ETag is that MD5); else None: the caller
        fetches it again pinned, which tells a replaced object (ObjectChanged) from a bad body."""
        data = await self.source.read_small(item.info, by_content=True)
        if data is None:
            return None
        if len(data) != item.info.size or not md5_is(data, item.info.md5 or ""):
            return None
        st = write_file(tmp, data)
        self.events.on_bytes(len(data))
        publish(tmp, item.dest, durable=self.options.durable)
        return len(data), (st.st_mtime_ns, st.st_size)

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
