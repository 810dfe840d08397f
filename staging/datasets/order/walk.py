"""One rank's (or one DataLoader worker's) walk through its node's sequence: sample locations in
order, with when each shard is done with (release) and which shards come next (prefetch).

A node's sequence is its pieces (stretches of lane orders, :mod:`.deal`) *merged by key*: the
sample at lane position ``q`` of a piece that starts at lane position ``s`` and at offset ``C``
of the pieces' concatenation has the node key ``C + key[q] - s`` (``key``: its lane's keys,
:class:`~lading.datasets.order.lanes.LaneOrder`), and the node's sequence is its samples by
(node key, place in the concatenation). A piece keeps its own order in the merge, so what a node
delivered is a prefix of each of its pieces (the resume state stays per-lane ranges), and near
the junction of two lanes a window of the sequence draws on both (py1e's spread across
neighbouring blocks). A key is within ``R = window / 2`` of the place, so a sample's node
position is within ``2R`` of its place in the concatenation: only pieces that close interleave,
and a position is located from the few pieces around it, never from the whole sequence.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from lading.datasets.order.deal import NodeSequences, home_edges
from lading.datasets.order.lanes import LaneOrder, Lanes, visit_start

#: Locations are computed this many samples at a time (arrays, not per-sample objects).
CHUNK = 1024
#: A node's sequence is merged this many positions at a time (a few such segments kept).
SEGMENT = 1 << 16


@dataclass(frozen=True)
class Shuffle:
    """How an epoch's lanes are ordered: ``shuffle`` permutes pieces and lanes, ``window`` spreads
    samples; ``homes``: the run's first node count (where a node's sequence starts and ends)."""

    seed: int
    epoch: int
    shuffle: bool
    window: int
    homes: int

    @property
    def reach(self) -> float:
        """A bound on how far a sample's key is from its place (0: no spread)."""
        return self.window / 2 + 1 if self.window > 1 else 0.0


class LaneOrders:
    """The lane orders of one epoch, computed when first needed (a few kept)."""

    def __init__(self, lanes: Lanes, shuffle: Shuffle, keep: int = 4) -> None:
        self.lanes, self.shuffle, self.keep = lanes, shuffle, keep
        self._orders: OrderedDict[int, LaneOrder] = OrderedDict()
        self._edges: tuple[np.ndarray, np.ndarray] | None = None

    def get(self, lane: int) -> LaneOrder:
        """Lane ``lane``'s order this epoch."""
        order = self._orders.get(lane)
        if order is not None:
            self._orders.move_to_end(lane)
            return order
        s = self.shuffle
        if self._edges is None:
            start = visit_start(s.seed, s.epoch, self.lanes.count, s.shuffle)
            self._edges = home_edges(self.lanes.count, s.homes, start)
        edges = (bool(self._edges[0][lane]), bool(self._edges[1][lane]))
        order = LaneOrder(self.lanes, lane, s.seed, s.epoch, s.shuffle, s.window, edges)
        self._orders[lane] = order
        if len(self._orders) > self.keep:
            self._orders.popitem(last=False)
        return order


class NodeOrder:
    """One group's pieces merged by key (module docstring): node position <-> (piece, lane position)."""

    def __init__(self, pieces: np.ndarray, orders: LaneOrders) -> None:
        self.pieces, self.orders = pieces.reshape(-1, 3), orders
        self.lengths = self.pieces[:, 2] - self.pieces[:, 1]
        self.starts = np.concatenate(([0], np.cumsum(self.lengths))).astype(np.int64)
        self.size = int(self.starts[-1])
        self.reach = orders.shuffle.reach
        self._segments: OrderedDict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
        # pieces whose keys may interleave: concatenation ranges within 2R of each other
        margin = 2 * self.reach
        low, high = self.starts[:-1] - margin, self.starts[1:] + margin
        self.neighbours = [
            np.flatnonzero((self.starts[:-1] <= high[i]) & (self.starts[1:] >= low[i]) & (np.arange(len(low)) != i))
            for i in range(len(low))
        ]

    def _keys(self, piece: int) -> tuple[np.ndarray, float]:
        """Piece ``piece``'s lane keys (a view) and the shift to node keys."""
        lane, start, end = (int(v) for v in self.pieces[piece])
        return self.orders.get(lane).key[start:end], float(self.starts[piece] - start)

    def rank(self, piece: int, q: np.ndarray) -> np.ndarray:
        """Node positions of lane positions ``q`` (ascending) of piece ``piece``."""
        lane, start, _ = (int(v) for v in self.pieces[piece])
        ranks = self.starts[piece] + (q - start)
        if not len(q) or not self.reach:
            return ranks
        x = self.orders.get(lane).key[q] + float(self.starts[piece] - start)
        lowest, highest = float(x[0]), float(x[-1])
        for other in self.neighbours[piece].tolist():
            if other > piece:  # its samples with a smaller key come before
                if highest < self.starts[other] - self.reach:
                    continue
                keys, shift = self._keys(other)
                ranks = ranks + np.searchsorted(keys, x - shift, side="left")
            else:  # its samples with a larger key come after
                if lowest > self.starts[other + 1] + self.reach:
                    continue
                keys, shift = self._keys(other)
                ranks = ranks - (len(keys) - np.searchsorted(keys, x - shift, side="right"))
        return ranks

    def first_at(self, piece: int, target: int) -> int:
        """The first lane position of piece ``piece`` whose node position is ``target`` or more."""
        lane, start, end = (int(v) for v in self.pieces[piece])
        offset = int(self.starts[piece]) - start
        margin = int(np.ceil(2 * self.reach)) + 1
        low, high = max(start, target - margin - offset), min(end, target + margin - offset + 1)
        if low >= high:
            return end if low >= end else start
        if high - low >= 2:  # first try the place in the concatenation: exact where no other piece is near
            guess = min(max(target - offset, low + 1), high - 1)
            below, at = self.rank(piece, np.array([guess - 1, guess]))
            if below < target <= at:
                return guess
            low, high = (guess + 1, high) if at < target else (low, guess - 1)
        while low < high:  # the rank grows with q
            middle = (low + high) // 2
            if self.rank(piece, np.array([middle]))[0] < target:
                low = middle + 1
            else:
                high = middle
        return low

    def prefix(self, count: int) -> list[int]:
        """Per piece, how many of its samples are among the first ``count`` node positions."""
        margin = 2 * self.reach
        taken = []
        for piece in range(len(self.lengths)):
            begin, end = int(self.starts[piece]), int(self.starts[piece + 1])
            if end - 1 + margin < count:
                taken.append(end - begin)
            elif begin - margin >= count:
                taken.append(0)
            else:
                taken.append(self.first_at(piece, count) - int(self.pieces[piece, 1]))
        return taken

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(shard, sample, done_after)`` for node positions; ``done_after``: the node position
        after which this walk needs that shard no more within its piece."""
        number, offset = np.divmod(positions, SEGMENT)
        if len(positions) and number.min() == number.max():  # the usual case: one segment
            table = self._segment(int(number[0]))
            return (table[0][offset].astype(np.int64), table[1][offset].astype(np.int64), table[2][offset])
        shard = np.empty(len(positions), dtype=np.int64)
        sample = np.empty(len(positions), dtype=np.int64)
        done = np.empty(len(positions), dtype=np.int64)
        for value in np.unique(number).tolist():
            mask = number == value
            table = self._segment(value)
            where = offset[mask]
            shard[mask], sample[mask], done[mask] = table[0][where], table[1][where], table[2][where]
        return shard, sample, done

    def _segment(self, number: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Shard, sample and done_after of node positions ``[number * SEGMENT, (number + 1) * SEGMENT)``
        (a few kept)."""
        found = self._segments.get(number)
        if found is not None:
            return found
        low = number * SEGMENT
        high = min(self.size, low + SEGMENT)
        shard = np.zeros(high - low, dtype=np.int32)
        sample = np.zeros(high - low, dtype=np.int32)
        done = np.zeros(high - low, dtype=np.int64)
        margin = 2 * self.reach
        near = np.flatnonzero((self.starts[:-1] - margin < high) & (self.starts[1:] + margin > low))
        for piece in near.tolist():
            first, last = self.first_at(piece, low), self.first_at(piece, high)
            if first >= last:
                continue
            lane, _, end = (int(v) for v in self.pieces[piece])
            order = self.orders.get(lane)
            q = np.arange(first, last, dtype=np.int64)
            at = self.rank(piece, q) - low
            shard[at], sample[at] = order.shard[q], order.sample[q]
            done[at] = self.rank(piece, np.minimum(order.last[q].astype(np.int64), end - 1))
        found = (shard, sample, done)
        self._segments[number] = found
        if len(self._segments) > 2:
            self._segments.popitem(last=False)
        return found


class RankOrder:
    """The samples of local rank ``me`` of group ``group`` in one epoch."""

    def __init__(self, lanes: Lanes, sequences: NodeSequences, group: int, me: int, shuffle: Shuffle) -> None:
        self.lanes, self.shuffle = lanes, shuffle
        pieces = sequences.pieces[group]
        real = sequences.real[group]
        self.count = sequences.count(group, me) if real or sequences.per_rank else 0
        if real == 0:  # nothing of its own (more ranks than samples): pad from the first group with any
            donor = next((g for g, length in enumerate(sequences.real) if length), group)
            pieces, real = sequences.pieces[donor], sequences.real[donor]
        self.node = NodeOrder(np.array(pieces, dtype=np.int64), LaneOrders(lanes, shuffle))
        self.real, self.ranks, self.me = real, sequences.ranks, me

    def node_positions(self, locals_: np.ndarray) -> np.ndarray:
        """Node-sequence positions of rank-local sample numbers (padding wraps to the start)."""
        positions = locals_ * self.ranks + self.me
        return np.where(positions < self.real, positions, positions % max(1, self.real))

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(shard, sample, done_after)`` for node positions (see :meth:`NodeOrder.locate`)."""
        return self.node.locate(positions)

    def locations(self, locals_: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """``(node positions, shard, sample, done_after)`` for rank-local numbers, ``CHUNK`` at a time."""
        for begin in range(0, len(locals_), CHUNK):
            positions = self.node_positions(locals_[begin : begin + CHUNK])
            yield (positions, *self.locate(positions))


def delivered(lanes: Lanes, sequences: NodeSequences, shuffle: Shuffle, counts: list[int]) -> list[list[int]]:
    """Per group, how many samples of each of its pieces its first ``counts[group]`` positions hold."""
    orders = LaneOrders(lanes, shuffle)
    found = []
    for pieces, count in zip(sequences.pieces, counts):
        if count <= 0 or not pieces:
            found.append([0] * len(pieces))
        elif count >= sum(end - start for _, start, end in pieces):
            found.append([end - start for _, start, end in pieces])
        else:
            found.append(NodeOrder(np.array(pieces, dtype=np.int64), orders).prefix(count))
    return found
