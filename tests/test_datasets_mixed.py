"""MixedDataset: proportions within tolerance, reproducible, a new interleave per epoch, and exact
elastic resume like ShardDataset (real DataLoaders with workers)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from lading.core.errors import UsageError
from lading.datasets import MixedDataset, ShardDataset
from lading.datasets.mixed import MixOrder, apportion
from lading.pack import PackOptions, plan_pack, run_pack

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def pack(root, name: str, count: int) -> str:
    source = root / f"{name}-src"
    source.mkdir()
    for i in range(count):
        (source / f"{name}{i:04d}.txt").write_text(f"{name} {i}")
    plan = plan_pack(str(source), str(root / name), PackOptions(name, shard_size=4_000))
    run_pack(plan, str(source), str(root / name))
    return str(root / name / f"{name}.index.json")


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> tuple[str, str, str]:
    root = tmp_path_factory.mktemp("mixed")
    return pack(root, "big", 300), pack(root, "mid", 120), pack(root, "tiny", 17)


def mix(indexes, **options):
    big, mid, tiny = indexes
    children = [
        ShardDataset(big, shuffle_buffer=32, seed=1, randomize_shard_order=True),
        ShardDataset(mid, shuffle_buffer=8, seed=2),
        ShardDataset(tiny, seed=3),
    ]
    return MixedDataset(children, **{"weights": [0.5, 0.3, 0.2], "seed": 9, "samples_per_epoch": 2000, **options})


def source_of(key: str) -> str:
    return key.rstrip("0123456789")


def test_proportions_within_tolerance_and_reproducible(indexes):
    keys = [s["__key__"] for s in mix(indexes)]
    counts = Counter(source_of(key) for key in keys)
    assert len(keys) == 2000
    for name, weight in (("big", 0.5), ("mid", 0.3), ("tiny", 0.2)):
        assert abs(counts[name] / 2000 - weight) < 0.01, counts
    window = Counter(source_of(key) for key in keys[:500])  # the mix holds in any stretch
    assert abs(window["tiny"] / 500 - 0.2) < 0.05
    assert keys == [s["__key__"] for s in mix(indexes)], "same seed, same mix"
    # each dataset is read through its own order: tiny (17 samples, 400 draws) repeats whole passes
    tiny = [key for key in keys if source_of(key) == "tiny"]
    assert all(sorted(tiny[i : i + 17]) == sorted(tiny[:17]) for i in range(0, 17 * 23, 17))
    big = [key for key in keys if source_of(key) == "big"]
    assert len(big) == 1000 and len(set(big[:300])) == 300  # a whole pass over big, then the next


def test_set_epoch_and_seed_change_the_mix(indexes):
    dataset = mix(indexes)
    first = [s["__key__"] for s in dataset]
    dataset.set_epoch(1)
    second = [s["__key__"] for s in dataset]
    assert first != second
    other_seed = [s["__key__"] for s in mix(indexes, seed=10)]
    assert other_seed != first
    # epoch 1 continues each dataset where epoch 0 left it (a big dataset is covered over epochs)
    big_first = [k for k in first if source_of(k) == "big"]
    big_second = [k for k in second if source_of(k) == "big"]
    assert len(set(big_first[:300])) == 300 and set(big_second) <= set(big_first)


def keys_of(batch):
    return [sample["__key__"] for sample in batch]


def node_mix(indexes, rank: int, world: int, per_node: int, **options):
    big, mid, tiny = indexes
    slot = {"rank": rank, "world_size": world, "local_world_size": per_node}
    children = [
        ShardDataset(big, shuffle_buffer=32, seed=1, randomize_shard_order=True, shuffle_block=2, **slot),
        ShardDataset(mid, shuffle_buffer=8, seed=2, **slot),
        ShardDataset(tiny, seed=3, **slot),
    ]
    return MixedDataset(children, weights=[0.5, 0.3, 0.2], seed=9, samples_per_epoch=400, **slot, **options)


def shard_of(index: str) -> dict[str, int]:
    """Each key's shard number in the index."""
    from lading.datasets import load_index
    from lading.datasets.shards import iter_shard
    from lading.stores import StoreConfig

    found = {}
    for number, ref in enumerate(load_index(index, StoreConfig.from_env()).shards):
        for sample in iter_shard(ref, StoreConfig.from_env()):
            found[sample["__key__"]] = number
    return found


@pytest.mark.parametrize("new_nodes", [2, 3])
def test_resume_from_four_nodes_continues_every_dataset_exactly(indexes, new_nodes):
    torch_data = pytest.importorskip("torch.utils.data")
    before, states, node_keys = [], [], {}
    for rank in range(8):  # 4 nodes of 2 ranks, 7 batches of 5 each, DataLoaders with 2 workers
        dataset = node_mix(indexes, rank, 8, 2, batch_size=5)
        loader = torch_data.DataLoader(
            dataset, batch_size=5, num_workers=2, collate_fn=keys_of, multiprocessing_context="fork"
        )
        keys = [key for batch in list(loader)[:7] for key in batch]
        before.append(keys)
        node_keys.setdefault(rank // 2, []).extend(keys)
        states.append(json.loads(json.dumps(dataset.state_dict(len(keys)))))
    assert all(state == states[0] for state in states) and states[0]["left"] == 400 - 8 * 35
    assert len(json.dumps(states[0])) < 4000
    after = []
    for rank in range(new_nodes):  # one rank per node, 3 workers, another batch size
        dataset = node_mix(indexes, rank, new_nodes, 1, batch_size=4)
        dataset.load_state_dict(states[0])
        assert len(dataset) == -(-120 // new_nodes)
        loader = torch_data.DataLoader(
            dataset, batch_size=4, num_workers=3, collate_fn=keys_of, multiprocessing_context="fork"
        )
        after.append([key for batch in loader for key in batch])
        node_keys.setdefault(10 + rank, []).extend(after[-1])
    drawn = Counter(k for part in before + after for k in part)
    assert sum(drawn.values()) == 280 + new_nodes * -(-120 // new_nodes)
    big = Counter({key: count for key, count in drawn.items() if source_of(key) == "big"})
    assert sum(big.values()) < 300 and max(big.values()) == 1, "big (within its first pass): no sample twice"
    # node locality: before the resume, the four nodes read disjoint shards of big (edges aside)
    shards = shard_of(indexes[0])
    sets = [{shards[key] for key in node_keys[node] if source_of(key) == "big"} for node in range(4)]
    for a in range(4):
        for b in range(a + 1, 4):
            assert len(sets[a] & sets[b]) <= 1, f"nodes {a} and {b} share shards of big: {sets[a] & sets[b]}"


def test_apportion_and_block_layout():
    assert apportion([0.5, 0.3, 0.2], 1000) == [500, 300, 200]
    assert apportion([1, 1, 1], 10) == [4, 3, 3]
    order = MixOrder([3, 2], seed=0, epoch=0)
    sources = [order.source(p) for p in range(10)]
    assert Counter(d for d, _ in sources[:5]) == Counter({0: 3, 1: 2})
    assert [draw for d, draw in sources if d == 0] == list(range(6))
    assert order.draws(7) == [sum(1 for d, _ in sources[:7] if d == 0), sum(1 for d, _ in sources[:7] if d == 1)]


def test_bad_mixes_are_refused(indexes, tmp_path):
    big, _, _ = indexes
    with pytest.raises(UsageError, match="one non-negative weight per dataset"):
        MixedDataset([ShardDataset(big)], weights=[1, 2])
    with pytest.raises(UsageError, match="through an index"):
        MixedDataset([ShardDataset([str(tmp_path / "x.tar")])])
    state = mix(indexes).state_dict(0)
    with pytest.raises(UsageError, match="another dataset or order"):
        mix(indexes, seed=1).load_state_dict(state)
    with pytest.raises(UsageError, match="'pad' or 'drop'"):
        mix(indexes, remainder="uneven")
    with pytest.raises(UsageError, match="not a MixedDataset state"):
        mix(indexes).load_state_dict({"format": "lading-mixed-1", "consumed": 3})
