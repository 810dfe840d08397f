"""StoreDataset: map-style over the objects under a store prefix, in key order."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

from lading.datasets.decode import DecodeOption, decode_field, decoder_for, decoders_for
from lading.stores import open_store
from lading.stores.base import ObjectInfo, Store
from lading.stores.config import StoreConfig
from lading.stores.uri import parse_uri


def _extension(key: str) -> str:
    """A key's extension by WebDataset's rule (after the first dot of the basename), lower-cased."""
    return key.rpartition("/")[2].partition(".")[2].lower()


class StoreDataset:
    """Map-style dataset: object ``i`` under a store prefix, in key order.

    ``decode`` decodes by the key's extension (:mod:`lading.datasets.decode`), then
    ``transform(data, key)`` turns the data into a sample (default: the data). Listing happens
    once, here; each process opens its own connection lazily. When index ``i`` follows ``i-1``,
    the next ``prefetch`` objects are fetched in the background; a batch (``__getitems__``, what
    DataLoader asks for) is fetched on ``prefetch`` threads at once.
    """

    def __init__(self, uri: str, *, transform: Callable[[Any, str], Any] | None = None,
                 config: StoreConfig | None = None, prefetch: int = 8, suffixes: Sequence[str] = (),
                 decode: DecodeOption = None) -> None:
        self.uri = uri
        self.config = config or StoreConfig.from_env()
        self.transform = transform
        self.decoders = decoders_for(decode)
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
        return self._finish(data, self.objects[index].key)

    def _finish(self, data: bytes, key: str) -> Any:
        if self.decoders is not None:
            ext = _extension(key)
            function = decoder_for(self.decoders, ext)
            if function is not None:
                data = decode_field(function, data, ext, key, self.uri)
        return data if self.transform is None else self.transform(data, key)

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
        if self.transform is None and self.decoders is None:
            return results
        return [self._finish(data, self.objects[index].key) for data, index in zip(results, positions)]
