"""PackedDataset: map-style random access into packed shards, one ranged read per sample."""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Sequence

from lading.core.errors import ProblemFound, UsageError
from lading.datasets.cache import CachedShard, NodeCache, default_cache_root
from lading.datasets.decode import DecodeOption, decode_sample, decoders_for
from lading.datasets.index import load_index, store_for
from lading.datasets.reader import Sample, map_local
from lading.pack.offsets import OffsetsTable
from lading.stores.base import Store
from lading.stores.batch import RangeRequest, read_batch
from lading.stores.config import StoreConfig
from lading.stores.process import ProcessLocal, control_plane

#: Neighbouring samples of one shard closer than this are fetched in one read.
DEFAULT_GAP = 64 << 10
_KEEP_MAPPED = 16


class _Local:
    """What one process keeps: mapped shards (cached or local files), misses, the node cache."""

    def __init__(self) -> None:
        self.mapped: OrderedDict[int, tuple[Any, CachedShard | None]] = OrderedDict()
        self.missing: set[int] = set()
        self.cache: NodeCache | None = None
        self.lock = threading.Lock()


class PackedDataset:
    """Map-style over a ``lading pack`` dataset: ``ds[i]`` is sample ``i`` of the pack (shards in
    index order, samples in shard order), as ``{"__key__": key, ext: bytes, ...}``.

    Each sample is one ranged read (its members are adjacent), located through the offsets file
    ``lading pack`` writes next to the index; a shard already in the node cache (put there by a
    :class:`ShardDataset` on this node) is read from there instead, and local shards in place.
    ``__getitems__`` (what DataLoader calls per batch) reads a batch's samples in one call to the
    I/O core (the GETs concurrent), neighbours within ``max_gap`` bytes in one read. Works with any sampler, e.g.
    ``DistributedSampler``. ``decode`` and ``transform(sample)`` as for ShardDataset.
    """

    def __init__(
        self,
        index_uri: str,
        *,
        decode: DecodeOption = None,
        transform: Callable[[Sample], Any] | None = None,
        config: StoreConfig | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        use_cache: bool = True,
        max_gap: int = DEFAULT_GAP,
        threads: int = 8,
    ) -> None:
        self.config = config or StoreConfig.from_env()
        with control_plane():  # not obstore: DataLoader workers forked after this still may use it
            self.index = load_index(index_uri, self.config)
            table = self.index.table(self.config)
        if table is None:
            raise UsageError(
                f"{index_uri} has no offsets file, so its samples cannot be addressed",
                "re-pack the dataset with this version of lading (it writes NAME.offsets.safetensors)",
            )
        self._table: OffsetsTable | None = table
        self.decoders = decoders_for(decode)
        self.transform = transform
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self.use_cache = use_cache
        self.max_gap = max_gap
        self.threads = max(1, threads)  # kept for compatibility: batches run on the I/O core
        self._local: ProcessLocal[_Local] = ProcessLocal(_Local)

    def __getstate__(self) -> dict[str, Any]:
        # Neither the process's mappings nor the (possibly large) table travel to a spawned
        # worker: it reads the offsets file again, once.
        return {name: value for name, value in self.__dict__.items() if name not in ("_local", "_table")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = ProcessLocal(_Local)
        self._table = None

    @property
    def table(self) -> OffsetsTable:
        """The offsets table (see :mod:`lading.pack.offsets`)."""
        if self._table is None:
            self._table = self.index.table(self.config)
        if self._table is None:
            raise ProblemFound(f"{self.index.uri} has no offsets table", "pack it again with lading pack")
        return self._table

    def __len__(self) -> int:
        return self.table.nsamples

    def key(self, index: int) -> str:
        """The key of sample ``index``, without reading it."""
        return self.table.key(self._checked(index))

    def _checked(self, index: int) -> int:
        total = self.table.nsamples
        position = index + total if index < 0 else index
        if not 0 <= position < total:
            raise IndexError(f"index {index} out of range for {total} samples")
        return position

    def _shard_of(self, index: int) -> int:
        return bisect_right(self.table.shard_samples, index) - 1

    # -- bytes -----------------------------------------------------------------------------------

    def _state(self) -> _Local:
        return self._local.get()  # reset in a forked child: mappings do not come along

    def _mapped(self, shard: int) -> Any | None:
        """The shard's bytes when local or in the node cache, else None (read it by range)."""
        local = self._state()
        with local.lock:
            found = local.mapped.get(shard)
            if found is not None:
                local.mapped.move_to_end(shard)
                return found[0]
            if shard in local.missing:
                return None
        ref = self.index.shards[shard]
        entry: tuple[Any, CachedShard | None] | None = None
        if ref.local:
            entry = (map_local(ref), None)
        elif self.use_cache:
            cache = self._cache(local)
            cached = None if cache is None else cache.find(ref.uri, ref.etag, ref.filesize)
            if cached is not None:
                entry = (cached.buffer, cached)
        with local.lock:
            if entry is None:
                local.missing.add(shard)
                return None
            local.mapped[shard] = entry
            while len(local.mapped) > _KEEP_MAPPED:
                closer = local.mapped.popitem(last=False)[1][1]
                if closer is not None:
                    closer.release()  # another thread may still be slicing its mapping
        return entry[0]

    def _cache(self, local: _Local) -> NodeCache | None:
        if local.cache is None:
            root = Path(self.cache_dir) if self.cache_dir is not None else default_cache_root()
            if not (root / "datasets").is_dir():
                return None  # nothing was ever cached here: don't create a cache just to look
            local.cache = NodeCache(root)
        return local.cache

    def _read(self, shard: int, start: int, end: int) -> Any:
        return self._read_runs([(shard, start, end)])[0]

    def _read_runs(self, runs: Sequence[tuple[int, int, int]]) -> list[Any]:
        """Bytes ``[start, end)`` of each ``(shard, start, end)``: sliced from mapped shards, the
        rest in one batched read (zero-copy buffers)."""
        out: list[Any] = [None] * len(runs)
        remote: list[tuple[int, tuple[Store, RangeRequest]]] = []
        for position, (shard, start, end) in enumerate(runs):
            mapped = self._mapped(shard)
            if mapped is not None:
                out[position] = mapped[start:end]
                continue
            ref = self.index.shards[shard]
            store, key = store_for(ref.uri, self.config)
            remote.append((position, (store, RangeRequest(key, start, end, ref.etag))))
        for (position, _item), data in zip(remote, read_batch([item for _position, item in remote])):
            out[position] = data
        return out

    # -- samples ---------------------------------------------------------------------------------

    def _build(self, index: int, data: bytes, base: int) -> Any:
        table = self.table
        sample: Sample = {"__key__": table.key(index)}
        exts, ext_of, offsets, sizes = table.exts, table.member_ext, table.member_offset, table.member_size
        for member in range(table.sample_members[index], table.sample_members[index + 1]):
            offset = offsets[member] - base
            # bytes, not a view: samples cross process boundaries (DataLoader pickles them)
            sample[exts[ext_of[member]]] = bytes(data[offset : offset + sizes[member]])
        if self.decoders is not None:
            decode_sample(sample, self.decoders, lambda: self.index.shards[self._shard_of(index)].uri)
        return sample if self.transform is None else self.transform(sample)

    def __getitem__(self, index: int) -> Any:
        position = self._checked(index)
        start, end = self.table.byte_range(position)
        return self._build(position, self._read(self._shard_of(position), start, end), start)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch: samples of one shard within ``max_gap`` of each other in one read, the reads
        concurrent."""
        wanted = sorted((self._shard_of(p), *self.table.byte_range(p), p) for p in map(self._checked, indices))
        runs: list[list[Any]] = []  # [shard, start, end, [positions]]
        for shard, start, end, position in wanted:
            if runs and runs[-1][0] == shard and start - runs[-1][2] <= self.max_gap:
                runs[-1][2] = max(runs[-1][2], end)
                runs[-1][3].append(position)
            else:
                runs.append([shard, start, end, [position]])
        chunks = self._read_runs([(run[0], run[1], run[2]) for run in runs])
        built: dict[int, Any] = {}
        for run, data in zip(runs, chunks):
            for position in run[3]:
                if position not in built:
                    built[position] = self._build(position, data, run[1])
        return [built[position] for position in map(self._checked, indices)]
