"""A streaming tar reader for shards: regular files as ``(name, data)``, in archive order.

Python's ``tarfile`` costs tens of microseconds per member; shards of small files are read
member after member, so this reader does only what streaming needs: ustar headers (with the
prefix field), pax ``path``/``size`` records, GNU long names, base-256 sizes; directories,
links and other entries are skipped. Checksums are verified. It reads from anything with
``read(n)``.
"""

from __future__ import annotations

from typing import Callable, Iterator

from lading.pack.tarformat import BLOCK

_ZERO_BLOCK = bytes(BLOCK)
_FILE_TYPES = (b"0", b"\0", b"7")


class TarFormatError(Exception):
    """The stream is not a well-formed tar archive."""


def _read_exact(read: Callable[[int], bytes], size: int) -> bytes:
    data = read(size)
    if len(data) == size:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        chunk = read(size - got)
        if not chunk:
            raise TarFormatError(f"archive truncated: wanted {size} bytes, got {got}")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _number(field: bytes) -> int:
    if field[0] & 0x80:  # GNU base-256, for sizes over 8 GiB
        return int.from_bytes(field[1:], "big") | ((field[0] & 0x3F) << (8 * (len(field) - 1)))
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise TarFormatError(f"bad number field {field!r}") from None


def _pax_records(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    position = 0
    while position < len(data):
        space = data.find(b" ", position)
        if space < 0:
            break
        length = int(data[position:space])
        if length <= 0:
            raise TarFormatError("bad pax record length")
        keyword, _, value = data[space + 1 : position + length - 1].partition(b"=")
        records[keyword.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


def _checked(header: bytes) -> None:
    expected = _number(header[148:156])
    actual = sum(header[:148]) + 8 * 32 + sum(header[156:])
    if expected != actual:
        raise TarFormatError("header checksum mismatch: not a tar archive, or a damaged one")


def _member_name(header: bytes | memoryview, pax: dict[str, str], long_name: str | None) -> str:
    """A file member's name: pax ``path``, else a GNU long name, else the ustar prefix/name."""
    name = pax.get("path") or long_name
    if name is None:
        header = bytes(header)
        name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if header[257:262] == b"ustar" and header[345] != 0:
            prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            name = f"{prefix}/{name}"
    return name


def iter_files(read: Callable[[int], bytes]) -> Iterator[tuple[str, bytes]]:
    """``(name, data)`` of every regular file in the tar stream ``read``, in order."""
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        header = read(BLOCK)
        if not header or header == _ZERO_BLOCK:
            return  # end of archive (or a stream that ends without its end marker)
        if len(header) < BLOCK:
            header += _read_exact(read, BLOCK - len(header))
        _checked(header)
        kind = header[156:157]
        size = int(pax["size"]) if "size" in pax and kind in _FILE_TYPES else _number(header[124:136])
        data = _read_exact(read, size) if size else b""
        if size % BLOCK:
            _read_exact(read, BLOCK - size % BLOCK)
        if kind == b"x":
            pax = _pax_records(data)
            continue
        if kind == b"L":
            long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if kind in _FILE_TYPES:
            name = _member_name(header, pax, long_name)
            yield name, data
        long_name, pax = None, {}  # per-member records apply to the next entry only ('g' is ignored)


def iter_member_spans(buffer: bytes | memoryview) -> Iterator[tuple[str, int, int]]:
    """``(name, data offset, size)`` of every regular file in a tar archive held in memory (an
    mmap of a cached shard), in order, without copying any member's data."""
    view = memoryview(buffer)
    end = len(view)
    position = 0
    long_name: str | None = None
    pax: dict[str, str] = {}
    while position + BLOCK <= end:
        header = bytes(view[position : position + BLOCK])
        if header == _ZERO_BLOCK:
            return
        _checked(header)
        kind = header[156:157]
        size = int(pax["size"]) if "size" in pax and kind in _FILE_TYPES else _number(header[124:136])
        start = position + BLOCK
        position = start + size + (-size % BLOCK)
        if start + size > end:
            raise TarFormatError(f"archive truncated: a member needs {start + size} bytes, there are {end}")
        if kind == b"x":
            pax = _pax_records(bytes(view[start : start + size]))
            continue
        if kind == b"L":
            long_name = bytes(view[start : start + size]).rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if kind in _FILE_TYPES:
            name = _member_name(header, pax, long_name)
            yield name, start, size
        long_name, pax = None, {}
    if position < end and any(view[position:end]):
        raise TarFormatError("archive ends inside a header")
