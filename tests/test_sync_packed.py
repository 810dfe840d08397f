"""`lading sync` of a packed dataset through the node cache: reuse on matching ETags, refuse a mix."""

from __future__ import annotations

import json
import os

import pytest
from proxies import FaultProxy
from sync_fixtures import object_gets, read_tree, s3_client

BUCKET = "packed-bucket"
SOURCE = f"s3://{BUCKET}/ds"


@pytest.fixture
def packed(s3_env, tmp_path, lading):
    """A tiny dataset packed into moto as toy v1 (several 4 KB shards); returns the boto3 client."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(10):
        (src / f"s{i:02d}.bin").write_bytes(os.urandom(1500))
    client = s3_client(s3_env)
    client.create_bucket(Bucket=BUCKET)
    result = lading("pack", str(src), SOURCE, "--name", "toy", "--version", "v1", "--shard-size", "4KB")
    assert result.returncode == 0, result.stderr
    return client


def sync(lading, dest, cache, env, *extra):
    return lading("sync", SOURCE, str(dest), "--cache-dir", str(cache), *extra, env=env)


def shard_keys(client) -> list[str]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="ds/toy/v1/")["Contents"]
    return sorted(item["Key"] for item in listed if item["Key"].endswith(".tar"))


def test_second_sync_reuses_the_cache_without_any_get(packed, s3_env, tmp_path, lading):
    assert len(shard_keys(packed)) >= 3
    cache = tmp_path / "cache"
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        env = {"AWS_ENDPOINT_URL": proxy.url}
        first = sync(lading, tmp_path / "rank0", cache, env, "--json")
        assert first.returncode == 0, first.stderr
        first_summary = json.loads(first.stdout)
        assert first_summary["reused"] == [] and first_summary["downloaded_bytes"] > 0
        assert object_gets(proxy) == first_summary["files"]

        proxy.reset_counts()
        second = sync(lading, tmp_path / "rank1", cache, env, "--json")
        assert second.returncode == 0, second.stderr
        assert object_gets(proxy) == 0  # not even the index
        summary = json.loads(second.stdout)
        assert summary["reused"] == [{"name": "toy", "version": "v1", "index": "toy/v1/toy.index.json"}]
        assert summary["downloaded_bytes"] == 0 and summary["files"] == first_summary["files"]
        assert read_tree(tmp_path / "rank1") == read_tree(tmp_path / "rank0")

        human = sync(lading, tmp_path / "rank2", cache, env)
        assert human.returncode == 0, human.stderr
        assert "reused cached packed dataset toy v1" in human.stderr
        assert object_gets(proxy) == 0


def test_shard_replaced_behind_the_index_is_refused(packed, s3_env, tmp_path, lading):
    cache = tmp_path / "cache"
    first = sync(lading, tmp_path / "rank0", cache, {})
    assert first.returncode == 0, first.stderr
    before = read_tree(tmp_path / "rank0")
    replaced = shard_keys(packed)[1]
    packed.put_object(Bucket=BUCKET, Key=replaced, Body=b"re-packed content")

    for dest in (tmp_path / "rank1", tmp_path / "rank0"):
        result = sync(lading, dest, cache, {})
        assert result.returncode == 1, result.stderr
        assert "packed dataset toy v1 does not match its index, nothing was written" in result.stderr
        assert replaced.removeprefix("ds/") in result.stderr and "Traceback" not in result.stderr
        assert "re-pack" in result.stderr  # the hint
    assert not (tmp_path / "rank1").exists()
    assert read_tree(tmp_path / "rank0") == before


def test_mismatch_on_a_cold_cache_is_refused_before_dest(packed, tmp_path, lading):
    packed.put_object(Bucket=BUCKET, Key=shard_keys(packed)[0], Body=b"x" * 10)
    result = sync(lading, tmp_path / "rank0", tmp_path / "cache", {}, "--json")
    assert result.returncode == 1
    assert "does not match its index" in result.stderr
    assert not (tmp_path / "rank0").exists()


def test_filtered_or_uncached_sync_is_unchanged(packed, tmp_path, lading):
    packed.put_object(Bucket=BUCKET, Key=shard_keys(packed)[0], Body=b"x" * 10)
    plain = lading("sync", SOURCE, str(tmp_path / "plain"), "--json")  # no cache: a plain mirror
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["reused"] == []
    assert read_tree(tmp_path / "plain")["toy/v1/toy-000000.tar"] == b"x" * 10
    shards_only = sync(lading, tmp_path / "shards", tmp_path / "cache", {}, "--include", "*.tar", "--json")
    assert shards_only.returncode == 0, shards_only.stderr  # no index in the selection: no check
