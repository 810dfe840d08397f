"""Random access: PackedDataset (one ranged read per sample, through the offsets file lading pack
writes next to the index) and RecordDataset (fixed-size records, neighbours coalesced)."""

from __future__ import annotations

import json
import random
import struct
import tarfile
import uuid
from collections import Counter
from pathlib import Path

import pytest
from lading.core.errors import UsageError
from lading.datasets import NodeCache, PackedDataset, RecordDataset, ShardDataset
from lading.pack import PackOptions, plan_pack, run_pack
from lading.pack.offsets import decode
from lading.stores import StoreConfig
from proxies import FaultProxy

NSAMPLES = 60


def make_source(root: Path) -> dict[str, dict[str, bytes]]:
    """60 samples; some with a third member, one with a long (pax) name, varied sizes."""
    files: dict[str, dict[str, bytes]] = {}
    for i in range(NSAMPLES):
        key = f"part{i % 3}/s{i:03d}" if i != 7 else "deep/" + "x" * 120 + "/s007"
        fields = {"bin": bytes([i]) * (13 * i + 1), "json": json.dumps({"i": i}).encode()}
        if i % 4 == 0:
            fields["seg.png"] = b"\x89PNG-not-really" + bytes([i])
        files[key] = fields
        for ext, data in fields.items():
            path = root / f"{key}.{ext}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return files


@pytest.fixture(scope="module")
def local_pack(tmp_path_factory) -> tuple[str, dict[str, dict[str, bytes]], list[str]]:
    root = tmp_path_factory.mktemp("packed")
    files = make_source(root / "src")
    plan = plan_pack(str(root / "src"), str(root / "out"), PackOptions("ds", shard_size=8_000, shuffle=True, seed=3))
    run_pack(plan, str(root / "src"), str(root / "out"))
    order = [sample.key for shard in plan.shards for sample in shard.samples]
    return str(root / "out" / "ds.index.json"), files, order


def plain(sample: dict) -> dict[str, bytes]:
    return {ext: data for ext, data in sample.items() if ext != "__key__"}


def test_random_indices_return_exactly_the_input_files(local_pack):
    index, files, order = local_pack
    dataset = PackedDataset(index)
    assert len(dataset) == NSAMPLES
    for position in random.Random(5).sample(range(NSAMPLES), 25) + [0, NSAMPLES - 1, -1]:
        sample = dataset[position]
        assert sample["__key__"] == order[position] == dataset.key(position)
        assert plain(sample) == files[order[position]]
    batch = dataset.__getitems__([9, 3, 4, 9, 59])
    assert [s["__key__"] for s in batch] == [order[i] for i in (9, 3, 4, 9, 59)]
    assert all(plain(s) == files[s["__key__"]] for s in batch)
    with pytest.raises(IndexError):
        dataset[NSAMPLES]


def test_pack_order_matches_the_iterable(local_pack):
    index, _, order = local_pack
    assert [s["__key__"] for s in ShardDataset(index)] == order


def test_distributed_sampler_with_dataloader_workers(local_pack):
    torch_data = pytest.importorskip("torch.utils.data")
    from torch.utils.data.distributed import DistributedSampler

    index, files, _ = local_pack
    dataset = PackedDataset(index)
    seen = []
    for rank in range(3):
        sampler = DistributedSampler(dataset, num_replicas=3, rank=rank, shuffle=True, seed=1)
        loader = torch_data.DataLoader(
            dataset, batch_size=5, sampler=sampler, num_workers=2, collate_fn=list, multiprocessing_context="fork"
        )
        for batch in loader:
            for sample in batch:
                assert plain(sample) == files[sample["__key__"]]
                seen.append(sample["__key__"])
    assert Counter(seen) == Counter(list(files))


def test_offsets_file_describes_every_member(local_pack):
    index, files, _ = local_pack
    folder = Path(index).parent
    document = json.loads(Path(index).read_text())
    entry = document["lading"]["offsets"]
    assert entry["url"] == "ds.offsets.safetensors" and entry["filesize"] == (folder / entry["url"]).stat().st_size
    assert document["__kind__"] == "wids-shard-index-v1" and document["wids_version"] == 1  # still a wids index
    data = (folder / entry["url"]).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    assert (8 + length) % 8 == 0 and json.loads(data[8 : 8 + length])["__metadata__"]["format"] == "lading-offsets"
    table = decode(data, entry["url"])
    number = 0
    for s, shard in enumerate(document["shardlist"]):
        assert table.shards[s] == (shard["url"], shard["nsamples"])
        with tarfile.open(folder / shard["url"]) as archive:
            members = archive.getmembers()
        for member in members:  # tarfile's own idea of where each file's data is
            assert table.member_offset[number] == member.offset_data and table.member_size[number] == member.size
            number += 1
    assert number == len(table.member_offset) == sum(len(f) for f in files.values())


def test_offsets_file_is_a_safetensors_file(local_pack):
    safetensors = pytest.importorskip("safetensors")
    pytest.importorskip("torch")
    index, _, _ = local_pack
    path = Path(index).parent / "ds.offsets.safetensors"
    table = decode(path.read_bytes(), str(path))
    with safetensors.safe_open(str(path), framework="pt") as handle:
        assert handle.metadata()["format"] == "lading-offsets"
        assert handle.get_tensor("member_size").tolist() == list(table.member_size)
        assert bytes(handle.get_tensor("keys").tolist()) == table.keys


def test_an_index_without_offsets_is_refused_with_a_hint(local_pack, tmp_path):
    index, _, _ = local_pack
    document = json.loads(Path(index).read_text())
    del document["lading"]["offsets"]
    for shard in document["shardlist"]:
        shard["url"] = str(Path(index).parent / shard["url"])
    (tmp_path / "old.index.json").write_text(json.dumps(document))
    with pytest.raises(UsageError, match="no offsets file"):
        PackedDataset(str(tmp_path / "old.index.json"))
    # the iterable still reads it, finding samples through the tar headers
    assert len(list(ShardDataset(str(tmp_path / "old.index.json")))) == NSAMPLES


@pytest.fixture
def bucket(s3_env):
    import boto3

    name = f"packed-{uuid.uuid4().hex[:10]}"
    client = boto3.client("s3")
    client.create_bucket(Bucket=name)
    return name, client


def test_one_ranged_get_per_sample_from_a_bucket(bucket, s3_env, tmp_path):
    name, _ = bucket
    files = make_source(tmp_path / "src")
    dest = f"s3://{name}/sets"
    plan = plan_pack(str(tmp_path / "src"), dest, PackOptions("ds", shard_size=8_000))
    run_pack(plan, str(tmp_path / "src"), dest)
    order = [sample.key for shard in plan.shards for sample in shard.samples]
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        config = StoreConfig.from_env(endpoint_url=proxy.url)
        dataset = PackedDataset(f"{dest}/ds.index.json", config=config, cache_dir=tmp_path / "no-cache-yet")
        proxy.reset_counts()
        picks = random.Random(2).sample(range(NSAMPLES), 12)
        for position in picks:
            assert plain(dataset[position]) == files[order[position]]
        gets = [seen for seen in proxy.requests if seen.method == "GET"]
        assert len(gets) == len(picks) and all(seen.headers.get("Range") for seen in gets)
        assert proxy.count("HEAD") == 0
        # a batch: samples of one shard close together come in one read
        proxy.reset_counts()
        first_shard = list(range(len(plan.shards[0].samples)))
        batch = dataset.__getitems__(first_shard)
        assert [s["__key__"] for s in batch] == order[: len(first_shard)]
        assert proxy.count("GET") == 1
        # once a ShardDataset has cached the shards on this node, no GET at all
        list(ShardDataset(f"{dest}/ds.index.json", config=config, cache_dir=tmp_path / "cache"))
        cached = PackedDataset(f"{dest}/ds.index.json", config=config, cache_dir=tmp_path / "cache")
        proxy.reset_counts()
        assert [plain(cached[p]) for p in picks] == [files[order[p]] for p in picks]
        assert proxy.count("GET") == 0
    assert NodeCache(tmp_path / "cache").root.is_dir()


def test_records_one_read_each_and_neighbours_coalesced(bucket, s3_env):
    name, client = bucket
    header = b"HDR:v1\0\0"
    records = [struct.pack("<4I", i, i * i, 7, i % 3) for i in range(1000)]
    client.put_object(Bucket=name, Key="tokens/train.bin", Body=header + b"".join(records))
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        config = StoreConfig.from_env(endpoint_url=proxy.url)
        dataset = RecordDataset(f"s3://{name}/tokens/train.bin", 16, header_bytes=8, config=config, max_gap=0)
        assert len(dataset) == 1000
        proxy.reset_counts()
        assert dataset[5] == records[5] and dataset[-1] == records[999]
        assert proxy.count("GET") == 2
        proxy.reset_counts()
        assert dataset.__getitems__([501, 5, 6, 7, 500, 6]) == [records[i] for i in (501, 5, 6, 7, 500, 6)]
        ranges = Counter(seen.headers.get("Range") for seen in proxy.requests if seen.method == "GET")
        assert ranges == Counter([f"bytes={8 + 5 * 16}-{8 + 8 * 16 - 1}", f"bytes={8 + 500 * 16}-{8 + 502 * 16 - 1}"])
        decoded = RecordDataset(
            f"s3://{name}/tokens/train.bin",
            16,
            header_bytes=8,
            config=config,
            decode=lambda data: struct.unpack("<4I", data),
        )
        proxy.reset_counts()
        assert decoded.__getitems__([10, 12, 11]) == [(i, i * i, 7, i % 3) for i in (10, 12, 11)]
        assert proxy.count("GET") == 1  # within the default gap: one read
    with pytest.raises(UsageError, match="whole records"):
        RecordDataset(f"s3://{name}/tokens/train.bin", 15, header_bytes=8)
    with pytest.raises(IndexError):
        dataset[1000]
