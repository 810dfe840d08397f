"""Batched reads across stores: one ``read_many`` per store (one hop to the I/O core for obstore stores)."""

from __future__ import annotations

from typing import Sequence

from lading.stores.base import RangeRequest, Store


def read_batch(items: Sequence[tuple[Store, RangeRequest]]) -> list[memoryview]:
    """Each ``(store, request)``'s bytes, in order; the requests to one store go out together."""
    results: list[memoryview] = [memoryview(b"")] * len(items)
    groups: dict[int, tuple[Store, list[int]]] = {}
    for position, (store, _request) in enumerate(items):
        groups.setdefault(id(store), (store, []))[1].append(position)
    for store, positions in groups.values():
        views = store.read_many([items[position][1] for position in positions])
        for position, view in zip(positions, views):
            results[position] = view
    return results


__all__ = ["RangeRequest", "read_batch"]
