"""NodeLocalSampler: the node-local order of :mod:`lading.datasets.partition` for map-style
datasets (a ``DistributedSampler`` replacement for :class:`~lading.datasets.PackedDataset`)."""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Sequence

from lading.core.errors import UsageError
from lading.datasets.locality import NodeLocalOrder
from lading.datasets.partition import DEFAULT_PARTITIONS


class NodeLocalSampler(NodeLocalOrder):
    """Indices (in pack order: shards in index order, samples in shard order) for this rank, in
    the node-local order ShardDataset uses: node ``n`` of ``N`` draws only from its block of
    partitions, so the shards it touches stay the same from epoch to epoch (and in the node
    cache). ``dataset`` is a PackedDataset (or anything with ``.index.counts``), or the list of
    samples per shard. Call :meth:`set_epoch` each epoch; :meth:`state_dict` /
    :meth:`load_state_dict` resume an epoch exactly on any number of nodes and ranks.
    """

    def __init__(self, dataset: Any, *, shuffle_buffer: int = 0, seed: int = 0, randomize_shard_order: bool = False,
                 rank: int | None = None, world_size: int | None = None, local_world_size: int | None = None,
                 partitions: int = DEFAULT_PARTITIONS, remainder: str = "pad") -> None:
        index = None if isinstance(dataset, (list, tuple)) else getattr(dataset, "index", None)
        counts = list(index.counts) if index is not None else list(dataset)
        if not counts or any(not isinstance(count, int) or count < 0 for count in counts):
            raise UsageError("NodeLocalSampler needs samples per shard (a PackedDataset or a list of counts)")
        self.counts: Sequence[int] = counts
        self.identity = getattr(index, "identity", None)
        self.first = list(itertools.accumulate(counts, initial=0))
        self.shuffle_buffer, self.seed, self.randomize_shard_order = shuffle_buffer, seed, randomize_shard_order
        self._setup_locality(rank, world_size, local_world_size, partitions, remainder)

    def _counts(self) -> Sequence[int]:
        return self.counts

    def _identity(self) -> dict[str, Any]:
        return {"dataset": self.identity, "seed": self.seed, "shuffle_buffer": max(1, self.shuffle_buffer),
                "randomize_shard_order": self.randomize_shard_order}

    def __iter__(self) -> Iterator[int]:
        first = self.first
        for shard, sample in self.locations():
            yield first[shard] + sample


__all__ = ["NodeLocalSampler"]
