"""A packed dataset as the readers see it: its shards (from the wids index) and, when ``lading pack``
wrote one, the offsets file that places every sample (:mod:`lading.pack.offsets`)."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from lading.core.errors import ProblemFound, UsageError
from lading.pack import offsets as offsets_format
from lading.pack.index import parse_index
from lading.stores import open_store
from lading.stores.base import Store
from lading.stores.config import StoreConfig
from lading.stores.process import ProcessLocal
from lading.stores.uri import StoreURI, parse_uri


class _Stores:
    """Stores by (folder, config) in one process (reset in a forked child, like all per-process state)."""

    def __init__(self) -> None:
        self.by_folder: dict[tuple[str, StoreConfig], Store] = {}
        self.lock = threading.Lock()


_STORES: ProcessLocal[_Stores] = ProcessLocal(_Stores)


def store_for(uri: str | StoreURI, config: StoreConfig) -> tuple[Store, str]:
    """The store holding ``uri``'s object (one per folder, process and config: clients are costly
    to build) and the object's key in it."""
    parsed = parse_uri(uri) if isinstance(uri, str) else uri
    parent, name = parsed.split_name()
    if not name:
        raise UsageError(f"{parsed} names a directory, not an object")
    cache_key = (str(parent), config)
    stores = _STORES.get()
    with stores.lock:
        store = stores.by_folder.get(cache_key)
        if store is None:
            store = stores.by_folder[cache_key] = open_store(parent, config)
    return store, name


def read_object(uri: str, config: StoreConfig) -> bytes:
    """A whole (small) object: the index or the offsets file."""
    store, name = store_for(uri, config)
    info = store.stat(name)
    return store.read_range(name, 0, info.size, info.version) if info.size else b""


@dataclass(frozen=True)
class ShardRef:
    """A shard to read: its URI and, when an index gave them, its sample count, the version the
    index recorded (ETag / generation) and its size."""

    uri: str
    nsamples: int | None = None
    etag: str | None = None
    filesize: int | None = None

    @property
    def local(self) -> bool:
        """Whether the shard is a local file (read in place, never cached): a path or ``file://``
        (no URI parse: an index of 10^5 shards asks this of every one)."""
        return "://" not in self.uri or self.uri.startswith("file://")


@dataclass
class DatasetIndex:
    """Shards in index order, where the offsets file is (if any), and an identity for resume."""

    uri: str
    shards: list[ShardRef]
    offsets: ShardRef | None = None
    identity: str = ""
    _table: Any = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # The table can be large: a spawned worker reads it again (from the node cache), a
        # forked one shares the parent's copy.
        return {name: value for name, value in self.__dict__.items() if name != "_table"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._table = None

    @property
    def counts(self) -> list[int]:
        """Samples per shard (an index always has them)."""
        return [shard.nsamples or 0 for shard in self.shards]

    def table(
        self, config: StoreConfig, fetch: Callable[[ShardRef], bytes] | None = None
    ) -> offsets_format.OffsetsTable | None:
        """The offsets table, read on first use (None when the pack wrote none). ``fetch`` reads
        the file (through the node cache); by default it is read from the store."""
        if self._table is None and self.offsets is not None:
            uri = self.offsets.uri
            data = fetch(self.offsets) if fetch is not None else read_object(uri, config)
            table = offsets_format.decode(data, uri)
            listed = [(shard.uri.rpartition("/")[2], shard.nsamples) for shard in self.shards]
            if [(url.rpartition("/")[2], count) for url, count in table.shards] != listed:
                raise ProblemFound(
                    f"{uri} does not describe the shards of {self.uri}",
                    "the dataset was re-packed in place: pack a new --version",
                )
            self._table = table
        return self._table


def _resolve(parent: str, url: str) -> str:
    return url if "://" in url or url.startswith("/") else f"{parent}/{url}"


def load_index(index_uri: str, config: StoreConfig) -> DatasetIndex:
    """Read a ``NAME.index.json`` (wids shard index) and resolve its shard URLs next to it."""
    data = read_object(index_uri, config)
    document = parse_index(data, index_uri)
    parent = str(parse_uri(index_uri).split_name()[0]).rstrip("/")
    shards = []
    for shard in document["shardlist"]:
        etag, size = shard.get("etag"), shard.get("filesize")
        shards.append(
            ShardRef(
                _resolve(parent, shard["url"]),
                shard["nsamples"],
                etag if isinstance(etag, str) else None,
                size if isinstance(size, int) else None,
            )
        )
    block = document.get("lading") if isinstance(document.get("lading"), dict) else {}
    entry = block.get("offsets") if isinstance(block, dict) else None
    offsets = None
    if isinstance(entry, dict) and isinstance(entry.get("url"), str):
        etag, size = entry.get("etag"), entry.get("filesize")
        offsets = ShardRef(
            _resolve(parent, entry["url"]),
            None,
            etag if isinstance(etag, str) else None,
            size if isinstance(size, int) else None,
        )
    # The order of an epoch depends on the sample counts only: a copy (other versions) resumes too.
    identity = hashlib.sha256(repr([(s.uri.rpartition("/")[2], s.nsamples) for s in shards]).encode()).hexdigest()[:16]
    return DatasetIndex(index_uri, shards, offsets, identity)
