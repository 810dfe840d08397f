"""ShardDataset: an iterable over packed tar shards, exact and elastic on resume, through the node cache."""

from __future__ import annotations

import itertools
import os
import random
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator, Sequence, TypeVar

import numpy as np

from lading.core.errors import NotFound, ProblemFound, UsageError
from lading.datasets.cache import NodeCache, parse_limit
from lading.datasets.decode import DecodeOption, decode_sample, decoders_for
from lading.datasets.index import DatasetIndex, ShardList, ShardRef, load_index, store_for
from lading.datasets.iterable import IterableBase
from lading.datasets.order import EpochOrder, check_remainder
from lading.datasets.order.deal import worker_locals
from lading.datasets.order.engine import block_shards, resolve_layout
from lading.datasets.order.walk import RankOrder
from lading.datasets.reader import Sample, ShardReader
from lading.pack.tarread import TarFormatError, iter_files
from lading.stores.base import ObjectInfo, Store
from lading.stores.config import StoreConfig
from lading.stores.process import ProcessLocal, control_plane
from lading.stores.uri import parse_uri

_CHUNK = 8 << 20
#: Shards done with are released (the node cache may evict them) every this many samples.
RELEASE_EVERY = 8


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
            self._buffer = self._buffer[len(part) :]
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
            handle = open(uri.prefix, "rb", buffering=1 << 20)
        except FileNotFoundError:
            raise NotFound(f"shard not found: {uri.prefix}") from None
        _check_size(ref, os.fstat(handle.fileno()).st_size, handle.close)
        return handle
    store, name = store_for(uri, config)
    info = store.stat(name)
    _check_size(ref, info.size, lambda: None)
    return _RangeReader(store, info)


def _check_size(ref: ShardRef, size: int, release: Callable[[], None]) -> None:
    """Refuse a shard whose size is not the one its index recorded (replaced or truncated)."""
    if ref.filesize is not None and size != ref.filesize:
        release()
        raise ProblemFound(
            f"{ref.uri} is {size} bytes, but its index says {ref.filesize}",
            "the shard changed after the index was written; pack the dataset again",
        )


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


class ShardDataset(IterableBase):
    """Iterable over packed shards: an index URI (``.../NAME.index.json``) or a list of shard URIs.

    With an index (sample counts known), the order is the one epoch-order engine's
    (:mod:`lading.datasets.order`): the run's samples are cut into *lanes* (chosen from the data,
    or ``lanes=``); node ``n`` of ``N`` reads only its lanes, so it downloads about ``1/N`` of the
    shards and keeps them across epochs. A node walks its lanes a *block* of shards at a time
    (``shuffle_block``: shards, or bytes such as ``"2GB"``; default half of what ``cache_limit``
    holds, else 16 shards): its shard pieces in an order permuted per epoch, each sample moved by
    up to ``shuffle_buffer / 2`` positions (capped by the block), so a node needs about one block of
    shards at a time however large the dataset. Positions are dealt round-robin to the node's ranks;
    each rank's samples are cut into batches of ``batch_size`` (pass the DataLoader's) and worker ``w``
    yields the rank's batches ``w``, ``w + num_workers``, ... Nodes and local ranks come from
    ``local_world_size`` (default: the launcher's, see :mod:`lading.selection.topology`; else one
    rank per node). Every rank gets the same number of samples: ``remainder="pad"`` (default; a
    node short of samples after balancing wraps to its start), ``"drop"`` or ``"uneven"`` (each
    sample exactly once). :meth:`state_dict` / :meth:`load_state_dict` resume an epoch exactly,
    with any number of nodes, ranks, workers and batch size.

    Remote shards are read from the node cache (``cache_dir``, ``cache_limit``; see
    :mod:`lading.datasets.cache`), downloaded once per node; local shards are read in place. The
    offsets file stays in the cache while the dataset is read. A ``cache_limit`` smaller than one
    block and one more of the largest shards, plus the offsets file, is refused here, naming the
    smallest that works.
    ``decode`` turns fields into objects (:mod:`lading.datasets.decode`), then ``transform(sample)``
    runs. ``rank``/``world_size`` default to torch.distributed's when a process group is
    initialised, else the launcher's, else 0 and 1.

    With a bare list of shards (no counts), whole shards are dealt to ranks, then workers, and
    ``shuffle_buffer`` is a streaming shuffle buffer: counts per rank differ and there is no
    resume state. Pack the shards (an index) for the guarantees above.
    """

    def __init__(
        self,
        source: str | Sequence[str],
        *,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle_buffer: int = 0,
        seed: int = 0,
        randomize_shard_order: bool = False,
        batch_size: int | None = None,
        remainder: str = "pad",
        decode: DecodeOption = None,
        transform: Callable[[Sample], Any] | None = None,
        config: StoreConfig | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        prefetch: int = 2,
        local_world_size: int | None = None,
        shuffle_block: int | str | None = None,
        lanes: int | None = None,
    ) -> None:
        self.config = config or StoreConfig.from_env()
        self.index: DatasetIndex | None = None
        if isinstance(source, str) and source.endswith(".json"):
            with control_plane():  # not obstore: DataLoader workers forked after this still may use it
                self.index = load_index(source, self.config)
            self.shards: Sequence[ShardRef] = self.index.shards
        elif isinstance(source, str):
            self.shards = [ShardRef(source)]
        else:
            self.shards = [ShardRef(uri) for uri in source]
        if not self.shards:
            raise UsageError("no shards to read")
        if shuffle_buffer < 0:
            raise UsageError(f"shuffle_buffer={shuffle_buffer} must not be negative")
        if batch_size is not None and batch_size < 1:
            raise UsageError(f"batch_size={batch_size} must be positive")
        self.layout = resolve_layout(rank, world_size, local_world_size)
        self.rank, self.world_size = self.layout.rank, self.layout.world_size
        self.local_world_size = self.layout.per_node
        self.batch_size, self.remainder = batch_size, check_remainder(remainder)
        self.shuffle_buffer, self.seed, self.randomize_shard_order = shuffle_buffer, seed, randomize_shard_order
        self.decoders = decoders_for(decode)
        self.transform = transform
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self.cache_limit = parse_limit(cache_limit)
        self.prefetch = prefetch
        self.epoch = 0
        self.order: EpochOrder | None = None
        if self.index is not None:
            self.order = self._new_order(shuffle_block, lanes)
        if self.cache_dir is not None or cache_limit is not None or not self._all_local():
            NodeCache(self.cache_dir, cache_limit)  # refuse a bad root or limit now, not in a worker

    def _new_order(self, shuffle_block: int | str | None, lanes: int | None) -> EpochOrder:
        assert self.index is not None
        sizes = self.index.shards.sizes()
        shard_bytes = None if sizes is None else np.asarray(sizes, dtype=np.int64)
        block = block_shards(shuffle_block, self.cache_limit, shard_bytes)
        if self.cache_limit is not None and shard_bytes is not None and not self._all_local():
            offsets = self.index.offsets
            kept = (offsets.filesize or 0) if offsets is not None else 0  # in use while reading
            smallest = int(np.sort(shard_bytes)[::-1][: block + 1].sum()) + kept
            if self.cache_limit < smallest:
                also = " (and the offsets file)" if kept else ""
                raise UsageError(
                    f"cache_limit={self.cache_limit} bytes cannot hold one block of {block} shard(s) "
                    f"and the next shard{also}: the smallest that works is {smallest} bytes",
                    "raise cache_limit, or lower shuffle_block",
                )
        return EpochOrder(
            np.asarray(self.index.counts, dtype=np.int64),
            seed=self.seed,
            shuffle_buffer=self.shuffle_buffer,
            randomize_shard_order=self.randomize_shard_order,
            layout=self.layout,
            remainder=self.remainder,
            block=block,
            lanes=lanes,
        )

    @property
    def nsamples(self) -> int | None:
        """Samples in the whole dataset, when an index gave the counts."""
        return None if self.index is None else sum(self.index.counts)

    def _all_local(self) -> bool:
        if isinstance(self.shards, ShardList):
            return self.shards.all_local()
        return all(ref.local for ref in self.shards)

    @property
    def shuffle_block(self) -> int | None:
        """Shards a node walks together (None without an index)."""
        return None if self.order is None else self.order.block

    @property
    def lanes(self) -> int | None:
        """The run's lane count (None without an index)."""
        return None if self.order is None else self.order.lane_count

    # -- per process -----------------------------------------------------------------------------

    def reader(self) -> ShardReader:
        """This process's reader (a new one after a fork: threads and open shards don't come along)."""
        holder = self.__dict__.get("_local")
        if holder is None:
            holder = self.__dict__["_local"] = ProcessLocal()  # dropped when pickled (iterable.py)
        return holder.get(self._new_reader)

    def _new_reader(self) -> ShardReader:
        cache_dir, cache_limit = self.cache_dir, self.cache_limit
        block = 0 if self.order is None else self.order.block
        return ShardReader(
            self.shards,
            self.index,
            self.config,
            lambda: NodeCache(cache_dir, cache_limit),
            self.prefetch,
            keep_open=4 if self.order is None else block + self.prefetch + 4,
            ahead=block,  # a worker's downloads reach at most one block past the shard it opens
        )

    def finish(self, sample: Sample, shard: int | None = None) -> Any:
        """Decode, then transform, one raw sample (of shard number ``shard``, named in a decoder's error)."""
        if self.decoders is not None:
            decode_sample(sample, self.decoders, None if shard is None else (lambda: self.shards[shard].uri))
        return sample if self.transform is None else self.transform(sample)

    def _ordered(self) -> EpochOrder:
        if self.order is None:
            raise UsageError(
                "a list of shards has no sample counts: no length, order or resume state",
                "read the shards through their index (NAME.index.json)",
            )
        return self.order

    def _identity(self) -> dict[str, Any]:
        assert self.index is not None
        return {
            "dataset": self.index.identity,
            "seed": self.seed,
            "shuffle_buffer": self.shuffle_buffer,
            "randomize_shard_order": self.randomize_shard_order,
            "shuffle_block": self._ordered().block,
        }

    # -- epochs and resume -----------------------------------------------------------------------

    def __len__(self) -> int:
        """Samples this rank yields in the current epoch (from the resume point, after a resume);
        a TypeError without an index (no counts)."""
        if self.order is None:
            raise TypeError("a ShardDataset over a list of shards has no length (no sample counts)")
        return self.order.count(self.epoch)

    def locations(self, epoch: int | None = None) -> Iterator[tuple[int, int]]:
        """``(shard, sample in shard)`` of this rank's samples, in order (no worker split)."""
        return iter_locations(self._ordered(), self.epoch if epoch is None else epoch)

    def state_dict(self, samples_seen: int) -> dict[str, Any]:
        """A small JSON-able state (the same on every rank): save it with the checkpoint.

        ``samples_seen`` is how many samples this rank's training loop consumed in the current
        epoch *in this run* (since iteration started, or since the resume point after a resume).
        """
        return self._ordered().state(self.epoch, samples_seen, self._identity())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved epoch where it stopped, on this layout (any nodes, ranks, workers,
        batch size): every sample of the epoch not consumed before is delivered once."""
        self.epoch = self._ordered().load(state, self._identity(), type(self).__name__)

    # -- iteration -------------------------------------------------------------------------------

    def iter_worker(self, worker: int, num_workers: int) -> Iterator[Any]:
        """The samples worker ``worker`` of ``num_workers`` yields (what ``__iter__`` runs)."""
        if self.order is not None:
            return self._iter_ordered(worker, num_workers)
        return self._iter_listed(worker, num_workers)

    def _iter_ordered(self, worker: int, num_workers: int) -> Iterator[Any]:
        assert self.order is not None
        walk = self.order.rank_order(self.epoch)
        locals_ = worker_locals(walk.count, self.batch_size or 1, worker, num_workers)
        finish = self.finish if self.decoders is not None or self.transform is not None else _identity
        # the node's other workers and ranks may be up to one round of batches behind this one
        behind = walk.ranks * num_workers * (self.batch_size or 1)
        yield from read_walk(walk, locals_, self.reader(), finish, walk.ranks * num_workers, behind)

    def spans(self, worker: int = 0, num_workers: int = 1) -> list[ShardSpan]:
        """With a list of shards: the whole shards worker ``worker`` of ``num_workers`` reads."""
        shards = list(self.shards)
        if self.randomize_shard_order:
            random.Random(f"shards:{self.seed}:{self.epoch}").shuffle(shards)
        return [ShardSpan(shard) for shard in shards[self.rank :: self.world_size][worker::num_workers]]

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


def iter_locations(order: EpochOrder, epoch: int) -> Iterator[tuple[int, int]]:
    """``(shard, sample in shard)`` of this rank's samples of ``epoch``, in order."""
    walk = order.rank_order(epoch)
    for _, shards, samples, _ in walk.locations(np.arange(walk.count, dtype=np.int64)):
        yield from zip(shards.tolist(), samples.tolist())


def read_walk(
    walk: RankOrder,
    locals_: np.ndarray,
    reader: ShardReader,
    finish: Callable[[Sample, int], Any],
    spread: int,
    behind: int = 0,
) -> Iterator[Any]:
    """Samples of ``walk`` at rank-local numbers ``locals_``: shards opened as first needed, the
    next ones prefetched, each released once this walk is ``behind`` node positions past the
    node's last use of it (so the node cache may evict it, but not while a worker that lags
    this one still needs it). ``spread``: node positions between this walk's consecutive samples."""
    done_after: dict[int, int] = {}
    chunks = _chunks(walk, locals_, max(16, min(1024, 4096 // max(1, spread))))
    current = next(chunks, None)
    while current is not None:
        following = next(chunks, None)
        positions, shards, samples, done = current
        upcoming = _first_seen(shards if following is None else np.concatenate((shards, following[1])))
        reader.upcoming(upcoming)
        for step, (now, shard, sample, last) in enumerate(
            zip(positions.tolist(), shards.tolist(), samples.tolist(), done.tolist())
        ):
            done_after[shard] = last
            if step % RELEASE_EVERY == 0:
                reader.release(lambda number: done_after.get(number, now) + behind < now)
            yield finish(reader.sample(shard, sample), shard)
        current = following


def _chunks(walk: RankOrder, locals_: np.ndarray, size: int) -> Iterator[tuple[np.ndarray, ...]]:
    for begin in range(0, len(locals_), size):
        positions = walk.node_positions(locals_[begin : begin + size])
        yield (positions, *walk.locate(positions))


def _first_seen(shards: np.ndarray) -> list[int]:
    _, first = np.unique(shards, return_index=True)
    return shards[np.sort(first)].tolist()


def _identity(sample: Sample, shard: int | None = None) -> Sample:
    return sample
