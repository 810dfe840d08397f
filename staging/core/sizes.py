"""Byte sizes as people write them: ``"95MiB"``, ``"256KB"``, and back to text."""

from __future__ import annotations

import re

from lading.core.errors import UsageError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse ``"95MiB"``, ``"96MB"``, ``"100 MiB"``, ``"1.5GiB"`` or plain bytes into whole bytes.

    Raises UsageError for anything else, including zero, negative values and the ambiguous
    bare ``K``/``M``/``G``.
    """
    match = _SIZE.match(text)
    unit = match.group("unit").lower() if match else ""
    if not match or unit not in _UNITS:
        hint = (
            "use MiB (1,048,576 bytes) or MB (1,000,000 bytes)"
            if unit in ("k", "m", "g", "t")
            else "plain bytes or a number with B, KB, MB, GB, KiB, MiB or GiB, e.g. 95MiB"
        )
        raise UsageError(f"invalid size {text!r}", hint=hint)
    whole, _, fraction = match.group("number").partition(".")
    value = int((whole or "0") + fraction) * _UNITS[unit] // 10 ** len(fraction)  # exact, rounded down
    if value <= 0:
        raise UsageError(f"invalid size {text!r}: must be at least 1 byte")
    return value


def format_size(n_bytes: int) -> str:
    """Human size with binary units: ``"95.0 MiB"``, ``"812 B"``; negative values keep their sign."""
    sign = "-" if n_bytes < 0 else ""
    value = float(abs(n_bytes))
    if value < 1024:
        return f"{sign}{int(value)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{sign}{value:.1f} {unit}"
    raise AssertionError("unreachable")
