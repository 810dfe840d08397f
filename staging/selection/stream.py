"""Stream objects, in order, into one byte stream: what ``lading cat`` does (SageMaker's Pipe mode).

Two steps, as for sync:

1. :func:`select_stream` decides *which* objects and in *what order*: a prefix (key order), a
   manifest (its order; :mod:`lading.selection.manifest`), a shard list written with braces
   (``s3://b/pets/pets-{000000..000009}.tar``, in expansion order) or a single object; then the
   ``--include``/``--exclude`` globs, this rank's share by sync's sharding rule
   (:mod:`lading.selection.sharding`, order kept) and, optionally, a seeded shuffle.
2. :func:`stream_objects` writes their bytes to a sink in that order. Objects are read as ranged
   GETs of ``part_size`` bytes, each pinned to the version the listing (or a stat) reported, so
   an object replaced mid-stream fails with :class:`ObjectChanged` naming it, never mixed bytes.
   Up to ``workers`` GETs run ahead of the writer, and the parts fetched but not yet written
   never exceed ``max_memory`` bytes (one part at least), so memory stays bounded however large
   the objects and however slow the reader.

Nothing here prints or reads ``os.environ``; errors are the project's exceptions. A sink that
raises (a reader that went away: ``BrokenPipeError``) stops the stream at once.
"""

from __future__ import annotations

import fnmatch
import itertools
import logging
import os
import queue
import re
import stat as stat_mode
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from lading.core.errors import NotFound, ObjectChanged, UsageError, local_error
from lading.selection.manifest import Manifest, keys_under, share_records
from lading.selection.sharding import BALANCES, DISTRIBUTIONS, assign_ranks
from lading.stores.base import ObjectInfo, Store
from lading.stores.config import StoreConfig
from lading.stores.uri import StoreURI, parse_uri

log = logging.getLogger(__name__)

#: Receives the stream's bytes in order; raising stops the stream.
Sink = Callable[[memoryview], None]

_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_MAX_EXPANSION = 1_000_000


@dataclass(frozen=True)
class StreamRequest:
    """What to stream, for which rank, in which order."""

    source: str
    manifest: Manifest | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    distribution: str = "replicated"
    balance: str = "count"
    rank: int = 0
    world_size: int = 1
    shuffle: bool = False
    seed: int = 0
    allow_empty: bool = False

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise UsageError(f"unknown distribution {self.distribution!r}", "use replicated or sharded")
        if self.balance not in BALANCES:
            raise UsageError(f"unknown balance {self.balance!r}", "use count or bytes")
        if not 0 <= self.rank < self.world_size:
            raise UsageError(f"rank {self.rank} is outside 0..{self.world_size - 1}")


@dataclass(frozen=True)
class StreamOptions:
    """How to read: GETs in flight, the size of each ranged GET, and the memory they may hold."""

    workers: int = 16
    part_size: int = 8 << 20
    max_memory: int = 256 << 20

    def __post_init__(self) -> None:
        if self.workers < 1 or self.part_size < 1 or self.max_memory < 1:
            raise UsageError("workers, part size and memory must be at least 1")


@dataclass
class StreamSummary:
    """What was streamed."""

    objects: int = 0
    bytes: int = 0
    seconds: float = 0.0
    most_in_flight: int = 0  # the most GETs that ran at once


# -- which objects, in which order ---------------------------------------------------------------


def expand_braces(text: str) -> list[str]:
    """WebDataset's shard-list notation: ``a-{000..002}.tar`` -> ``a-000.tar a-001.tar a-002.tar``
    (zero-padded as written), ``{train,val}`` -> both; several groups multiply, left to right."""
    match = _BRACES.search(text)
    if match is None:
        return [text]
    body = match.group(1)
    numbers = _RANGE.match(body)
    if numbers:
        first, last = numbers.group(1), numbers.group(2)
        width = len(first) if first.lstrip("-").startswith("0") and len(first) > 1 else 0
        step = 1 if int(last) >= int(first) else -1
        choices = [str(n).zfill(width) for n in range(int(first), int(last) + step, step)]
    elif "," in body:
        choices = body.split(",")
    else:
        raise UsageError(
            f"cannot expand {{{body}}} in {text!r}", "write a range {000000..000099} or alternatives {train,val}"
        )
    head, tail = text[: match.start()], text[match.end() :]
    rest = expand_braces(tail)
    if len(choices) * len(rest) > _MAX_EXPANSION:
        raise UsageError(f"{text!r} expands to more than {_MAX_EXPANSION:,} names")
    return [head + choice + more for choice in choices for more in rest]


def _shard_list(source: str) -> tuple[StoreURI, list[str]]:
    """The store root and the keys of a braced shard list (their common directory is the root)."""
    names = expand_braces(source)
    uris = [parse_uri(name) for name in names]
    first = uris[0]
    if any((uri.scheme, uri.bucket) != (first.scheme, first.bucket) for uri in uris):
        raise UsageError(f"{source!r} expands to several buckets", "stream one bucket at a time")
    common = os.path.commonprefix([uri.prefix for uri in uris])
    root = common[: common.rfind("/") + 1] if "/" in common else ""
    if first.scheme == "file" and not root:
        root = "/"
    keys = [uri.prefix[len(root) :] for uri in uris]
    if any(not key or key.endswith("/") for key in keys):
        raise UsageError(f"{source!r} names a prefix, not objects", "braces in a shard list name objects")
    return StoreURI(first.scheme, first.bucket, root), keys


def open_source(
    source: str,
    config: StoreConfig | None = None,
    manifest: Manifest | None = None,
    snapshot: str | Path | None = None,
    connect: Callable[[Store], None] | None = None,
) -> tuple[Store, str, list[str] | None]:
    """The store to read, its location as a string, and the keys when SOURCE names them itself.

    SOURCE with braces is a shard list; SOURCE not ending in ``/`` names one object when an
    object of that name exists (one HEAD), as ``lading fetch`` decides; otherwise it is a prefix.
    With a manifest or a ``snapshot`` (``lading snapshot``: the objects and versions it recorded),
    SOURCE is always a prefix. ``connect``, when given, is called with each store opened, before
    its first request (the CLI builds the client there, bracketed by
    ``lading.cli.store_options.unused_roots_skipped``); without it a client is built at its first
    request, as everywhere in the library.
    """
    from lading.stores import open_store as open_any

    def open_store(location: StoreURI | str, config: StoreConfig | None, snapshot: str | Path | None = None) -> Store:
        store = open_any(location, config, snapshot=snapshot)
        if connect is not None:
            connect(store)
        return store

    if snapshot is not None:
        store = open_store(source, config, snapshot=snapshot)
        return store, store.url, None
    if manifest is None and _BRACES.search(source):
        root, keys = _shard_list(source)
        return open_store(root, config), str(root), keys
    uri = parse_uri(source)
    if manifest is None:
        parent, name = uri.split_name()
        if name and not (uri.scheme == "file" and _is_snapshot(uri.prefix)):  # a snapshot: the store it pins
            store = open_store(parent, config)
            try:
                store.stat(name)
            except NotFound:
                pass
            else:
                return store, str(parent), [name]
    return open_store(uri, config), str(uri), None


def _is_snapshot(path: str) -> bool:
    from lading.stores.snapshot import is_snapshot

    return is_snapshot(path)


def matches(key: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """sync's filter rule: an include glob matches (or there is none) and no exclude does; ``*``
    also matches ``/``."""
    if include and not any(fnmatch.fnmatchcase(key, pattern) for pattern in include):
        return False
    return not any(fnmatch.fnmatchcase(key, pattern) for pattern in exclude)


def select_stream(
    store: Store, request: StreamRequest, keys: Sequence[str] | None = None, workers: int = 32
) -> Iterable[ObjectInfo]:
    """This rank's objects in stream order (see the module docstring).

    ``keys`` (from :func:`open_source`) or the request's manifest are stat'ed in parallel, in
    their order; otherwise the store is listed (key order). Objects listed without a version
    are stat'ed, so every read can be pinned. A listed prefix without ``--shuffle`` or the
    ``bytes`` balance is returned as an iterator over the listing (the key walk never holds the
    keys; an empty selection is still refused before it is returned); otherwise a list.
    """
    if keys is None and request.manifest is not None:
        keys = keys_under(request.manifest, request.source)
    sharded = request.distribution == "sharded" and request.world_size > 1
    if keys is None and not request.shuffle and not (sharded and request.balance == "bytes"):
        return _walk(store, request)
    if keys is not None:
        keys = list(dict.fromkeys(keys))
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(keys) or 1))) as pool:
            listed = list(pool.map(store.stat, keys))
    else:
        listed = list(store.list())
    kept = [info for info in listed if _kept(info, request)]
    if not kept and not request.allow_empty:
        _refuse_empty(request, len(listed))
    mine = _share(kept, request)
    if request.shuffle:
        import random  # only for --shuffle: it costs start-up otherwise

        random.Random(request.seed).shuffle(mine)
    if any(not info.version for info in mine):  # some servers list no ETag: pin to a stat's
        mine = [info if info.version else store.stat(info.key) for info in mine]
    return mine


def _kept(info: ObjectInfo, request: StreamRequest) -> bool:
    return not (info.key.endswith("/") and info.size == 0) and matches(info.key, request.include, request.exclude)


def _refuse_empty(request: StreamRequest, listed: int) -> None:
    if request.manifest is not None and not request.manifest.entries:
        raise NotFound(
            f"the manifest {request.manifest.origin} is empty: it lists no keys",
            "check the file; --allow-empty accepts an empty stream",
        )
    what = "no objects" if not listed else f"{listed} object(s), none kept by --include/--exclude"
    raise NotFound(
        f"nothing at {request.source}: {what}",
        "check the bucket, prefix and filters (keys are case-sensitive); --allow-empty accepts an empty stream",
    )


def _walk(store: Store, request: StreamRequest) -> Iterator[ObjectInfo]:
    """The listing, filtered and shared (``count``: key i of the kept ones goes to rank
    i mod world size, the listing being in key order), pinned; the first object is found
    before this returns, so an empty selection is refused at once."""
    listed = 0

    def kept() -> Iterator[ObjectInfo]:
        nonlocal listed
        for info in store.list():
            listed += 1
            if _kept(info, request):
                yield info

    objects = kept()
    if request.distribution == "sharded" and request.world_size > 1:
        objects = (info for index, info in enumerate(objects) if index % request.world_size == request.rank)
    first = next(objects, None)
    if first is None:
        if not request.allow_empty:
            _refuse_empty(request, listed)
        return iter(())
    pinned = (info if info.version else store.stat(info.key) for info in itertools.chain([first], objects))
    return pinned


def _share(kept: list[ObjectInfo], request: StreamRequest) -> list[ObjectInfo]:
    """This rank's objects by sync's rule, in stream order."""
    if request.distribution == "replicated" or request.world_size == 1:
        return list(kept)
    if request.manifest is not None and request.manifest.augmented:
        owner = assign_ranks(kept, request.world_size, request.balance)
        mine_by_rule = [info for info in kept if owner[info.key] == request.rank]
        wanted = {
            info.key
            for info in share_records(
                request.manifest,
                request.source,
                kept,
                mine_by_rule,
                request.rank,
                request.world_size,
                request.distribution,
                request.balance,
            )[0]
        }
        return [info for info in kept if info.key in wanted]
    owner = assign_ranks(kept, request.world_size, request.balance)
    return [info for info in kept if owner[info.key] == request.rank]


# -- the bytes -----------------------------------------------------------------------------------


@dataclass
class _Part:
    """One ranged GET: bytes ``[start, end)`` of ``info``; filled in by a worker."""

    info: ObjectInfo
    start: int
    end: int
    done: threading.Event = field(default_factory=threading.Event)
    data: bytes | None = None
    error: BaseException | None = None

    @property
    def size(self) -> int:
        return self.end - self.start


def _parts(objects: Iterable[ObjectInfo], part_size: int, summary: StreamSummary) -> Iterator[_Part]:
    for info in objects:
        if info.size == 0:
            summary.objects += 1  # streamed as nothing, no GET
        for start in range(0, info.size, part_size):
            yield _Part(info, start, min(info.size, start + part_size))


class _Fetchers:
    """Daemon threads that run parts from a queue (a stopped stream leaves no thread to wait for:
    Ctrl-C and a closed pipe end the process at once)."""

    def __init__(self, store: Store, count: int) -> None:
        self.store = store
        self.count = count
        self.tasks: queue.SimpleQueue[_Part | None] = queue.SimpleQueue()
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.threads: list[threading.Thread] = []

    def submit(self, part: _Part) -> None:
        if len(self.threads) < self.count:
            thread = threading.Thread(target=self._run, name=f"lading-cat-{len(self.threads)}", daemon=True)
            thread.start()
            self.threads.append(thread)
        self.tasks.put(part)

    def _run(self) -> None:
        while not self.stopped.is_set():
            part = self.tasks.get()
            if part is None:
                return
            if not self.stopped.is_set():
                self._fetch(part)
            part.done.set()

    def _fetch(self, part: _Part) -> None:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            info = part.info
            data = self.store.read_range(info.key, part.start, part.end, info.version or None)
            if len(data) != part.size:  # the version matched, yet the bytes did not: never pass them on
                raise ObjectChanged(
                    f"{self.store.url.rstrip('/')}/{info.key}: got {len(data)} of {part.size} "
                    f"bytes at offset {part.start} (listed size {info.size})",
                    "the object changed while it was streamed; run again",
                )
            part.data = data
        except BaseException as err:  # handed to the writer, which raises it in stream order
            part.error = err
        finally:
            with self.lock:
                self.in_flight -= 1

    def close(self) -> None:
        self.stopped.set()
        for _ in self.threads:
            self.tasks.put(None)


def stream_objects(
    store: Store, objects: Iterable[ObjectInfo], sink: Sink, options: StreamOptions = StreamOptions()
) -> StreamSummary:
    """Write the objects' bytes to ``sink``, in order, with GETs prefetched (see the module docstring).

    Raises the first failure in stream order (bytes before it were written), or what ``sink``
    raises. Returns counts and the most GETs that ran at once.
    """
    started = time.monotonic()
    summary = StreamSummary()
    pending = _parts(objects, options.part_size, summary)
    ahead_limit = max(1, 4 * options.workers)  # parts queued ahead, whatever their size
    window: deque[_Part] = deque()
    held = 0  # bytes of the parts in the window
    fetchers = _Fetchers(store, options.workers)
    upcoming: _Part | None = next(pending, None)
    try:
        while upcoming is not None or window:
            while (
                upcoming is not None
                and len(window) < ahead_limit
                and (not window or held + upcoming.size <= options.max_memory)
            ):
                window.append(upcoming)
                held += upcoming.size
                fetchers.submit(upcoming)
                upcoming = next(pending, None)
            part = window.popleft()
            part.done.wait()
            if part.error is not None:
                raise part.error
            data, part.data = part.data, None
            held -= part.size
            if data:
                sink(memoryview(data))
            summary.bytes += len(data or b"")
            if part.end == part.info.size:
                summary.objects += 1
    finally:
        fetchers.close()
    summary.seconds = time.monotonic() - started
    summary.most_in_flight = fetchers.most_in_flight
    log.debug(
        "streamed %d object(s), %d bytes in %.2fs; at most %d GETs at once",
        summary.objects,
        summary.bytes,
        summary.seconds,
        summary.most_in_flight,
    )
    return summary


# -- where the bytes go --------------------------------------------------------------------------


def fd_sink(fd: int, name: str = "the stream") -> Sink:
    """A sink writing to a file descriptor (stdout, a pipe); a reader that went away raises
    ``BrokenPipeError``, any other write failure the local error for ``name`` (a full disk
    under a redirected stdout: ``LocalIOError``, exit 6)."""

    def write(chunk: memoryview) -> None:
        view = chunk
        try:
            while view:
                view = view[os.write(fd, view) :]
        except BrokenPipeError:
            raise
        except OSError as err:
            raise local_error(err, f"write {name}") from err

    return write


def make_fifo(path: str | Path) -> Path:
    """Create the named pipe ``path`` (mode 0600) unless it exists; an existing file that is not a
    pipe is a usage error."""
    path = Path(path)
    try:
        if stat_mode.S_ISFIFO(os.stat(path).st_mode):
            return path
        raise UsageError(
            f"{path} exists and is not a named pipe", "give a new path (lading creates the pipe) or remove the file"
        )
    except FileNotFoundError:
        pass
    except OSError as err:
        raise local_error(err, f"use {path} as a named pipe") from err
    try:
        os.mkfifo(path, 0o600)
    except FileExistsError:
        return make_fifo(path)
    except OSError as err:
        raise local_error(err, f"create the named pipe {path}") from err
    return path


def open_fifo(path: str | Path) -> int:
    """Open a named pipe for writing; blocks until a reader opens it (as SageMaker's Pipe mode)."""
    try:
        return os.open(path, os.O_WRONLY)
    except OSError as err:
        raise local_error(err, f"open the named pipe {path}") from err


def release_waiting_reader(path: str | Path) -> None:
    """If a reader is blocked opening the pipe, let it see an empty stream (EOF) instead of waiting
    forever: for a stream that failed before it started."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader, or no pipe


__all__ = [
    "StreamOptions",
    "StreamRequest",
    "StreamSummary",
    "expand_braces",
    "fd_sink",
    "make_fifo",
    "matches",
    "open_fifo",
    "open_source",
    "release_waiting_reader",
    "select_stream",
    "stream_objects",
]
