"""What ShardDataset and NodeLocalSampler share: the partitioned order's layout, deal and resume
state (see :mod:`lading.datasets.partition`)."""

from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

from lading.core.errors import UsageError
from lading.datasets.order import check_remainder, check_slot
from lading.datasets.partition import (
    DEFAULT_PARTITIONS,
    EpochDeal,
    Layout,
    Partitions,
    decode_counts,
    encode_counts,
    layout_for,
)
from lading.datasets.slots import distributed_slot

STATE_FORMAT = "lading-partitioned-1"


def env_topology() -> Any | None:
    """The launcher's topology from the environment (None when it is inconsistent)."""
    from lading.selection.topology import detect_topology

    try:
        return detect_topology(os.environ)
    except UsageError:
        return None


class NodeLocalOrder:
    """Mixin: ``_counts()`` (samples per shard), ``_identity()``; call :meth:`_setup_locality`."""

    def _setup_locality(self, rank: int | None, world_size: int | None, local_world_size: int | None,
                        partitions: int, remainder: str) -> None:
        topology = env_topology()
        default_rank, default_world = distributed_slot()
        if default_world == 1 and topology is not None and topology.world_size > 1:
            default_rank, default_world = topology.rank, topology.world_size  # a launcher, no process group
        rank = default_rank if rank is None else rank
        world_size = default_world if world_size is None else world_size
        check_slot(rank, world_size)
        if partitions < 1:
            raise UsageError(f"partitions={partitions} must be positive")
        self.rank, self.world_size = rank, world_size
        self.layout: Layout = layout_for(rank, world_size, local_world_size, topology)
        self.local_world_size = self.layout.per_node
        self.partitions = partitions
        self.remainder = check_remainder(remainder)
        self.epoch = 0
        self._resume_offsets: tuple[int, list[int]] | None = None
        self.lanes: int | None = None  # the run's first node count, once a resume state named it

    def _lanes(self) -> int:
        """The node count whose blocks are this run's lanes (see lading.datasets.partition)."""
        return self.lanes or self.layout.nodes

    def _counts(self) -> Sequence[int]:
        raise NotImplementedError

    def _identity(self) -> dict[str, Any]:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (another reproducible order inside each node's partitions)."""
        self.epoch = epoch

    def _partitions(self) -> Partitions:
        return Partitions(self._counts(), self.seed, self.randomize_shard_order, self.partitions)  # type: ignore[attr-defined]

    def deal(self, epoch: int | None = None) -> EpochDeal:
        """This rank's share of the epoch: ``count`` samples, ``position(i)`` in ``.group``."""
        epoch = self.epoch if epoch is None else epoch
        resumed = self._resume_offsets is not None and self._resume_offsets[0] == epoch
        offsets = self._resume_offsets[1] if resumed else [0] * self.partitions  # type: ignore[index]
        return EpochDeal(self._partitions(), self.layout, offsets, self.seed, epoch,  # type: ignore[attr-defined]
                         self.shuffle_buffer, self.remainder, resumed, self._lanes())  # type: ignore[attr-defined]

    def __len__(self) -> int:
        """Samples this rank yields in the current epoch (from the resume point, after a resume)."""
        return self.deal().count

    def locations(self, epoch: int | None = None) -> Iterator[tuple[int, int]]:
        """``(shard, sample in shard)`` of this rank's samples, in order (no worker split)."""
        deal = self.deal(epoch)
        for local in range(deal.count):
            yield deal.group.locate(deal.position(local))

    def state_dict(self, samples_seen: int) -> dict[str, Any]:
        """A small JSON-able state (the same on every rank): save it with the checkpoint.

        ``samples_seen`` is how many samples this rank's training loop consumed in the current
        epoch *in this run* (since iteration started, or since the resume point after a resume).
        """
        deal = self.deal()
        if not 0 <= samples_seen <= deal.count:
            raise UsageError(f"samples_seen={samples_seen}: this rank has {deal.count} samples in epoch {self.epoch}")
        consumed = deal.consumed_after(samples_seen)
        return {"format": STATE_FORMAT, "epoch": self.epoch, "total": deal.parts.total,
                "partitions": self.partitions, "consumed": encode_counts(consumed),
                "samples": sum(consumed), "nodes": self.layout.nodes, "lanes": self._lanes(), **self._identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved epoch where it stopped, on this layout (any nodes, ranks, workers,
        batch size): every sample of the epoch not consumed before is delivered once."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise UsageError(f"not a {type(self).__name__} state (format {STATE_FORMAT!r} expected)",
                             "states saved before node locality cannot be resumed exactly: start the epoch again")
        mine = {**self._identity(), "total": sum(self._counts())}
        differing = sorted(key for key, value in mine.items() if state.get(key) != value)
        if differing:
            shown = ", ".join(f"{key}: saved {state.get(key)!r}, now {mine[key]!r}" for key in differing)
            raise UsageError(f"the saved state is for another dataset or order ({shown})",
                             "resume with the same index, seed and shuffle settings as the saved run")
        partitions = int(state.get("partitions", 0))
        if partitions < 1:
            raise UsageError("the saved state has no partition count")
        self.partitions = partitions  # fixed for the run: the saved one wins
        offsets = decode_counts(state.get("consumed"), partitions)
        parts = self._partitions()
        if any(not 0 <= done <= parts.size(c) for c, done in enumerate(offsets)):
            raise UsageError("the saved state's consumed counts do not fit this dataset's partitions")
        self.epoch = int(state["epoch"])
        self._resume_offsets = (self.epoch, offsets)
        lanes = state.get("lanes", state.get("nodes"))
        self.lanes = lanes if isinstance(lanes, int) and lanes > 0 else None


__all__ = ["DEFAULT_PARTITIONS", "STATE_FORMAT", "NodeLocalOrder"]
