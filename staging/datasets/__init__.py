"""Datasets for training code that read straight from a store. No torch import at module import.

- :class:`ShardDataset`: iterable over packed tar shards (``lading pack``) through the node cache;
  the one epoch order (:mod:`lading.datasets.order`: node-local lanes walked a block of shards at
  a time, dealt to ranks and DataLoader workers) so that a resumed epoch (any nodes, world size,
  number of workers) delivers every sample exactly once.
- :class:`MixedDataset`: a deterministic weighted interleave of ShardDatasets, resumable the same way.
- :class:`PackedDataset`: map-style random access into packed shards, one ranged read per sample;
  :class:`NodeLocalSampler` gives it ShardDataset's node-local order (DistributedSampler's place).
- :class:`RecordDataset`: map-style over fixed-size records in one object.
- :class:`StoreDataset`: map-style over the objects under a prefix, in key order.
- :class:`DataLoader` (imports torch, loaded on first use): torch's DataLoader with ``set_epoch``
  reaching persistent workers and ``state_dict``/``load_state_dict`` counting delivered samples.

``decode=`` on each turns fields into objects (:mod:`lading.datasets.decode`). All pickle without
their connections, threads and open shards, so DataLoader workers (fork or spawn) open their own.
When torch is installed, ``ShardDataset(...)`` and ``MixedDataset(...)`` are instances of
``torch.utils.data.IterableDataset`` (DataLoader checks that with isinstance).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lading.datasets.cache import NodeCache, default_cache_root
from lading.datasets.decode import DEFAULT_DECODERS
from lading.datasets.index import DatasetIndex, ShardRef, load_index
from lading.datasets.packed import PackedDataset
from lading.datasets.records import RecordDataset
from lading.datasets.slots import distributed_slot as _distributed_slot  # noqa: F401 - looked up here
from lading.datasets.slots import worker_slot as _worker_slot  # noqa: F401 - by __iter__ (tests stand in a slot)
from lading.datasets.store import StoreDataset

__all__ = [
    "DEFAULT_DECODERS",
    "DataLoader",
    "REMAINDERS",
    "DatasetIndex",
    "EpochOrder",
    "MixedDataset",
    "NodeLocalSampler",
    "NodeCache",
    "PackedDataset",
    "RecordDataset",
    "ShardDataset",
    "ShardRef",
    "ShardSpan",
    "StoreDataset",
    "default_cache_root",
    "iter_shard",
    "load_index",
]


if TYPE_CHECKING:  # what the lazy names are, for the type checker
    from lading.datasets.loader import DataLoader
    from lading.datasets.mixed import MixedDataset
    from lading.datasets.order import REMAINDERS, EpochOrder
    from lading.datasets.sampler import NodeLocalSampler
    from lading.datasets.shards import ShardDataset, ShardSpan, iter_shard

#: Loaded on first use: the order engine imports numpy, torch's DataLoader imports torch.
_LAZY = {
    "DataLoader": "lading.datasets.loader",
    "EpochOrder": "lading.datasets.order",
    "MixedDataset": "lading.datasets.mixed",
    "NodeLocalSampler": "lading.datasets.sampler",
    "REMAINDERS": "lading.datasets.order",
    "ShardDataset": "lading.datasets.shards",
    "ShardSpan": "lading.datasets.shards",
    "iter_shard": "lading.datasets.shards",
}


def __getattr__(name: str) -> object:
    """The order engine (numpy) and ``DataLoader`` (torch) load on first use only."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lading.datasets' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
