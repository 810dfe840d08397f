"""EpochOrder: the order engine's settings for one dataset, its epochs, and its resume state."""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from lading.core.errors import UsageError
from lading.datasets.order.deal import Layout, NodeSequences, check_remainder, check_slot, layout_for, node_sequences
from lading.datasets.order.lanes import Lanes, choose_lanes
from lading.datasets.order.state import Remaining
from lading.datasets.order.walk import RankOrder, Shuffle, delivered
from lading.datasets.slots import distributed_slot

STATE_FORMAT = "lading-order-4"
#: Shards a node walks together when neither ``shuffle_block`` nor ``cache_limit`` says otherwise.
DEFAULT_BLOCK_SHARDS = 16
_OLDER_FORMATS = ("lading-order-3", "lading-order-2", "lading-partitioned-1", "lading-elastic-1", "lading-shards-1")


def env_topology() -> Any | None:
    """The launcher's topology from the environment (None when it is inconsistent)."""
    from lading.selection.topology import detect_topology

    try:
        return detect_topology(os.environ)
    except UsageError:
        return None


def resolve_layout(rank: int | None, world_size: int | None, local_world_size: int | None) -> Layout:
    """Rank and world from arguments, torch.distributed, then the launcher; nodes from the launcher."""
    topology = env_topology()
    default_rank, default_world = distributed_slot()
    if default_world == 1 and topology is not None and topology.world_size > 1:
        default_rank, default_world = topology.rank, topology.world_size  # a launcher, no process group
    rank = default_rank if rank is None else rank
    world_size = default_world if world_size is None else world_size
    check_slot(rank, world_size)
    return layout_for(rank, world_size, local_world_size, topology)


def block_shards(shuffle_block: int | str | None, cache_limit: int | None, shard_bytes: np.ndarray | None) -> int:
    """Shards per block: ``shuffle_block`` in shards (int) or bytes (``"2GB"``), else half of what
    ``cache_limit`` holds of the largest shards, else :data:`DEFAULT_BLOCK_SHARDS`."""
    from lading.datasets.cache import parse_limit

    largest = int(shard_bytes.max()) if shard_bytes is not None and len(shard_bytes) else 0
    if isinstance(shuffle_block, int) and not isinstance(shuffle_block, bool):
        if shuffle_block < 1:
            raise UsageError(f"shuffle_block={shuffle_block} must be at least 1 shard")
        return shuffle_block
    if shuffle_block is not None:
        size = parse_limit(shuffle_block)
        if not largest:
            raise UsageError("shuffle_block in bytes needs the shards' sizes (an index written by lading pack)")
        mean = max(1, int(shard_bytes.mean()))  # type: ignore[union-attr]
        return max(1, int(size) // mean)  # type: ignore[arg-type]
    if cache_limit is not None and largest:
        return max(1, cache_limit // largest // 2)
    return DEFAULT_BLOCK_SHARDS


class EpochOrder:
    """Which samples this rank reads in each epoch, in what order, and how to resume.

    ``counts``: samples per shard (index order); ``shard_bytes``: their sizes, when known. Every
    rank computes the same lanes and node sequences from the same settings (no communication)."""

    def __init__(
        self,
        counts: Sequence[int] | np.ndarray,
        *,
        seed: int,
        shuffle_buffer: int,
        randomize_shard_order: bool,
        layout: Layout,
        remainder: str,
        block: int,
        lanes: int | None = None,
    ) -> None:
        if shuffle_buffer < 0:
            raise UsageError(f"shuffle_buffer={shuffle_buffer} must not be negative")
        if lanes is not None and lanes < 1:
            raise UsageError(f"lanes={lanes} must be positive")
        self.counts = np.asarray(counts, dtype=np.int64)
        self.seed, self.shuffle_buffer, self.randomize_shard_order = seed, shuffle_buffer, randomize_shard_order
        self.layout, self.remainder, self.block = layout, check_remainder(remainder), block
        self.total = int(self.counts.sum())
        mean = self.total / max(1, len(self.counts))
        self.window = int(min(shuffle_buffer, max(1, round(block * mean))))
        self.homes = layout.nodes  # the run's first node count (a resume state names the saved one)
        self.lane_count = lanes or choose_lanes(self.total, max(1, round(block * mean)), layout.nodes)
        self.epoch = 0
        self._resume: tuple[int, Remaining] | None = None
        self._lanes: Lanes | None = None
        #: the node sequences last computed on this dataset's own layout (count, state and the walk
        #: share them): the settings they came from, the resume point, the sequences
        self._sequences: tuple[tuple[Any, ...], Any, tuple[NodeSequences, bool]] | None = None

    def lanes(self) -> Lanes:
        """The run's lanes."""
        if self._lanes is None or self._lanes.count != self.lane_count:
            self._lanes = Lanes(self.counts, self.seed, self.randomize_shard_order, self.lane_count)
        return self._lanes

    def shuffle(self, epoch: int) -> Shuffle:
        """Epoch ``epoch``'s shuffle settings."""
        return Shuffle(self.seed, epoch, self.shuffle_buffer > 0 or self.randomize_shard_order, self.window, self.homes)

    def remaining(self, epoch: int) -> Remaining:
        """What is left of ``epoch`` when this run starts it (all of it, unless resumed)."""
        if self._resume is not None and self._resume[0] == epoch:
            return self._resume[1]
        return self.full()

    def sequences(
        self, epoch: int, remaining: Remaining | None = None, layout: Layout | None = None, remainder: str | None = None
    ) -> tuple[NodeSequences, bool]:
        """Every node's sequence of epoch ``epoch`` (the same on every rank), and whether locality
        holds; by default from what is left of it, on this dataset's layout and remainder rule."""
        mine = remaining is None and layout in (None, self.layout) and remainder in (None, self.remainder)
        key = (epoch, self.lane_count, self.homes, self.layout, self.remainder, self.seed, self.shuffle(epoch).shuffle)
        cached = self._sequences
        if mine and cached is not None and cached[0] == key and cached[1] is self._resume:
            return cached[2]
        found = node_sequences(
            self.remaining(epoch) if remaining is None else remaining,
            layout or self.layout,
            self.homes,
            self.seed,
            epoch,
            self.shuffle(epoch).shuffle,
            remainder or self.remainder,
        )
        if mine:
            self._sequences = (key, self._resume, found)
        return found

    def rank_order(
        self, epoch: int, remaining: Remaining | None = None, layout: Layout | None = None, remainder: str | None = None
    ) -> RankOrder:
        """This rank's walk of epoch ``epoch`` (arguments as for :meth:`sequences`)."""
        layout = layout or self.layout
        sequences, local = self.sequences(epoch, remaining, layout, remainder)
        group = layout.node if local else 0
        me = layout.local_rank if local else layout.rank
        return RankOrder(self.lanes(), sequences, group, me, self.shuffle(epoch))

    def take(self, left: Remaining, epoch: int, sequences: NodeSequences, consumed: list[int]) -> Remaining:
        """``left`` without what each group's first ``consumed[group]`` positions of epoch ``epoch`` hold."""
        left = left.copy()
        taken = delivered(self.lanes(), sequences, self.shuffle(epoch), consumed)
        for pieces, counts in zip(sequences.pieces, taken):
            left.take(pieces, counts)
        return left

    def full(self) -> Remaining:
        """A whole epoch: nothing delivered yet."""
        return Remaining.full(self.lanes().sizes().tolist())

    def count(self, epoch: int) -> int:
        """Samples this rank yields in epoch ``epoch`` (from the resume point, after a resume)."""
        return self.rank_order(epoch).count

    # -- resume ----------------------------------------------------------------------------------

    def state(self, epoch: int, samples_seen: int, identity: dict[str, Any]) -> dict[str, Any]:
        """The resume state once every rank consumed ``samples_seen`` samples of ``epoch`` in this run."""
        sequences = self.sequences(epoch)[0]
        count = self.rank_order(epoch).count
        if not 0 <= samples_seen <= count:
            raise UsageError(f"samples_seen={samples_seen}: this rank has {count} samples in epoch {epoch}")
        left = self.take(self.remaining(epoch), epoch, sequences, sequences.consumed(samples_seen))
        return {
            "format": STATE_FORMAT,
            "epoch": epoch,
            "total": self.total,
            "lanes": self.lane_count,
            "homes": self.homes,
            "left": left.total(),
            "remaining": left.encode(self.lanes().sizes().tolist()),
            **identity,
        }

    def load(self, state: Any, identity: dict[str, Any], kind: str) -> int:
        """Resume from ``state`` (see :meth:`state`); returns the saved epoch."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            hint = (
                "this state was saved by an older lading (another order): start the epoch again"
                if isinstance(state, dict) and state.get("format") in _OLDER_FORMATS
                else f"pass what {kind}.state_dict() returned"
            )
            raise UsageError(f"not a {kind} state (format {STATE_FORMAT!r} expected)", hint)
        mine = {**identity, "total": self.total}
        differing = sorted(key for key, value in mine.items() if state.get(key) != value)
        if differing:
            shown = ", ".join(f"{key}: saved {state.get(key)!r}, now {mine[key]!r}" for key in differing)
            raise UsageError(
                f"the saved state is for another dataset or order ({shown})",
                "resume with the same index, seed and shuffle settings as the saved run",
            )
        lanes, homes = state.get("lanes"), state.get("homes")
        if not isinstance(lanes, int) or lanes < 1 or not isinstance(homes, int) or homes < 1:
            raise UsageError("the saved state has no lane layout")
        self.lane_count, self.homes = lanes, homes  # fixed for the run: the saved ones win
        remaining = Remaining.decode(state.get("remaining"), self.lanes().sizes().tolist())
        epoch = int(state["epoch"])
        self._resume = (epoch, remaining)
        return epoch
