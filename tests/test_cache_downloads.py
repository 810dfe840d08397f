"""The node cache's shard downloads go through the I/O core: a shard larger than a part comes in
parallel ranged parts pinned to its version, and its bytes are checked against the MD5 its S3 ETag
stands for, as lading sync checks them (a corrupted body is refused, never cached)."""

from __future__ import annotations

import hashlib
import os

import pytest
from lading.datasets import NodeCache
from lading.stores import StoreConfig, open_store
from lading.stores import obstore_reads
from lading.sync.cache import ShardSource
from lading.transfer.verify import IntegrityError
from proxies import FaultProxy
from sync_fixtures import BUCKET, put_objects, s3_client

PART = 256 << 10


@pytest.fixture
def proxy(s3_env):
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as running:
        yield running


@pytest.fixture
def small_parts(monkeypatch):
    monkeypatch.setattr(obstore_reads, "PART_SIZE", PART)  # our own tunable, so moto stays fast


def source_of(proxy: FaultProxy, key: str, body: bytes) -> ShardSource:
    store = open_store(f"s3://{BUCKET}/data", StoreConfig(endpoint_url=proxy.url, region="us-east-1"))
    return ShardSource(f"s3://{BUCKET}/data/{key}", lambda: store, key, hashlib.md5(body).hexdigest(), len(body))


def test_a_large_shard_comes_in_parallel_parts_pinned_to_its_version(s3_env, proxy, small_parts, tmp_path):
    body = os.urandom(4 * PART + 1000)
    put_objects(s3_client(s3_env), {"big.tar": body})
    cached = NodeCache(tmp_path / "cache").open(source_of(proxy, "big.tar", body))
    try:
        assert bytes(cached.buffer) == body
    finally:
        cached.close()
    gets = [seen for seen in proxy.requests if seen.method == "GET" and seen.path.endswith("big.tar")]
    ranges = sorted(seen.headers.get("Range") for seen in gets)
    assert len(gets) == 5 and ranges[0] == f"bytes=0-{PART - 1}"
    assert all(seen.headers.get("If-Match") == f'"{hashlib.md5(body).hexdigest()}"' for seen in gets)


@pytest.mark.parametrize("size", [3000, 4 * PART + 1000], ids=["whole", "parts"])
def test_a_corrupted_body_is_refused_and_not_cached(s3_env, proxy, small_parts, tmp_path, size):
    body = os.urandom(size)
    put_objects(s3_client(s3_env), {"shard.tar": body})
    cache = NodeCache(tmp_path / "cache")
    proxy.add_fault("corrupt", first=1, method="GET")
    with pytest.raises(IntegrityError, match="MD5"):
        cache.open(source_of(proxy, "shard.tar", body))
    assert proxy.injected["corrupt"] == 1
    cached = cache.open(source_of(proxy, "shard.tar", body))  # the next open downloads it again
    try:
        assert bytes(cached.buffer) == body
    finally:
        cached.close()
