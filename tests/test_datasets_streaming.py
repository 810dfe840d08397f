"""The one epoch order at realistic sizes: a dataset larger than the node cache streams within
``cache_limit`` (counted at a proxy and on disk), shuffles mean something on small data, exact
elastic resume, lanes that keep locality on 64 nodes, and bad settings refused."""

from __future__ import annotations

import bisect
import itertools
import json
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest
from lading.core.errors import UsageError
from lading.datasets import NodeLocalSampler, ShardDataset, load_index
from lading.datasets.cache import iter_entries
from lading.datasets.order import choose_lanes
from lading.pack import PackOptions, plan_pack, run_pack
from lading.stores import StoreConfig
from proxies import FaultProxy

SHARDS = 96
PER_SHARD = 10
SAMPLE_BYTES = 2048 + 512  # in the tar: a header and the data


def expected() -> dict[str, bytes]:
    return {f"k{i:05d}": bytes([i % 251]) * 2048 for i in range(SHARDS * PER_SHARD)}


@pytest.fixture(scope="module")
def remote_pack(rclone_server, tmp_path_factory) -> str:
    """96 shards of 10 samples (~26 KB each) in a bucket of ``rclone serve s3``; the index URI."""
    import boto3

    env = rclone_server.env
    config = StoreConfig.from_env(env)
    bucket = f"stream-{uuid.uuid4().hex[:10]}"
    boto3.client(
        "s3",
        endpoint_url=config.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    ).create_bucket(Bucket=bucket)
    source = tmp_path_factory.mktemp("stream") / "src"
    source.mkdir()
    for key, data in expected().items():
        (source / f"{key}.bin").write_bytes(data)
    dest = f"s3://{bucket}/ds"
    plan = plan_pack(str(source), dest, PackOptions("ds", shard_size=PER_SHARD * SAMPLE_BYTES), config)
    run_pack(plan, str(source), dest, config)
    assert len(plan.shards) == SHARDS
    return f"{dest}/ds.index.json"


def shard_gets(proxy: FaultProxy) -> list[str]:
    return [path for method, path in proxy.counts if method == "GET" and path.endswith(".tar")]


def cache_bytes(cache: Path, shards_only: bool = False) -> int:
    entries = iter_entries(cache / "datasets") if (cache / "datasets").exists() else ()
    return sum(entry.size for entry in entries if not shards_only or entry.path.name.endswith(".tar"))


def stream(dataset: ShardDataset, proxy: FaultProxy, cache: Path) -> tuple[list[str], int, int]:
    """Keys in order, peak bytes of shards in the cache directory (the dataset's index and offsets
    file, 44 KB here, sit beside them), shard GETs before the first sample."""
    keys, peak, first = [], 0, -1
    wanted = expected()
    for sample in dataset:
        if first < 0:
            first = len(shard_gets(proxy))
        assert bytes(sample["bin"]) == wanted[sample["__key__"]]
        keys.append(sample["__key__"])
        peak = max(peak, cache_bytes(cache, shards_only=True))
    return keys, peak, first


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_dataset_larger_than_the_cache_streams_within_the_limit(remote_pack, rclone_env, tmp_path, nodes):
    largest = max(ref.filesize for ref in load_index(remote_pack, StoreConfig.from_env()).shards)
    limit = 8 * largest
    seen: Counter[str] = Counter()
    with ExitStack() as stack:
        for node in range(nodes):
            proxy = stack.enter_context(FaultProxy(rclone_env["AWS_ENDPOINT_URL"]))
            cache = tmp_path / f"node-{node}"
            dataset = ShardDataset(
                remote_pack,
                config=StoreConfig.from_env(endpoint_url=proxy.url),
                cache_dir=cache,
                cache_limit=limit,
                shuffle_buffer=10_000,
                seed=3,
                rank=node,
                world_size=nodes,
                prefetch=2,
            )
            block = dataset.shuffle_block
            assert block == 4, "half of what the cache holds, by default"
            keys, peak, first = stream(dataset, proxy, cache)
            seen.update(keys)
            gets = shard_gets(proxy)
            share = SHARDS // nodes
            assert len(gets) <= share + 2, f"node {node}: {len(gets)} shard GETs for a share of {share} shards"
            assert len(set(gets)) == len(gets), "each shard downloaded once in the epoch"
            assert first <= block + 1 + dataset.prefetch, f"{first} shards fetched before the first sample"
            in_flight = (dataset.prefetch + 1) * largest
            assert peak <= limit + in_flight, f"node {node}: cache reached {peak} bytes, limit {limit}"
    assert seen == Counter(list(expected())), "every sample exactly once"


def test_the_first_samples_come_from_one_block_and_are_shuffled(remote_pack, rclone_env, tmp_path):
    dataset = ShardDataset(remote_pack, cache_dir=tmp_path / "c", shuffle_buffer=10_000, shuffle_block=4, seed=1)
    first = [next(iter(dataset))["__key__"]]
    keys = [sample["__key__"] for sample in dataset][:32]
    assert keys[0] == first[0]
    shards = {int(key[1:]) // PER_SHARD for key in keys}
    assert 2 <= len(shards) <= 4 + 1, f"the first batch of 32 comes from one block's shards, got {sorted(shards)}"
    assert keys != sorted(keys)


def small_pack(tmp_path: Path, count: int, shard_size: int) -> str:
    source = tmp_path / "small-src"
    source.mkdir(parents=True)
    for i in range(count):
        (source / f"img{i:04d}.cls").write_text(str(i % 10))
    plan = plan_pack(str(source), str(tmp_path / "small"), PackOptions("small", shard_size=shard_size))
    run_pack(plan, str(source), str(tmp_path / "small"))
    return str(tmp_path / "small" / "small.index.json")


def test_shuffle_buffer_shuffles_small_datasets(tmp_path):
    index = small_pack(tmp_path, 100, 40_000)
    plain = [int(s["cls"]) for s in ShardDataset(index)]
    shuffled = [int(s["cls"]) for s in ShardDataset(index, shuffle_buffer=50, seed=0)]
    assert sorted(plain) == sorted(shuffled) and plain != shuffled
    runs = sum(1 for a, b in zip(shuffled, shuffled[1:]) if a == b)
    assert runs < 30, f"{runs} neighbours share a label: barely shuffled"
    assert len(set(shuffled[:5])) >= 3, f"first labels {shuffled[:5]}"
    again = [int(s["cls"]) for s in ShardDataset(index, shuffle_buffer=50, seed=1)]
    assert again != shuffled, "another seed, another order"
    index = small_pack(tmp_path / "more", 1000, 40_000)
    keys = [s["__key__"] for s in ShardDataset(index)]
    assert keys != [s["__key__"] for s in ShardDataset(index, shuffle_buffer=1000)]


@pytest.mark.parametrize("nodes", [1, 2])
def test_windows_at_lane_edges_mix_as_many_shards_as_mosaicml_py1e(nodes):
    """Packed class by class (the worst case), 200 shards of 1,000, blocks of 10 shards: windows
    of 1,000 consecutive samples draw on as many shards as MosaicML's py1e with the same block
    size, and labels run no longer. py1e measured here (bench_streaming.py shuffle, seeds 1-16):
    10.65-10.71 shards per window (min 5-6), mean label run 1.22-1.25; with each lane (about
    one block) spread on its own, windows at lane edges reached one side only: 8.3 (min 6), 1.29-1.30."""
    import numpy as np

    per, shards = 1000, 200
    sampler = NodeLocalSampler(
        [per] * shards, shuffle_buffer=10 * per, shuffle_block=10, seed=1, randomize_shard_order=True, world_size=nodes
    )
    shard = np.fromiter(sampler, dtype=np.int64) // per
    assert len(shard) == per * shards // nodes
    windows = [len(np.unique(shard[i : i + 1000])) for i in range(0, len(shard) - 999, 1000)]
    assert np.mean(windows) >= 10.6 and min(windows) >= 6, f"{np.mean(windows):.2f} / {min(windows)}"
    label = shard * 10 // shards
    runs = np.diff(np.concatenate(([0], np.flatnonzero(np.diff(label)) + 1, [len(label)])))
    assert runs.mean() <= 1.26 and runs.max() <= 20, f"label runs {runs.mean():.3f} / {runs.max()}"


def test_four_ranks_resumed_on_three_deliver_408_samples_exactly_once():
    counts = [4] * 102
    assert sum(counts) == 408
    before: Counter[int] = Counter()
    states = []
    for rank in range(4):
        sampler = NodeLocalSampler(counts, shuffle_buffer=64, seed=2, rank=rank, world_size=4)
        before.update(list(sampler)[:30])
        states.append(sampler.state_dict(30))
    assert all(state == states[0] for state in states)
    assert states[0]["left"] == 288 and len(json.dumps(states[0])) < 4000
    after = []
    for rank in range(3):
        sampler = NodeLocalSampler(counts, shuffle_buffer=64, seed=2, rank=rank, world_size=3)
        sampler.load_state_dict(states[0])
        indices = list(sampler)
        assert len(indices) == len(sampler) == 96
        after += indices
    assert Counter(after) + before == Counter(range(408)), "every sample exactly once"


def test_an_epochs_node_sequences_are_computed_once_until_a_resume():
    counts = [4] * 102
    sampler = NodeLocalSampler(counts, shuffle_buffer=64, seed=2, rank=1, world_size=4)
    order = sampler.order
    first = order.sequences(0)
    assert len(sampler) == 102 and order.sequences(0) is first, "len() built the node sequences again"
    assert order.sequences(1) is not first and order.sequences(1) is order.sequences(1)
    state = NodeLocalSampler(counts, shuffle_buffer=64, seed=2, rank=0, world_size=4).state_dict(0)
    sampler.set_epoch(1)
    sampler.load_state_dict({**state, "epoch": 1})
    assert order.sequences(1) is not first and len(sampler) == 102


def test_a_cache_of_a_few_shards_reads_each_shard_about_once_per_epoch():
    from collections import OrderedDict

    counts = [200 + 7 * (i % 5) for i in range(102)]  # bench (a)'s layout: ~100 shards, an 8-shard cache
    sampler = NodeLocalSampler(counts, shuffle_buffer=1000, seed=1, randomize_shard_order=True, shuffle_block=4)
    lanes = sampler.order.lanes()
    split = sum(len(lanes.pieces(lane)[0]) for lane in range(lanes.count)) - len(counts)
    assert split > 10, "the case: many shards split between lanes"
    first = [0, *itertools.accumulate(counts)]
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        cache: OrderedDict[int, None] = OrderedDict()  # least recently used
        downloads = 0
        for index in sampler:
            shard = bisect.bisect_right(first, index) - 1
            if shard in cache:
                cache.move_to_end(shard)
                continue
            downloads += 1
            cache[shard] = None
            if len(cache) > 8:
                cache.popitem(last=False)
        # the lane visited last may end with a piece of the shard the first one started with
        assert downloads <= len(counts) + 1, f"epoch {epoch}: {downloads} downloads of {len(counts)} shards"


def test_a_resume_of_a_resume_onto_other_node_counts_is_exact():
    counts = [7, 13, 9, 11] * 30
    total = sum(counts)
    seen: Counter[int] = Counter()
    state = None
    for world, per_node, take in [(8, 2, 15), (4, 1, 20), (12, 3, 7), (6, 2, None)]:
        samplers = [
            NodeLocalSampler(
                counts,
                shuffle_buffer=40,
                seed=4,
                rank=rank,
                world_size=world,
                local_world_size=per_node,
                remainder="uneven",
                shuffle_block=3,
            )
            for rank in range(world)
        ]
        for sampler in samplers:
            if state is not None:
                sampler.load_state_dict(state)
            seen.update(list(sampler)[:take])
        if take is not None:
            state = samplers[0].state_dict(take)
    assert seen == Counter(range(total))


def test_lanes_keep_locality_on_64_nodes_at_scale():
    lanes = choose_lanes(10**8, 16 * 1000, 64)
    assert lanes % 64 == 0 and all(lanes % n == 0 for n in (1, 2, 4, 8, 16, 32, 64, 3, 6, 12))
    assert 10**8 // lanes >= 16 * 1000, "a lane holds at least one block"
    assert choose_lanes(100, 1600, 1) == 1, "tiny data: one lane"
    sampler = NodeLocalSampler([1000] * 100_000, shuffle_buffer=16_000, rank=0, world_size=512, local_world_size=8)
    assert sampler.order.lane_count % 64 == 0
    first = next(iter(sampler))
    state = sampler.state_dict(0)
    assert len(json.dumps(state)) < 4000 and 0 <= first < 10**8


def test_bad_settings_are_refused_with_one_line(remote_pack, rclone_env, tmp_path):
    with pytest.raises(UsageError, match="shuffle_buffer=-1"):
        ShardDataset(remote_pack, shuffle_buffer=-1, cache_dir=tmp_path / "c")
    with pytest.raises(UsageError, match="smallest that works is"):
        ShardDataset(remote_pack, cache_dir=tmp_path / "c", cache_limit=20_000, shuffle_block=4)
    index = load_index(remote_pack, StoreConfig.from_env())
    five = sum(sorted((ref.filesize for ref in index.shards), reverse=True)[:5])
    offsets = index.offsets.filesize  # the offsets file stays in the cache while the dataset is read
    with pytest.raises(UsageError, match=f"and the offsets file.*smallest that works is {five + offsets} bytes"):
        ShardDataset(remote_pack, cache_dir=tmp_path / "c", cache_limit=five, shuffle_block=4)
    ShardDataset(remote_pack, cache_dir=tmp_path / "c", cache_limit=five + offsets, shuffle_block=4)
    with pytest.raises(UsageError, match="shuffle_block=0"):
        ShardDataset(remote_pack, cache_dir=tmp_path / "c", shuffle_block=0)
    dataset = ShardDataset(remote_pack, cache_dir=tmp_path / "c")
    with pytest.raises(UsageError, match="not a ShardDataset state") as raised:
        dataset.load_state_dict({"format": "lading-partitioned-1", "epoch": 0})
    assert "older lading" in raised.value.hint


def test_record_dataset_takes_the_same_order_through_node_local_sampler(tmp_path):
    from lading.datasets import RecordDataset

    path = tmp_path / "tokens.bin"
    path.write_bytes(b"".join(i.to_bytes(4, "little") for i in range(20_000)))
    records = RecordDataset(str(path), record_size=4)
    assert sum(records.chunk_counts(4096)) == 20_000 and records.chunk_counts(4096)[0] == 1024
    per_node: dict[int, set[int]] = {}
    before: Counter[int] = Counter()
    states = []
    for rank in range(4):  # 2 nodes of 2 ranks
        sampler = NodeLocalSampler(records, rank=rank, world_size=4, local_world_size=2, shuffle_buffer=500)
        indices = list(sampler)
        per_node.setdefault(rank // 2, set()).update(indices)
        before.update(indices[:100])
        states.append(sampler.state_dict(100))
        assert int.from_bytes(records[indices[0]], "little") == indices[0]
    assert not per_node[0] & per_node[1], "each node its own records"
    assert max(per_node[0]) < min(per_node[1]) or max(per_node[1]) < min(per_node[0]), "contiguous lanes"
    after: Counter[int] = Counter()
    for rank in range(2):  # one node of 2 ranks: 19,600 left divide evenly
        sampler = NodeLocalSampler(records, rank=rank, world_size=2, local_world_size=2, shuffle_buffer=500)
        sampler.load_state_dict(states[0])
        after.update(sampler)
    assert before + after == Counter(range(20_000))


def test_dataloader_workers_stream_within_the_limit_too(remote_pack, rclone_env, tmp_path):
    torch_data = pytest.importorskip("torch.utils.data")
    largest = max(ref.filesize for ref in load_index(remote_pack, StoreConfig.from_env()).shards)
    limit = 8 * largest
    with FaultProxy(rclone_env["AWS_ENDPOINT_URL"]) as proxy:
        cache = tmp_path / "node"
        dataset = ShardDataset(
            remote_pack,
            config=StoreConfig.from_env(endpoint_url=proxy.url),
            cache_dir=cache,
            cache_limit=limit,
            shuffle_buffer=10_000,
            seed=5,
            batch_size=8,
            prefetch=1,
        )
        loader = torch_data.DataLoader(
            dataset, batch_size=8, num_workers=2, collate_fn=lambda batch: batch, multiprocessing_context="fork"
        )
        keys, peak = [], 0
        for batch in loader:
            keys += [sample["__key__"] for sample in batch]
            peak = max(peak, cache_bytes(cache))
        gets = shard_gets(proxy)
    assert Counter(keys) == Counter(list(expected()))
    assert len(gets) <= SHARDS + 4, f"{len(gets)} shard GETs for {SHARDS} shards"
    in_flight = 2 * (dataset.prefetch + 2) * largest  # each worker: the shard it reads and what it prefetches
    assert peak <= limit + in_flight, f"cache reached {peak} bytes, limit {limit}"


def test_a_ranks_dataloader_workers_download_different_shards_at_once(remote_pack, rclone_env, tmp_path):
    """Both workers read shards 0, 1, 2, ... in turn (batches dealt round-robin, no shuffle): each
    claims its own next downloads instead of both racing for the same ones, so the node has the
    first shard and 2 workers x ``prefetch`` others in flight at once, and each shard is GET once."""
    torch_data = pytest.importorskip("torch.utils.data")
    with FaultProxy(rclone_env["AWS_ENDPOINT_URL"]) as proxy:
        dataset = ShardDataset(
            remote_pack,
            config=StoreConfig.from_env(endpoint_url=proxy.url),
            cache_dir=tmp_path / "node",
            batch_size=1,
            prefetch=2,
        )
        gate = proxy.gather(1 + 2 * dataset.prefetch, path_suffix=".tar")
        loader = torch_data.DataLoader(
            dataset, batch_size=1, num_workers=2, collate_fn=lambda batch: batch, multiprocessing_context="fork"
        )
        keys = [sample["__key__"] for batch in loader for sample in batch]
        gets = shard_gets(proxy)
    assert keys == sorted(expected()), "in order: both workers walk the shards together"
    assert gate.together == gate.count, f"{gate.together} shard downloads in flight at most, not {gate.count}"
    assert Counter(gets) == Counter(set(gets)) and len(gets) == SHARDS, "each shard downloaded once"


def test_the_next_epochs_workers_find_the_offsets_file_in_the_cache(remote_pack, rclone_env, tmp_path):
    """Each epoch forks new DataLoader workers, and each reads the offsets file at its start: it
    must still be cached then, though the epoch before evicted shards all along."""
    torch_data = pytest.importorskip("torch.utils.data")
    largest = max(ref.filesize for ref in load_index(remote_pack, StoreConfig.from_env()).shards)
    limit = 8 * largest
    with FaultProxy(rclone_env["AWS_ENDPOINT_URL"]) as proxy:
        dataset = ShardDataset(
            remote_pack,
            config=StoreConfig.from_env(endpoint_url=proxy.url),
            cache_dir=tmp_path / "node",
            cache_limit=limit,
            shuffle_buffer=10_000,
            seed=5,
            batch_size=8,
        )
        loader = torch_data.DataLoader(
            dataset, batch_size=8, num_workers=2, collate_fn=lambda batch: batch, multiprocessing_context="fork"
        )
        for epoch in range(2):
            dataset.set_epoch(epoch)
            keys = [sample["__key__"] for batch in loader for sample in batch]
            assert Counter(keys) == Counter(list(expected())), f"epoch {epoch + 1}: every sample once"
        requests = proxy.counts
    offsets = sum(
        n for (method, path), n in requests.items() if method == "GET" and path.endswith(".offsets.safetensors")
    )
    gets = sum(n for (method, path), n in requests.items() if method == "GET" and path.endswith(".tar"))
    assert offsets == 1, f"the offsets file was downloaded {offsets} times in 2 epochs"
    assert gets <= 2 * (SHARDS + 4), f"{gets} shard GETs for {SHARDS} shards in 2 epochs"
