"""StoreDataset: map-style over the objects under a store prefix, in key order."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

from lading.core.errors import NotFound
from lading.datasets.decode import DecodeOption, decode_field, decoder_for, decoders_for
from lading.stores import open_store, refuse_an_object
from lading.stores.base import ObjectInfo, Store
from lading.stores.batch import RangeRequest, read_batch
from lading.stores.config import StoreConfig
from lading.stores.process import ProcessLocal, control_plane
from lading.stores.uri import parse_uri


def _extension(key: str) -> str:
    """A key's extension by WebDataset's rule (after the first dot of the basename), lower-cased."""
    return key.rpartition("/")[2].partition(".")[2].lower()


class StoreDataset:
    """Map-style dataset: object ``i`` under a store prefix, in key order.

    ``decode`` decodes by the key's extension (:mod:`lading.datasets.decode`), then
    ``transform(data, key)`` turns the data into a sample (default: the data). Listing happens
    once, here, through the SDK (so DataLoader workers forked later can all read through
    obstore); each process opens its own connection lazily. When index ``i`` follows ``i-1``, the
    next ``prefetch`` objects are fetched in the background; a batch (``__getitems__``, what
    DataLoader asks for) is one call to the I/O core, its GETs concurrent. Nothing under the
    prefix (or none with ``suffixes``) raises NotFound, as ``lading sync`` exits 3.
    """

    def __init__(
        self,
        uri: str,
        *,
        transform: Callable[[Any, str], Any] | None = None,
        config: StoreConfig | None = None,
        prefetch: int = 8,
        suffixes: Sequence[str] = (),
        decode: DecodeOption = None,
    ) -> None:
        self.uri = uri
        self.config = config or StoreConfig.from_env()
        self.transform = transform
        self.decoders = decoders_for(decode)
        self.prefetch = prefetch
        with control_plane():
            store = open_store(parse_uri(uri), self.config)
            self.objects: list[ObjectInfo] = sorted(
                (
                    info
                    for info in store.list()
                    if not info.key.endswith("/") and (not suffixes or info.key.endswith(tuple(suffixes)))
                ),
                key=lambda info: info.key,
            )
        if not self.objects:  # a mistyped prefix, as `lading sync` says with exit 3
            with control_plane():
                refuse_an_object(store)  # a URI that names one object: UsageError
            matching = f" ending in {', '.join(suffixes)}" if suffixes else ""
            raise NotFound(
                f"nothing at {store.url}: no objects{matching} under this prefix",
                "check the bucket and prefix (keys are case-sensitive)",
            )
        self._local: ProcessLocal[_Local] = ProcessLocal(_Local)

    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name != "_local"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = ProcessLocal(_Local)

    def __len__(self) -> int:
        return len(self.objects)

    def key(self, index: int) -> str:
        """The key of object ``index``."""
        return self.objects[index].key

    def _open(self) -> _Local:
        local = self._local.get()
        if local.store is None:
            local.store = open_store(parse_uri(self.uri), self.config)
        return local

    def _fetch(self, index: int) -> bytes:
        return self._fetch_many([index])[0]

    def _fetch_many(self, indices: Sequence[int]) -> list[bytes]:
        """Whole objects, one batched read (zero-copy until the copy a sample needs to be pickled
        into the training process)."""
        store = self._open().store
        assert store is not None
        wanted = [(position, self.objects[index]) for position, index in enumerate(indices)]
        requests = [(store, RangeRequest(info.key, 0, None, info.version or None)) for _, info in wanted if info.size]
        views = iter(read_batch(requests))
        return [bytes(next(views)) if info.size else b"" for _, info in wanted]

    def _schedule_ahead(self, local: "_Local", index: int) -> None:
        if local.pool is None:
            local.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lading-ds")
        upcoming = [
            ahead
            for ahead in range(index + 1, min(index + 1 + self.prefetch, len(self.objects)))
            if ahead not in local.ahead
        ]
        if upcoming:
            batch = local.pool.submit(self._fetch_many, upcoming)
            for slot, ahead in enumerate(upcoming):
                local.ahead[ahead] = _Slot(batch, slot)

    def __getitem__(self, index: int) -> Any:
        if index < 0:
            index += len(self.objects)
        if not 0 <= index < len(self.objects):
            raise IndexError(f"index {index} out of range for {len(self.objects)} objects")
        local = self._open()
        with local.lock:
            slot = local.ahead.pop(index, None)
            sequential = index == local.last + 1
            local.last = index
            if not sequential:
                for stale in local.ahead.values():
                    stale.batch.cancel()
                local.ahead.clear()
            elif self.prefetch > 0:
                self._schedule_ahead(local, index)
        data = slot.result() if slot is not None else self._fetch(index)
        return self._finish(data, self.objects[index].key)

    def _finish(self, data: bytes, key: str) -> Any:
        if self.decoders is not None:
            ext = _extension(key)
            function = decoder_for(self.decoders, ext)
            if function is not None:
                data = decode_field(function, data, ext, key, self.uri)
        return data if self.transform is None else self.transform(data, key)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch of objects in one call to the I/O core, its GETs concurrent (DataLoader calls
        this for each batch)."""
        positions = [index + len(self.objects) if index < 0 else index for index in indices]
        for index in positions:
            if not 0 <= index < len(self.objects):
                raise IndexError(f"index {index} out of range for {len(self.objects)} objects")
        results = self._fetch_many(positions)
        if self.transform is None and self.decoders is None:
            return results
        return [self._finish(data, self.objects[index].key) for data, index in zip(results, positions)]


class _Slot:
    """One object of a prefetched batch."""

    def __init__(self, batch: "Future[list[bytes]]", slot: int) -> None:
        self.batch, self.slot = batch, slot

    def result(self) -> bytes:
        """The object's bytes (waits for its batch)."""
        return self.batch.result()[self.slot]


class _Local:
    """What one process keeps: its store, the prefetch thread and what it fetched ahead."""

    def __init__(self) -> None:
        self.store: Store | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.ahead: dict[int, _Slot] = {}
        self.last = -2
        self.lock = threading.Lock()
