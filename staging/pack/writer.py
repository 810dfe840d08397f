"""Write tar members into a shard file at known offsets, fast.

The plan knows every member's exact offset, so a shard can be written by several workers at
once, each filling its own byte range with ``pwrite``. Small files are read straight into one
preallocated buffer next to their header and written out in large chunks; large files are
copied by the kernel (``copy_file_range``), else read and written in large blocks.
"""

from __future__ import annotations

import errno
import os
from typing import Callable

from lading.core.errors import ObjectChanged
from lading.pack.tarformat import BLOCK, END_OF_ARCHIVE, PLAIN_CHECKSUM_BASE, PLAIN_HEADER, RECORD, member_header

_BUFFER_SIZE = 8 << 20
_ZEROS = bytes(BLOCK)
#: Files up to this size are read into the write buffer; larger ones are copied by the kernel.
SMALL_FILE = 1 << 20
_COPY_CHUNK = 64 << 20
_NO_KERNEL_COPY = (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)
#: Buffers of closed writers, reused by the next writer in this process: a fresh 8 MiB buffer
#: per 16 MB task costs ~2,000 page faults (the kernel zero-fills every page on first touch).
_SPARE_BUFFERS: list[bytearray] = []


def _take_buffer() -> bytearray:
    try:
        return _SPARE_BUFFERS.pop()  # atomic: writers on several threads each get their own
    except IndexError:
        return bytearray(_BUFFER_SIZE)


def drop_spare_buffers() -> None:
    """Free the buffers kept for reuse (call once the shards of a pack are written)."""
    _SPARE_BUFFERS.clear()


def _kernel_copy(src: int, dst: int, size: int, offset: int) -> int:
    """Copy ``size`` bytes from the current position of ``src`` to ``dst`` at ``offset``."""
    copied = 0
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is not None:
        try:
            while copied < size:
                step = copy_range(src, dst, min(_COPY_CHUNK, size - copied), None, offset + copied)
                if step == 0:
                    return copied
                copied += step
            return copied
        except OSError as err:
            if copied or err.errno not in _NO_KERNEL_COPY:
                raise
    while copied < size:
        data = os.read(src, min(_COPY_CHUNK, size - copied))
        if not data:
            break
        _pwrite_all(dst, data, offset + copied)
        copied += len(data)
    return copied


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    done, total = 0, len(data)
    with memoryview(data) as view:
        while done < total:
            with view[done:total] as rest:
                done += os.pwrite(fd, rest, offset + done)


class ShardWriter:
    """Writes members into the shard open as ``fd``, starting at byte ``offset``.

    ``finish()`` writes the end-of-archive blocks and record padding after the last member.
    ``progress`` is called with payload bytes as they are written (in batches, not per file).
    """

    def __init__(self, fd: int, progress: Callable[[int], None] | None = None, offset: int = 0) -> None:
        self.fd = fd
        self.offset = offset  # where the buffer's first byte goes
        self._buffer: bytearray | None = _take_buffer()  # old bytes past ``_used`` are never written
        self._view = memoryview(self._buffer)
        self._used = 0
        self._pending_progress = 0
        self._progress = progress
        self.payload_bytes = 0  # member contents written so far (headers and padding not counted)

    @property
    def position(self) -> int:
        """The offset just after the last member added."""
        return self.offset + self._used

    def _put(self, data: bytes | memoryview) -> None:
        end = self._used + len(data)
        self._view[self._used : end] = data
        self._used = end

    def _put_padding(self, size: int) -> None:
        pad = -size % BLOCK
        if pad:
            self._put(_ZEROS[:pad])

    def add_bytes(self, name: str, data: bytes | memoryview) -> None:
        """Add a member whose content is in memory."""
        header = member_header(name, len(data))
        if self._used + len(header) + len(data) + BLOCK > _BUFFER_SIZE:
            self.flush()
        if len(header) + len(data) + BLOCK > _BUFFER_SIZE:
            _pwrite_all(self.fd, header, self.offset)
            _pwrite_all(self.fd, data, self.offset + len(header))
            self.offset += len(header) + len(data)
        else:
            self._put(header)
            self._put(data)
        self._put_padding(len(data))
        self._pending_progress += len(data)

    def add_file(self, name: str, fd: int, size: int, source: str) -> None:
        """Add a member copied from the open file ``fd`` (at offset 0), exactly ``size`` bytes.

        Raises ObjectChanged when the file holds fewer bytes than its header promised.
        """
        if size > SMALL_FILE:
            self._add_large(member_header(name, size), fd, size, source)
            return
        # The hot path for small files, kept flat: header, data read straight into the buffer,
        # zero padding, with no intermediate bytes objects.
        encoded = name.encode("utf-8")
        plain = len(encoded) <= 100 and encoded.isascii()  # one header block, ustar name field
        header = b"" if plain else member_header(name, size)
        header_size = BLOCK if plain else len(header)
        used = self._used
        if used + header_size + size + BLOCK > _BUFFER_SIZE:
            self.flush()
            used = 0
        view = self._view
        start = used + header_size
        if plain:  # the header's constant fields, then name, size and checksum in place
            view[used:start] = PLAIN_HEADER
            view[used : used + len(encoded)] = encoded
            size_field = b"%011o\0" % size
            view[used + 124 : used + 136] = size_field
            view[used + 148 : used + 156] = b"%06o\0 " % (PLAIN_CHECKSUM_BASE + sum(encoded) + sum(size_field))
        else:
            view[used:start] = header
        got = os.readv(fd, [view[start : start + size]]) if size else 0
        while got < size:
            step = os.readv(fd, [view[start + got : start + size]])
            if step == 0:
                raise ObjectChanged(f"{source} shrank while packing it ({got} of {size} bytes)")
            got += step
        used = start + size
        pad = -size % BLOCK
        if pad:
            view[used : used + pad] = _ZEROS[:pad]
            used += pad
        self._used = used
        self._pending_progress += size

    def _add_large(self, header: bytes, fd: int, size: int, source: str) -> None:
        if self._used + len(header) > _BUFFER_SIZE:
            self.flush()
        self._put(header)
        self.flush()
        if _kernel_copy(fd, self.fd, size, self.offset) != size:
            raise ObjectChanged(f"{source} shrank while packing it")
        self.offset += size
        self._put_padding(size)
        self._pending_progress += size

    def flush(self) -> None:
        """Write out the buffer and report progress."""
        if self._used:
            with self._view[: self._used] as used:
                _pwrite_all(self.fd, used, self.offset)
            self.offset += self._used
            self._used = 0
        self.payload_bytes += self._pending_progress
        if self._progress is not None and self._pending_progress:
            self._progress(self._pending_progress)
        self._pending_progress = 0

    def finish(self) -> int:
        """Write the end-of-archive blocks and record padding; return the archive's size."""
        total = self.position + len(END_OF_ARCHIVE)
        tail = END_OF_ARCHIVE + bytes(-total % RECORD)
        if self._used + len(tail) > _BUFFER_SIZE:
            self.flush()
        self._put(tail)
        self.close()
        return self.offset

    def close(self) -> None:
        """Flush what is buffered and give the buffer back for the next writer."""
        self.flush()
        self._view.release()
        if self._buffer is not None and len(_SPARE_BUFFERS) < 4:
            _SPARE_BUFFERS.append(self._buffer)
        self._buffer = None
