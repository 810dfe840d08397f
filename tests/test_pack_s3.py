"""lading pack with buckets (moto over HTTP): into a bucket with the index uploaded last, out of a
bucket, a server failing mid-pack, and the datasets reading back from the bucket."""

from __future__ import annotations

import base64
import json
import tarfile
from collections import Counter
from pathlib import Path

import boto3
import google_crc32c
import pytest
from lading.core.errors import TransientError
from lading.core.retry import RetryPolicy
from lading.transfer.verify import IntegrityError
from lading.datasets import ShardDataset, StoreDataset
from lading.pack import PackOptions, plan_pack, run_pack
from lading.stores import StoreConfig
from proxies import FaultProxy

BUCKET = "lading-pack"
FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.005, max_delay=0.01)


def crc32c_of(data: bytes) -> str:
    """The CRC32C as an index records it (base64, big-endian), computed here independently."""
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


@pytest.fixture
def s3(s3_env):
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return client


def config(endpoint: str) -> StoreConfig:
    return StoreConfig(endpoint_url=endpoint, region="us-east-1", retry=FAST_RETRY, timeout=10)


def make_source(root: Path, count: int = 24) -> dict[str, bytes]:
    files = {}
    for i in range(count):
        files[f"part/s{i:02d}.bin"] = bytes([i]) * (1500 + 100 * i)
        files[f"part/s{i:02d}.json"] = json.dumps({"i": i}).encode()
    for key, data in files.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def uploads_in_order(proxy: FaultProxy) -> list[str]:
    """Object keys as their upload completed: a PUT without a query, or CompleteMultipartUpload."""
    keys = []
    for seen in proxy.requests:
        single_put = seen.method == "PUT" and not seen.query
        complete = seen.method == "POST" and "uploadId=" in seen.query
        if (single_put or complete) and seen.fault is None:
            keys.append(seen.path.split("/", 2)[2])
    return keys


def test_pack_into_bucket_uploads_shards_then_manifest_then_index(s3, s3_env, tmp_path):
    source = tmp_path / "src"
    files = make_source(source)
    dest = f"s3://{BUCKET}/datasets"
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        settings = config(proxy.url)
        plan = plan_pack(str(source), dest, PackOptions("ds", shard_size=20_000, version="v1"), settings)
        summary = run_pack(plan, str(source), dest, settings).summary()
        order = uploads_in_order(proxy)
    prefix = "datasets/ds/v1/"
    shards = [prefix + shard.name for shard in plan.shards]
    assert len(shards) >= 3
    assert order == shards + [prefix + "ds.manifest.json", prefix + "ds.offsets.safetensors", prefix + "ds.index.json"]
    index = json.loads(s3.get_object(Bucket=BUCKET, Key=prefix + "ds.index.json")["Body"].read())
    for entry, shard_key in zip(index["shardlist"], shards):
        head = s3.head_object(Bucket=BUCKET, Key=shard_key)
        assert entry["etag"] == head["ETag"].strip('"') and entry["filesize"] == head["ContentLength"]
        assert entry["crc32c"] == crc32c_of(s3.get_object(Bucket=BUCKET, Key=shard_key)["Body"].read())
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=prefix + "ds.manifest.json")["Body"].read())
    assert manifest[0] == {"prefix": f"s3://{BUCKET}/{prefix}"}
    assert summary["index"] == f"s3://{BUCKET}/{prefix}ds.index.json"

    # The iterable reads the shards back from the bucket: exactly the input samples.
    loaded = ShardDataset(summary["index"], config=config(s3_env["AWS_ENDPOINT_URL"]), shuffle_buffer=5)
    got = {sample["__key__"]: sample for sample in loaded}
    assert sorted(got) == sorted({key.rsplit(".", 1)[0] for key in files})
    assert all(got[f"part/s{i:02d}"]["bin"] == files[f"part/s{i:02d}.bin"] for i in range(24))

    # A body corrupted on its way is caught by the index's CRC32C, and nothing of it is cached.
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        proxy.add_fault("corrupt", first=1, method="GET", path_prefix=f"/{BUCKET}/{shards[0]}")
        reader = ShardDataset(summary["index"], config=config(proxy.url), cache_dir=tmp_path / "fresh")
        with pytest.raises(IntegrityError, match="CRC32C mismatch"):
            list(reader)
        assert proxy.injected["corrupt"] == 1


def test_server_failing_mid_pack_leaves_no_index(s3, s3_env, tmp_path):
    source = tmp_path / "src"
    make_source(source)
    dest = f"s3://{BUCKET}/broken"
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        settings = config(proxy.url)
        plan = plan_pack(str(source), dest, PackOptions("ds", shard_size=20_000), settings)
        # the 2nd shard's PUT and all its retries get 503 SlowDown
        proxy.add_fault("slowdown", rate=1.0, method="PUT", path_prefix=f"/{BUCKET}/broken/ds-000001")
        with pytest.raises(TransientError):
            run_pack(plan, str(source), dest, settings)
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="broken/").get("Contents", [])]
    assert "broken/ds.index.json" not in keys and "broken/ds.manifest.json" not in keys
    assert "broken/ds-000001.tar" not in keys


def test_pack_out_of_a_bucket(s3, s3_env, tmp_path):
    files = make_source(tmp_path / "src", count=10)
    for key, data in files.items():
        s3.put_object(Bucket=BUCKET, Key=f"raw/{key}", Body=data)
    s3.put_object(Bucket=BUCKET, Key="raw/part/", Body=b"")  # a console "folder" marker is ignored
    settings = config(s3_env["AWS_ENDPOINT_URL"])
    dest = tmp_path / "out"
    plan = plan_pack(f"s3://{BUCKET}/raw", str(dest), PackOptions("raw", shard_size=10_000), settings)
    run_pack(plan, f"s3://{BUCKET}/raw", str(dest), settings)
    contents = {}
    for shard in sorted(dest.glob("raw-*.tar")):
        with tarfile.open(shard) as archive:
            contents.update({m.name: archive.extractfile(m).read() for m in archive.getmembers()})
    assert contents == files


def test_store_dataset_over_a_bucket_prefix(s3, s3_env):
    objects = {f"imgs/{i:03d}.bin": bytes([i]) * (10 + i) for i in range(12)}
    for key, data in objects.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        dataset = StoreDataset(f"s3://{BUCKET}/imgs", config=config(proxy.url), prefetch=4)
        assert len(dataset) == 12
        proxy.reset_counts()
        got = [dataset[i] for i in range(12)]
        gets = Counter(seen.path for seen in proxy.requests if seen.method == "GET")
    assert got == list(objects.values())
    assert set(gets) == {f"/{BUCKET}/{key}" for key in objects}
    assert all(count == 1 for count in gets.values()), "prefetched objects were fetched again"


def test_cli_missing_bucket_and_existing_dataset(s3, s3_env, lading, tmp_path):
    source = tmp_path / "src"
    make_source(source, count=3)
    missing = lading("pack", str(source), "s3://no-such-bucket-here/x", env=s3_env)
    assert missing.returncode == 3, missing.stderr
    assert "Traceback" not in missing.stderr
    first = lading("pack", str(source), f"s3://{BUCKET}/sets", "--name", "ds", "--json", env=s3_env)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["index"] == f"s3://{BUCKET}/sets/ds.index.json"
    again = lading("pack", str(source), f"s3://{BUCKET}/sets", "--name", "ds", env=s3_env)
    assert again.returncode == 2 and "already exists" in again.stderr
