"""The transfer engine: :func:`fetch_all` fetches a batch of objects into final paths, safely.

``workers`` threads pull jobs from the item iterator themselves: a whole-object download for
a small object, or the parts of a large one (:mod:`lading.transfer.large`), of which at most
``part_concurrency`` run at once. Items are consumed lazily, so memory holds one result per
item and nothing per pending item. S3 and GCS stream through obstore
(:class:`lading.transfer.readers.StreamingReader`), which resumes a cut body.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Callable, Iterable, Iterator

from lading.core.errors import LadingError
from lading.stores.base import Store
from lading.transfer.files import (
    DirectoryMaker,
    as_lading_error,
    publish,
    remove_temporaries,
    temporary_path,
    write_file,
)
from lading.transfer.large import LargeContext, LargeDownload
from lading.transfer.readers import Reader, open_reader
from lading.transfer.types import NoEvents, TransferEvents, TransferItem, TransferOptions, TransferResult
from lading.transfer.verify import IntegrityError, Verifier

#: How long an interrupted transfer waits for running requests before giving up on them.
_CANCEL_GRACE = 1.0
#: How far (in multiples of ``part_concurrency`` parts) a download may run ahead of its checksum.
_HASH_LEAD = 1
#: Objects up to this size are fetched ``SMALL_BATCH`` at a time in one batched read (one hop to
#: the I/O core, the GETs concurrent) instead of a call each; a body cut short costs at most this
#: much again (larger objects resume from the bytes received).
SMALL_OBJECT = 256 << 10
SMALL_BATCH = 16


class Cancelled(BaseException):
    """Raised inside workers once the transfer is interrupted (not an error of the item)."""


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
    reader = open_reader(store, policy)
    try:
        return _Engine(reader, options, events).run(items)
    finally:
        reader.close()


class _Engine:
    """Worker threads pull jobs themselves: parts of large objects first, then the next item.

    Pulling (rather than a main thread feeding an executor) keeps per-object overhead to a
    lock acquisition, which matters at thousands of small objects per second.
    """

    def __init__(self, reader: Reader, options: TransferOptions, events: TransferEvents) -> None:
        self.reader = reader
        self.options = options
        self.events = events
        self.results: list[TransferResult] = []
        self._results_lock = threading.Lock()
        self._cancel = threading.Event()
        self._dirs = DirectoryMaker()
        self._part_limit = max(1, options.part_concurrency)
        self._jobs = threading.Condition()
        self._large = LargeContext(reader, options, events.on_bytes, self._finish, self._checkpoint,
                                   self._wake, int(_HASH_LEAD * self._part_limit))
        self._parts: deque[LargeDownload] = deque()  # downloads with parts not yet handed out
        self._preparing = 0
        self._parts_running = 0
        self._items: Iterator[TransferItem] = iter(())
        self._held: deque[TransferItem] = deque()  # taken from the iterator, not yet handed out
        self._exhausted = False
        self._batching = True  # until the reader says it has no batched reads
        self._failure: BaseException | None = None
        self._downloads: weakref.WeakSet[LargeDownload] = weakref.WeakSet()

    def run(self, items: Iterable[TransferItem]) -> list[TransferResult]:
        """Run the workers until every item is done; return the results."""
        self._items = iter(items)
        threads = [threading.Thread(target=self._work, name=f"lading-fetch-{n}", daemon=True)
                   for n in range(max(1, self.options.workers))]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.25)
        except BaseException:
            self._cancel.set()
            deadline = time.monotonic() + _CANCEL_GRACE
            for thread in threads:
                if thread.ident is not None:  # started
                    thread.join(max(0.0, deadline - time.monotonic()))
            for download in list(self._downloads):
                download.flush()  # what is on disk stays resumable
            raise
        if self._failure is not None:
            raise self._failure
        return self.results

    def _work(self) -> None:
        try:
            while not self._cancel.is_set():
                job = self._next_job()
                if job is None:
                    return
                job()
        except Cancelled:
            pass
        except BaseException as err:  # noqa: BLE001 - e.g. the item iterator failed: stop everyone
            with self._jobs:
                if self._failure is None:
                    self._failure = err
            self._cancel.set()
        finally:
            with self._jobs:
                self._jobs.notify_all()

    def _next_job(self) -> Callable[[], None] | None:
        """A queued part (while fewer than ``part_concurrency`` run), else a job for the next
        item, else None once everything is handed out."""
        with self._jobs:
            while True:
                if self._parts and self._parts_running < self._part_limit:
                    part = self._next_part()
                    if part is not None:
                        self._parts_running += 1
                        return self._as_part(part)
                if not self._exhausted:
                    item = self._pull()
                    if item is not None:
                        break
                    self._exhausted = True
                if (not self._parts and not self._preparing) or self._cancel.is_set():
                    return None
                self._jobs.wait()  # parts are queued or coming: wait for a free slot
            if self._batchable(item):
                batch = self._batch_from(item)
                return lambda: self._fetch_batch(batch)
            if not self._is_large(item):
                return lambda: self._fetch_small(item)
            self._preparing += 1
        return lambda: self._start_large(item)

    def _pull(self) -> TransferItem | None:
        """The next item: one held back by a batch first (caller holds ``_jobs``)."""
        if self._held:
            return self._held.popleft()
        return next(self._items, None)

    def _batchable(self, item: TransferItem) -> bool:
        return self._batching and item.info.size <= SMALL_OBJECT and not self._is_large(item)

    def _batch_from(self, first: TransferItem) -> list[TransferItem]:
        """``first`` and the small items right after it, up to SMALL_BATCH (caller holds ``_jobs``)."""
        batch = [first]
        while len(batch) < SMALL_BATCH:
            item = self._pull()
            if item is None:
                self._exhausted = True
                break
            if not self._batchable(item):
                self._held.append(item)
                break
            batch.append(item)
        return batch

    def _next_part(self) -> Callable[[], None] | None:
        """The first part any download lets start now (caller holds ``_jobs``)."""
        for download in self._parts:
            index = download.next_part()
            if index is not None:
                if not download.has_parts:
                    self._parts.remove(download)
                return lambda: download.run_part(index)
        return None

    def _wake(self, count: int) -> None:
        """Wake up to ``count`` waiting workers: that many more parts may start."""
        with self._jobs:
            self._jobs.notify(count)

    def _as_part(self, job: Callable[[], None]) -> Callable[[], None]:
        def part() -> None:
            try:
                job()
            finally:
                with self._jobs:
                    self._parts_running -= 1
                    self._jobs.notify()  # one waiter may take the freed slot

        return part

    def _is_large(self, item: TransferItem) -> bool:
        size = item.info.size
        return size >= self.options.multipart_threshold and size > self.options.part_size

    def _checkpoint(self) -> None:
        if self._cancel.is_set():
            raise Cancelled()

    def _finish(self, result: TransferResult) -> None:
        with self._results_lock:
            self.results.append(result)
        self.events.on_done(result)

    def _fail(self, item: TransferItem, error: BaseException) -> None:
        self._finish(TransferResult(item.info.key, item.dest, False, 0, as_lading_error(error, item.dest)))

    def _start_large(self, item: TransferItem) -> None:
        """Prepare the temporary and queue the missing parts."""
        download = LargeDownload(item, self._large)
        self._downloads.add(download)
        parts: list[int] = []
        try:
            self._dirs.ensure(item.dest.parent)
            parts = download.prepare()
        except (LadingError, OSError) as err:
            self._fail(item, err)
        finally:
            with self._jobs:
                self._preparing -= 1
                if parts:
                    self._parts.append(download)
                if parts:  # wake only as many workers as can start a part
                    self._jobs.notify(min(len(parts), self._part_limit))
                else:
                    self._jobs.notify_all()  # waiters may be done

    def _fetch_batch(self, items: list[TransferItem]) -> None:
        """Small objects read in one batch, then each written, verified and published; an object
        whose read failed, or whose bytes do not match, goes the one-by-one way (its own retries)."""
        self._checkpoint()
        fetched = self.reader.fetch_small_many([item.info for item in items])
        if fetched is None:
            self._batching = False
        outcomes: list[memoryview | BaseException | None] = [None] * len(items) if fetched is None else list(fetched)
        for item, outcome in zip(items, outcomes):
            self._checkpoint()
            if isinstance(outcome, (LadingError, OSError)):  # after the core's own retries
                self._fail(item, outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
            elif outcome is None or not self._store_small(item, outcome):
                self._fetch_small(item)

    def _store_small(self, item: TransferItem, data: memoryview) -> bool:
        """Write, verify and publish one object read in a batch; False (nothing kept) when its
        bytes do not match the listed checksum, so the caller fetches it again on its own."""
        tmp = temporary_path(item.dest)
        try:
            self._dirs.ensure(item.dest.parent)
            verifier = Verifier(item.info, checksums=self.options.verify)
            write_file(tmp, data)
            verifier.update(data)
            if verifier.md5_mismatch(len(data)) and not self.reader.etag_is_md5(item.info.key):
                verifier.skip_md5()
            verifier.check(len(data))
            publish(tmp, item.dest, durable=self.options.durable)
        except IntegrityError:
            remove_temporaries(item.dest)
            return False
        except (LadingError, OSError) as err:
            remove_temporaries(item.dest)
            self._fail(item, err)
            return True
        self.events.on_bytes(len(data))
        self._finish(TransferResult(item.info.key, item.dest, True, len(data)))
        return True

    def _fetch_small(self, item: TransferItem) -> None:
        tmp = temporary_path(item.dest)
        try:
            self._dirs.ensure(item.dest.parent)
            nbytes = self._download_verified(item, tmp)
            publish(tmp, item.dest, durable=self.options.durable)
        except Cancelled:
            remove_temporaries(item.dest)
            raise
        except (LadingError, OSError) as err:
            remove_temporaries(item.dest)
            self._fail(item, err)
            return
        self._finish(TransferResult(item.info.key, item.dest, True, nbytes))

    def _download_verified(self, item: TransferItem, tmp: Path) -> int:
        """Download with retries; a checksum mismatch is retried once, then reported."""
        for attempt in (1, 2):

            def once() -> tuple[int, Verifier]:
                # A fresh verifier per attempt: a retried body must not hash the failed attempt's bytes.
                verifier = Verifier(item.info, checksums=self.options.verify)
                return self.reader.fetch_whole(item.info, tmp, verifier, self.events.on_bytes, self._checkpoint), verifier

            nbytes, verifier = once()  # the reader retries (and resumes) on its own
            try:
                verifier.check(nbytes)
                return nbytes
            except IntegrityError:
                self.events.on_bytes(-nbytes)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

