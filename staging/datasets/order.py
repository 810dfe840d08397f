"""The order of an epoch, and who reads which part of it: the rule behind exact, elastic resume.

1. **One global sequence per epoch**, a pure function of the index (samples per shard), the seed
   and the epoch, never of ranks or workers. Shards are taken in index order, or in a seeded
   random order (``randomize_shard_order``); their samples, concatenated, are cut into windows
   of ``shuffle_buffer`` consecutive samples and each window is permuted with a generator seeded
   by ``(seed, epoch, window number)``. Position ``p`` of the epoch is computable on its own.
2. **Positions are dealt round-robin**: resuming from ``start`` consumed positions, rank ``r`` of
   ``W`` takes positions ``start + r``, ``start + W + r``, ``start + 2W + r``, ... After every rank
   has consumed ``n`` samples, exactly positions ``0 .. start + n*W - 1`` are consumed, whatever
   ``W`` was.
3. **Workers take whole batches**: the rank's samples are cut into batches of ``batch_size`` and
   DataLoader worker ``w`` of ``k`` yields batches ``w, w+k, w+2k, ...``, the order in which
   DataLoader collects them, so the samples the loop has consumed are always a prefix.
4. **Equal counts**: the ``N - start`` remaining positions give each rank ``ceil((N-start)/W)``
   samples with ``remainder="pad"`` (positions past the end wrap to the start of the epoch's
   sequence, as DistributedSampler pads), ``floor`` with ``"drop"`` (the last ``(N-start) % W``
   positions are skipped), or ``"uneven"``: every position once, the first ranks one more.
"""

from __future__ import annotations

import itertools
import math
import random
from bisect import bisect_right
from dataclasses import dataclass
from typing import Iterator, Sequence

from lading.core.errors import UsageError

REMAINDERS = ("pad", "drop", "uneven")


class EpochOrder:
    """The global sequence of one epoch: position -> (shard number in the index, sample in shard)."""

    def __init__(self, counts: Sequence[int], seed: int, epoch: int, shuffle_shards: bool, window: int) -> None:
        self.counts = counts
        self.total = sum(counts)
        order = list(range(len(counts)))
        if shuffle_shards:
            random.Random(f"lading-shards:{seed}:{epoch}").shuffle(order)
        self.shard_order = order
        #: where each shard (in epoch order) starts in the concatenated sequence
        self.starts = list(itertools.accumulate((counts[s] for s in order), initial=0))
        #: each shard's place in the epoch's shard order
        self.slot = {shard: slot for slot, shard in enumerate(order)}
        self.seed, self.epoch = seed, epoch
        self.window = max(1, window)
        self._windows: dict[int, list[int]] = {}

    def _permutation(self, number: int) -> list[int]:
        perm = self._windows.get(number)
        if perm is None:
            size = min(self.window, self.total - number * self.window)
            perm = list(range(size))
            random.Random(f"lading-window:{self.seed}:{self.epoch}:{number}").shuffle(perm)
            if len(self._windows) >= 4:
                self._windows.pop(next(iter(self._windows)))
            self._windows[number] = perm
        return perm

    def concatenated(self, position: int) -> int:
        """Where position ``position`` lands in the shards concatenated in epoch order."""
        if self.window <= 1:
            return position
        number, offset = divmod(position, self.window)
        return number * self.window + self._permutation(number)[offset]

    def locate(self, position: int) -> tuple[int, int]:
        """``(shard, sample)``: the shard's number in the index and the sample's number in it."""
        spot = self.concatenated(position)
        slot = bisect_right(self.starts, spot) - 1
        return self.shard_order[slot], spot - self.starts[slot]

    def first_slot(self, position: int) -> int:
        """The slot (in the epoch's shard order) of the first shard ``position``'s window touches:
        shards in earlier slots are done with, for positions from here on."""
        return max(0, bisect_right(self.starts, (position // self.window) * self.window) - 1)

    def shards_from(self, position: int) -> list[int]:
        """Shards (index numbers) in the order the epoch reaches them, from ``position`` on."""
        return self.shard_order[self.first_slot(position):]

    def shards_per_window(self) -> int:
        """At most how many shards one window touches (a bound for how many to keep open)."""
        smallest = min((count for count in self.counts if count), default=1)
        return 1 + math.ceil(self.window / smallest)


@dataclass(frozen=True)
class Deal:
    """Rank ``rank`` of ``world_size``'s share of positions ``start .. total-1`` (see module doc)."""

    total: int
    start: int
    world_size: int
    rank: int
    remainder: str = "pad"

    @property
    def count(self) -> int:
        """Samples this rank yields in this run of the epoch."""
        left = max(0, self.total - self.start)
        if self.remainder == "pad":
            return -(-left // self.world_size)
        if self.remainder == "drop":
            return left // self.world_size
        return max(0, -(-(left - self.rank) // self.world_size))

    def position(self, local: int) -> int:
        """The epoch position of this rank's ``local``-th sample (padding wraps to the start)."""
        position = self.start + local * self.world_size + self.rank
        return position if position < self.total else position % self.total


def worker_batches(count: int, batch_size: int, worker: int, num_workers: int) -> Iterator[range]:
    """The local sample ranges of the batches worker ``worker`` of ``num_workers`` yields."""
    batch = worker
    while batch * batch_size < count:
        yield range(batch * batch_size, min((batch + 1) * batch_size, count))
        batch += num_workers


def check_remainder(remainder: str) -> str:
    """Refuse an unknown ``remainder=``."""
    if remainder not in REMAINDERS:
        raise UsageError(f"remainder={remainder!r} is not one of {', '.join(REMAINDERS)}")
    return remainder


def check_slot(rank: int, world_size: int) -> None:
    """Refuse a rank outside the world."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in 0..{world_size - 1}")
