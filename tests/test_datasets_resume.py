"""Exact, elastic resume of ShardDataset through real DataLoaders with several workers: stop an
epoch mid-way with 4 ranks x 2 workers, resume with 3 ranks x 3 workers (shuffling on), and every
sample of the epoch is delivered exactly once; the epoch's order depends on the index, the seed
and the epoch only; equal counts per rank with each remainder rule."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from lading.core.errors import UsageError
from lading.datasets import ShardDataset
from lading.pack import PackOptions, plan_pack, run_pack

torch_data = pytest.importorskip("torch.utils.data")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

NSAMPLES = 101  # prime: every world size leaves a remainder
BATCH = 4
SHUFFLE = {"shuffle_buffer": 16, "seed": 11, "randomize_shard_order": True}


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> str:
    """101 samples in ~9 local shards, packed by lading pack (so with the offsets file)."""
    root = tmp_path_factory.mktemp("resume")
    source = root / "src"
    source.mkdir()
    for i in range(NSAMPLES):
        (source / f"k{i:03d}.txt").write_text(f"sample {i}")
        (source / f"k{i:03d}.bin").write_bytes(bytes([i % 256]) * (50 + i))
    plan = plan_pack(str(source), str(root / "out"), PackOptions("ds", shard_size=20_000))
    run_pack(plan, str(source), str(root / "out"))
    assert len(plan.shards) >= 5
    return str(root / "out" / "ds.index.json")


def keys_of(batch):
    return [sample["__key__"] for sample in batch]


def loader(dataset, workers: int):
    return torch_data.DataLoader(
        dataset,
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=keys_of,
        multiprocessing_context="fork" if workers else None,
        prefetch_factor=4 if workers else None,
    )


def run_ranks(index: str, world: int, workers: int, state=None, stop_after=None, epoch=0, **options):
    """Each rank's consumed keys (in order) and, when stopped, the state saved after the stop."""
    consumed, states = [], []
    for rank in range(world):
        dataset = ShardDataset(index, rank=rank, world_size=world, batch_size=BATCH, **SHUFFLE, **options)
        dataset.set_epoch(epoch)
        if state is not None:
            dataset.load_state_dict(state)
        keys = []
        for number, batch in enumerate(loader(dataset, workers)):  # workers run ahead; only consumption counts
            if stop_after is not None and number == stop_after:
                break
            keys += batch
        consumed.append(keys)
        if stop_after is not None:
            states.append(json.loads(json.dumps(dataset.state_dict(len(keys)))))  # JSON-able, and small
    return consumed, states


@pytest.mark.parametrize("remainder", ["uneven", "pad", "drop"])
def test_resume_4x2_to_3x3_delivers_every_sample_once(index, remainder):
    before, states = run_ranks(index, 4, 2, stop_after=3, remainder=remainder)
    assert all(state == states[0] for state in states), "ranks must agree on the state"
    assert states[0]["total"] - states[0]["left"] == 4 * 3 * BATCH and len(json.dumps(states[0])) < 4000
    after, _ = run_ranks(index, 3, 3, state=states[0], remainder=remainder)
    everything = Counter(key for part in before + after for key in part)
    expected = {f"k{i:03d}" for i in range(NSAMPLES)}
    left = NSAMPLES - 48  # 53 positions for the 3 resumed ranks
    if remainder == "uneven":
        assert everything == Counter(expected)
    elif remainder == "pad":  # each rank at least ceil(53/3) = 18; short nodes repeat a few samples
        # (ranks without a launcher's local size are nodes of their own; pad evens out their shares)
        assert set(everything) == expected and 0 <= sum(everything.values()) - NSAMPLES < 3 * 3
        assert all(len(part) >= math.ceil(left / 3) for part in after)
    else:  # drop: each rank at most floor(53/3) = 17; the longer nodes skip a few positions
        assert set(everything) <= expected and max(everything.values()) == 1
        assert 0 <= NSAMPLES - len(everything) < 3 * 3 and all(len(part) <= left // 3 for part in after)
    if remainder != "uneven":
        assert len({len(part) for part in before}) == 1 and len({len(part) for part in after}) == 1


def test_the_order_does_not_depend_on_ranks_or_workers(index):
    # within one node: the node's sequence is dealt to its ranks (across nodes, see test_datasets_locality)
    single, _ = run_ranks(index, 1, 0, remainder="uneven")
    for world, workers in ((3, 2), (4, 3)):
        parts, _ = run_ranks(index, world, workers, remainder="uneven", local_world_size=world)
        merged = [
            parts[rank][step] for step in range(len(parts[0])) for rank in range(world) if step < len(parts[rank])
        ]
        assert merged == single[0], f"{world} ranks x {workers} workers dealt another sequence"
    reordered, _ = run_ranks(index, 1, 2, epoch=1, remainder="uneven")
    assert sorted(reordered[0]) == sorted(single[0]) and reordered[0] != single[0]


def test_a_resume_inside_a_resume_and_any_batch_size(index):
    first, states = run_ranks(index, 2, 2, stop_after=2, remainder="uneven")
    second_parts, second_states = [], []
    for rank in range(5):  # resumed with 5 ranks and another batch size, stopped again
        dataset = ShardDataset(index, rank=rank, world_size=5, batch_size=3, remainder="uneven", **SHUFFLE)
        dataset.load_state_dict(states[0])
        keys = [
            key
            for batch in list(torch_data.DataLoader(dataset, batch_size=3, num_workers=2, collate_fn=keys_of))[:2]
            for key in batch
        ]
        second_parts.append(keys)
        second_states.append(dataset.state_dict(len(keys)))
    assert second_states[0]["total"] - second_states[0]["left"] == 16 + 5 * 6
    third, _ = run_ranks(index, 1, 1, state=second_states[0], remainder="uneven")
    assert Counter(k for part in first + second_parts + third for k in part) == Counter(
        f"k{i:03d}" for i in range(NSAMPLES)
    )


def test_equal_lengths_and_dataloader_len(index):
    for remainder, per_rank in (("pad", 26), ("drop", 25)):
        datasets = [ShardDataset(index, rank=r, world_size=4, batch_size=BATCH, remainder=remainder) for r in range(4)]
        assert [len(d) for d in datasets] == [per_rank] * 4
        batches = list(loader(datasets[1], 3))
        assert len(batches) == len(loader(datasets[1], 3)) == math.ceil(per_rank / BATCH)
    uneven = [len(ShardDataset(index, rank=r, world_size=4, remainder="uneven")) for r in range(4)]
    assert sorted(uneven) == [25, 25, 25, 26]  # 4 nodes of one rank: one node's block has the extra sample


def test_a_state_for_another_order_is_refused(index):
    state = ShardDataset(index, world_size=2, rank=0, batch_size=BATCH, **SHUFFLE).state_dict(8)
    other = ShardDataset(
        index, world_size=3, rank=1, batch_size=2, shuffle_buffer=16, seed=12, randomize_shard_order=True
    )
    with pytest.raises(UsageError, match="seed: saved 11, now 12"):
        other.load_state_dict(state)
    with pytest.raises(UsageError, match="samples_seen=99"):
        ShardDataset(index, world_size=2, rank=0).state_dict(99)
    with pytest.raises(UsageError, match="remainder="):
        ShardDataset(index, remainder="wrap")


def test_resume_applies_to_its_epoch_only(index):
    dataset = ShardDataset(index, batch_size=BATCH, **SHUFFLE)
    dataset.set_epoch(3)
    state = dataset.state_dict(40)
    resumed = ShardDataset(index, batch_size=BATCH, **SHUFFLE)
    resumed.load_state_dict(state)
    assert resumed.epoch == 3 and len(resumed) == NSAMPLES - 40
    resumed.set_epoch(3)  # a training loop calls set_epoch(start_epoch) after loading: still resumed
    assert len(list(resumed)) == NSAMPLES - 40
    resumed.set_epoch(4)
    assert len(list(resumed)) == NSAMPLES
