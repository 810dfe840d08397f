"""Write one tar shard to a file descriptor, fast: small files batched into large writes,
large files copied in the kernel (copy_file_range, else sendfile, else read/write)."""

from __future__ import annotations

import os
from typing import Callable

from staging.errors import ObjectChanged
from staging.pack.tarformat import BLOCK, END_OF_ARCHIVE, RECORD, member_header, padding

_BUFFER_SIZE = 8 << 20
_ZEROS = bytes(BLOCK)
#: Files up to this size are read into the write buffer; larger ones are copied by the kernel.
SMALL_FILE = 1 << 20
_COPY_CHUNK = 64 << 20


def _kernel_copy(src: int, dst: int, size: int) -> int:
    """Copy ``size`` bytes from the current offset of ``src`` to ``dst``; return bytes copied."""
    copied = 0
    for method in (getattr(os, "copy_file_range", None), os.sendfile):
        if method is None:
            continue
        try:
            while copied < size:
                if method is os.sendfile:
                    step = os.sendfile(dst, src, None, min(_COPY_CHUNK, size - copied))
                else:
                    step = method(src, dst, min(_COPY_CHUNK, size - copied))
                if step == 0:
                    return copied
                copied += step
            return copied
        except OSError as err:
            if copied or err.errno not in (18, 22, 38, 95):  # EXDEV, EINVAL, ENOSYS, EOPNOTSUPP
                raise
    while copied < size:
        data = os.read(src, min(_COPY_CHUNK, size - copied))
        if not data:
            break
        os.write(dst, data)
        copied += len(data)
    return copied


class ShardWriter:
    """Appends members to a tar shard open as ``fd``; ``finish()`` writes the end marker.

    Small files are read straight into one preallocated buffer (header, data and padding
    side by side) that is written out in large chunks; nothing is copied twice.
    ``progress`` is called with payload bytes as they are written (in batches, not per file).
    """

    def __init__(self, fd: int, progress: Callable[[int], None] | None = None) -> None:
        self.fd = fd
        self.written = 0
        self._buffer = bytearray(_BUFFER_SIZE)
        self._view = memoryview(self._buffer)
        self._used = 0
        self._pending_progress = 0
        self._progress = progress

    def _room(self, nbytes: int) -> None:
        if self._used + nbytes > _BUFFER_SIZE:
            self.flush()

    def _put(self, data: bytes | memoryview) -> None:
        end = self._used + len(data)
        self._view[self._used:end] = data
        self._used = end

    def _put_padding(self, size: int) -> None:
        pad = padding(size)
        if pad:
            self._put(_ZEROS[:pad])

    def add_bytes(self, name: str, data: bytes | memoryview) -> None:
        """Add a member whose content is in memory."""
        header = member_header(name, len(data))
        if len(header) + len(data) + BLOCK > _BUFFER_SIZE:
            self.flush()
            self._write_all(header)
            self._write_all(data)
            self._put_padding(len(data))
        else:
            self._room(len(header) + len(data) + BLOCK)
            self._put(header)
            self._put(data)
            self._put_padding(len(data))
        self._pending_progress += len(data)

    def add_file(self, name: str, fd: int, size: int, source: str) -> None:
        """Add a member copied from the open file ``fd`` (at offset 0), exactly ``size`` bytes.

        Raises ObjectChanged when the file holds fewer bytes than its header promised.
        """
        header = member_header(name, size)
        if size > SMALL_FILE:
            self._add_large(header, fd, size, source)
            return
        # The hot path for small files, kept flat: header, data read straight into the buffer,
        # zero padding, with no intermediate bytes objects.
        used = self._used
        end = used + len(header) + size + BLOCK
        if end > _BUFFER_SIZE:
            self.flush()
            used = 0
        view = self._view
        start = used + len(header)
        view[used:start] = header
        got = os.readv(fd, [view[start:start + size]]) if size else 0
        while got < size:
            step = os.readv(fd, [view[start + got:start + size]])
            if step == 0:
                raise ObjectChanged(f"{source} shrank while packing it ({got} of {size} bytes)")
            got += step
        used = start + size
        pad = -size % BLOCK
        if pad:
            view[used:used + pad] = _ZEROS[:pad]
            used += pad
        self._used = used
        self._pending_progress += size

    def _add_large(self, header: bytes, fd: int, size: int, source: str) -> None:
        self._room(len(header))
        self._put(header)
        self.flush()
        if _kernel_copy(fd, self.fd, size) != size:
            raise ObjectChanged(f"{source} shrank while packing it")
        self.written += size
        self._put_padding(size)
        self._pending_progress += size

    def _write_all(self, data: bytes | memoryview) -> None:
        offset, total = 0, len(data)
        with memoryview(data) as view:
            while offset < total:
                with view[offset:total] as rest:
                    offset += os.write(self.fd, rest)
        self.written += total

    def flush(self) -> None:
        """Write out the buffer and report progress."""
        if self._used:
            with self._view[:self._used] as used:
                self._write_all(used)
            self._used = 0
        if self._progress is not None and self._pending_progress:
            self._progress(self._pending_progress)
        self._pending_progress = 0

    def finish(self) -> int:
        """Write the end-of-archive blocks and record padding; return the archive's size."""
        self.flush()
        total = self.written + len(END_OF_ARCHIVE)
        self._write_all(END_OF_ARCHIVE + bytes(-total % RECORD))
        self._view.release()
        return self.written
