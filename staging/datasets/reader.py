"""Reading samples out of whole shards: local files in place, remote shards through the node cache.

One :class:`ShardReader` per dataset and process. It keeps a few shards mapped (least recently
used beyond ``keep_open`` are released, so eviction may take them), downloads up to ``prefetch``
of the next shards of its order on background threads (a prefetched shard stays mapped and
locked until it is read, so eviction cannot take it in between), and finds a sample's bytes through the
offsets file when the pack wrote one, else through the shard's tar headers (read once per shard
and process, from the mapped file). A cached shard's samples are read with ``pread``; the cached
offsets file stays in use while the reader lives, so eviction never takes it from under the
next epoch's processes.

Prefetch deals the node's downloads between its processes: a reader looks up to ``ahead``
shards past the one it opens (one block) and claims, without waiting, the next ones that the
node cache neither holds nor is downloading for another process (:meth:`NodeCache.claim`).
DataLoader workers of a rank read the same shards (batches are dealt round-robin from one
order), so instead of racing for the same next shards, each downloads its own: a node has up
to (processes x ``prefetch``) distinct downloads in flight, within one block ahead, and each
shard is downloaded once. A shard another process is fetching is opened (waiting for it) when
first read; shards already cached are opened then too, with no thread involved.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

from lading.core.errors import NotFound, ObjectChanged, ProblemFound
from lading.datasets.cache import CachedShard, FetchClaim, NodeCache, ShardSource, map_file
from lading.datasets.index import DatasetIndex, ShardRef, store_for
from lading.pack.offsets import OffsetsTable
from lading.pack.tarread import TarFormatError, iter_member_spans
from lading.stores.config import StoreConfig
from lading.stores.uri import parse_uri

log = logging.getLogger(__name__)

Sample = dict[str, Any]
#: a scanned shard: per sample, its key and ``(ext, offset, size)`` per member
Layout = list[tuple[str, tuple[tuple[str, int, int], ...]]]


def scan_layout(buffer: Any, where: str) -> Layout:
    """Samples of a tar shard in memory, grouped as WebDataset readers group them."""
    layout: Layout = []
    key: str | None = None
    members: list[tuple[str, int, int]] = []
    try:
        for name, offset, size in iter_member_spans(buffer):
            directory, slash, base = name.rpartition("/")
            stem, dot, ext = base.partition(".")
            if not dot or not stem:
                continue  # no key: WebDataset readers skip such members too
            sample_key = directory + slash + stem
            if sample_key != key:
                if key is not None:
                    layout.append((key, tuple(members)))
                key, members = sample_key, []
            members.append((ext.lower(), offset, size))
    except TarFormatError as err:
        raise ProblemFound(f"{where} is not a readable tar shard: {err}") from err
    if key is not None:
        layout.append((key, tuple(members)))
    return layout


def _recorded_size(ref: ShardRef) -> int | None:
    """The size the index recorded for ``ref``: its ``filesize``, else the size part of a local
    ``mtime-size`` version tag."""
    if ref.filesize is not None:
        return ref.filesize
    mtime, dash, size = (ref.etag or "").partition("-")
    return int(size) if dash and mtime.isdigit() and size.isdigit() else None


def map_local(ref: ShardRef) -> Any:
    """A local shard mapped in place, refused when its size is not the one its index recorded
    (a truncated or replaced file would otherwise read as empty or wrong samples). Only the
    size is compared: copying a pack (``cp -r``) changes the files' times, not their sizes."""
    path = Path(parse_uri(ref.uri).prefix)
    try:
        buffer = map_file(path)
    except FileNotFoundError:
        raise NotFound(f"shard not found: {path}") from None
    expected, size = _recorded_size(ref), len(buffer)
    if expected is not None and size != expected:
        close = getattr(buffer, "close", None)
        if close is not None:
            close()
        raise ObjectChanged(
            f"{path} has {size} bytes, its index says {expected}",
            "the shard was truncated or replaced after packing: re-pack the dataset",
        )
    return buffer


class OpenShard:
    """A shard's bytes (mapped) and how to find a sample in them."""

    def __init__(
        self,
        number: int,
        buffer: Any,
        closer: CachedShard | None,
        table: OffsetsTable | None,
        base: int,
        layout: Layout | None,
    ) -> None:
        self.number, self.buffer, self._closer = number, buffer, closer
        self.table, self.base, self.layout = table, base, layout
        self._file = None if closer is None else closer.file  # a cached shard: read with pread

    def sample(self, index: int) -> Sample:
        """Sample ``index`` of this shard: ``{"__key__": key, ext: bytes, ...}``."""
        read = self._read
        table = self.table
        if table is None:
            key, members = self.layout[index]  # type: ignore[index]
            sample: Sample = {"__key__": key}
            for ext, offset, size in members:
                sample[ext] = read(offset, size)
            return sample
        number = self.base + index
        sample = {"__key__": table.key(number)}
        exts, ext_of, offsets, sizes = table.exts, table.member_ext, table.member_offset, table.member_size
        for member in range(table.sample_members[number], table.sample_members[number + 1]):
            sample[exts[ext_of[member]]] = read(offsets[member], sizes[member])
        return sample

    def _read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset``: a local shard's from its mapping; a cached shard's with
        ``pread`` (one copy without page faults on a fresh mapping, and without the GIL, so the
        process's download threads write on meanwhile; bench/RESULTS.md, session 8)."""
        if self._file is None:
            return self.buffer[offset : offset + size]
        data = os.pread(self._file, size, offset)
        if len(data) != size:
            raise ProblemFound(
                f"shard {self.number}: {size} bytes at {offset} reach past the end of its cached file",
                "the shard was replaced after packing: re-pack the dataset",
            )
        return data

    def close(self) -> None:
        """Release the shard (its cache lock)."""
        self._file = None
        if self._closer is not None:
            self._closer.close()
            self._closer = None


class ShardReader:
    """Samples by (shard, sample) for one dataset in one process (see the module docstring)."""

    def __init__(
        self,
        shards: Sequence[ShardRef],
        index: DatasetIndex | None,
        config: StoreConfig,
        cache: Callable[[], NodeCache],
        prefetch: int = 2,
        keep_open: int = 4,
        ahead: int | None = None,
    ) -> None:
        self.shards, self.index, self.config = shards, index, config
        self._cache_factory = cache
        self._cache: NodeCache | None = None
        self.prefetch = prefetch
        self.ahead = max(prefetch, ahead or 0)
        self.keep_open = max(1, keep_open)
        self._open: OrderedDict[int, OpenShard] = OrderedDict()
        self._upcoming: dict[int, int] = {}
        self._order: list[int] = []
        self._warming: dict[int, Future[CachedShard]] = {}
        self._sources: dict[int, ShardSource] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._stated: dict[str, tuple[str, int]] = {}
        self._held: CachedShard | None = None  # the cached offsets file: in use while this reader lives

    # -- sources ---------------------------------------------------------------------------------

    def cache(self) -> NodeCache:
        """The node cache (created, and its root checked, on first remote shard)."""
        if self._cache is None:
            self._cache = self._cache_factory()
        return self._cache

    def source(self, number: int) -> ShardSource:
        """Where shard ``number`` comes from, with the version and size the index recorded."""
        source = self._sources.get(number)
        if source is None:
            source = self._sources[number] = self.source_of(self.shards[number])
        return source

    def source_of(self, ref: ShardRef) -> ShardSource:
        """Where ``ref`` comes from, with the version and size the index recorded. A shard given
        without them (a bare list of shards) is stat'ed once per process, so a cached copy is
        reused only at the object's current version."""
        config = self.config
        key = parse_uri(ref.uri).split_name()[1]

        def store() -> Any:
            return store_for(ref.uri, config)[0]

        version, size = ref.etag, ref.filesize
        if version is None:
            with self._lock:
                known = self._stated.get(ref.uri)
            if known is None:
                info = store().stat(key)
                known = (info.version, info.size)
                with self._lock:
                    self._stated[ref.uri] = known
            version, size = known
        return ShardSource(ref.uri, store, key, version, size, ref.crc32c)

    def table(self) -> OffsetsTable | None:
        """The dataset's offsets table (read through the node cache), if the pack wrote one."""
        if self.index is None:
            return None
        return self.index.table(self.config, self.fetch_whole)

    def fetch_whole(self, ref: ShardRef) -> bytes:
        """A whole object of the dataset (the offsets file), through the node cache when remote.
        The cached copy stays in use (its shared lock held, so never evicted) until :meth:`close`:
        every process that reads the dataset needs it at its start (the DataLoader workers of
        each epoch), and it would otherwise be the first file evicted, read once and never again."""
        if ref.local:
            try:
                return Path(parse_uri(ref.uri).prefix).read_bytes()
            except FileNotFoundError:
                raise NotFound(f"not found: {ref.uri}") from None
        cached = self.cache().open(self.source_of(ref))
        try:
            data = bytes(cached.buffer)
        except BaseException:
            cached.close()
            raise
        cached.unmap()  # the bytes are copied: keep the lock only
        if self._held is not None:
            self._held.close()
        self._held = cached
        return data

    def _map(self, number: int) -> tuple[Any, CachedShard | None]:
        ref = self.shards[number]
        if ref.local:
            return map_local(ref), None
        warming = self._warming.pop(number, None)
        if warming is not None:
            try:
                cached = warming.result()
                return cached.buffer, cached
            except Exception:  # noqa: BLE001 - the prefetch failed: open again, and raise from here
                pass
        cached = self.cache().open(self.source(number))
        return cached.buffer, cached

    # -- open shards -----------------------------------------------------------------------------

    def open(self, number: int) -> OpenShard:
        """Shard ``number``, mapped (downloaded into the node cache first when remote)."""
        shard = self._open.get(number)
        if shard is not None:
            self._open.move_to_end(number)
            return shard
        table = self.table()  # first: found in the cache before this process's downloads evict
        self._warm_after(number)
        buffer, closer = self._map(number)
        ref = self.shards[number]
        if table is not None:
            shard = OpenShard(number, buffer, closer, table, table.shard_samples[number], None)
        else:
            layout = scan_layout(buffer, ref.uri)
            if ref.nsamples is not None and len(layout) != ref.nsamples:
                if closer is not None:
                    closer.close()
                raise ProblemFound(
                    f"{ref.uri} holds {len(layout)} samples, its index says {ref.nsamples}",
                    "the shard was replaced after packing: re-pack the dataset",
                )
            shard = OpenShard(number, buffer, closer, None, 0, layout)
        self._open[number] = shard
        while len(self._open) > self.keep_open:
            self._open.popitem(last=False)[1].close()
        return shard

    def release(self, done: Callable[[int], bool]) -> None:
        """Close the open shards for which ``done(number)`` is true (eviction may take them)."""
        for number in [number for number in self._open if done(number)]:
            self._open.pop(number).close()

    def sample(self, number: int, index: int) -> Sample:
        """Sample ``index`` of shard ``number``."""
        shard = self._open.get(number)
        if shard is None:
            shard = self.open(number)
        return shard.sample(index)

    # -- prefetch --------------------------------------------------------------------------------

    def upcoming(self, order: Sequence[int]) -> None:
        """The shards the iteration will need, in order: the next ones are fetched ahead."""
        self._order = list(order)
        self._upcoming = {number: slot for slot, number in enumerate(self._order)}
        for number in [number for number in self._warming if number not in self._upcoming]:
            self._warming.pop(number).add_done_callback(_close_prefetched)  # no longer on the way

    def _warm_after(self, number: int) -> None:
        """Claim and start the next downloads past shard ``number`` (module docstring)."""
        if self.prefetch <= 0 or not self._order:
            return
        slot = self._upcoming.get(number)
        if slot is None:
            return
        for ahead in self._order[slot + 1 : slot + 1 + self.ahead]:
            if len(self._warming) >= self.prefetch:
                return
            if ahead in self._open or ahead in self._warming or self.shards[ahead].local:
                continue
            source = self.source(ahead)
            cache = self.cache()
            if cache.holds(source.uri):
                continue  # opened when first read: a thread would only open it twice
            claim = cache.claim(source)
            if claim is None:
                continue  # another process of the node is downloading it
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.prefetch, thread_name_prefix="lading-prefetch")
            warming = self._pool.submit(self._warm, claim)
            warming.add_done_callback(_release_claim(claim))  # also when cancelled before it ran
            self._warming[ahead] = warming

    def _warm(self, claim: FetchClaim) -> CachedShard:
        try:
            return self.cache().fetch(claim)
        except Exception as err:
            log.debug("prefetching %s failed: %s", claim.source.uri, err)
            raise

    def close(self) -> None:
        """Release every open shard and stop prefetching."""
        for shard in self._open.values():
            shard.close()
        self._open.clear()
        if self._held is not None:
            self._held.close()
            self._held = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        for warming in self._warming.values():
            warming.add_done_callback(_close_prefetched)
        self._warming.clear()


def _release_claim(claim: FetchClaim) -> Callable[[Future[CachedShard]], None]:
    """A done-callback giving up ``claim`` (a no-op once :meth:`NodeCache.fetch` spent it)."""

    def release(_: Future[CachedShard]) -> None:
        claim.release()

    return release


def _close_prefetched(warming: Future[CachedShard]) -> None:
    """Release a prefetched shard nobody read (its download finished after :meth:`ShardReader.close`)."""
    if not warming.cancelled() and warming.exception() is None:
        warming.result().close()
