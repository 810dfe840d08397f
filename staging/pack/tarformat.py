"""Deterministic POSIX tar headers (ustar, with a pax record only when a name or size needs one).

Every member gets the same mode, owner and mtime, so the same files give the same bytes.
"""

from __future__ import annotations

BLOCK = 512
#: tar implementations pad an archive to a multiple of 20 blocks (GNU tar, Python's tarfile).
RECORD = 20 * BLOCK
END_OF_ARCHIVE = bytes(2 * BLOCK)

FIXED_MTIME = 0
FIXED_MODE = 0o644
FIXED_UID = 0
FIXED_GID = 0
_MAX_OCTAL_SIZE = 8**11 - 1  # 11 octal digits: just under 8 GiB

# The constant tail of every header after the name/size fields (mode, owner, mtime, magic).
_MODE = b"%07o\0" % FIXED_MODE
_UID = b"%07o\0" % FIXED_UID
_GID = b"%07o\0" % FIXED_GID
_MTIME = b"%011o\0" % FIXED_MTIME
_MAGIC = b"ustar\x0000"


def padding(size: int) -> int:
    """Zero bytes after ``size`` bytes of data to reach a block boundary."""
    return -size % BLOCK


def _ustar_split(name: bytes) -> tuple[bytes, bytes] | None:
    """``(prefix, name)`` for a ustar header, or None when the name needs a pax record."""
    if len(name) <= 100:
        return b"", name
    cut = name.find(b"/", len(name) - 101)
    while cut != -1 and cut <= 155:
        if 0 < len(name) - cut - 1 <= 100:
            return name[:cut], name[cut + 1 :]
        cut = name.find(b"/", cut + 1)
    return None


_HEAD_MODE_OWNER = _MODE + _UID + _GID
_HEAD_AFTER_SIZE = _MTIME + b" " * 8  # checksum field counts as spaces while summing
_HEAD_TAIL = bytes(100) + _MAGIC + bytes(64) + b"0000000\0" * 2
_ZERO_NAME = bytes(100)
_ZERO_PREFIX = bytes(155 + 12)
_CONSTANT_SUM = sum(_HEAD_MODE_OWNER) + sum(_HEAD_AFTER_SIZE) + sum(_HEAD_TAIL)


def _header(name: bytes, prefix: bytes, size: int, typeflag: bytes) -> bytes:
    size_field = b"%011o\0" % size if size <= _MAX_OCTAL_SIZE else b"00000000000\0"
    checksum = _CONSTANT_SUM + sum(name) + sum(size_field) + typeflag[0] + sum(prefix)
    return b"".join(
        (
            name,
            _ZERO_NAME[len(name) :],
            _HEAD_MODE_OWNER,
            size_field,
            _MTIME,
            b"%06o\0 " % checksum,
            typeflag,
            _HEAD_TAIL,  # linkname, magic, uname, gname, devices
            prefix,
            _ZERO_PREFIX[len(prefix) :],
        )
    )


#: A one-block header for a regular file with the name, size and checksum fields left zero, and
#: what its other fields add to the checksum: the writer fills in the three fields in place
#: (name at 0, size at 124..136, checksum at 148..156) instead of building a header.
PLAIN_HEADER = _header(b"", b"", 0, b"0")[:124] + bytes(12) + _MTIME + bytes(8) + b"0" + _HEAD_TAIL + _ZERO_PREFIX
PLAIN_CHECKSUM_BASE = _CONSTANT_SUM + ord("0")


def _pax_record(keyword: str, value: str) -> bytes:
    body = f" {keyword}={value}\n".encode()
    length = len(body)
    while len(str(length).encode()) + len(body) != length:
        length = len(str(length).encode()) + len(body)
    return str(length).encode() + body


def member_header(name: str, size: int) -> bytes:
    """The header block(s) for a regular file ``name`` of ``size`` bytes."""
    encoded = name.encode("utf-8")
    split = _ustar_split(encoded) if encoded.isascii() else None
    if split is not None and size <= _MAX_OCTAL_SIZE:
        return _header(split[1], split[0], size, b"0")
    records = b""
    if split is None:
        records += _pax_record("path", name)
    if size > _MAX_OCTAL_SIZE:
        records += _pax_record("size", str(size))
    short = encoded[:100] if split is None else split[1]
    pax = _header(b"././@PaxHeader", b"", len(records), b"x") + records + bytes(padding(len(records)))
    return pax + _header(
        short.decode("utf-8", "ignore").encode("ascii", "replace")[:100], b"" if split is None else split[0], size, b"0"
    )


def member_size(name: str, size: int) -> int:
    """Bytes the member takes in the archive: header(s), data and padding."""
    if len(name) <= 100 and size <= _MAX_OCTAL_SIZE and name.isascii():
        return BLOCK + size + padding(size)
    return len(member_header(name, size)) + size + padding(size)


def archive_size(members_bytes: int) -> int:
    """Total archive size for ``members_bytes`` of members, with the end marker and record padding."""
    total = members_bytes + len(END_OF_ARCHIVE)
    return total + (-total % RECORD)
