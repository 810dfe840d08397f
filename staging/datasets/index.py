"""A packed dataset as the readers see it: its shards (from the wids index) and, when ``lading pack``
wrote one, the offsets file that places every sample (:mod:`lading.pack.offsets`)."""

from __future__ import annotations

import hashlib
import itertools
import threading
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, overload

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
    index recorded (ETag / generation), its size and its CRC32C (base64, big-endian)."""

    uri: str
    nsamples: int | None = None
    etag: str | None = None
    filesize: int | None = None
    crc32c: str | None = None

    @property
    def local(self) -> bool:
        """Whether the shard is a local file (read in place, never cached): a path or ``file://``
        (no URI parse: an index of 10^5 shards asks this of every one)."""
        return "://" not in self.uri or self.uri.startswith("file://")


class PackedStrings(Sequence[str]):
    """Strings (``None`` allowed) packed into one: no object per string, and the many small ones
    a JSON parse made (between its freed dicts) can go, so their memory is returned. Plain
    arrays, no numpy: the map-style datasets never import it for their index."""

    def __init__(self, strings: Sequence[str | None]) -> None:
        if any(text is None for text in strings):
            self.present = array("b", (text is not None for text in strings))
            strings = [text or "" for text in strings]
        else:
            self.present = array("b", b"\x01" * len(strings))
        self.bounds = array("q", itertools.accumulate(map(len, strings), initial=0))  # type: ignore[arg-type]
        self.text = "".join(strings)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.present)

    def __iter__(self) -> Iterator[Any]:
        bounds, text = self.bounds.tolist(), self.text
        for number, present in enumerate(self.present.tolist()):
            yield text[bounds[number] : bounds[number + 1]] if present else None

    @overload
    def __getitem__(self, number: int) -> str: ...

    @overload
    def __getitem__(self, number: slice) -> list[str]: ...

    def __getitem__(self, number: int | slice) -> Any:
        if isinstance(number, slice):
            return [self[i] for i in range(*number.indices(len(self)))]
        if not self.present[number]:
            return None
        return self.text[int(self.bounds[number]) : int(self.bounds[number + 1])]


class ShardList(Sequence[ShardRef]):
    """An index's shards in index order, kept as the index's URLs, ETags and CRC32Cs (packed) and
    arrays of counts and sizes: an index of 10^5 shards makes no object per shard until one is
    asked for. ``etags`` or ``crc32cs`` is None when the index has none (CRC32Cs: packed before
    lading recorded them)."""

    def __init__(
        self,
        parent: str,
        urls: Sequence[str],
        nsamples: Sequence[int],
        filesizes: Sequence[int],
        etags: Sequence[str | None] | None,
        crc32cs: Sequence[str | None] | None = None,
    ) -> None:
        self.parent = parent
        self.urls = urls if isinstance(urls, PackedStrings) else PackedStrings(urls)
        self.etags = _packed(etags)
        self.crc32cs = _packed(crc32cs)
        self.nsamples = array("q", nsamples)  # samples per shard
        self.filesizes = array("q", filesizes)  # bytes per shard, -1 where the index gave none

    def __len__(self) -> int:
        return len(self.urls)

    @overload
    def __getitem__(self, number: int) -> ShardRef: ...

    @overload
    def __getitem__(self, number: slice) -> list[ShardRef]: ...

    def __getitem__(self, number: int | slice) -> ShardRef | list[ShardRef]:
        if isinstance(number, slice):
            return [self[i] for i in range(*number.indices(len(self)))]
        etag = self.etags[number] if self.etags is not None else None  # a str or None
        crc32c = self.crc32cs[number] if self.crc32cs is not None else None
        size = int(self.filesizes[number])
        return ShardRef(
            _resolve(self.parent, self.urls[number]),
            int(self.nsamples[number]),
            etag if isinstance(etag, str) else None,
            size if size >= 0 else None,
            crc32c if isinstance(crc32c, str) else None,
        )

    def __iter__(self) -> Iterator[ShardRef]:
        return (self[number] for number in range(len(self)))

    def names(self) -> list[str]:
        """Each shard's file name."""
        return [url.rpartition("/")[2] for url in self.urls]

    def sizes(self) -> array[int] | None:
        """Bytes per shard, or None when the index lacks any."""
        return None if min(self.filesizes, default=0) < 0 else self.filesizes

    def all_local(self) -> bool:
        """Whether every shard is a local file (see :attr:`ShardRef.local`)."""
        parent_local = ShardRef(self.parent).local
        if parent_local and "://" not in self.urls.text:
            return True  # every URL is a path, under a local folder or absolute
        for url in self.urls:
            if "://" in url:
                if not url.startswith("file://"):
                    return False
            elif not parent_local and not url.startswith("/"):
                return False
        return True


def _packed(strings: Sequence[str | None] | None) -> PackedStrings | None:
    return strings if strings is None or isinstance(strings, PackedStrings) else PackedStrings(strings)


def _identity(names: list[str], counts: list[int]) -> str:
    """What a resume state checks: the shards' names and sample counts."""
    return hashlib.sha256(repr(list(zip(names, counts))).encode()).hexdigest()[:16]


@dataclass
class DatasetIndex:
    """Shards in index order, where the offsets file is (if any), and an identity for resume."""

    uri: str
    shards: ShardList
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
    def counts(self) -> array[int]:
        """Samples per shard (an index always has them)."""
        return self.shards.nsamples

    def table(
        self, config: StoreConfig, fetch: Callable[[ShardRef], bytes] | None = None
    ) -> offsets_format.OffsetsTable | None:
        """The offsets table, read on first use (None when the pack wrote none). ``fetch`` reads
        the file (through the node cache); by default it is read from the store."""
        if self._table is None and self.offsets is not None:
            uri = self.offsets.uri
            data = fetch(self.offsets) if fetch is not None else read_object(uri, config)
            table = offsets_format.decode(data, uri)
            listed = list(zip(self.shards.names(), self.shards.nsamples.tolist()))
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
    del data
    parent = str(parse_uri(index_uri).split_name()[0]).rstrip("/")
    listed = document.pop("shardlist")
    urls = [shard["url"] for shard in listed]
    counts = [shard["nsamples"] for shard in listed]
    sizes = _sizes([shard.get("filesize") for shard in listed])
    etags = _strings(listed, "etag")
    crc32cs = _strings(listed, "crc32c")
    del listed
    shards = ShardList(parent, urls, counts, sizes, etags, crc32cs)
    identity = _identity([url.rpartition("/")[2] for url in urls], counts)
    del urls, etags, crc32cs, counts
    block = document.get("lading") if isinstance(document.get("lading"), dict) else {}
    entry = block.get("offsets") if isinstance(block, dict) else None
    offsets = None
    if isinstance(entry, dict) and isinstance(entry.get("url"), str):
        etag, size, crc32c = entry.get("etag"), entry.get("filesize"), entry.get("crc32c")
        offsets = ShardRef(
            _resolve(parent, entry["url"]),
            None,
            etag if isinstance(etag, str) else None,
            size if isinstance(size, int) else None,
            crc32c if isinstance(crc32c, str) else None,
        )
    # The order of an epoch depends on the sample counts only: a copy (other versions) resumes too.
    return DatasetIndex(index_uri, shards, offsets, identity)


def _strings(listed: list[dict[str, Any]], field: str) -> list[str | None] | None:
    """A string field of every shard (None where one is missing or not a string), or None when
    no shard has it."""
    values = [value if isinstance(value := shard.get(field), str) else None for shard in listed]
    return values if any(value is not None for value in values) else None


def _sizes(values: list[Any]) -> list[int]:
    """Shard sizes from the index, -1 where one is missing or not a size."""
    return [v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else -1 for v in values]
