"""One rank's (or one DataLoader worker's) walk through its node's sequence: sample locations in
order, with when each shard is done with (release) and which shards come next (prefetch)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from lading.datasets.order.deal import NodeSequences
from lading.datasets.order.lanes import LaneOrder, Lanes

#: Locations are computed this many samples at a time (arrays, not per-sample objects).
CHUNK = 1024


@dataclass(frozen=True)
class Shuffle:
    """How an epoch's lanes are ordered: ``shuffle`` permutes pieces and lanes, ``window`` spreads samples."""

    seed: int
    epoch: int
    shuffle: bool
    window: int


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
        self.pieces = np.array(pieces, dtype=np.int64).reshape(-1, 3)
        self.starts = np.concatenate(([0], np.cumsum(self.pieces[:, 2] - self.pieces[:, 1])))
        self.real, self.ranks, self.me = real, sequences.ranks, me
        self._orders: OrderedDict[int, LaneOrder] = OrderedDict()

    def lane_order(self, lane: int) -> LaneOrder:
        """Lane ``lane``'s order this epoch (a few kept)."""
        order = self._orders.get(lane)
        if order is None:
            shuffle = self.shuffle
            order = LaneOrder(self.lanes, lane, shuffle.seed, shuffle.epoch, shuffle.shuffle, shuffle.window)
            self._orders[lane] = order
            if len(self._orders) > 4:
                self._orders.popitem(last=False)
        else:
            self._orders.move_to_end(lane)
        return order

    def node_positions(self, locals_: np.ndarray) -> np.ndarray:
        """Node-sequence positions of rank-local sample numbers (padding wraps to the start)."""
        positions = locals_ * self.ranks + self.me
        return np.where(positions < self.real, positions, positions % max(1, self.real))

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(shard, sample, done_after)`` for node positions; ``done_after``: the node position
        after which this walk needs that shard no more within its piece."""
        piece = np.searchsorted(self.starts, positions, side="right") - 1
        lane = self.pieces[piece, 0]
        offset = positions - self.starts[piece]
        lane_pos = self.pieces[piece, 1] + offset
        shard = np.empty(len(positions), dtype=np.int64)
        sample = np.empty(len(positions), dtype=np.int64)
        done = np.empty(len(positions), dtype=np.int64)
        for value in np.unique(lane).tolist():
            mask = lane == value
            order = self.lane_order(value)
            where = lane_pos[mask]
            shard[mask], sample[mask] = order.shard[where], order.sample[where]
            piece_end = self.pieces[piece[mask], 2]
            last = np.minimum(order.last[where], piece_end - 1)
            done[mask] = self.starts[piece[mask]] + (last - self.pieces[piece[mask], 1])
        return shard, sample, done

    def locations(self, locals_: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """``(node positions, shard, sample, done_after)`` for rank-local numbers, ``CHUNK`` at a time."""
        for begin in range(0, len(locals_), CHUNK):
            positions = self.node_positions(locals_[begin : begin + CHUNK])
            yield (positions, *self.locate(positions))
