"""NodeLocalSampler: ShardDataset's epoch order (:mod:`lading.datasets.order`) for map-style
datasets (a ``DistributedSampler`` replacement for :class:`~lading.datasets.PackedDataset`)."""

from __future__ import annotations

import itertools
from typing import Any, Iterator

import numpy as np


from lading.core.errors import UsageError
from lading.datasets.order import EpochOrder
from lading.datasets.records import RecordDataset
from lading.datasets.order.engine import block_shards, resolve_layout
from lading.datasets.shards import iter_locations


class NodeLocalSampler:
    """Indices (in pack order: shards in index order, samples in shard order) for this rank, in
    ShardDataset's order: node ``n`` of ``N`` draws only from its lanes, so the shards it touches
    stay the same from epoch to epoch (and in the node cache), a block of shards at a time.
    ``dataset`` is a PackedDataset (or anything with ``.index.counts``), a RecordDataset (its
    records in chunks of about 64 MiB: :meth:`~lading.datasets.RecordDataset.chunk_counts`), or
    the list of samples per shard. Call :meth:`set_epoch` each epoch; :meth:`state_dict` / :meth:`load_state_dict` resume
    an epoch exactly on any number of nodes and ranks.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        shuffle_buffer: int = 0,
        seed: int = 0,
        randomize_shard_order: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        local_world_size: int | None = None,
        remainder: str = "pad",
        shuffle_block: int | str | None = None,
        lanes: int | None = None,
    ) -> None:
        index = None if isinstance(dataset, (list, tuple, RecordDataset)) else getattr(dataset, "index", None)
        if isinstance(dataset, RecordDataset):
            counts = dataset.chunk_counts()
        else:
            counts = list(index.counts) if index is not None else list(dataset)
        if not counts or any(not isinstance(count, int) or count < 0 for count in counts):
            raise UsageError("NodeLocalSampler needs samples per shard (a PackedDataset or a list of counts)")
        sizes = index.shards.sizes() if index is not None else None
        shard_bytes = None if sizes is None else np.asarray(sizes, dtype=np.int64)
        self.identity = getattr(index, "identity", None)
        self.first = list(itertools.accumulate(counts, initial=0))
        self.seed, self.shuffle_buffer, self.randomize_shard_order = seed, shuffle_buffer, randomize_shard_order
        layout = resolve_layout(rank, world_size, local_world_size)
        self.order = EpochOrder(
            counts,
            seed=seed,
            shuffle_buffer=shuffle_buffer,
            randomize_shard_order=randomize_shard_order,
            layout=layout,
            remainder=remainder,
            block=block_shards(shuffle_block, None, shard_bytes),
            lanes=lanes,
        )
        self.epoch = 0

    def _identity(self) -> dict[str, Any]:
        return {
            "dataset": self.identity,
            "seed": self.seed,
            "shuffle_buffer": self.shuffle_buffer,
            "randomize_shard_order": self.randomize_shard_order,
            "shuffle_block": self.order.block,
        }

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (another reproducible order inside each node's lanes)."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Indices this rank yields in the current epoch (from the resume point, after a resume)."""
        return self.order.count(self.epoch)

    def __iter__(self) -> Iterator[int]:
        first = self.first
        for shard, sample in iter_locations(self.order, self.epoch):
            yield first[shard] + sample

    def state_dict(self, samples_seen: int) -> dict[str, Any]:
        """A small JSON-able state (the same on every rank): save it with the checkpoint."""
        return self.order.state(self.epoch, samples_seen, self._identity())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved epoch where it stopped, on this layout."""
        self.epoch = self.order.load(state, self._identity(), type(self).__name__)


__all__ = ["NodeLocalSampler"]
