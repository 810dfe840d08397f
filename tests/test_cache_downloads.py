"""The node cache's shard downloads go through the I/O core: a shard larger than a part comes in
parallel ranged parts pinned to its version. Its bytes are checked against the CRC32C the index
recorded, inline as they are written; a shard without one (an older index) against the MD5 its
S3 ETag stands for, as lading sync checks them. A corrupted body is refused, never cached."""

from __future__ import annotations

import base64
import hashlib
import os

import google_crc32c
import pytest
from lading.datasets import NodeCache
from lading.stores import StoreConfig, open_store
from lading.stores.local import LocalStore
from lading.stores import obstore_reads
from lading.sync.cache import ShardSource
from lading.transfer.verify import IntegrityError
from proxies import FaultProxy
from sync_fixtures import BUCKET, put_multipart, put_objects, s3_client

PART = 256 << 10


@pytest.fixture
def proxy(s3_env):
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as running:
        yield running


@pytest.fixture
def small_parts(monkeypatch):
    monkeypatch.setattr(obstore_reads, "PART_SIZE", PART)  # our own tunable, so moto stays fast


def crc32c_of(body: bytes) -> str:
    return base64.b64encode(google_crc32c.value(body).to_bytes(4, "big")).decode()


def source_of(
    proxy: FaultProxy, key: str, body: bytes, version: str | None = None, crc32c: str | None = None
) -> ShardSource:
    store = open_store(f"s3://{BUCKET}/data", StoreConfig(endpoint_url=proxy.url, region="us-east-1"))
    version = version or hashlib.md5(body).hexdigest()
    return ShardSource(f"s3://{BUCKET}/data/{key}", lambda: store, key, version, len(body), crc32c)


def read_all(cache: NodeCache, source: ShardSource) -> bytes:
    cached = cache.open(source)
    try:
        return bytes(cached.buffer)
    finally:
        cached.close()


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


@pytest.mark.parametrize("size", [3000, 4 * PART + 1000], ids=["whole", "parts"])
def test_a_recorded_crc32c_is_checked_as_the_bytes_arrive(s3_env, proxy, small_parts, tmp_path, size):
    body = os.urandom(size)
    put_objects(s3_client(s3_env), {"shard.tar": body})
    cache = NodeCache(tmp_path / "cache")
    proxy.add_fault("corrupt", first=1, method="GET")
    with pytest.raises(IntegrityError, match="CRC32C mismatch"):
        cache.open(source_of(proxy, "shard.tar", body, crc32c=crc32c_of(body)))
    assert proxy.injected["corrupt"] == 1
    assert not list((tmp_path / "cache").rglob("shard.tar*.lading-meta")), "nothing cached"
    assert read_all(cache, source_of(proxy, "shard.tar", body, crc32c=crc32c_of(body))) == body


def test_a_shard_whose_etag_is_no_md5_is_still_checked_by_its_crc32c(s3_env, proxy, small_parts, tmp_path):
    """A multipart upload's ETag is not an MD5, so without the index's CRC32C nothing would be
    checked but the size."""
    body = os.urandom((5 << 20) + 1000)
    client = s3_client(s3_env)
    put_objects(client, {})
    etag = put_multipart(client, "data/multi.tar", body)
    assert etag.endswith("-2")
    cache = NodeCache(tmp_path / "cache")
    proxy.add_fault("corrupt", first=1, method="GET")
    with pytest.raises(IntegrityError, match="CRC32C mismatch"):
        cache.open(source_of(proxy, "multi.tar", body, version=etag, crc32c=crc32c_of(body)))
    assert read_all(cache, source_of(proxy, "multi.tar", body, version=etag, crc32c=crc32c_of(body))) == body


def test_a_shard_corrupted_in_the_store_under_the_same_version_is_caught(tmp_path):
    """A local store's version is the file's mtime and size: bytes changed in place, with both
    kept, are the same version, and only the CRC32C tells."""
    folder = tmp_path / "store"
    folder.mkdir()
    body = os.urandom(100_000)
    shard = folder / "shard.tar"
    shard.write_bytes(body)
    store = LocalStore(str(folder))
    info = store.stat("shard.tar")
    stat = shard.stat()
    with open(shard, "r+b") as handle:
        handle.seek(50_000)
        handle.write(bytes([body[50_000] ^ 1]))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert store.stat("shard.tar").version == info.version
    source = ShardSource(str(shard), lambda: store, "shard.tar", info.version, info.size, crc32c_of(body))
    with pytest.raises(IntegrityError, match="CRC32C mismatch"):
        NodeCache(tmp_path / "cache").open(source)


def test_the_inline_check_joins_interleaved_parts_and_refuses_gaps_and_overlaps():
    from lading.transfer.verify import InlineCrc32c

    body = os.urandom(10_000)
    pieces = [(start, body[start : start + 700]) for start in range(0, len(body), 700)]
    check = InlineCrc32c("k", crc32c_of(body))
    for start, piece in pieces[1::2] + pieces[0::2]:  # two interleaved streams, each in order
        check(memoryview(piece), start)
    check.check(len(body))
    gap = InlineCrc32c("k", crc32c_of(body))
    for start, piece in pieces[:3] + pieces[4:]:
        gap(memoryview(piece), start)
    with pytest.raises(IntegrityError, match="do not tile"):
        gap.check(len(body))
    twice = InlineCrc32c("k", crc32c_of(body))
    for start, piece in pieces + pieces[:1]:
        twice(memoryview(piece), start)
    with pytest.raises(IntegrityError):
        twice.check(len(body))
