"""Content verification for downloads: size, plus the strongest checksum the store gave us.

S3 single-part ETags are the hex MD5 of the content (``ObjectInfo.md5``); GCS reports a
base64 big-endian CRC32C for every object (``ObjectInfo.crc32c``) and an MD5 for
non-composite ones. CRC32C is preferred when both exist: it is several times cheaper.
"""

from __future__ import annotations

import base64
import os
from typing import Protocol

from lading.core.checksums import Crc32c, crc32c_combine, crc32c_extend, crc32c_text
from lading.core.errors import ProblemFound
from lading.stores.base import ObjectInfo

_READ_CHUNK = 1 << 20


class IntegrityError(ProblemFound):
    """Downloaded bytes do not match the size or checksum the store reported."""


class Hasher(Protocol):
    """The subset of hashlib's interface we use."""

    def update(self, data: bytes | memoryview, /) -> None: ...


class Verifier:
    """Accumulates a checksum over the content, in order, and checks it at the end."""

    def __init__(self, info: ObjectInfo, checksums: bool = True) -> None:
        self.info = info
        self._expected: str | None = None
        self._hasher: Hasher | None = None
        self._kind = ""
        self._digest: bytes | None = None
        if not checksums:
            return  # size only
        if info.crc32c:
            self._hasher = Crc32c()
            self._expected, self._kind = info.crc32c, "CRC32C"
        elif info.md5:
            import hashlib  # here: a sync of multipart objects (no MD5 to check) never loads it

            self._hasher = hashlib.md5(usedforsecurity=False)
            self._expected, self._kind = info.md5.lower(), "MD5"

    @property
    def needs_content(self) -> bool:
        """Whether :meth:`update` must see every byte (else only the size is checked)."""
        return self._hasher is not None

    def skip_md5(self) -> None:
        """Stop checking an MD5 (the server says the ETag is not one: SSE-KMS, SSE-C)."""
        if self._kind == "MD5":
            self._hasher, self._expected, self._kind = None, None, ""

    def md5_mismatch(self, size: int) -> bool:
        """Whether the content has the right size but not the MD5 the listing promised (the
        ETag of an SSE-KMS or SSE-C object is not its MD5). Call once, after the last byte."""
        if self._kind != "MD5" or size != self.info.size or self._hasher is None:
            return False
        self._digest = self._hasher.digest()  # type: ignore[attr-defined]
        return self._digest.hex() != self._expected

    def update(self, data: bytes | memoryview) -> None:
        """Feed the next bytes of the content."""
        if self._hasher is not None:
            self._hasher.update(data)

    def update_from_file(self, fd: int, start: int, end: int) -> None:
        """Feed bytes ``[start, end)`` of an open file."""
        hasher = self._hasher  # skip_md5() may drop it from another thread meanwhile
        if hasher is None:
            return
        offset = start
        while offset < end:
            chunk = os.pread(fd, min(_READ_CHUNK, end - offset), offset)
            if not chunk:
                raise IntegrityError(f"{self.info.key}: temporary file shorter than expected")
            hasher.update(chunk)
            offset += len(chunk)

    def check(self, size: int) -> None:
        """Raise :class:`IntegrityError` unless size and checksum match what the store reported."""
        if size != self.info.size:
            raise IntegrityError(f"{self.info.key}: got {size} bytes, expected {self.info.size}")
        if self._hasher is None:
            return
        digest = self._digest or self._hasher.digest()  # type: ignore[attr-defined]
        actual = base64.b64encode(digest).decode() if self._kind == "CRC32C" else digest.hex()
        if actual != self._expected:
            raise IntegrityError(f"{self.info.key}: {self._kind} mismatch (got {actual}, store says {self._expected})")


def md5_is(data: bytes | memoryview, expected: str) -> bool:
    """Whether ``data``'s MD5 is the hex digest ``expected`` (any case): a whole small object
    checked in one call, with no :class:`Verifier` made for it."""
    import hashlib  # loaded by the first object to check (a sync of multipart objects never needs it)

    return hashlib.md5(data, usedforsecurity=False).hexdigest() == expected.lower()


class InlineCrc32c:
    """Checks a download against a recorded CRC32C as its pieces are written, with no read-back
    of the file: pass it as ``Store.download``'s ``on_piece``, then call :meth:`check`.

    A ranged download's pieces arrive in order within each part but with the parts interleaved,
    so it keeps one running CRC per contiguous run of bytes (a piece that starts where a run
    ends extends it) and combines the runs in offset order at the end. Called from one thread at
    a time (the I/O core's loop, or the thread that copies a local file)."""

    def __init__(self, key: str, expected: str) -> None:
        self.key, self.expected = key, expected
        self._runs: dict[int, tuple[int, int]] = {}  # end offset -> (start offset, CRC of the run)

    def __call__(self, piece: memoryview, offset: int) -> None:
        """Feed the piece of the content that starts at ``offset``."""
        start, crc = self._runs.pop(offset, (offset, 0))
        self._runs[offset + piece.nbytes] = (start, crc32c_extend(crc, piece))

    def check(self, size: int) -> None:
        """Raise :class:`IntegrityError` unless exactly bytes ``[0, size)`` arrived, once, with
        the recorded CRC32C."""
        crc, position = 0, 0
        for start, end, run in sorted((start, end, run) for end, (start, run) in self._runs.items()):
            if start != position:
                raise IntegrityError(f"{self.key}: the download's pieces do not tile the object (at byte {position})")
            crc, position = crc32c_combine(crc, run, end - start), end
        if position != size:
            raise IntegrityError(f"{self.key}: got {position} bytes, expected {size}")
        actual = crc32c_text(crc)
        if actual != self.expected:
            raise IntegrityError(f"{self.key}: CRC32C mismatch (got {actual}, the index says {self.expected})")
