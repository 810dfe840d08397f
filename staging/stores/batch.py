"""Batched reads across stores: one call per store (one hop to the I/O core for obstore stores)."""

from __future__ import annotations

from typing import Sequence

from lading.stores.base import Store
from lading.stores.obstore_reads import RangeRequest


def read_batch(items: Sequence[tuple[Store, RangeRequest]]) -> list[memoryview]:
    """Each ``(store, request)``'s bytes, in order. Requests to one store go out together
    (concurrently, where the store has ``read_many``); other stores read range by range."""
    results: list[memoryview | None] = [None] * len(items)
    groups: dict[int, tuple[Store, list[int]]] = {}
    for position, (store, _request) in enumerate(items):
        groups.setdefault(id(store), (store, []))[1].append(position)
    for store, positions in groups.values():
        requests = [items[position][1] for position in positions]
        read_many = getattr(store, "read_many", None)
        if read_many is not None:
            views = read_many(requests)
        else:
            views = [memoryview(_read_one(store, request)) for request in requests]
        for position, view in zip(positions, views):
            results[position] = view
    return results  # type: ignore[return-value]


def _read_one(store: Store, request: RangeRequest) -> bytes:
    if request.end is None:
        size = store.stat(request.key).size
        return store.read_range(request.key, request.start, size, request.version)
    return store.read_range(request.key, request.start, request.end, request.version)


__all__ = ["RangeRequest", "read_batch"]
