"""ShardDataset over packed shards: every sample exactly once across ranks and workers, the same
order for the same seed, and it works from PyTorch's DataLoader with several workers."""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from lading import datasets
from lading.core.errors import UsageError
from lading.datasets import ShardDataset
from lading.pack import PackOptions, plan_pack, run_pack

NSAMPLES = 53


def expected_samples() -> dict[str, dict[str, bytes]]:
    return {f"s{i:03d}": {"cls": str(i % 5).encode(), "bin": bytes([i]) * (200 + 13 * i)} for i in range(NSAMPLES)}


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """53 samples of 2 files in 7 shards; returns the index path."""
    root = tmp_path_factory.mktemp("packed")
    source = root / "src"
    source.mkdir()
    for key, fields in expected_samples().items():
        for ext, data in fields.items():
            (source / f"{key}.{ext}").write_bytes(data)
    plan = plan_pack(str(source), str(root / "out"), PackOptions("ds", shard_size=20_000))
    run_pack(plan, str(source), str(root / "out"))
    assert len(plan.shards) == 7, len(plan.shards)
    return root / "out" / "ds.index.json"


def as_plain(sample: dict) -> tuple[str, dict[str, bytes]]:
    return sample["__key__"], {k: v for k, v in sample.items() if k != "__key__"}


def collect(index: Path, world: int, workers: int, **kwargs) -> list[list[list[str]]]:
    """keys[rank][worker] in the order yielded, checking each sample's contents on the way."""
    expected = expected_samples()
    result = []
    for rank in range(world):
        dataset = ShardDataset(str(index), rank=rank, world_size=world, **kwargs)
        per_worker = []
        for worker in range(workers):
            keys = []
            for sample in dataset.iter_worker(worker, workers):
                key, fields = as_plain(sample)
                assert fields == expected[key]
                keys.append(key)
            per_worker.append(keys)
        result.append(per_worker)
    return result


@pytest.mark.parametrize("world, workers", [(1, 1), (2, 1), (3, 2), (4, 3), (2, 8)])
def test_ranks_and_workers_are_disjoint_and_complete(packed, world, workers):
    # remainder="uneven": each sample exactly once, ranks differ by one (the default pads to equal counts)
    parts = collect(packed, world, workers, shuffle_buffer=10, seed=4, randomize_shard_order=True, remainder="uneven")
    everything = [key for rank in parts for worker in rank for key in worker]
    assert Counter(everything) == Counter(list(expected_samples()))  # each sample exactly once
    per_rank = [sum(len(worker) for worker in rank) for rank in parts]
    assert max(per_rank) - min(per_rank) <= 1, "ranks must get equal counts (DDP would hang)"


def test_unshuffled_single_reader_yields_pack_order(packed):
    # unshuffled, one node: its sequence is the pack itself
    assert collect(packed, 1, 1) == [[[f"s{i:03d}" for i in range(NSAMPLES)]]]
    interleaved = collect(packed, 1, 1)[0][0]
    assert sorted(interleaved) == [f"s{i:03d}" for i in range(NSAMPLES)] and interleaved == collect(packed, 1, 1)[0][0]


def test_same_seed_same_order_other_seed_other_order(packed):
    first = collect(packed, 2, 2, shuffle_buffer=16, seed=7, randomize_shard_order=True)
    again = collect(packed, 2, 2, shuffle_buffer=16, seed=7, randomize_shard_order=True)
    other = collect(packed, 2, 2, shuffle_buffer=16, seed=8, randomize_shard_order=True)
    assert first == again
    assert first != other


def test_set_epoch_reshuffles_reproducibly(packed):
    dataset = ShardDataset(str(packed), shuffle_buffer=16, seed=1, randomize_shard_order=True)
    orders = []
    for epoch in (0, 1, 0):
        dataset.set_epoch(epoch)
        orders.append([s["__key__"] for s in dataset])
    assert orders[0] == orders[2] != orders[1]
    assert sorted(orders[1]) == sorted(orders[0])


def test_shard_list_without_index_deals_whole_shards(packed):
    shards = sorted(str(p) for p in packed.parent.glob("ds-*.tar"))
    seen = []
    for rank in range(2):
        dataset = ShardDataset(shards, rank=rank, world_size=2)
        for worker in range(2):
            spans = dataset.spans(worker, 2)
            assert [span.shard.uri for span in spans] == shards[rank::2][worker::2]
            seen += [s["__key__"] for s in dataset.iter_worker(worker, 2)]
    assert sorted(seen) == sorted(expected_samples())


def test_worker_splitting_through_simulated_worker_info(packed, monkeypatch):
    dataset = ShardDataset(str(packed))
    keys = []
    for worker in range(3):
        monkeypatch.setattr(datasets, "_worker_slot", lambda w=worker: (w, 3))
        keys.append([s["__key__"] for s in dataset])
    assert sorted(k for part in keys for k in part) == sorted(expected_samples())
    assert all(abs(len(part) - NSAMPLES / 3) < 1 for part in keys)


def test_bad_arguments(packed, tmp_path):
    with pytest.raises(UsageError, match="rank 2 is not in 0..1"):
        ShardDataset(str(packed), rank=2, world_size=2)
    (tmp_path / "bad.index.json").write_text('{"shardlist": []}')
    with pytest.raises(Exception, match="not a wids shard index"):
        ShardDataset(str(tmp_path / "bad.index.json"))


def test_pickles_and_has_no_torch_import_at_module_import(packed):
    dataset = ShardDataset(str(packed), shuffle_buffer=4, seed=2)
    clone = pickle.loads(pickle.dumps(dataset))
    assert [s["__key__"] for s in clone] == [s["__key__"] for s in dataset]
    code = "import sys, lading.datasets; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def keys_of(batch):
    """A collate_fn keeping the sample keys (module level: DataLoader workers pickle it)."""
    return [sample["__key__"] for sample in batch]


@pytest.mark.parametrize("workers, start", [(2, "fork"), (3, "fork")])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dataloader_with_workers(packed, workers, start):
    torch_data = pytest.importorskip("torch.utils.data")
    seen = []
    for rank in range(2):
        dataset = ShardDataset(str(packed), rank=rank, world_size=2, shuffle_buffer=8, seed=5, remainder="uneven")
        assert isinstance(dataset, torch_data.IterableDataset)
        loader = torch_data.DataLoader(
            dataset, batch_size=4, num_workers=workers, collate_fn=keys_of, multiprocessing_context=start
        )
        seen += [key for batch in loader for key in batch]
    assert Counter(seen) == Counter(list(expected_samples()))


def test_damaged_shard_is_a_one_line_problem(tmp_path):
    from lading.core.errors import ProblemFound

    bad = tmp_path / "bad-000000.tar"
    bad.write_bytes(b"definitely not a tar archive" * 50)
    with pytest.raises(ProblemFound, match="bad-000000.tar is not a readable tar shard"):
        list(ShardDataset([str(bad)]))


def test_iter_shard_refuses_a_shard_of_another_size_than_its_index_says(packed, tmp_path):
    import shutil

    from lading.core.errors import ProblemFound
    from lading.datasets import iter_shard, load_index
    from lading.stores.config import StoreConfig

    copy = tmp_path / "copy"
    shutil.copytree(packed.parent, copy)
    ref = load_index(str(copy / packed.name), StoreConfig()).shards[0]
    assert len(list(iter_shard(ref, StoreConfig()))) == ref.nsamples  # intact: read whole
    shard = copy / ref.uri.rpartition("/")[2]
    shard.write_bytes(shard.read_bytes()[:-1024])  # truncated after the index was written
    with pytest.raises(ProblemFound, match=f"{shard.name} is {shard.stat().st_size} bytes, but its index says"):
        list(iter_shard(ref, StoreConfig()))


def test_an_index_keeps_its_shards_as_arrays_and_makes_refs_on_demand(tmp_path):
    import hashlib
    import json

    import numpy as np
    from lading.datasets import load_index
    from lading.datasets.index import ShardList, ShardRef
    from lading.stores.config import StoreConfig

    shardlist = [
        {"url": "a-0.tar", "nsamples": 3, "filesize": 30, "etag": '"e0"', "crc32c": "mnG7TA=="},
        {"url": "sub/a-1.tar", "nsamples": 4},
        {"url": f"{tmp_path}/elsewhere/a-2.tar", "nsamples": 5, "filesize": 50, "crc32c": 7},
        {"url": "s3://bucket/a-3.tar", "nsamples": 6, "filesize": 60, "etag": None, "crc32c": "AAAAAA=="},
    ]
    path = tmp_path / "ds.index.json"
    offsets = {"url": "ds.offsets.safetensors", "filesize": 9, "etag": "e9", "crc32c": "AAAAAA=="}
    path.write_text(json.dumps({"wids_version": 1, "shardlist": shardlist, "lading": {"offsets": offsets}}))
    index = load_index(str(path), StoreConfig())
    assert isinstance(index.shards, ShardList) and len(index.shards) == 4
    assert list(index.shards) == [
        ShardRef(f"{tmp_path}/a-0.tar", 3, '"e0"', 30, "mnG7TA=="),
        ShardRef(f"{tmp_path}/sub/a-1.tar", 4, None, None),
        ShardRef(f"{tmp_path}/elsewhere/a-2.tar", 5, None, 50),  # not a CRC32C: none
        ShardRef("s3://bucket/a-3.tar", 6, None, 60, "AAAAAA=="),
    ]
    assert index.offsets == ShardRef(f"{tmp_path}/ds.offsets.safetensors", None, "e9", 9, "AAAAAA==")
    for entry in shardlist:
        entry.pop("crc32c", None)
    path.write_text(json.dumps({"wids_version": 1, "shardlist": shardlist}))
    older = load_index(str(path), StoreConfig()).shards  # packed before lading recorded CRC32Cs
    assert older.crc32cs is None and [ref.crc32c for ref in older] == [None] * 4
    assert index.shards[1:3] == list(index.shards)[1:3] and index.counts.tolist() == [3, 4, 5, 6]
    assert index.shards.sizes() is None, "a shard without a size: no sizes"
    assert not index.shards.all_local(), "s3://bucket/a-3.tar is remote"
    local = ShardList(str(tmp_path), ["x.tar", "/abs/y.tar"], np.array([1, 2]), np.array([10, 20]), None)
    assert local.all_local() and local.sizes().tolist() == [10, 20]
    names = [(url.rpartition("/")[2], shard["nsamples"]) for url, shard in zip(index.shards.names(), shardlist)]
    assert index.identity == hashlib.sha256(repr(names).encode()).hexdigest()[:16], "the identity resumes as before"
