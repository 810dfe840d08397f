"""Node locality of ShardDataset and NodeLocalSampler, with nodes simulated on one machine: each
simulated node has its own node cache, its own counting proxy in front of moto (so GETs are
counted per node) and its ranks' launcher variables (torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK); its ranks iterate in this process."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest
from lading.datasets import NodeLocalSampler, PackedDataset, ShardDataset, load_index
from lading.datasets.order.deal import lane_owners
from lading.datasets.order.lanes import Lanes
from lading.pack import PackOptions, plan_pack, run_pack
from lading.stores import StoreConfig
from proxies import FaultProxy

NSAMPLES = 240
PER_NODE = 2
ORDER = {"shuffle_buffer": 6, "seed": 5, "randomize_shard_order": True, "shuffle_block": 2}


def expected() -> dict[str, bytes]:
    return {f"s{i:03d}": bytes([i % 256]) * (200 + (i * 7) % 90) for i in range(NSAMPLES)}


@pytest.fixture
def dataset(s3_env, tmp_path) -> str:
    """240 samples in 24 small shards in a moto bucket; the index URI."""
    import boto3

    config = StoreConfig.from_env()
    bucket = f"loc-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=config.endpoint_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    source = tmp_path / "src"
    source.mkdir()
    for key, data in expected().items():
        (source / f"{key}.bin").write_bytes(data)
    dest = f"s3://{bucket}/ds"
    plan = plan_pack(str(source), dest, PackOptions("ds", shard_size=10_500), config)
    run_pack(plan, str(source), dest, config)
    assert 20 <= len(plan.shards) <= 30, len(plan.shards)
    return f"{dest}/ds.index.json"


class Node:
    """One simulated node: a cache directory and a counting proxy of its own."""

    def __init__(self, number: int, nodes: int, upstream: str, root: Path, stack: ExitStack) -> None:
        self.number, self.nodes = number, nodes
        self.proxy = stack.enter_context(FaultProxy(upstream))
        self.config = StoreConfig.from_env(endpoint_url=self.proxy.url)
        self.cache = root / f"node-{nodes}-{number}"

    def env(self, local: int) -> dict[str, str]:
        rank = self.number * PER_NODE + local
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(self.nodes * PER_NODE),
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(PER_NODE),
            "GROUP_RANK": str(self.number),
        }

    def shards_read(self) -> set[str]:
        """Shards this node's proxy saw a GET for."""
        return {
            path.rsplit("/", 1)[-1] for method, path in self.proxy.counts if method == "GET" and path.endswith(".tar")
        }

    def gets(self) -> int:
        return self.proxy.count("GET")


def make_nodes(count: int, s3_env, root: Path, stack: ExitStack) -> list[Node]:
    return [Node(n, count, s3_env["AWS_ENDPOINT_URL"], root, stack) for n in range(count)]


def ranks_of(node: Node, index: str, monkeypatch, **options) -> list[ShardDataset]:
    """The node's ranks, each created under its launcher variables (no rank arguments)."""
    made = []
    for local in range(PER_NODE):
        for name, value in node.env(local).items():
            monkeypatch.setenv(name, value)
        made.append(ShardDataset(index, config=node.config, cache_dir=node.cache, **ORDER, **options))
    return made


def read(ranks: list[ShardDataset], stop: int | None = None) -> list[list[str]]:
    """Each rank's keys (contents checked), at most ``stop`` per rank."""
    wanted = expected()
    keys = []
    for dataset in ranks:
        got = []
        for sample in dataset:
            if stop is not None and len(got) == stop:
                break
            assert bytes(sample["bin"]) == wanted[sample["__key__"]]
            got.append(sample["__key__"])
        keys.append(got)
    return keys


def block_shards(
    index: str, config: StoreConfig, node: int, nodes: int, homes: int | None = None, lanes: int | None = None
) -> set[str]:
    """The shards holding the samples of the lanes ``node`` of ``nodes`` owns (edges included);
    ``homes``: the node count the run started with (see lading.datasets.order.deal.lane_owners)."""
    homes = homes or nodes
    loaded = load_index(index, config)
    count = (
        lanes
        or ShardDataset(
            index, config=config, rank=0, world_size=homes * PER_NODE, local_world_size=PER_NODE, **ORDER
        ).lanes
    )
    run = Lanes(loaded.counts, ORDER["seed"], ORDER["randomize_shard_order"], count)
    owners = lane_owners(count, nodes, homes)
    assert owners is not None
    found: set[str] = set()
    for lane in range(count):
        if owners[lane] == node:
            found.update(loaded.shards[shard].uri.rsplit("/", 1)[-1] for shard in run.pieces(lane)[0].tolist())
    return found


def test_four_nodes_read_disjoint_shard_sets_and_epoch_two_makes_no_get(dataset, s3_env, tmp_path, monkeypatch):
    config = StoreConfig.from_env()
    index = load_index(dataset, config)
    share = sum(ref.filesize for ref in index.shards) / 4
    with ExitStack() as stack:
        nodes = make_nodes(4, s3_env, tmp_path, stack)
        ranks = {
            node.number: ranks_of(node, dataset, monkeypatch, remainder="uneven", cache_limit=int(1.5 * share))
            for node in nodes
        }
        assert [(d.layout.node, d.layout.local_rank) for d in ranks[2]] == [(2, 0), (2, 1)]  # from GROUP_RANK
        first = {n: read(ranks[n]) for n in ranks}
        everything = Counter(key for n in first for keys in first[n] for key in keys)
        assert everything == Counter(list(expected())), "every sample exactly once"
        sets = [node.shards_read() for node in nodes]
        total = len(index.shards)
        for node, got in zip(nodes, sets):
            assert got <= block_shards(dataset, config, node.number, 4)
            assert len(got) <= -(-total // 4) + 2, f"node {node.number} read {len(got)} of {total} shards"
        for a in range(4):
            for b in range(a + 1, 4):
                assert len(sets[a] & sets[b]) <= 1, "nodes share at most the shard split at their edge"
        assert set().union(*sets) == {ref.uri.rsplit("/", 1)[-1] for ref in index.shards}

        for node in nodes:
            node.proxy.reset_counts()
        for datasets in ranks.values():
            for dataset_ in datasets:
                dataset_.set_epoch(1)
        second = {n: read(ranks[n]) for n in ranks}
        assert [node.gets() for node in nodes] == [0, 0, 0, 0], "epoch 2 is read from each node's cache"
        for n in ranks:
            assert sorted(sum(second[n], [])) == sorted(sum(first[n], [])), "a node keeps its samples"
            assert second[n] != first[n], "and reshuffles them"


def stop_four_nodes(
    dataset: str, s3_env, root: Path, monkeypatch, stack: ExitStack, stop: int, **options
) -> tuple[list[str], dict]:
    consumed, state, _ = stop_nodes(dataset, s3_env, root, monkeypatch, stack, stop, **options)
    return consumed, state


def stop_nodes(
    dataset: str, s3_env, root: Path, monkeypatch, stack: ExitStack, stop: int, **options
) -> tuple[list[str], dict, list[set[str]]]:
    """Four nodes each read ``stop`` samples per rank: what they read, the state, each node's shard GETs."""
    nodes = make_nodes(4, s3_env, root, stack)
    consumed, states = [], []
    for node in nodes:
        for rank in ranks_of(node, dataset, monkeypatch, **options):
            consumed += read([rank], stop)[0]
            states.append(rank.state_dict(stop))
    assert all(state == states[0] for state in states), "ranks agree on the state"
    assert states[0]["total"] - states[0]["left"] == 8 * stop
    return consumed, states[0], [node.shards_read() for node in nodes]


@pytest.mark.parametrize("new_nodes", [2, 3])
def test_resume_onto_fewer_nodes_is_exact_and_each_node_reads_its_share(
    dataset, s3_env, tmp_path, monkeypatch, new_nodes
):
    config = StoreConfig.from_env()
    with ExitStack() as stack:
        before, state = stop_four_nodes(dataset, s3_env, tmp_path, monkeypatch, stack, 7, remainder="uneven")
        nodes = make_nodes(new_nodes, s3_env, tmp_path / "after", stack)
        after = []
        for node in nodes:
            ranks = ranks_of(node, dataset, monkeypatch, remainder="uneven")
            for rank in ranks:
                rank.load_state_dict(state)
            after += sum(read(ranks), [])
            assert node.shards_read() <= block_shards(dataset, config, node.number, new_nodes, homes=4), (
                f"new node {node.number} of {new_nodes} read outside its lanes"
            )
        assert Counter(before + after) == Counter(list(expected())), "every sample exactly once"


def test_a_resume_onto_half_the_nodes_keeps_each_survivors_cached_block(dataset, s3_env, tmp_path, monkeypatch):
    config = StoreConfig.from_env()
    with ExitStack() as stack:
        before, state, fetched = stop_nodes(dataset, s3_env, tmp_path, monkeypatch, stack, 7, remainder="uneven")
        assert state["homes"] == 4
        after = []
        for number, node in enumerate(make_nodes(2, s3_env, tmp_path / "after", stack)):
            node.cache = tmp_path / f"node-4-{number}"  # the surviving machine keeps its node cache
            ranks = ranks_of(node, dataset, monkeypatch, remainder="uneven")
            for rank in ranks:
                rank.load_state_dict(state)
            after += sum(read(ranks), [])
            own = block_shards(dataset, config, number, 4)
            added = block_shards(dataset, config, number + 2, 4)
            assert block_shards(dataset, config, number, 2, homes=4) == own | added
            assert node.shards_read() <= own | added, "a survivor reads only its own and its new lanes"
            assert not fetched[number] & node.shards_read(), "a survivor fetched a shard its cache already held"
            assert node.shards_read() & added, "and it took over the lanes of a node that left"
        assert Counter(before + after) == Counter(list(expected())), "every sample exactly once"


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_resume_keeps_equal_counts_per_rank(dataset, s3_env, tmp_path, monkeypatch, remainder):
    with ExitStack() as stack:
        before, state = stop_four_nodes(dataset, s3_env, tmp_path, monkeypatch, stack, 5, remainder=remainder)
        nodes = make_nodes(3, s3_env, tmp_path / "after", stack)
        ranks = [rank for node in nodes for rank in ranks_of(node, dataset, monkeypatch, remainder=remainder)]
        for rank in ranks:
            rank.load_state_dict(state)
        after = read(ranks)
    assert len({len(keys) for keys in after}) == 1, "equal counts per rank (DDP would hang)"
    seen = Counter(before + sum(after, []))
    if remainder == "pad":
        assert set(seen) == set(expected()) and sum(seen.values()) - NSAMPLES < 3 * PER_NODE
    else:
        assert max(seen.values()) == 1 and NSAMPLES - len(seen) < 3 * PER_NODE


@pytest.mark.parametrize("lanes, new_nodes", [(8, 3), (None, 11)])
def test_incompatible_node_count_is_exact_and_logs_the_loss(
    dataset, s3_env, tmp_path, monkeypatch, caplog, lanes, new_nodes
):
    with ExitStack() as stack:
        before, state = stop_four_nodes(
            dataset, s3_env, tmp_path, monkeypatch, stack, 6, remainder="uneven", lanes=lanes
        )
        assert state["lanes"] == (lanes or 12), "lanes chosen from the data: a multiple of the 4 nodes"
        caplog.clear()
        nodes = make_nodes(new_nodes, s3_env, tmp_path / "after", stack)
        after = []
        with caplog.at_level(logging.INFO, logger="lading"):
            for node in nodes:
                ranks = ranks_of(node, dataset, monkeypatch, remainder="uneven")  # the state's lanes win
                for rank in ranks:
                    rank.load_state_dict(state)
                after += sum(read(ranks), [])
        assert Counter(before + after) == Counter(list(expected())), "every sample exactly once"
        lost = [r for r in caplog.records if "locality lost" in r.getMessage()]
        assert len(lost) == 1 and f"{new_nodes} nodes" in lost[0].getMessage(), caplog.text


def test_node_local_sampler_for_packed_dataset(dataset, s3_env, tmp_path, monkeypatch):
    config = StoreConfig.from_env()
    with ExitStack() as stack:
        nodes = make_nodes(4, s3_env, tmp_path, stack)
        before, states = [], []
        for node in nodes:
            packed = PackedDataset(dataset, config=node.config, cache_dir=node.cache)
            node.proxy.reset_counts()  # the index and offsets file are read once by every node
            for local in range(PER_NODE):
                for name, value in node.env(local).items():
                    monkeypatch.setenv(name, value)
                sampler = NodeLocalSampler(packed, remainder="uneven", **ORDER)
                indices = list(sampler)
                assert len(sampler) == len(indices)
                keys = [sample["__key__"] for sample in packed.__getitems__(indices[:9])]
                keys += [packed[i]["__key__"] for i in indices[9:]]
                before += keys[:9]
                states.append(sampler.state_dict(9))
            assert node.shards_read() <= block_shards(dataset, config, node.number, 4)
        assert all(state == states[0] for state in states)
        after = []
        for rank in range(3):  # resumed as 3 ranks on one node, rank arguments given
            sampler = NodeLocalSampler(
                PackedDataset(dataset, config=config),
                rank=rank,
                world_size=3,
                local_world_size=3,
                remainder="uneven",
                **ORDER,
            )
            sampler.load_state_dict(states[0])
            after += [PackedDataset(dataset, config=config).key(i) for i in sampler]
        assert Counter(before + after) == Counter(list(expected()))


def test_one_node_sequence_does_not_depend_on_ranks_or_workers(dataset, s3_env, tmp_path):
    config = StoreConfig.from_env()
    single = [
        s["__key__"]
        for s in ShardDataset(dataset, config=config, cache_dir=tmp_path / "c", rank=0, world_size=1, **ORDER)
    ]
    ranks = [
        ShardDataset(
            dataset,
            config=config,
            cache_dir=tmp_path / "c",
            rank=r,
            world_size=2,
            local_world_size=2,
            batch_size=3,
            **ORDER,
        )
        for r in range(2)
    ]
    parts = [[s["__key__"] for w in range(2) for s in ranks[r].iter_worker(w, 2)] for r in range(2)]
    assert sorted(parts[0] + parts[1]) == sorted(single)
    assert len(parts[0]) == len(parts[1]) == NSAMPLES // 2


def test_a_synced_pack_is_read_by_shard_dataset_from_the_same_cache(dataset, s3_env, tmp_path):
    import json
    import os
    import subprocess
    import sys

    cache = tmp_path / "node-cache"
    source = dataset.rsplit("/", 1)[0] + "/"
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.url}
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "lading",
                "sync",
                source,
                str(tmp_path / "dest"),
                "--cache-dir",
                str(cache),
                "--json",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        proxy.reset_counts()
        config = StoreConfig.from_env(endpoint_url=proxy.url)
        keys = sorted(s["__key__"] for s in ShardDataset(dataset, config=config, cache_dir=cache))
        assert keys == sorted(expected())
        assert not any(path.endswith(".tar") for method, path in proxy.counts if method == "GET"), (
            "the shards lading sync cached are read without a GET"
        )
    shard = sorted((tmp_path / "dest").glob("ds-*.tar"))[0]
    assert shard.stat().st_nlink >= 3, "sync's entry, DEST and the datasets' folder share one inode"
    shown = subprocess.run(
        [sys.executable, "-m", "lading", "cache", "--cache-dir", str(cache), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    listing = json.loads(shown.stdout)
    assert {row["kind"] for row in listing["datasets"]} == {"datasets", "sync"}
    stored = sum(path.stat().st_size for path in (tmp_path / "dest").iterdir() if path.is_file())
    assert listing["bytes"] <= stored + 4096, "bytes are counted once, however many links"
