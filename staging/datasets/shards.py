"""ShardDataset: an iterable over packed tar shards, exact and elastic on resume, through the node cache."""

from __future__ import annotations

import itertools
import os
import random
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator, Sequence, TypeVar

from lading.core.errors import NotFound, ProblemFound, UsageError
from lading.datasets.cache import NodeCache
from lading.datasets.decode import DecodeOption, decode_sample, decoders_for
from lading.datasets.elastic import ElasticIterable
from lading.datasets.locality import STATE_FORMAT, NodeLocalOrder
from lading.datasets.index import DatasetIndex, ShardRef, load_index, store_for
from lading.datasets.order import EpochOrder, worker_batches
from lading.datasets.partition import DEFAULT_PARTITIONS, GroupOrder
from lading.datasets.reader import Sample, ShardReader
from lading.pack.tarread import TarFormatError, iter_files
from lading.stores.base import ObjectInfo, Store
from lading.stores.config import StoreConfig
from lading.stores.process import ProcessLocal, control_plane
from lading.stores.uri import parse_uri

_CHUNK = 8 << 20


@dataclass(frozen=True)
class ShardSpan:
    """Samples ``[skip, skip + take)`` of one shard (``take`` None: to the end)."""

    shard: ShardRef
    skip: int = 0
    take: int | None = None


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


def _open_stream(ref: ShardRef, config: StoreConfig) -> IO[bytes] | _RangeReader:
    uri = parse_uri(ref.uri)
    if uri.scheme == "file":
        try:
            return open(uri.prefix, "rb", buffering=1 << 20)
        except FileNotFoundError:
            raise NotFound(f"shard not found: {uri.prefix}") from None
    store, name = store_for(uri, config)
    return _RangeReader(store, store.stat(name))


def grouped(files: Iterator[tuple[str, bytes]]) -> Iterator[Sample]:
    """Consecutive tar members with the same key (up to the first dot of the basename) as sample
    dicts; extensions lower-cased, as WebDataset does."""
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
    """Samples of one shard in tar order, streamed (ranged reads, no cache):
    ``{"__key__": key, ext: bytes, ...}``. Reading stops after ``take`` samples."""
    handle = _open_stream(ref, config)
    try:
        stop = None if take is None else skip + take
        yield from itertools.islice(grouped(iter_files(handle.read)), skip, stop)
    except TarFormatError as err:
        raise ProblemFound(f"{ref.uri} is not a readable tar shard: {err}") from err
    finally:
        handle.close()


_T = TypeVar("_T")


def _buffer_shuffled(samples: Iterator[_T], size: int, rng: random.Random) -> Iterator[_T]:
    if size <= 1:
        yield from samples
        return
    buffer: list[_T] = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        slot = rng.randrange(size)
        yield buffer[slot]
        buffer[slot] = sample
    rng.shuffle(buffer)
    yield from buffer


class _ShardEpoch:
    """One epoch of a ShardDataset in one process: position -> sample."""

    def __init__(self, order: EpochOrder, reader: ShardReader, finish: Callable[[Sample, int], Any]) -> None:
        self.order, self.reader, self.finish = order, reader, finish
        self._window = self._first = -1

    def begin(self, position: int) -> None:
        self.reader.upcoming(self.order.shards_from(position))

    def fetch(self, position: int) -> Any:
        window = position // self.order.window
        if window != self._window:  # shards behind this window are done: let eviction have them
            self._window = window
            first = self.order.first_slot(position)
            if first != self._first:
                self._first, slot = first, self.order.slot
                self.reader.release(lambda number: slot[number] < first)
        shard, index = self.order.locate(position)
        return self.finish(self.reader.sample(shard, index), shard)


class _NodeEpoch:
    """One epoch of a ShardDataset's node group in one process: position -> sample."""

    def __init__(self, group: GroupOrder, reader: ShardReader, finish: Callable[[Sample, int], Any]) -> None:
        self.group, self.reader, self.finish = group, reader, finish
        self._every = max(1, len(group.members))
        self._fetched = 0

    def begin(self, position: int) -> None:
        self.reader.upcoming(self.group.shards_from(position))

    def fetch(self, position: int) -> Any:
        self._fetched += 1
        if self._fetched % self._every == 0:  # shards no partition needs any more: let eviction have them
            done = self.group.done_before(position)
            if done:
                self.reader.release(done.__contains__)
        shard, index = self.group.locate(position)
        return self.finish(self.reader.sample(shard, index), shard)


class ShardDataset(NodeLocalOrder, ElasticIterable):
    """Iterable over packed shards: an index URI (``.../NAME.index.json``) or a list of shard URIs.

    With an index (sample counts known), the order is node-local (:mod:`lading.datasets.partition`):
    the samples of the run's shard order (index order, or with ``randomize_shard_order`` an order
    seeded by ``seed``, the same in every epoch) are cut into ``partitions`` contiguous partitions;
    node ``n`` of ``N`` reads only the partitions ``[n*C/N, (n+1)*C/N)``, so it downloads about
    ``1/N`` of the shards and keeps them across epochs. Inside a node the order changes every
    epoch (windows of ``shuffle_buffer`` permuted per epoch, partitions interleaved), positions
    are dealt round-robin to the node's ranks; each rank's samples are cut into batches of
    ``batch_size`` (pass the DataLoader's) and DataLoader worker ``w`` yields the rank's batches
    ``w``, ``w + num_workers``, ... Nodes and local ranks come from ``local_world_size`` (default:
    the launcher's, see :mod:`lading.selection.topology`; else one rank per node). Every rank gets
    the same number of samples: ``remainder="pad"`` (default; short nodes wrap to the start of
    their sequence, as DistributedSampler pads), ``"drop"`` (the extra positions are skipped) or
    ``"uneven"`` (each sample exactly once). :meth:`state_dict` / :meth:`load_state_dict` resume
    an epoch exactly, with any number of nodes, ranks, workers and batch size; on a node count
    that divides ``partitions`` each node keeps reading only its own partitions.

    Remote shards are read from the node cache (``cache_dir``, ``cache_limit``; see
    :mod:`lading.datasets.cache`), downloaded once per node; local shards are read in place.
    ``decode`` turns fields into objects (:mod:`lading.datasets.decode`), then ``transform(sample)``
    runs. ``rank``/``world_size`` default to torch.distributed's when a process group is
    initialised, else 0 and 1.

    With a bare list of shards (no counts), whole shards are dealt to ranks, then workers, and
    ``shuffle_buffer`` is a streaming shuffle buffer: counts per rank differ and there is no
    resume state. Pack the shards (an index) for the guarantees above.
    """

    STATE_FORMAT = STATE_FORMAT

    def __init__(self, source: str | Sequence[str], *, rank: int | None = None, world_size: int | None = None,
                 shuffle_buffer: int = 0, seed: int = 0, randomize_shard_order: bool = False,
                 batch_size: int | None = None, remainder: str = "pad", decode: DecodeOption = None,
                 transform: Callable[[Sample], Any] | None = None, config: StoreConfig | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | str | None = None,
                 prefetch: int = 2, local_world_size: int | None = None,
                 partitions: int = DEFAULT_PARTITIONS) -> None:
        self.config = config or StoreConfig.from_env()
        self.index: DatasetIndex | None = None
        if isinstance(source, str) and source.endswith(".json"):
            with control_plane():  # not obstore: DataLoader workers forked after this still may use it
                self.index = load_index(source, self.config)
            self.shards = list(self.index.shards)
        elif isinstance(source, str):
            self.shards = [ShardRef(source)]
        else:
            self.shards = [ShardRef(uri) for uri in source]
        if not self.shards:
            raise UsageError("no shards to read")
        self._setup(rank, world_size, batch_size, remainder)
        self._setup_locality(rank, world_size, local_world_size, partitions, remainder)
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.randomize_shard_order = randomize_shard_order
        self.decoders = decoders_for(decode)
        self.transform = transform
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self.cache_limit = cache_limit
        self.prefetch = prefetch
        if self.cache_dir is not None or cache_limit is not None or not all(ref.local for ref in self.shards):
            NodeCache(self.cache_dir, cache_limit)  # refuse a bad root or limit now, not in a worker

    @property
    def nsamples(self) -> int | None:
        """Samples in the whole dataset, when an index gave the counts."""
        return None if self.index is None else sum(self.index.counts)

    # -- per process -----------------------------------------------------------------------------

    def reader(self) -> ShardReader:
        """This process's reader (a new one after a fork: threads and open shards don't come along)."""
        holder = self.__dict__.get("_local")
        if holder is None:
            holder = self.__dict__["_local"] = ProcessLocal()  # dropped when pickled (elastic.py)
        return holder.get(self._new_reader)

    def _new_reader(self) -> ShardReader:
        cache_dir, cache_limit = self.cache_dir, self.cache_limit
        keep = 4
        if self.index is not None:
            keep = self.deal().group.keep_open()
        return ShardReader(self.shards, self.index, self.config, lambda: NodeCache(cache_dir, cache_limit),
                           self.prefetch, keep)

    def finish(self, sample: Sample, shard: int | None = None) -> Any:
        """Decode, then transform, one raw sample (of shard number ``shard``, named in a decoder's error)."""
        if self.decoders is not None:
            decode_sample(sample, self.decoders, None if shard is None else (lambda: self.shards[shard].uri))
        return sample if self.transform is None else self.transform(sample)

    def order(self, epoch: int | None = None) -> EpochOrder:
        """The global sequence of an epoch (needs an index)."""
        if self.index is None:
            raise UsageError("a list of shards has no global order", "read the shards through their index")
        return EpochOrder(self.index.counts, self.seed, self.epoch if epoch is None else epoch,
                          self.randomize_shard_order, self.shuffle_buffer)

    # -- ElasticIterable hooks -------------------------------------------------------------------

    def _total(self) -> int:
        if self.index is None:
            raise UsageError("a list of shards has no sample counts: no length or resume state",
                             "read the shards through their index (NAME.index.json)")
        return sum(self.index.counts)

    def _plan(self, epoch: int) -> _ShardEpoch:
        finish = self.finish if self.decoders is not None or self.transform is not None else _identity
        return _ShardEpoch(self.order(epoch), self.reader(), finish)

    def _identity(self) -> dict[str, Any]:
        assert self.index is not None
        return {"dataset": self.index.identity, "seed": self.seed, "shuffle_buffer": max(1, self.shuffle_buffer),
                "randomize_shard_order": self.randomize_shard_order}

    def _counts(self) -> Sequence[int]:
        self._total()
        assert self.index is not None
        return self.index.counts

    def __len__(self) -> int:
        """Samples this rank yields in the current epoch; a TypeError without an index (no counts)."""
        if self.index is None:
            raise TypeError("a ShardDataset over a list of shards has no length (no sample counts)")
        return super().__len__()

    def state_dict(self, samples_seen: int) -> dict[str, Any]:
        """See :meth:`ElasticIterable.state_dict`; needs an index."""
        self._total()
        return super().state_dict(samples_seen)

    # -- iteration -------------------------------------------------------------------------------

    def iter_worker(self, worker: int, num_workers: int) -> Iterator[Any]:
        """The samples worker ``worker`` of ``num_workers`` yields (what ``__iter__`` runs)."""
        if self.index is not None:
            return self._iter_partitioned(worker, num_workers)
        return self._iter_listed(worker, num_workers)

    def _iter_partitioned(self, worker: int, num_workers: int) -> Iterator[Any]:
        deal = self.deal()
        finish = self.finish if self.decoders is not None or self.transform is not None else _identity
        plan = _NodeEpoch(deal.group, self.reader(), finish)
        position = deal.position
        for number, batch in enumerate(worker_batches(deal.count, self.batch_size or 1, worker, num_workers)):
            if number == 0:
                plan.begin(position(batch.start))
            for local in batch:
                yield plan.fetch(position(local))

    def spans(self, worker: int = 0, num_workers: int = 1) -> list[ShardSpan]:
        """With a list of shards: the whole shards worker ``worker`` of ``num_workers`` reads."""
        shards = list(self.shards)
        if self.randomize_shard_order:
            random.Random(f"shards:{self.seed}:{self.epoch}").shuffle(shards)
        return [ShardSpan(shard) for shard in shards[self.rank::self.world_size][worker::num_workers]]

    def _iter_listed(self, worker: int, num_workers: int) -> Iterator[Any]:
        rng = random.Random(f"samples:{self.seed}:{self.epoch}:{self.rank}:{worker}")
        reader = self.reader()
        numbers = {shard.uri: number for number, shard in enumerate(self.shards)}

        def stream() -> Iterator[tuple[Sample, int]]:  # with the shard's number, for a decoder's error
            for span in self.spans(worker, num_workers):
                number = numbers[span.shard.uri]
                shard = reader.open(number)
                yield from ((shard.sample(index), number) for index in range(len(shard.layout or ())))

        for sample, number in _buffer_shuffled(stream(), self.shuffle_buffer, rng):
            yield self.finish(sample, number)


def _identity(sample: Sample, shard: int | None = None) -> Sample:
    return sample

