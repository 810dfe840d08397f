"""One large object fetched as parallel ranged reads into a preallocated temporary file.

Every part is guarded by the object's version, so a replace mid-download fails the item with
ObjectChanged instead of mixing bytes. Completed parts are recorded in a sidecar
(:class:`~lading.transfer.files.ResumeRecord`) so an interrupted download resumes. The
checksum, when the store gave one, is computed in part order while later parts still
download, so verifying costs little extra wall time. Hashing (MD5: ~800 MB/s on one core) can
be slower than the download; then parts may run at most ``lead`` parts ahead of the hashed
prefix, so idle download threads do not take CPU from the hash (measured in bench/RESULTS.md).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from lading.core.errors import LadingError, ObjectChanged, TransientError
from lading.core.retry import with_retries
from lading.transfer.files import (
    ResumeRecord,
    as_lading_error,
    publish,
    remove_temporaries,
    sidecar_path,
    temporary_path,
)
from lading.transfer.readers import Reader
from lading.transfer.types import TransferItem, TransferOptions, TransferResult
from lading.transfer.verify import IntegrityError, Verifier

_SAVE_INTERVAL = 1.0


@dataclass
class LargeContext:
    """What a large download needs from the engine."""

    reader: Reader
    options: TransferOptions
    on_bytes: Callable[[int], None]
    finish: Callable[[TransferResult], None]
    checkpoint: Callable[[], None]  # raises when the whole transfer is cancelled
    wake: Callable[[int], None] = lambda count: None  # up to ``count`` more parts may start now
    lead: int = 0  # parts allowed ahead of the hashed prefix (0: no limit)


class LargeDownload:
    """State of one ranged download; :meth:`run_part` is called from worker threads."""

    def __init__(self, item: TransferItem, ctx: LargeContext) -> None:
        self.item = item
        self.ctx = ctx
        self.info = item.info
        self.part_size = ctx.options.part_size
        self.count = (self.info.size + self.part_size - 1) // self.part_size
        self.tmp = temporary_path(item.dest)
        self.sidecar = sidecar_path(item.dest)
        self.verifier = Verifier(self.info, checksums=ctx.options.verify)
        self._lock = threading.Lock()
        self._hash_lock = threading.Lock()
        self._hashed = 0  # parts fed to the verifier, in order
        self._error: BaseException | None = None
        self._fd = -1
        self._pending = 0
        self._saved_at = time.monotonic()
        self._completed = False
        self._todo: deque[int] = deque()
        self._running = 0  # parts handed out by next_part and not yet ended
        self.record = ResumeRecord(self.info.key, self.info.version, self.info.size, self.part_size)

    def prepare(self) -> list[int]:
        """Open (or resume) the temporary; return the parts still to fetch."""
        previous = ResumeRecord.load(self.sidecar)
        resumable = (previous is not None and self.tmp.exists()
                     and previous.matches(self.info.key, self.info.version, self.info.size, self.part_size)
                     and self.tmp.stat().st_size == self.info.size)
        if resumable and previous is not None:
            self.record = previous
            self._fd = os.open(self.tmp, os.O_RDWR)
            resumed = sum(self._part_end(i) - self._part_start(i) for i in previous.done)
            self.ctx.on_bytes(resumed)
        else:
            remove_temporaries(self.item.dest)
            self._fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            os.ftruncate(self._fd, self.info.size)
            self.record.save(self.sidecar)
        todo = [i for i in range(self.count) if i not in self.record.done]
        self._todo = deque(todo)
        self._pending = len(todo)
        if not todo:
            self._pending = 1
            self._part_ended()
        return todo

    @property
    def has_parts(self) -> bool:
        """Whether parts remain to be handed out by :meth:`next_part`."""
        return bool(self._todo)

    def next_part(self) -> int | None:
        """The next part to fetch, or None while none may start (the engine serialises calls).

        A part more than ``lead`` parts past the hashed prefix waits, unless none of this
        download's parts is running (then nothing else would advance the hash).
        """
        if not self._todo:
            return None
        index = self._todo[0]
        with self._lock:
            if (self.ctx.lead and self._error is None and self._running
                    and self.verifier.needs_content and index >= self._hashed + self.ctx.lead):
                return None
            self._running += 1
        return self._todo.popleft()

    def _part_start(self, index: int) -> int:
        return index * self.part_size

    def _part_end(self, index: int) -> int:
        return min(self.info.size, (index + 1) * self.part_size)

    def run_part(self, index: int) -> None:
        """Fetch one part (with retries), record it, advance the checksum."""
        try:
            if self._error is None:
                reached = [self._part_start(index)]  # a retry resumes the part from here
                with_retries(lambda: self._fetch_part(index, reached), self.ctx.reader.retry_policy)
                with self._lock:
                    self.record.done.add(index)
                    self._save_record(force=False)
                self._advance_hash(blocking=False)
        except BaseException as err:  # noqa: BLE001 - recorded, reported once by _part_ended
            with self._lock:
                if self._error is None:
                    self._error = err
                self._save_record(force=True)
            self._open_gate()
            if not isinstance(err, (LadingError, OSError)):
                self._part_ended()
                raise
        self._part_ended()

    def flush(self) -> None:
        """Record the parts on disk now and stop recording: an interrupted transfer calls this
        before returning, so a straggling thread cannot overwrite a later run's record."""
        with self._lock:
            if not self._completed:
                self._save_record(force=True)
            self._completed = True

    def _save_record(self, force: bool) -> None:
        """Persist the completed parts (caller holds the lock). Throttled: a kill -9 costs at
        most ``_SAVE_INTERVAL`` seconds of parts, while a save per part would serialise the
        workers on small synchronous writes."""
        now = time.monotonic()
        if self._completed:
            return
        if force or now - self._saved_at >= _SAVE_INTERVAL:
            self.record.save(self.sidecar)
            self._saved_at = now

    def _fetch_part(self, index: int, reached: list[int]) -> None:
        """One attempt at the rest of a part: bytes ``[reached[0], end)``; ``reached[0]`` moves on
        with every byte written, so a body cut short is resumed by the next attempt, not refetched."""
        end = self._part_end(index)
        start = offset = reached[0]

        def sink(chunk: memoryview) -> None:
            nonlocal offset
            self.ctx.checkpoint()
            if self._error is not None:
                raise self._error
            if offset + len(chunk) > end:
                raise LadingError(f"{self.info.key}: server sent more than the requested range")
            view = chunk
            while view:
                written = os.pwrite(self._fd, view, offset)
                view = view[written:]
                offset += written
            self.ctx.on_bytes(len(chunk))
            reached[0] = offset

        if start >= end:
            return
        md5_usable = self.ctx.reader.read_part(self.info, start, end, sink)
        if offset != end:
            raise TransientError(f"{self.info.key}: short ranged read ({offset - start} of {end - start} bytes)")
        if not md5_usable:
            self.verifier.skip_md5()
            self._open_gate()

    def _open_gate(self) -> None:
        """Nothing holds parts back any more (no hash, or a failure): wake enough workers."""
        if self.ctx.lead and self._todo:
            self.ctx.wake(self.ctx.options.part_concurrency)

    def _advance_hash(self, blocking: bool) -> None:
        """Feed completed parts to the verifier in order; one thread at a time does it."""
        if not self.verifier.needs_content:
            return
        while self._hash_lock.acquire(blocking=blocking):
            try:
                while self._hashed in self.record.done:
                    self.verifier.update_from_file(self._fd, self._part_start(self._hashed),
                                                   self._part_end(self._hashed))
                    self._hashed += 1
                    if self.ctx.lead and self._todo:
                        self.ctx.wake(1)  # one more part is within the lead now
            finally:
                self._hash_lock.release()
            # a part may have completed after our last check but before we released the lock
            if self._hashed not in self.record.done:
                return

    def _part_ended(self) -> None:
        with self._lock:
            self._running = max(0, self._running - 1)
            self._pending -= 1
            if self._pending:
                return
        self._complete()

    def _complete(self) -> None:
        """Runs once, after the last part ended: publish, or report and keep what can resume."""
        with self._lock:
            if self._completed:  # flushed by an interrupted run: leave everything as recorded
                os.close(self._fd)
                return
            self._completed = True
        error = self._error
        try:
            if error is None:
                self._advance_hash(blocking=True)
                size = os.fstat(self._fd).st_size
                if self.verifier.md5_mismatch(size) and not self.ctx.reader.etag_is_md5(self.info.key):
                    self.verifier.skip_md5()  # SSE-KMS / SSE-C: the ETag is not the content's MD5
                self.verifier.check(size)
                publish(self.tmp, self.item.dest, self._fd, self.ctx.options.durable)
                self.sidecar.unlink(missing_ok=True)
        except (LadingError, OSError) as err:
            error = err
        finally:
            os.close(self._fd)
        if error is None:
            self.ctx.finish(TransferResult(self.info.key, self.item.dest, True, self.info.size))
            return
        if not isinstance(error, (LadingError, OSError)):
            return  # cancelled: keep the temporary and sidecar for the next run
        if not isinstance(error, OSError) and not _resumable(error):
            remove_temporaries(self.item.dest)
        self.ctx.finish(TransferResult(self.info.key, self.item.dest, False, 0, as_lading_error(error, self.item.dest)))


def _resumable(error: LadingError) -> bool:
    """Keep the parts on disk unless the object changed or its content failed verification."""
    return not isinstance(error, (ObjectChanged, IntegrityError))

