"""MixedDataset: a deterministic weighted interleave of ShardDatasets, node-local, streaming and
exact on resume across node counts.

- **The mix pattern.** A node's mixed sequence is cut into blocks of ``block`` positions; in each
  block dataset ``d`` gets its share (largest remainder of ``block * weight_d``), placed at
  positions permuted per ``(seed, epoch, block number)``. Every node uses the same pattern, so
  every node draws from each dataset at the same rate.
- **Each dataset's draws on a node** come from that dataset's own epoch order dealt over nodes
  (:mod:`lading.datasets.order`: its lanes, blocks and shuffle, each node one share): what is left
  of its current pass, then whole passes (each a new epoch of the dataset). So every dataset keeps
  node locality and its bounded working set; a pass gives each node the same number of draws,
  repeating at most ``nodes - 1`` of its samples to balance them.
- **Ranks and workers** deal the node's mixed positions as ShardDataset does (``t*R + r``, whole
  batches to workers); every rank gets ``ceil`` (``remainder="pad"``) or ``floor`` (``"drop"``)
  of the mixed samples left over the world size.
- **The resume state** is the mixed epoch, the mixed samples left, and for each dataset its pass
  and what is left of it, lane by lane: a resume onto any node, rank or worker count continues
  every dataset exactly where it stopped (no sample of a pass drawn twice, none skipped).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from lading.core.errors import UsageError
from lading.datasets.iterable import IterableBase
from lading.datasets.order import EpochOrder
from lading.datasets.order.deal import Layout, worker_locals
from lading.datasets.order.engine import resolve_layout
from lading.datasets.order.state import Remaining
from lading.datasets.order.walk import RankOrder
from lading.datasets.shards import RELEASE_EVERY, ShardDataset

STATE_FORMAT = "lading-mixed-3"


def apportion(weights: Sequence[float], seats: int) -> list[int]:
    """Largest-remainder apportionment of ``seats`` by ``weights`` (ties: lower index first)."""
    total = float(sum(weights))
    exact = [seats * weight / total for weight in weights]
    shares = [math.floor(value) for value in exact]
    order = sorted(range(len(weights)), key=lambda d: (-(exact[d] - shares[d]), d))
    for d in order[: seats - sum(shares)]:
        shares[d] += 1
    return shares


class MixOrder:
    """Which dataset each position of a node's mixed sequence draws from, and its draw number."""

    def __init__(self, quotas: Sequence[int], seed: int, epoch: int, segment: int = 0) -> None:
        self.quotas, self.seed, self.epoch, self.segment = list(quotas), seed, epoch, segment
        self.block = sum(quotas)
        self._blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _layout(self, number: int) -> tuple[np.ndarray, np.ndarray]:
        """``(dataset at offset, draws of that dataset before offset in the block)``."""
        found = self._blocks.get(number)
        if found is None:
            sources = [d for d, quota in enumerate(self.quotas) for _ in range(quota)]
            random.Random(f"lading-mix:{self.seed}:{self.epoch}:{self.segment}:{number}").shuffle(sources)
            seen = [0] * len(self.quotas)
            before = []
            for d in sources:
                before.append(seen[d])
                seen[d] += 1
            found = (np.array(sources, dtype=np.int64), np.array(before, dtype=np.int64))
            if len(self._blocks) >= 4:
                self._blocks.pop(next(iter(self._blocks)))
            self._blocks[number] = found
        return found

    def source(self, position: int) -> tuple[int, int]:
        """``(dataset, draw number)`` of ``position``."""
        d, draw = self.locate(np.array([position], dtype=np.int64))
        return int(d[0]), int(draw[0])

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(dataset, draw number)`` arrays for node positions."""
        number, offset = np.divmod(positions, self.block)
        datasets = np.empty(len(positions), dtype=np.int64)
        draws = np.empty(len(positions), dtype=np.int64)
        quotas = np.array(self.quotas, dtype=np.int64)
        for value in np.unique(number).tolist():
            mask = number == value
            sources, before = self._layout(value)
            chosen = sources[offset[mask]]
            datasets[mask] = chosen
            draws[mask] = value * quotas[chosen] + before[offset[mask]]
        return datasets, draws

    def draws(self, positions: int) -> list[int]:
        """How many draws each dataset has in positions ``0 .. positions-1``."""
        number, offset = divmod(positions, self.block)
        counts = [number * quota for quota in self.quotas]
        if offset:
            for d in self._layout(number)[0][:offset].tolist():
                counts[d] += 1
        return counts


@dataclass(frozen=True)
class ChildState:
    """A dataset's place in the mix: the pass (its own epoch) it draws from, and what is left of it."""

    passes: int
    left: Remaining


def _node_layout(nodes: int, node: int = 0) -> Layout:
    """Each node as one rank: a dataset's pass dealt over nodes."""
    return Layout(node, nodes, node, 0, 1)


def advance(order: EpochOrder, state: ChildState, draws: int, nodes: int) -> ChildState:
    """``state`` once every node drew ``draws`` more samples from the dataset."""
    layout = _node_layout(nodes)
    sequences = order.sequences(state.passes, state.left, layout, "pad")[0]
    count = sequences.per_rank or 0
    passes, base = state.passes, state.left
    if draws >= count:
        draws -= count
        passes += 1
        whole = order.sequences(passes, order.full(), layout, "pad")[0].per_rank or 1
        passes += draws // whole
        draws %= whole
        base = order.full()
        sequences = order.sequences(passes, base, layout, "pad")[0]
    return ChildState(passes, order.take(base, passes, sequences, sequences.consumed(draws)))


class ChildStream:
    """One dataset's draws on node ``node`` of ``nodes``: its current pass's rest, then whole passes."""

    def __init__(self, order: EpochOrder, state: ChildState, nodes: int, node: int) -> None:
        self.order, self.state = order, state
        self.layout = _node_layout(nodes, node)
        self.first = order.rank_order(state.passes, state.left, self.layout, "pad")
        self.whole = max(1, order.rank_order(state.passes + 1, order.full(), self.layout, "pad").count)
        self._walks: dict[int, RankOrder] = {state.passes: self.first}

    def walk(self, passes: int) -> RankOrder:
        """Pass ``passes``'s walk on this node."""
        found = self._walks.get(passes)
        if found is None:
            if len(self._walks) > 3:
                self._walks.pop(next(key for key in self._walks if key != self.state.passes))
            found = self._walks[passes] = self.order.rank_order(passes, self.order.full(), self.layout, "pad")
        return found

    def locate(self, draws: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(shard, sample, pass, node position, done_after)`` for draw numbers on this node."""
        current = self.first.count
        rest = draws - current
        passes = np.where(draws < current, self.state.passes, self.state.passes + 1 + rest // self.whole)
        local = np.where(draws < current, draws, rest % self.whole)
        shard, sample, position, done = (np.empty(len(draws), dtype=np.int64) for _ in range(4))
        for value in np.unique(passes).tolist():
            mask = passes == value
            walk = self.walk(value)
            position[mask] = walk.node_positions(local[mask])
            shard[mask], sample[mask], done[mask] = walk.locate(position[mask])
        return shard, sample, passes, position, done


@dataclass(frozen=True)
class _Start:
    """Where an epoch of the mix starts: mixed samples left, and each dataset's state."""

    epoch: int
    left: int
    children: tuple[ChildState, ...]


class MixedDataset(IterableBase):
    """A weighted, deterministic interleave of :class:`ShardDataset` s (each with an index).

    ``weights`` (default: the datasets' sizes) set the share of each dataset in every block of
    ``block`` positions; ``samples_per_epoch`` (default: the sum of the datasets' sizes) is the
    length of a mixed epoch. Each dataset keeps its own order (seed, shuffle settings, lanes and
    blocks: so node locality and a bounded working set), decoders and transform; a small dataset
    with a large weight repeats (a new order each pass), a large one is covered over several mixed
    epochs. The mix has its own ``seed``, ranks, ``batch_size`` and ``remainder`` (``"pad"`` or
    ``"drop"``), and supports ``set_epoch``, ``state_dict`` and ``load_state_dict`` like
    ShardDataset: exact across any change of nodes, ranks and workers (see the module docstring).
    """

    STATE_FORMAT = STATE_FORMAT

    def __init__(
        self,
        datasets: Sequence[ShardDataset],
        weights: Sequence[float] | None = None,
        *,
        seed: int = 0,
        samples_per_epoch: int | None = None,
        block: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        batch_size: int | None = None,
        remainder: str = "pad",
        local_world_size: int | None = None,
    ) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise UsageError("MixedDataset needs at least one dataset")
        sizes = []
        for dataset in self.datasets:
            if not isinstance(dataset, ShardDataset) or dataset.order is None:
                raise UsageError("MixedDataset mixes ShardDatasets read through an index (NAME.index.json)")
            sizes.append(dataset.order.total)
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
        if remainder not in ("pad", "drop"):
            raise UsageError(
                f"remainder={remainder!r}: a MixedDataset deals with 'pad' or 'drop'",
                "every rank needs the same number of mixed samples",
            )
        if batch_size is not None and batch_size < 1:
            raise UsageError(f"batch_size={batch_size} must be positive")
        self.layout = resolve_layout(rank, world_size, local_world_size)
        self.rank, self.world_size = self.layout.rank, self.layout.world_size
        self.batch_size, self.remainder = batch_size, remainder
        self.epoch = 0
        self._base = self._fresh()
        self._starts: dict[int, _Start] = {}

    def _orders(self) -> list[EpochOrder]:
        return [dataset.order for dataset in self.datasets]  # type: ignore[misc]

    def _fresh(self) -> _Start:
        return _Start(0, self.samples_per_epoch, tuple(ChildState(0, order.full()) for order in self._orders()))

    # -- the arithmetic of an epoch --------------------------------------------------------------

    def _per_rank(self, left: int) -> int:
        return -(-left // self.world_size) if self.remainder == "pad" else left // self.world_size

    def _pattern(self, start: _Start) -> MixOrder:
        return MixOrder(self.quotas, self.seed, start.epoch, self.samples_per_epoch - start.left)

    def _start(self, epoch: int) -> _Start:
        """Where ``epoch`` starts in this run (the saved point after a resume, else computed)."""
        found = self._starts.get(epoch)
        if found is not None:
            return found
        start = self._base if epoch >= self._base.epoch else self._fresh()
        while start.epoch < epoch:
            start = self._after(start, self._per_rank(start.left) * self.layout.per_node)
            start = _Start(start.epoch + 1, self.samples_per_epoch, start.children)
        self._starts = {epoch: start}
        return start

    def _after(self, start: _Start, consumed: int) -> _Start:
        """``start`` once every node consumed ``consumed`` mixed positions of it."""
        draws = self._pattern(start).draws(consumed)
        nodes = self.layout.nodes
        children = tuple(
            advance(order, state, count, nodes) for order, state, count in zip(self._orders(), start.children, draws)
        )
        return _Start(start.epoch, max(0, start.left - consumed * nodes), children)

    def __len__(self) -> int:
        """Samples this rank yields in the current epoch (from the resume point, after a resume)."""
        return self._per_rank(self._start(self.epoch).left)

    def proportions(self) -> list[float]:
        """Each dataset's share of a block (what the weights became)."""
        return [quota / sum(self.quotas) for quota in self.quotas]

    # -- iteration -------------------------------------------------------------------------------

    def iter_worker(self, worker: int, num_workers: int) -> Iterator[Any]:
        """The rank's batches ``worker``, ``worker + num_workers``, ... (each ``batch_size`` samples)."""
        start = self._start(self.epoch)
        layout = self.layout
        pattern = self._pattern(start)
        streams = [
            ChildStream(order, state, layout.nodes, layout.node) for order, state in zip(self._orders(), start.children)
        ]
        readers = [dataset.reader() for dataset in self.datasets]
        done_after: list[dict[int, tuple[int, int]]] = [{} for _ in self.datasets]
        now: list[tuple[int, int]] = [(0, 0)] * len(self.datasets)
        locals_ = worker_locals(self._per_rank(start.left), self.batch_size or 1, worker, num_workers)
        step = 0
        for begin in range(0, len(locals_), 512):
            positions = locals_[begin : begin + 512] * layout.per_node + layout.local_rank
            sources, draws = pattern.locate(positions)
            placed = [streams[d].locate(draws[sources == d]) for d in range(len(streams))]
            cursor = [0] * len(streams)
            for d in sources.tolist():
                shard, sample, passes, position, done = (int(column[cursor[d]]) for column in placed[d])
                cursor[d] += 1
                done_after[d][shard] = (passes, done)
                now[d] = (passes, position)
                if step % RELEASE_EVERY == 0:
                    for reader, marks, mark in zip(readers, done_after, now):
                        reader.release(_passed(marks, mark))
                step += 1
                yield self.datasets[d].finish(readers[d].sample(shard, sample), shard)

    # -- resume ----------------------------------------------------------------------------------

    def _identity(self) -> dict[str, Any]:
        return {
            "datasets": [dataset._identity() for dataset in self.datasets],
            "quotas": self.quotas,
            "seed": self.seed,
        }

    def state_dict(self, samples_seen: int) -> dict[str, Any]:
        """A small JSON-able state: save it with the checkpoint, on any rank (they agree)."""
        start = self._start(self.epoch)
        count = self._per_rank(start.left)
        if not 0 <= samples_seen <= count:
            raise UsageError(f"samples_seen={samples_seen}: this rank has {count} samples in epoch {self.epoch}")
        after = self._after(start, samples_seen * self.layout.per_node)
        children = [
            {
                "pass": state.passes,
                "lanes": order.lane_count,
                "homes": order.homes,
                "remaining": state.left.encode(order.lanes().sizes().tolist()),
            }
            for order, state in zip(self._orders(), after.children)
        ]
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "total": self.samples_per_epoch,
            "left": after.left,
            "children": children,
            **self._identity(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved epoch where it stopped (any nodes, ranks, workers, batch size)."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise UsageError(
                f"not a MixedDataset state (format {STATE_FORMAT!r} expected)",
                "states saved by an older lading cannot be resumed exactly: start the epoch again",
            )
        mine = {**self._identity(), "total": self.samples_per_epoch}
        differing = sorted(key for key, value in mine.items() if state.get(key) != value)
        if differing:
            shown = ", ".join(f"{key}: saved {state.get(key)!r}, now {mine[key]!r}" for key in differing)
            raise UsageError(
                f"the saved state is for another dataset or order ({shown})",
                "resume with the same datasets, weights and seeds as the saved run",
            )
        try:
            saved = list(state["children"])
            left, epoch = int(state["left"]), int(state["epoch"])
            assert len(saved) == len(self.datasets) and 0 <= left <= self.samples_per_epoch
            children = []
            for order, child in zip(self._orders(), saved):
                order.lane_count, order.homes = int(child["lanes"]), int(child["homes"])
                assert order.lane_count > 0 and order.homes > 0
                left_of = Remaining.decode(child["remaining"], order.lanes().sizes().tolist())
                children.append(ChildState(int(child["pass"]), left_of))
        except (KeyError, TypeError, ValueError, AssertionError):
            raise UsageError("the saved MixedDataset state is not readable") from None
        self.epoch = epoch
        self._base = _Start(epoch, left, tuple(children))
        self._starts = {}


def _passed(marks: dict[int, tuple[int, int]], mark: tuple[int, int]) -> Callable[[int], bool]:
    """Whether a shard's last use (``marks``, by shard number) is behind ``mark``."""
    return lambda number: marks.get(number, mark) < mark
