"""CRC32C (Castagnoli), the cheap whole-object checksum lading records and checks.

Written as GCS and S3 write it: base64 of the four big-endian bytes (``"AAAAAA=="`` for no
bytes). google-crc32c computes it in C (about 0.1 ms of CPU per MiB here, against 1.8 ms for an
MD5). :func:`crc32c_combine` joins the CRCs of two adjacent runs of bytes, so a download whose
parts arrive interleaved is checked without reading the file back.
"""

from __future__ import annotations

import base64
import logging
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

_CHUNK = 1 << 20
_POLY = 0x82F63B78  # the Castagnoli polynomial, bit-reversed (x^0 is the top bit)


#: A view at least this long is hashed in place (:func:`_in_place`) rather than copied to bytes.
IN_PLACE = 256 << 10


def crc32c_extend(crc: int, data: bytes | memoryview) -> int:
    """``crc`` (0 for no bytes yet) extended over ``data``."""
    # The C extension takes bytes only, not a memoryview (not even a read-only one): a view of a
    # whole bytes object is hashed through that object, a long one in place, anything else is copied.
    if isinstance(data, memoryview):
        whole = data.obj
        if isinstance(whole, bytes) and len(whole) == data.nbytes:
            data = whole
        else:
            extended = _in_place(crc, data) if data.nbytes >= IN_PLACE else None
            if extended is not None:
                return extended
            data = bytes(data)
    return int(_google_crc32c().extend(crc, data))


@cache
def _google_crc32c() -> ModuleType:
    """The C extension, imported at the first CRC: an S3 sync of objects with MD5 ETags never
    computes one, and it costs a few ms of every command's start-up."""
    import google_crc32c

    return google_crc32c


def _in_place(crc: int, view: memoryview) -> int | None:
    """``crc`` extended over ``view`` without copying it: the ``crc32c_extend`` of the libcrc32c
    that google-crc32c's C extension links, called through ctypes on the view's address (the GIL
    released meanwhile). Copying a download's 8 MiB part buffers to bytes cost more CPU than the
    CRC itself (bench/RESULTS.md, 2026-11-27 session 9). None where the function is not reachable
    (a pure-Python google-crc32c, a static build): the caller copies."""
    extend = _find_extend()
    if extend is None or not view.c_contiguous:
        return None
    import numpy

    array = numpy.frombuffer(view, numpy.uint8)  # holds the buffer for the call
    return int(extend(crc, array.__array_interface__["data"][0], array.nbytes))


@cache
def _find_extend() -> Any:
    """libcrc32c's ``crc32c_extend`` (resolved through the extension module that links it), or None."""
    try:
        import ctypes

        from google_crc32c import _crc32c

        extend = ctypes.CDLL(_crc32c.__file__).crc32c_extend
        extend.restype = ctypes.c_uint32
        extend.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
    except (ImportError, OSError, AttributeError) as error:
        logging.getLogger("lading").info("CRC32C: hashing long buffers through a copy (%s)", error)
        return None
    return extend


def crc32c_text(crc: int) -> str:
    """The recorded form of a CRC32C: base64 of its big-endian bytes."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


class Crc32c:
    """A running CRC32C with hashlib's ``update``/``digest`` (digest: the four big-endian bytes)."""

    def __init__(self) -> None:
        self.crc = 0

    def update(self, data: bytes | memoryview) -> None:
        """Extend the CRC over ``data``."""
        self.crc = crc32c_extend(self.crc, data)

    def digest(self) -> bytes:
        """The CRC's four big-endian bytes."""
        return self.crc.to_bytes(4, "big")


def crc32c_of_file(path: Path) -> str:
    """The recorded form of a file's CRC32C."""
    crc = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            crc = crc32c_extend(crc, chunk)
    return crc32c_text(crc)


def crc32c_of_bytes(data: bytes) -> str:
    """The recorded form of ``data``'s CRC32C."""
    return crc32c_text(crc32c_extend(0, data))


def _multiply(a: int, b: int) -> int:
    """``a * b`` modulo the polynomial, both in bit-reversed order."""
    top = 1 << 31
    product = 0
    while top:
        if a & top:
            product ^= b
            if not a & (top - 1):
                break
        top >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


@cache
def _square_powers() -> list[int]:
    """``x^(2^k)`` modulo the polynomial for k = 0..31 (made at the first combine, not at import)."""
    powers = [1 << 30]  # x^1
    for _ in range(31):
        powers.append(_multiply(powers[-1], powers[-1]))
    return powers


def _shift(length: int) -> int:
    """``x^(8 * length)`` modulo the polynomial: appending ``length`` bytes, as a multiplier."""
    power, k = 1 << 31, 3  # x^0; 8 * length = length << 3
    while length:
        if length & 1:
            power = _multiply(_square_powers()[k & 31], power)
        length >>= 1
        k += 1
    return power


def crc32c_combine(first: int, second: int, second_length: int) -> int:
    """The CRC32C of ``A + B`` from ``A``'s CRC, ``B``'s CRC and ``B``'s length (the initial and
    final inversions cancel out, as in zlib's ``crc32_combine``)."""
    return _multiply(_shift(second_length), first) ^ second
