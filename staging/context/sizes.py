"""det's accounting of a file's bytes and its default limit (parsing and formatting sizes: lading.core.sizes)."""

from __future__ import annotations

#: det's MAX_CONTEXT_SIZE: the 96 MiB transport limit (128 MiB message, base64 6/8) less 1 MiB.
DET_LIMIT_BYTES = 99_614_720


def det_size(raw_bytes: int) -> int:
    """Bytes det counts for a file of ``raw_bytes``: its base64 payload, 4/3 of it, counted as 3/4.

    det sums ``len(base64) // 4 * 3`` per file, which is ``ceil(size / 3) * 3``.
    """
    return (raw_bytes + 2) // 3 * 3
