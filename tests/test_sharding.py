"""The sharding rule: disjoint shards whose union is the source; count and bytes balance."""

from __future__ import annotations

import random

import pytest
from lading.core.errors import UsageError
from lading.selection.sharding import assign_ranks, select_for_rank
from lading.stores.base import ObjectInfo


def objects(n: int, seed: int = 0) -> list[ObjectInfo]:
    rng = random.Random(seed)
    keys = [f"d{rng.randrange(5)}/k{i:04d}" for i in range(n)]
    rng.shuffle(keys)
    return [ObjectInfo(key, rng.choice([1, 10, 100, 10_000]), "v") for key in keys]


@pytest.mark.parametrize("balance", ["count", "bytes"])
@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_union_is_source_and_shards_disjoint(balance, world):
    objs = objects(101)
    shards = [select_for_rank(objs, r, world, "sharded", balance) for r in range(world)]
    keys = [obj.key for shard in shards for obj in shard]
    assert sorted(keys) == sorted(obj.key for obj in objs)
    assert len(keys) == len(set(keys))
    for shard in shards:
        assert [o.key for o in shard] == sorted(o.key for o in shard)


def test_count_rule_is_i_mod_world_size_over_sorted_keys():
    objs = [ObjectInfo(k, 1, "v") for k in ["c", "a", "e", "b", "d"]]
    assert [o.key for o in select_for_rank(objs, 0, 2, "sharded")] == ["a", "c", "e"]
    assert [o.key for o in select_for_rank(objs, 1, 2, "sharded")] == ["b", "d"]


def test_replicated_gives_everything():
    objs = objects(10)
    assert len(select_for_rank(objs, 1, 3, "replicated")) == 10


def test_bytes_balance_evens_out_skew():
    objs = [ObjectInfo("big", 1000, "v")] + [ObjectInfo(f"s{i:02d}", 100, "v") for i in range(10)]
    by_count = [sum(o.size for o in select_for_rank(objs, r, 2, "sharded", "count")) for r in range(2)]
    by_bytes = [sum(o.size for o in select_for_rank(objs, r, 2, "sharded", "bytes")) for r in range(2)]
    assert max(by_bytes) - min(by_bytes) == 0
    assert max(by_count) - min(by_count) >= 900


def test_bytes_balance_is_deterministic_with_ties():
    objs = [ObjectInfo(f"k{i}", 5, "v") for i in range(6)]
    owner = assign_ranks(objs, 3, "bytes")
    assert owner == assign_ranks(list(reversed(objs)), 3, "bytes")
    assert owner == {"k0": 0, "k1": 1, "k2": 2, "k3": 0, "k4": 1, "k5": 2}


def test_bad_arguments():
    with pytest.raises(UsageError):
        select_for_rank([], 2, 2, "sharded")
    with pytest.raises(UsageError):
        select_for_rank([], 0, 2, "striped")
    with pytest.raises(UsageError):
        assign_ranks([], 2, "weight")
