"""Which objects does a rank get? The one rule shared by ``sync``, ``mount`` and ``hook``.

- ``replicated``: every rank gets every object.
- ``sharded`` with ``balance="count"`` (SageMaker's ShardedByS3Key): sort the keys; key number
  ``i`` (0-based) goes to rank ``i mod world_size``.
- ``sharded`` with ``balance="bytes"``: objects are taken largest first (equal sizes in key
  order) and each goes to the rank with the fewest bytes so far (equal loads: the lowest rank).

Both sharded rules are deterministic functions of the whole object list, so every rank computes
the same assignment independently; the shards are disjoint and their union is the list.
Keys are compared as Python strings (code-point order), so every rank and every store agree.
"""

from __future__ import annotations

import heapq
from typing import Sequence, TypeVar

from lading.core.errors import UsageError
from lading.stores.base import ObjectInfo

DISTRIBUTIONS = ("replicated", "sharded")
BALANCES = ("count", "bytes")

T = TypeVar("T", bound=ObjectInfo)


def assign_ranks(objects: Sequence[ObjectInfo], world_size: int, balance: str = "count") -> dict[str, int]:
    """Map every key to the rank that owns it under the sharded rule."""
    if world_size < 1:
        raise UsageError(f"world size must be at least 1, got {world_size}")
    if balance not in BALANCES:
        raise UsageError(f"unknown balance {balance!r}", f"use one of {', '.join(BALANCES)}")
    if balance == "count":
        keys = sorted(obj.key for obj in objects)
        return {key: index % world_size for index, key in enumerate(keys)}
    loads = [(0, rank) for rank in range(world_size)]  # (bytes so far, rank): a min-heap
    owner: dict[str, int] = {}
    for obj in sorted(objects, key=lambda o: (-o.size, o.key)):
        load, rank = heapq.heappop(loads)
        owner[obj.key] = rank
        heapq.heappush(loads, (load + obj.size, rank))
    return owner


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
