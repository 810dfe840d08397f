"""Datasets for training code that read straight from a store. No torch import at module import.

- :class:`StoreDataset`: map-style over the objects under a prefix; ``ds[i]`` fetches object
  ``i`` (in key order). Sequential access is served ahead by a small thread pool.
- :class:`ShardDataset`: iterable over packed tar shards (``lading pack``), split by rank, then
  by DataLoader worker, with a seeded local shuffle buffer and optional shard-order
  randomisation: Ray Data's ``local_shuffle_buffer_size``, ``local_shuffle_seed`` and
  ``randomize_block_order``.

Both pickle without their open connections, so DataLoader workers (fork or spawn) open their
own store on first use. When torch is installed, ``ShardDataset(...)`` is an instance of
``torch.utils.data.IterableDataset`` (DataLoader checks that with isinstance).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import random
import sys
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator, Sequence

from lading.core.errors import NotFound, ProblemFound, UsageError
from lading.pack.index import parse_index
from lading.pack.tarread import TarFormatError, iter_files
from lading.stores import open_store
from lading.stores.base import ObjectInfo, Store
from lading.stores.config import StoreConfig
from lading.stores.uri import StoreURI, parse_uri

Sample = dict[str, Any]
_CHUNK = 8 << 20


def _worker_slot() -> tuple[int, int]:
    """``(worker id, number of workers)`` of the DataLoader worker running this code, else (0, 1).

    torch is consulted only when something already imported it (a DataLoader worker has).
    """
    if "torch" not in sys.modules:
        return 0, 1
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def _distributed_slot() -> tuple[int, int]:
    """``(rank, world size)`` from an initialised torch.distributed process group, else (0, 1)."""
    if "torch" not in sys.modules:
        return 0, 1
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _split(total: int, parts: int, index: int) -> tuple[int, int]:
    """``[start, end)`` of part ``index`` when ``total`` items are cut into ``parts`` near-equal runs."""
    return total * index // parts, total * (index + 1) // parts


_STORES: dict[tuple[int, str, StoreConfig], Store] = {}
_STORES_LOCK = threading.Lock()


def _store_for(uri: StoreURI, config: StoreConfig) -> tuple[Store, str]:
    """The store holding ``uri``'s object (one per directory, process and config: clients are
    costly to build) and the object's key in it."""
    parent, name = uri.split_name()
    if not name:
        raise UsageError(f"{uri} names a directory, not an object")
    cache_key = (os.getpid(), str(parent), config)
    with _STORES_LOCK:
        store = _STORES.get(cache_key)
        if store is None:
            store = _STORES[cache_key] = open_store(parent, config)
    return store, name


class StoreDataset:
    """Map-style dataset: object ``i`` under a store prefix, in key order.

    ``transform(data, key)`` turns the bytes into a sample (default: the bytes). Listing happens
    once, here; each process opens its own connection lazily. When index ``i`` follows ``i-1``,
    the next ``prefetch`` objects are fetched in the background; a batch (``__getitems__``, what
    DataLoader asks for) is fetched on ``prefetch`` threads at once.
    """

    def __init__(self, uri: str, *, transform: Callable[[bytes, str], Any] | None = None,
                 config: StoreConfig | None = None, prefetch: int = 8, suffixes: Sequence[str] = ()) -> None:
        self.uri = uri
        self.config = config or StoreConfig.from_env()
        self.transform = transform
        self.prefetch = prefetch
        self.objects: list[ObjectInfo] = sorted(
            (info for info in open_store(parse_uri(uri), self.config).list()
             if not info.key.endswith("/") and (not suffixes or info.key.endswith(tuple(suffixes)))),
            key=lambda info: info.key)
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        self._pid = os.getpid()
        self._store: Store | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: dict[int, Future[bytes]] = {}
        self._last = -2
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_store", "_pool", "_ahead", "_lock", "_pid", "_last"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    def __len__(self) -> int:
        return len(self.objects)

    def key(self, index: int) -> str:
        """The key of object ``index``."""
        return self.objects[index].key

    def _open(self) -> Store:
        if self._pid != os.getpid():  # forked: threads and connections did not come along
            self._reset_process_state()
        if self._store is None:
            self._store = open_store(parse_uri(self.uri), self.config)
        return self._store

    def _fetch(self, index: int) -> bytes:
        info = self.objects[index]
        if info.size == 0:
            return b""
        return self._open().read_range(info.key, 0, info.size, info.version)

    def _schedule_ahead(self, index: int) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(1, self.prefetch), thread_name_prefix="lading-ds")
        for ahead in range(index + 1, min(index + 1 + self.prefetch, len(self.objects))):
            if ahead not in self._ahead:
                self._ahead[ahead] = self._pool.submit(self._fetch, ahead)

    def __getitem__(self, index: int) -> Any:
        if index < 0:
            index += len(self.objects)
        if not 0 <= index < len(self.objects):
            raise IndexError(f"index {index} out of range for {len(self.objects)} objects")
        self._open()
        with self._lock:
            future = self._ahead.pop(index, None)
            sequential = index == self._last + 1
            self._last = index
            if not sequential:
                for stale in self._ahead.values():
                    stale.cancel()
                self._ahead.clear()
            elif self.prefetch > 0:
                self._schedule_ahead(index)
        data = future.result() if future is not None else self._fetch(index)
        return data if self.transform is None else self.transform(data, self.objects[index].key)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch of objects, fetched concurrently (DataLoader calls this for each batch)."""
        positions = [index + len(self.objects) if index < 0 else index for index in indices]
        for index in positions:
            if not 0 <= index < len(self.objects):
                raise IndexError(f"index {index} out of range for {len(self.objects)} objects")
        self._open()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(1, self.prefetch), thread_name_prefix="lading-ds")
        with self._lock:
            futures = [self._ahead.pop(index, None) or self._pool.submit(self._fetch, index) for index in positions]
        results = [future.result() for future in futures]
        if self.transform is None:
            return results
        return [self.transform(data, self.objects[index].key) for data, index in zip(results, positions)]


@dataclass(frozen=True)
class ShardRef:
    """A shard to read: its URI and, when an index gave it, its sample count."""

    uri: str
    nsamples: int | None = None


@dataclass(frozen=True)
class ShardSpan:
    """Samples ``[skip, skip + take)`` of one shard (``take`` None: to the end)."""

    shard: ShardRef
    skip: int = 0
    take: int | None = None


def load_index(index_uri: str, config: StoreConfig | None = None) -> list[ShardRef]:
    """The shards a ``NAME.index.json`` lists, with their URIs resolved next to the index."""
    uri = parse_uri(index_uri)
    store, name = _store_for(uri, config or StoreConfig.from_env())
    info = store.stat(name)
    document = parse_index(store.read_range(name, 0, info.size, info.version), index_uri)
    parent = str(uri.split_name()[0]).rstrip("/")
    refs = []
    for shard in document["shardlist"]:
        url = shard["url"]
        absolute = "://" in url or url.startswith("/")
        refs.append(ShardRef(url if absolute else f"{parent}/{url}", shard["nsamples"]))
    return refs


class _RangeReader:
    """A read-only file over one object, fetched in ``_CHUNK`` ranges, the next one in advance."""

    def __init__(self, store: Store, info: ObjectInfo) -> None:
        self.store, self.info = store, info
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lading-shard")
        self._offset = 0
        self._buffer = memoryview(b"")
        self._next: Future[bytes] | None = self._request(0)

    def _request(self, start: int) -> Future[bytes] | None:
        if start >= self.info.size:
            return None
        end = min(start + _CHUNK, self.info.size)
        return self._pool.submit(self.store.read_range, self.info.key, start, end, self.info.version)

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all remaining when negative)."""
        if 0 <= size <= len(self._buffer):  # the common case: served from the current chunk
            part = self._buffer[:size]
            self._buffer = self._buffer[size:]
            return bytes(part)
        parts = []
        wanted = self.info.size if size < 0 else size
        while wanted > 0:
            if not self._buffer:
                if self._next is None:
                    break
                self._buffer = memoryview(self._next.result())
                self._offset += len(self._buffer)
                self._next = self._request(self._offset)
            part = self._buffer[:wanted]
            parts.append(bytes(part))
            self._buffer = self._buffer[len(part):]
            wanted -= len(part)
        return b"".join(parts)

    def close(self) -> None:
        """Stop prefetching."""
        if self._next is not None:
            self._next.cancel()
        self._pool.shutdown(wait=False)


def _open_shard(ref: ShardRef, config: StoreConfig) -> IO[bytes] | _RangeReader:
    uri = parse_uri(ref.uri)
    if uri.scheme == "file":
        try:
            return open(uri.prefix, "rb", buffering=1 << 20)
        except FileNotFoundError:
            raise NotFound(f"shard not found: {uri.prefix}") from None
    store, name = _store_for(uri, config)
    return _RangeReader(store, store.stat(name))


def _grouped(files: Iterator[tuple[str, bytes]]) -> Iterator[Sample]:
    current: Sample | None = None
    for name, data in files:
        directory, slash, base = name.rpartition("/")
        stem, dot, ext = base.partition(".")
        if not dot or not stem:
            continue  # no key: WebDataset readers skip such members too
        key = directory + slash + stem
        if current is None or current["__key__"] != key:
            if current is not None:
                yield current
            current = {"__key__": key}
        current[ext.lower()] = data
    if current is not None:
        yield current


def iter_shard(ref: ShardRef, config: StoreConfig, skip: int = 0, take: int | None = None) -> Iterator[Sample]:
    """Samples of one shard in tar order: ``{"__key__": key, ext: bytes, ...}``.

    Consecutive members with the same key (up to the first dot of the basename) form a sample;
    extensions are lower-cased, as WebDataset does. Reading stops after ``take`` samples.
    """
    handle = _open_shard(ref, config)
    try:
        stop = None if take is None else skip + take
        yield from itertools.islice(_grouped(iter_files(handle.read)), skip, stop)
    except TarFormatError as err:
        raise ProblemFound(f"{ref.uri} is not a readable tar shard: {err}") from err
    finally:
        handle.close()


def _shuffled(samples: Iterator[Sample], size: int, rng: random.Random) -> Iterator[Sample]:
    if size <= 1:
        yield from samples
        return
    buffer: list[Sample] = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        slot = rng.randrange(size)
        yield buffer[slot]
        buffer[slot] = sample
    rng.shuffle(buffer)
    yield from buffer


class ShardDataset:
    """Iterable over packed shards: an index URI (``.../NAME.index.json``) or a list of shard URIs.

    Splitting: with an index (sample counts known), the dataset's samples, in shard order
    (seeded random order with ``randomize_shard_order``), are cut into ``world_size`` equal
    runs, one per rank, and each run into one per DataLoader worker: every rank gets the same
    number of samples (+-1), the union is the dataset, the parts are disjoint. With a bare list
    of shards, whole shards are dealt out (rank, then worker) instead.

    ``shuffle_buffer`` > 1 shuffles within a buffer of that many samples; ``seed`` and
    :meth:`set_epoch` make the order reproducible. ``rank``/``world_size`` default to
    torch.distributed's when a process group is initialised, else 0 and 1.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> "ShardDataset":
        return super().__new__(_iterable_class() if cls is ShardDataset else cls)

    def __init__(self, source: str | Sequence[str], *, rank: int | None = None, world_size: int | None = None,
                 shuffle_buffer: int = 0, seed: int = 0, randomize_shard_order: bool = False,
                 transform: Callable[[Sample], Any] | None = None, config: StoreConfig | None = None) -> None:
        self.config = config or StoreConfig.from_env()
        if isinstance(source, str):
            self.shards = load_index(source, self.config) if source.endswith(".json") else [ShardRef(source)]
        else:
            self.shards = [ShardRef(uri) for uri in source]
        if not self.shards:
            raise UsageError("no shards to read")
        default_rank, default_world = _distributed_slot()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise UsageError(f"rank {self.rank} is not in 0..{self.world_size - 1}")
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.randomize_shard_order = randomize_shard_order
        self.transform = transform
        self.epoch = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_shard_dataset, (self.__dict__,))

    @property
    def nsamples(self) -> int | None:
        """Samples in the whole dataset, when an index gave the counts."""
        counts = [shard.nsamples for shard in self.shards]
        return None if None in counts else sum(counts)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        """Vary shard order and shuffling per epoch, reproducibly (call before iterating)."""
        self.epoch = epoch

    def _ordered_shards(self) -> list[ShardRef]:
        shards = list(self.shards)
        if self.randomize_shard_order:
            random.Random(f"shards:{self.seed}:{self.epoch}").shuffle(shards)
        return shards

    def spans(self, worker: int = 0, num_workers: int = 1) -> list[ShardSpan]:
        """What worker ``worker`` of ``num_workers`` on this rank reads, in order."""
        shards = self._ordered_shards()
        if self.nsamples is None:
            return [ShardSpan(shard) for shard in shards[self.rank::self.world_size][worker::num_workers]]
        rank_start, rank_end = _split(self.nsamples, self.world_size, self.rank)
        start, end = _split(rank_end - rank_start, num_workers, worker)
        start, end = rank_start + start, rank_start + end
        spans, offset = [], 0
        for shard in shards:
            count = shard.nsamples or 0
            low, high = max(start, offset), min(end, offset + count)
            if low < high:
                spans.append(ShardSpan(shard, low - offset, high - low))
            offset += count
        return spans

    def iter_worker(self, worker: int, num_workers: int) -> Iterator[Any]:
        """The samples worker ``worker`` of ``num_workers`` yields (what ``__iter__`` runs)."""
        rng = random.Random(f"samples:{self.seed}:{self.epoch}:{self.rank}:{worker}")

        def stream() -> Iterator[Sample]:
            for span in self.spans(worker, num_workers):
                yield from iter_shard(span.shard, self.config, span.skip, span.take)

        for sample in _shuffled(stream(), self.shuffle_buffer, rng):
            yield sample if self.transform is None else self.transform(sample)

    def __iter__(self) -> Iterator[Any]:
        worker, num_workers = _worker_slot()
        return self.iter_worker(worker, num_workers)


_TORCH_CLASS: list[type] = []


def _iterable_class() -> type:
    """ShardDataset itself, or (when torch is installed) a subclass that is also torch's IterableDataset."""
    if not _TORCH_CLASS:
        if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
            _TORCH_CLASS.append(ShardDataset)
        else:
            with warnings.catch_warnings():  # torch warns at import when numpy is missing; we don't use it
                warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
                from torch.utils.data import IterableDataset

            class TorchShardDataset(ShardDataset, IterableDataset):  # type: ignore[misc]
                """ShardDataset as a torch IterableDataset, so DataLoader iterates it."""

            _TORCH_CLASS.append(TorchShardDataset)
    return _TORCH_CLASS[0]


def _rebuild_shard_dataset(state: dict[str, Any]) -> ShardDataset:
    dataset = ShardDataset.__new__(ShardDataset)
    dataset.__dict__.update(state)
    return dataset
