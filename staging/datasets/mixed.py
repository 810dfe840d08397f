"""MixedDataset: a deterministic weighted interleave of ShardDatasets, elastic and exact on resume.

The mixed epoch is a global sequence: positions are cut into
blocks of ``block`` positions; in each block, dataset ``d`` gets its share of the block (largest
remainder of ``block * weight_d``), placed at positions permuted with a generator seeded by
``(seed, epoch, block number)``. So the proportions hold within every block, and position ``p``'s
dataset and its draw number are computable on their own. A dataset's draws run on across mixed
epochs through its own epochs: draw ``k`` (counted from the first mixed epoch) is position
``k mod N_d`` of its epoch ``k // N_d``, in its own order (its seed and shuffle settings). A small
dataset with a large weight repeats (a new order each pass), a large one is covered over several
mixed epochs.
"""

from __future__ import annotations

import math
import random
from typing import Any, Iterator, Sequence

import numpy as np

from lading.core.errors import UsageError
from lading.datasets.iterable import IterableBase
from lading.datasets.order import check_remainder, check_slot
from lading.datasets.order.deal import Layout, worker_locals
from lading.datasets.order.walk import RankOrder
from lading.datasets.shards import ShardDataset
from lading.datasets.slots import distributed_slot


def apportion(weights: Sequence[float], seats: int) -> list[int]:
    """Largest-remainder apportionment of ``seats`` by ``weights`` (ties: lower index first)."""
    total = float(sum(weights))
    exact = [seats * weight / total for weight in weights]
    shares = [math.floor(value) for value in exact]
    order = sorted(range(len(weights)), key=lambda d: (-(exact[d] - shares[d]), d))
    for d in order[:seats - sum(shares)]:
        shares[d] += 1
    return shares


class MixOrder:
    """Which dataset each position of a mixed epoch draws from, and its draw number."""

    def __init__(self, quotas: Sequence[int], seed: int, epoch: int) -> None:
        self.quotas, self.seed, self.epoch = list(quotas), seed, epoch
        self.block = sum(quotas)
        self._blocks: dict[int, tuple[list[int], list[int]]] = {}

    def _layout(self, number: int) -> tuple[list[int], list[int]]:
        """``(dataset at offset, draws of that dataset before offset in the block)``."""
        found = self._blocks.get(number)
        if found is None:
            sources = [d for d, quota in enumerate(self.quotas) for _ in range(quota)]
            random.Random(f"lading-mix:{self.seed}:{self.epoch}:{number}").shuffle(sources)
            seen = [0] * len(self.quotas)
            before = []
            for d in sources:
                before.append(seen[d])
                seen[d] += 1
            found = (sources, before)
            if len(self._blocks) >= 4:
                self._blocks.pop(next(iter(self._blocks)))
            self._blocks[number] = found
        return found

    def source(self, position: int) -> tuple[int, int]:
        """``(dataset, draw number within this epoch)`` of ``position``."""
        number, offset = divmod(position, self.block)
        sources, before = self._layout(number)
        d = sources[offset]
        return d, number * self.quotas[d] + before[offset]

    def draws(self, positions: int) -> list[int]:
        """How many draws each dataset has in positions ``0 .. positions-1``."""
        number, offset = divmod(positions, self.block)
        counts = [number * quota for quota in self.quotas]
        if offset:
            for d in self._layout(number)[0][:offset]:
                counts[d] += 1
        return counts


class _MixEpoch:
    def __init__(self, mixed: MixedDataset, epoch: int) -> None:
        self.mixed = mixed
        self.order = MixOrder(mixed.quotas, mixed.seed, epoch)
        self.before = mixed.draws_before(epoch)
        self.readers = [child.reader() for child in mixed.datasets]
        self._orders: dict[tuple[int, int], RankOrder] = {}

    def _child_order(self, d: int, epoch: int) -> RankOrder:
        order = self._orders.get((d, epoch))
        if order is None:
            if len(self._orders) >= 2 * len(self.readers) + 2:
                self._orders.pop(next(iter(self._orders)))
            order = self._orders[(d, epoch)] = self.mixed.datasets[d].whole_epoch(epoch)
        return order

    def fetch(self, position: int) -> Any:
        d, draw = self.order.source(position)
        epoch, child_position = divmod(self.before[d] + draw, self.mixed.sizes[d])
        order = self._child_order(d, epoch)
        shards, samples, _ = order.locate(np.array([child_position], dtype=np.int64))
        shard, index = int(shards[0]), int(samples[0])
        child = self.mixed.datasets[d]
        return child.finish(self.readers[d].sample(shard, index), shard)


class MixedDataset(IterableBase):
    """A weighted, deterministic interleave of :class:`ShardDataset` s (each with an index).

    ``weights`` (default: the datasets' sizes) set the share of each dataset in every block of
    ``block`` positions; ``samples_per_epoch`` (default: the sum of the datasets' sizes) is the
    length of a mixed epoch. Each dataset keeps its own order (seed, shuffle settings), decoders
    and transform; the mix has its own ``seed``, ranks, ``batch_size`` and ``remainder``, and
    supports ``set_epoch``, ``state_dict`` and ``load_state_dict`` exactly like ShardDataset.
    """

    STATE_FORMAT = "lading-mixed-1"

    def __init__(self, datasets: Sequence[ShardDataset], weights: Sequence[float] | None = None, *, seed: int = 0,
                 samples_per_epoch: int | None = None, block: int | None = None, rank: int | None = None,
                 world_size: int | None = None, batch_size: int | None = None, remainder: str = "pad") -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise UsageError("MixedDataset needs at least one dataset")
        sizes = []
        for dataset in self.datasets:
            if not isinstance(dataset, ShardDataset) or dataset.index is None:
                raise UsageError("MixedDataset mixes ShardDatasets read through an index (NAME.index.json)")
            sizes.append(sum(dataset.index.counts))
        if 0 in sizes:
            raise UsageError("MixedDataset cannot draw from an empty dataset")
        self.sizes = sizes
        weights = list(sizes) if weights is None else [float(w) for w in weights]
        if len(weights) != len(self.datasets) or any(w < 0 or math.isnan(w) for w in weights) or sum(weights) <= 0:
            raise UsageError(f"weights={weights}: one non-negative weight per dataset, not all zero")
        self.weights = weights
        if block is None:
            smallest = min(w for w in weights if w > 0) / sum(weights)
            block = min(1 << 20, max(1000, math.ceil(100 / smallest)))
        self.quotas = apportion(weights, block)
        self.seed = seed
        self.samples_per_epoch = sum(sizes) if samples_per_epoch is None else samples_per_epoch
        if self.samples_per_epoch < 0:
            raise UsageError(f"samples_per_epoch={samples_per_epoch} must not be negative")
        default_rank, default_world = distributed_slot()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        check_slot(self.rank, self.world_size)
        if batch_size is not None and batch_size < 1:
            raise UsageError(f"batch_size={batch_size} must be positive")
        self.batch_size, self.remainder = batch_size, check_remainder(remainder)
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, positions consumed before this run)

    def draws_before(self, epoch: int) -> list[int]:
        """Draws each dataset made in the mixed epochs before ``epoch``."""
        totals = [0] * len(self.datasets)
        full = MixOrder(self.quotas, self.seed, 0)
        number, offset = divmod(self.samples_per_epoch, full.block)
        for earlier in range(epoch):
            partial = MixOrder(self.quotas, self.seed, earlier).draws(self.samples_per_epoch) if offset else None
            for d in range(len(totals)):
                totals[d] += partial[d] if partial is not None else number * self.quotas[d]
        return totals

    def _total(self) -> int:
        return self.samples_per_epoch

    def _deal(self) -> tuple[int, int]:
        """``(start, count)``: positions consumed before this run, and this rank's samples."""
        start = self._resume[1] if self._resume is not None and self._resume[0] == self.epoch else 0
        left = max(0, self.samples_per_epoch - start)
        if self.remainder == "pad":
            return start, -(-left // self.world_size)
        if self.remainder == "drop":
            return start, left // self.world_size
        return start, max(0, -(-(left - self.rank) // self.world_size))

    def __len__(self) -> int:
        """Samples this rank yields in the current epoch (from the resume point, after a resume)."""
        return self._deal()[1]

    def iter_worker(self, worker: int, num_workers: int) -> Iterator[Any]:
        """The rank's batches ``worker``, ``worker + num_workers``, ... (each ``batch_size`` samples):
        rank ``r`` of ``W`` takes positions ``start + r``, ``start + W + r``, ... of the mixed epoch."""
        start, count = self._deal()
        plan = _MixEpoch(self, self.epoch)
        total = self.samples_per_epoch
        for local in worker_locals(count, self.batch_size or 1, worker, num_workers).tolist():
            position = start + local * self.world_size + self.rank
            yield plan.fetch(position if position < total else position % total)

    def state_dict(self, samples_seen: int) -> dict[str, Any]:
        """A small JSON-able state: save it with the checkpoint, on any rank (they agree)."""
        start, count = self._deal()
        if not 0 <= samples_seen <= count:
            raise UsageError(f"samples_seen={samples_seen}: this rank has {count} samples in epoch {self.epoch}")
        consumed = min(self.samples_per_epoch, start + samples_seen * self.world_size)
        return {"format": self.STATE_FORMAT, "epoch": self.epoch, "consumed": consumed,
                "total": self.samples_per_epoch, **self._identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved epoch where it stopped (any world size, workers, batch size)."""
        if not isinstance(state, dict) or state.get("format") != self.STATE_FORMAT:
            raise UsageError(f"not a MixedDataset state (format {self.STATE_FORMAT!r} expected)")
        mine = {**self._identity(), "total": self.samples_per_epoch}
        differing = sorted(key for key, value in mine.items() if state.get(key) != value)
        if differing:
            shown = ", ".join(f"{key}: saved {state.get(key)!r}, now {mine[key]!r}" for key in differing)
            raise UsageError(f"the saved state is for another dataset or order ({shown})",
                             "resume with the same datasets, weights and seeds as the saved run")
        consumed = int(state["consumed"])
        if not 0 <= consumed <= self.samples_per_epoch:
            raise UsageError(f"the saved state's consumed={consumed} is outside 0..{self.samples_per_epoch}")
        self.epoch = int(state["epoch"])
        self._resume = (self.epoch, consumed)

    def _identity(self) -> dict[str, Any]:
        return {"datasets": [dataset._identity() for dataset in self.datasets], "quotas": self.quotas,
                "seed": self.seed}

    def proportions(self) -> list[float]:
        """Each dataset's share of a block (what the weights became)."""
        return [quota / sum(self.quotas) for quota in self.quotas]

