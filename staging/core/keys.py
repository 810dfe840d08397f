"""Keys are untrusted: turn them into safe relative paths or refuse them."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from lading.core.errors import UnsafeKey


def key_parts(key: str) -> tuple[str, ...]:
    """Split a key into path segments, refusing anything that could escape a directory.

    Refused: empty keys, absolute keys, empty segments (``a//b``), ``.`` and ``..`` segments,
    NUL bytes and backslashes (a path separator on some systems).
    """
    if not key:
        raise UnsafeKey("refusing an empty key")
    if "\x00" in key:
        raise UnsafeKey(f"refusing key with a NUL byte: {key!r}")
    if "\\" in key:
        raise UnsafeKey(f"refusing key with a backslash: {key!r}")
    if key.startswith("/"):
        raise UnsafeKey(f"refusing absolute key {key!r}", "keys must be relative to the source prefix")
    parts = tuple(key.split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafeKey(
                f"refusing key {key!r}: it has an empty, '.' or '..' segment",
                "such a key would escape or alias the destination",
            )
    return parts


def is_safe_key(key: str) -> bool:
    """True when :func:`key_parts` accepts ``key``: no empty key or segment (so no leading or
    trailing ``/``), no ``.`` or ``..`` segment, no NUL byte, no backslash. Substring tests only
    (C speed, no split), for the per-key paths that only need the answer: a listing's keys and
    the sync record's rows."""
    if not key or key[0] == "/" or key[-1] == "/" or "//" in key or "\\" in key or "\x00" in key:
        return False
    if "." not in key:
        return True
    return not (
        key in (".", "..")
        or key.startswith(("./", "../"))
        or key.endswith(("/.", "/.."))
        or "/./" in key
        or "/../" in key
    )


def safe_join(root: Path, key: str) -> Path:
    """``root / key``, guaranteed to stay inside ``root``."""
    return root.joinpath(*key_parts(key))


def find_collisions(keys: Iterable[str]) -> list[tuple[str, str]]:
    """Pairs ``(file_key, other_key)`` where ``file_key`` is also a directory prefix of ``other_key``."""
    key_list = list(keys)
    key_set = set(key_list)
    collisions: list[tuple[str, str]] = []
    for key in key_list:
        cut = key.find("/")
        while cut != -1:
            if key[:cut] in key_set:
                collisions.append((key[:cut], key))
            cut = key.find("/", cut + 1)
    return collisions
