"""What is left of an epoch: per lane, the ranges of its epoch order not yet delivered.

The resume state is this plus the epoch and the run's lane layout. It is exact whatever the
layout did: a node's delivered prefix maps back to lane ranges (:meth:`Remaining.take`), and a
resumed run deals exactly the ranges left. Encoded for JSON in a few KB: a bitmap of the lanes
still whole, and the ranges of the few lanes partly delivered (lanes in neither are done).
"""

from __future__ import annotations

import base64
from typing import Any, Iterable, Sequence

import numpy as np

from lading.core.errors import UsageError

Range = tuple[int, int]
#: a stretch of one lane's epoch order: (lane, start, end)
Piece = tuple[int, int, int]


class Remaining:
    """Per lane, the sorted ranges ``[start, end)`` of its epoch order still to deliver."""

    def __init__(self, ranges: list[list[Range]]) -> None:
        self.ranges = ranges

    @classmethod
    def full(cls, sizes: Sequence[int]) -> Remaining:
        """Nothing delivered yet."""
        return cls([[(0, int(size))] if size else [] for size in sizes])

    def copy(self) -> Remaining:
        """An independent copy."""
        return Remaining([list(ranges) for ranges in self.ranges])

    def total(self) -> int:
        """Samples left."""
        return sum(end - start for ranges in self.ranges for start, end in ranges)

    def pieces(self, lane: int) -> list[Piece]:
        """Lane ``lane``'s remaining ranges as pieces."""
        return [(lane, start, end) for start, end in self.ranges[lane]]

    def take(self, pieces: Iterable[Piece], counts: Iterable[int]) -> None:
        """Mark the first ``counts[i]`` samples of each piece ``pieces[i]`` delivered (what a node's
        merged sequence delivered: a prefix of each of its pieces)."""
        for (lane, start, end), count in zip(pieces, counts):
            if count > 0:
                self._remove(lane, start, min(end, start + count))

    def _remove(self, lane: int, start: int, stop: int) -> None:
        kept: list[Range] = []
        for low, high in self.ranges[lane]:
            if high <= start or low >= stop:
                kept.append((low, high))
                continue
            if low < start:
                kept.append((low, start))
            if high > stop:
                kept.append((stop, high))
        self.ranges[lane] = kept

    def encode(self, sizes: Sequence[int]) -> dict[str, Any]:
        """JSON-able: ``{"whole": base64 bitmap, "partial": [[lane, start, end, ...], ...]}``."""
        whole = np.zeros(len(sizes), dtype=bool)
        partial = []
        for lane, ranges in enumerate(self.ranges):
            if ranges == [(0, int(sizes[lane]))] and sizes[lane]:
                whole[lane] = True
            elif ranges:
                partial.append([lane, *[bound for pair in ranges for bound in pair]])
        bitmap = base64.b64encode(np.packbits(whole).tobytes()).decode()
        return {"whole": bitmap, "partial": partial}

    @classmethod
    def decode(cls, encoded: Any, sizes: Sequence[int]) -> Remaining:
        """The inverse of :meth:`encode`, checked against the lanes' sizes."""
        try:
            bits = np.unpackbits(np.frombuffer(base64.b64decode(encoded["whole"]), dtype=np.uint8))
            ranges: list[list[Range]] = [
                [(0, int(size))] if bits[lane] and size else [] for lane, size in enumerate(sizes)
            ]
            for lane, *bounds in encoded["partial"]:
                pairs = [(int(bounds[i]), int(bounds[i + 1])) for i in range(0, len(bounds), 2)]
                if any(not 0 <= low < high <= sizes[lane] for low, high in pairs):
                    raise ValueError(lane)
                ranges[int(lane)] = sorted(pairs)
        except (KeyError, TypeError, ValueError, IndexError):
            raise UsageError("the saved state's remaining samples are not readable for this dataset") from None
        return cls(ranges)
