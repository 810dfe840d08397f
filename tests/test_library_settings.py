"""Training code gets the CLI's connection settings with no ``config=``: the datasets resolve
AWS_ENDPOINT_URL and STORAGE_EMULATOR_HOST from the environment, as ``lading sync`` does."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from lading.datasets import ShardDataset, StoreDataset
from lading.pack import PackOptions, plan_pack, run_pack
from lading.stores import StoreConfig, open_store


def make_samples(root: Path, count: int = 12) -> dict[str, bytes]:
    root.mkdir(parents=True)
    samples = {f"s{i:02d}": bytes([i]) * (100 + 7 * i) for i in range(count)}
    for key, data in samples.items():
        (root / f"{key}.bin").write_bytes(data)
    return samples


def make_bucket(scheme: str, name: str) -> None:
    if scheme == "s3":
        import boto3

        boto3.client("s3").create_bucket(Bucket=name)
    else:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        storage.Client(project="test", credentials=AnonymousCredentials()).create_bucket(name)


@pytest.fixture(params=["s3", "gs"])
def bucket_uri(request) -> str:
    """A fresh bucket on moto (AWS_ENDPOINT_URL) or the GCS emulator (STORAGE_EMULATOR_HOST),
    with only those variables set: nothing passes a config."""
    request.getfixturevalue("s3_env" if request.param == "s3" else "gcs_env")
    name = f"settings-{uuid.uuid4().hex[:12]}"
    make_bucket(request.param, name)
    return f"{request.param}://{name}"


def test_from_env_reads_the_emulators(s3_env, gcs_env):
    config = StoreConfig.from_env()
    assert config.endpoint_url == s3_env["AWS_ENDPOINT_URL"]
    assert config.gcs_endpoint is not None and config.gcs_endpoint.endswith(
        gcs_env["STORAGE_EMULATOR_HOST"].split("//")[-1]
    )
    assert StoreConfig.from_env(endpoint_url="http://127.0.0.1:1").endpoint_url == "http://127.0.0.1:1"  # flag wins


def test_datasets_honour_the_environment_without_config(tmp_path, bucket_uri):
    samples = make_samples(tmp_path / "src")
    dest = f"{bucket_uri}/packed"
    plan = plan_pack(str(tmp_path / "src"), dest, PackOptions("ds", shard_size=600))
    run_pack(plan, str(tmp_path / "src"), dest)
    assert len(plan.shards) > 1

    streamed = {sample["__key__"]: sample["bin"] for sample in ShardDataset(f"{dest}/ds.index.json")}
    assert streamed == samples

    raw = StoreDataset(dest, suffixes=[".tar"])
    assert len(raw) == len(plan.shards)
    store = open_store(dest)  # also without a config
    first = sorted(info.key for info in store.list() if info.key.endswith(".tar"))[0]
    assert raw[0] == store.read_range(first, 0, store.stat(first).size)
