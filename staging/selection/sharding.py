"""Which objects does a rank get? The one rule shared by ``sync``, ``mount`` and ``hook``.

- ``replicated``: every rank gets every object.
- ``sharded`` with ``balance="count"`` (SageMaker's ShardedByS3Key): sort the keys; key number
  ``i`` (0-based) goes to rank ``i mod world_size``.
- ``sharded`` with ``balance="bytes"``: objects are taken largest first (equal sizes in key
  order) and each goes to the rank with the fewest bytes so far (equal loads: the lowest rank).

Both sharded rules are deterministic functions of the whole object list, so every rank computes
the same assignment independently; the shards are disjoint and their union is the list.
Keys are compared as Python strings (code-point order), so every rank and every store agree.
``lading sync`` applies the same rules to a streamed listing without holding the keys: ``count``
needs a counter over the keys in sorted order, ``bytes`` the sizes in key order
(:func:`owners_by_bytes`, 16 bytes an object); the assignment is the one :func:`assign_ranks` gives.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Sequence, TypeVar

if TYPE_CHECKING:
    import numpy.typing

from lading.core.errors import UsageError
from lading.stores.base import ObjectInfo

DISTRIBUTIONS = ("replicated", "sharded")
BALANCES = ("count", "bytes")

T = TypeVar("T", bound=ObjectInfo)


def assign_ranks(objects: Sequence[ObjectInfo], world_size: int, balance: str = "count") -> dict[str, int]:
    """Map every key to the rank that owns it under the sharded rule."""
    check_balance(world_size, balance)
    ordered = sorted(objects, key=lambda o: o.key)
    if balance == "count":
        return {obj.key: index % world_size for index, obj in enumerate(ordered)}
    owners = owners_by_bytes([obj.size for obj in ordered], world_size)
    return {obj.key: int(owners[index]) for index, obj in enumerate(ordered)}


def check_balance(world_size: int, balance: str) -> None:
    """Refuse a world size below 1 or an unknown balance."""
    if world_size < 1:
        raise UsageError(f"world size must be at least 1, got {world_size}")
    if balance not in BALANCES:
        raise UsageError(f"unknown balance {balance!r}", f"use one of {', '.join(BALANCES)}")


def owners_by_bytes(sizes: Sequence[int], world_size: int) -> numpy.typing.NDArray[numpy.int32]:
    """The ``bytes`` rule over sizes given in key order: the owner of the object at each index.

    Memory: the sizes and owners as flat arrays (16 bytes an object), never the keys, so a
    streamed listing can collect the sizes in one pass and select in a second one.
    """
    import numpy

    sizes_array = numpy.asarray(sizes, dtype=numpy.int64)
    order = numpy.argsort(-sizes_array, kind="stable")  # largest first; equal sizes in key order
    owners = numpy.zeros(len(sizes_array), dtype=numpy.int32)
    loads = [(0, rank) for rank in range(world_size)]  # (bytes so far, rank): a min-heap
    for start in range(0, len(order), 65536):  # a slice at a time: no list of a million ints
        part = order[start : start + 65536]
        ranks = []
        for size in sizes_array[part].tolist():
            load, rank = heapq.heappop(loads)
            ranks.append(rank)
            heapq.heappush(loads, (load + size, rank))
        owners[part] = ranks
    return owners


def select_for_rank(
    objects: Sequence[T],
    rank: int,
    world_size: int,
    distribution: str = "replicated",
    balance: str = "count",
) -> list[T]:
    """The objects ``rank`` of ``world_size`` gets, in ascending key order."""
    if distribution not in DISTRIBUTIONS:
        raise UsageError(f"unknown distribution {distribution!r}", f"use one of {', '.join(DISTRIBUTIONS)}")
    if not 0 <= rank < max(world_size, 1):
        raise UsageError(f"rank {rank} is outside 0..{world_size - 1}")
    ordered = sorted(objects, key=lambda o: o.key)
    if distribution == "replicated" or world_size == 1:
        return ordered
    owner = assign_ranks(ordered, world_size, balance)
    return [obj for obj in ordered if owner[obj.key] == rank]
