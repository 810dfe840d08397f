"""Shuffle: lanes fixed for the run, and each lane's order in an epoch.

- **Lanes.** The run's shard order (index order, or with ``randomize_shard_order`` an order seeded
  by ``seed`` alone) concatenates every shard's samples; lane ``l`` of ``L`` holds samples
  ``[l*T//L, (l+1)*T//L)`` of it. Only shards at lane edges are split. ``L`` is chosen from the
  data (:func:`choose_lanes`) and recorded in the resume state, so it is fixed for the run.
- **A lane's order in an epoch** (:class:`LaneOrder`): its shard pieces in an order permuted per
  ``(seed, epoch, lane)`` (a piece of a shard split with the previous or next lane stays first or
  last, next to its other part: lanes are visited in run order from a start drawn per epoch, so a
  split shard is read once per epoch however small the node cache), their samples concatenated,
  and each sample given a key: its position moved by a random offset of about half the shuffle
  window (MosaicML's ``py1e``: a piece of ``n`` samples spreads over about one window,
  ``(w - n) / 2`` each way and at least ``w / 4``). The lane's order is its samples by key. Keys
  reach past the lane's ends, so that a node's sequence can merge neighbouring lanes by key
  (:mod:`.walk`: a window at a lane's edge draws on both lanes, as py1e's does anywhere), except
  at the ends of a node's sequence on the run's first layout (:func:`home_edges`), where the
  spread is bounded as py1e bounds it at a node's ends.
  A sample therefore stays within ``w/2`` positions of its shard's place, so reading a node's
  sequence needs about one window of shards at a time: the bounded working set.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.random import default_rng  # imported here, not lazily inside an epoch's first iteration

#: Lane counts are divisors of this (2^8 * 3^2 * 5 * 7): every node count up to 10, and
#: 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 96, 128, 192, 256 among others, divide some of them.
LANE_BASE = 80640
#: The node counts jobs run with, most common first: lane counts are scored by how many divide them.
COMMON_NODE_COUNTS = (
    1,
    2,
    4,
    8,
    16,
    32,
    64,
    3,
    6,
    12,
    24,
    48,
    96,
    128,
    256,
    5,
    10,
    20,
    40,
    80,
    160,
    7,
    14,
    28,
    56,
    112,
    192,
    224,
)


def _divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


@lru_cache(maxsize=64)
def choose_lanes(total: int, block_samples: int, nodes: int) -> int:
    """The run's lane count: a multiple of ``nodes`` (the run's first node count) with lanes of at
    least ``block_samples`` samples, dividing as many common node counts as possible (ties: more
    lanes). When a node's share is smaller than one block, one lane per node."""
    most = max(1, total // max(1, block_samples))
    if most < nodes:
        return max(1, nodes)
    options = [nodes * d for d in _divisors(LANE_BASE) if nodes * d <= most]
    return max(options, key=lambda lanes: (sum(lanes % n == 0 for n in COMMON_NODE_COUNTS), lanes))


def _rng(*words: int | str) -> np.random.Generator:
    text = ":".join(str(word) for word in words)
    return default_rng(np.frombuffer(text.encode(), dtype=np.uint8).astype(np.uint32))


class Lanes:
    """The run's lanes over samples per shard ``counts`` (see the module docstring)."""

    def __init__(self, counts: np.ndarray, seed: int, randomize_shard_order: bool, count: int) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        order = np.arange(len(counts), dtype=np.int64)
        if randomize_shard_order:
            order = _rng("lading-run", seed).permutation(len(counts))
        self.counts, self.order, self.count = counts, order, max(1, count)
        self.starts = np.concatenate(([0], np.cumsum(counts[order])))
        self.total = int(self.starts[-1])

    def bounds(self, lane: int) -> tuple[int, int]:
        """Lane ``lane``'s samples in the run's concatenation: ``[start, end)``."""
        return lane * self.total // self.count, (lane + 1) * self.total // self.count

    def sizes(self) -> np.ndarray:
        """Samples in every lane."""
        edges = np.arange(self.count + 1, dtype=np.int64) * self.total // self.count
        return np.diff(edges)

    def pieces(self, lane: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(shard, first sample, length)`` of the shard pieces lane ``lane`` holds, in run order."""
        start, end = self.bounds(lane)
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        last = int(np.searchsorted(self.starts, end, side="left"))
        slots = np.arange(max(first, 0), max(last, 0))
        low = np.maximum(self.starts[slots], start)
        high = np.minimum(self.starts[slots + 1], end)
        keep = high > low
        slots, low, high = slots[keep], low[keep], high[keep]
        return self.order[slots], low - self.starts[slots], high - low


def _pinned_permutation(rng: np.random.Generator, count: int, keep_first: bool, keep_last: bool) -> np.ndarray:
    """A permutation of ``count`` pieces that leaves a lane's edge pieces at its edges when they are
    parts of a shard split with the neighbouring lane (read next to that lane's part, so once)."""
    low, high = int(keep_first), count - int(keep_last)
    middle = low + rng.permutation(max(0, high - low))
    return np.concatenate((np.arange(low), middle, np.arange(high, count))).astype(np.int64)


def visit_start(seed: int, epoch: int, lanes: int, shuffle: bool) -> int:
    """The lane an epoch's visit starts at (lanes are visited in run order from it, cyclically)."""
    return int(_rng("lading-lanes", seed, epoch).integers(lanes)) if shuffle else 0


def _spread(
    starts: np.ndarray, length: np.ndarray, size: int, window: int, edges: tuple[bool, bool]
) -> tuple[np.ndarray, np.ndarray]:
    """How far each piece's samples may move, ``[low, high]``: a piece of ``n`` samples spreads
    over about one window (``(window - n) / 2`` each way, at least a quarter window); at a lane end
    that ``edges`` marks as a node sequence's end, shifted so that keys stay inside the lane
    (MosaicML's py1e bounds, so the first and last positions mix every piece within reach
    instead of the edge pieces alone)."""
    reach = np.maximum((window - length) / 2, window / 4)
    low, high = -reach, reach
    if edges[0]:
        low = np.maximum(low, -starts[:-1])
    if edges[1]:
        high = np.minimum(high, size - starts[1:])
    return low, high


class LaneOrder:
    """Lane ``lane``'s samples in epoch ``epoch``: ``shard[j]``, ``sample[j]`` for lane position ``j``;
    ``last[j]``: the last lane position of the shard at ``j`` (when this lane is done with it);
    ``key[j]``: its key (non-decreasing, within ``window / 2`` of ``j``). ``edges``: whether the
    lane starts / ends a node's sequence (its spread is bounded there)."""

    def __init__(
        self, lanes: Lanes, lane: int, seed: int, epoch: int, shuffle: bool, window: int, edges: tuple[bool, bool]
    ) -> None:
        shards, first, length = lanes.pieces(lane)
        rng = _rng("lading-lane", seed, epoch, lane)
        if shuffle and len(shards) > 1:
            perm = _pinned_permutation(
                rng, len(shards), first[0] > 0, first[-1] + length[-1] < lanes.counts[shards[-1]]
            )
            shards, first, length = shards[perm], first[perm], length[perm]
        size = int(length.sum())
        piece = np.repeat(np.arange(len(shards), dtype=np.int32), length)
        starts = np.concatenate(([0], np.cumsum(length)))
        within = np.arange(size, dtype=np.int64) - starts[piece] + first[piece]
        if window > 1 and size > 1:
            low, high = _spread(starts, length, size, window, edges)
            keys = np.arange(size, dtype=np.float64)
            keys += low[piece] + (high - low)[piece] * rng.uniform(0, 1, size)
            perm = np.argsort(keys, kind="stable")
            piece, within, self.key = piece[perm], within[perm], keys[perm]
        else:
            self.key = np.arange(size, dtype=np.float64)
        self.shard = shards[piece].astype(np.int32)
        self.sample = within.astype(np.int32)
        last_of_piece = np.zeros(len(shards), dtype=np.int64)
        np.maximum.at(last_of_piece, piece, np.arange(size))
        self.last = last_of_piece[piece].astype(np.int32)
        self.size = size
