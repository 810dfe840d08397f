"""Which client reads in forked DataLoader workers (issue 18's fork rules), at the wire.

Each scenario runs a training-like script in a fresh process (tests/scripts/forked_loader.py):
it builds a dataset, then a DataLoader with two forked workers (torch's default on Linux). Requests
go through the counting proxy, which records each request's User-Agent: obstore's contains
``object_store``, boto3's ``Boto3``/``Botocore``, google-cloud-storage's ``gcloud-python``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest
from lading.pack import PackOptions, plan_pack, run_pack
from lading.stores import StoreConfig
from proxies import FaultProxy
from sync_fixtures import BUCKET, put_objects, s3_client

pytest.importorskip("torch.utils.data")

SCRIPT = Path(__file__).parent / "scripts" / "forked_loader.py"
NOBJECTS = 24


@pytest.fixture
def proxy(s3_env):
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as running:
        yield running


def run_loader(kind: str, uri: str, endpoint_env: dict[str, str], *extra: str) -> tuple[dict, str]:
    env = {**os.environ, **endpoint_env}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), kind, uri, *extra], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def object_gets(proxy: FaultProxy, prefix: str) -> list:
    return [
        seen
        for seen in proxy.requests
        if seen.method == "GET" and seen.path.startswith(prefix) and not seen.query.startswith("list-type")
    ]


def is_obstore(seen) -> bool:
    return "object_store" in (seen.headers.get("User-Agent") or "")


@pytest.fixture
def small_objects(s3_env):
    objects = {f"obj-{i:03d}.bin": os.urandom(1000 + 97 * i) for i in range(NOBJECTS)}
    put_objects(s3_client(s3_env), objects)
    return objects


def test_forked_workers_read_store_objects_through_obstore(proxy, small_objects):
    got, stderr = run_loader("store", f"s3://{BUCKET}/data", {"AWS_ENDPOINT_URL": proxy.url})
    assert sorted(got["samples"]) == sorted(len(body) for body in small_objects.values())
    assert len(got["workers"]) == 2 and got["parent"] not in got["workers"]
    gets = object_gets(proxy, f"/{BUCKET}/data/")
    assert len(gets) == NOBJECTS and all(is_obstore(seen) for seen in gets), {
        seen.headers.get("User-Agent") for seen in gets
    }
    assert "forked after obstore started" not in stderr


def test_a_parent_that_read_first_makes_workers_fall_back_with_one_warning_each(proxy, small_objects):
    proxy.add_fault("truncate", first=1, method="GET", path_prefix=f"/{BUCKET}/data/obj-02")
    got, stderr = run_loader("store", f"s3://{BUCKET}/data", {"AWS_ENDPOINT_URL": proxy.url}, "--parent-reads-first")
    assert sorted(got["samples"]) == sorted(len(body) for body in small_objects.values())
    gets = object_gets(proxy, f"/{BUCKET}/data/")
    worker_gets = [seen for seen in gets if not seen.path.endswith("obj-000.bin")]
    assert worker_gets and not any(is_obstore(seen) for seen in worker_gets)  # boto3 in the workers
    assert is_obstore(next(seen for seen in gets if seen.path.endswith("obj-000.bin")))  # the parent's read
    warnings = [line for line in stderr.splitlines() if "forked after obstore started" in line]
    assert len(warnings) == 2 and len({line.split()[0] for line in warnings}) == 2  # once per worker
    assert "forkserver" in warnings[0]
    # the cut body was resumed with a Range request from the bytes that had arrived
    cut = [seen for seen in gets if seen.fault == "truncate"]
    assert len(cut) == 1
    again = [seen for seen in gets if seen.path == cut[0].path and seen.fault is None]
    assert (
        again
        and again[-1].headers.get("Range", "").startswith("bytes=")
        and not again[-1].headers.get("Range").startswith("bytes=0-")
    )


def _pack_into_s3(tmp_path: Path, s3_env: dict[str, str], endpoint: str) -> str:
    source = tmp_path / "src"
    source.mkdir()
    for i in range(40):
        (source / f"k{i:03d}.bin").write_bytes(bytes([i]) * (300 + 41 * i))
    dest = f"s3://{BUCKET}/packed"
    s3_client(s3_env).create_bucket(Bucket=BUCKET)
    config = StoreConfig(endpoint_url=endpoint, region="us-east-1")
    plan = plan_pack(str(source), dest, PackOptions("ds", shard_size=4_000), config=config)
    run_pack(plan, str(source), dest, config=config)
    return f"{dest}/ds.index.json"


@pytest.mark.parametrize("kind", ["packed", "shards"])
def test_forked_workers_read_packs_through_obstore(kind, proxy, s3_env, tmp_path):
    index = _pack_into_s3(tmp_path, s3_env, s3_env["AWS_ENDPOINT_URL"])
    got, stderr = run_loader(kind, index, {"AWS_ENDPOINT_URL": proxy.url, "LADING_CACHE_DIR": str(tmp_path / "cache")})
    assert sorted(got["samples"]) == [f"k{i:03d}" for i in range(40)]
    shard_gets = [seen for seen in object_gets(proxy, f"/{BUCKET}/packed/") if ".tar" in seen.path]
    assert shard_gets and all(is_obstore(seen) for seen in shard_gets), {
        seen.headers.get("User-Agent") for seen in shard_gets
    }
    assert "forked after obstore started" not in stderr


def _gcs_objects(gcs_env, tmp_path, bucket: str, count: int = 12) -> None:
    from google.cloud import storage
    from lading.stores import open_store

    client = storage.Client(project="test", client_options={"api_endpoint": gcs_env["STORAGE_EMULATOR_HOST"]})
    client.create_bucket(bucket)
    store = open_store(f"gs://{bucket}/data")
    for i in range(count):
        (tmp_path / "f").write_bytes(os.urandom(500 + i))
        store.upload(tmp_path / "f", f"o{i:02d}.bin")


def _object_reads(proxy: FaultProxy, bucket: str) -> list:
    """GETs of the objects' bytes: obstore's object paths or the SDK's media downloads."""
    return [
        seen
        for seen in proxy.requests
        if seen.method == "GET"
        and (
            unquote(seen.path).startswith(f"/{bucket}/data/o")
            or (unquote(seen.path).startswith(f"/download/storage/v1/b/{bucket}/o/") and "alt=media" in seen.query)
        )
    ]


def test_forked_workers_read_gcs_through_obstore(gcs_env, tmp_path):
    bucket = f"fork-{os.getpid()}"
    with FaultProxy(gcs_env["STORAGE_EMULATOR_HOST"]) as proxy:
        _gcs_objects(gcs_env, tmp_path, bucket)
        proxy.reset_counts()
        got, stderr = run_loader("store", f"gs://{bucket}/data", {"STORAGE_EMULATOR_HOST": proxy.url})
    assert sorted(got["samples"]) == [500 + i for i in range(12)]
    reads = _object_reads(proxy, bucket)
    assert len(reads) >= 12 and all(is_obstore(seen) for seen in reads), {
        seen.headers.get("User-Agent") for seen in reads
    }
    assert "forked after obstore started" not in stderr


def test_gcs_workers_fall_back_to_the_sdk_when_the_parent_read_first(gcs_env, tmp_path):
    bucket = f"fallback-{os.getpid()}"
    with FaultProxy(gcs_env["STORAGE_EMULATOR_HOST"]) as proxy:
        _gcs_objects(gcs_env, tmp_path, bucket)
        proxy.reset_counts()
        got, stderr = run_loader(
            "store", f"gs://{bucket}/data", {"STORAGE_EMULATOR_HOST": proxy.url}, "--parent-reads-first"
        )
    assert sorted(got["samples"]) == [500 + i for i in range(12)]
    workers = [seen for seen in _object_reads(proxy, bucket) if "o00" not in unquote(seen.path)]
    assert len(workers) >= 11 and not any(is_obstore(seen) for seen in workers), {
        seen.headers.get("User-Agent") for seen in workers
    }
    warnings = [line for line in stderr.splitlines() if "forked after obstore started" in line]
    assert len(warnings) == 2 and len({line.split()[0] for line in warnings}) == 2
