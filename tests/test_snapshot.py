"""Pinned snapshots: a prefix of 4,000 keys on moto listed once, then sync, mount and StoreDataset
driven from the snapshot with zero listings and zero HEADs (counted at a proxy); replaced and
removed objects are reported by name; a mirror with the same ETags works; diff."""

from __future__ import annotations

import gzip
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from lading.datasets import StoreDataset
from lading.stores import StoreConfig, open_store
from lading.stores.snapshot import SnapshotStore, diff_snapshots, read_snapshot
from proxies import FaultProxy
from test_mount_support import mounted

BUCKET = "snap-bucket"
MIRROR = "snap-mirror"
COUNT = 2_400  # three listing pages, and three folders (1,000, 1,000 and 400 keys)
SOURCE = f"s3://{BUCKET}/data"


def body(i: int) -> bytes:
    return f"object {i}\n".encode() * (1 + i % 3)


def key(i: int) -> str:
    return f"part-{i // 1000}/obj-{i:05d}.txt"


def client_for(env: dict[str, str]):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture(scope="module")
def bucket(moto_server) -> dict[str, str]:
    """COUNT small objects under s3://snap-bucket/data/ (this module never resets moto)."""
    client = client_for(moto_server.env)
    client.create_bucket(Bucket=BUCKET)
    client.create_bucket(Bucket=MIRROR)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: client.put_object(Bucket=BUCKET, Key=f"data/{key(i)}", Body=body(i)), range(COUNT)))
    return dict(moto_server.env)


@pytest.fixture(scope="module")
def snapshot(
    bucket,
    tmp_path_factory,
) -> Path:
    from conftest import run_lading

    path = tmp_path_factory.mktemp("snap") / "data.snap.jsonl"
    result = run_lading("snapshot", SOURCE, "-o", str(path), "--json", env=bucket)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["objects"] == COUNT and summary["source"].startswith(SOURCE)
    return path


@pytest.fixture
def proxy(bucket):
    with FaultProxy(bucket["AWS_ENDPOINT_URL"]) as running:
        yield running


def listings_and_heads(proxy: FaultProxy) -> int:
    return sum(1 for seen in proxy.requests if seen.method == "HEAD" or "list-type" in seen.query)


def test_the_file_is_sorted_small_and_readable_line_by_line(snapshot):
    lines = snapshot.read_bytes().splitlines()
    header = json.loads(lines[0])
    assert header["lading_snapshot"] == 1 and header["source"].startswith(SOURCE) and header["taken"].endswith("Z")
    keys = [json.loads(line)["key"] for line in lines[1:]]
    assert keys == sorted(keys) and len(keys) == COUNT
    assert snapshot.stat().st_size < 110 * COUNT  # about a hundred bytes a key
    first = json.loads(lines[1])
    assert set(first) >= {"key", "size", "version", "mtime"} and first["size"] == len(body(0))
    assert next(read_snapshot(snapshot)).md5 == first["version"]  # a single-part ETag is the MD5


def test_sync_from_a_snapshot_lists_nothing_heads_nothing_and_shards_like_a_listing(
    lading, bucket, snapshot, proxy, tmp_path
):
    env = {**bucket, "AWS_ENDPOINT_URL": proxy.url}
    shard = ["--distribution", "sharded", "--rank", "3", "--world-size", "20"]
    planned = lading("sync", SOURCE, str(tmp_path / "planned"), *shard, "--dry-run", "--json", env=bucket)
    assert planned.returncode == 0, planned.stderr
    expected = sorted(item["key"] for item in json.loads(planned.stdout)["to_fetch"])
    assert len(expected) == COUNT // 20
    proxy.reset_counts()
    result = lading("sync", str(snapshot), str(tmp_path / "rank3"), *shard, "--json", env=env)
    assert result.returncode == 0, result.stderr
    got = sorted(str(p.relative_to(tmp_path / "rank3")) for p in (tmp_path / "rank3").rglob("*.txt"))
    assert got == expected  # the same shard as sharding the listing
    assert listings_and_heads(proxy) == 0
    gets = [seen for seen in proxy.requests if seen.method == "GET"]
    assert len(gets) == len(expected)
    # Each object is small and its recorded ETag is its MD5: one GET of the recorded size with no
    # precondition, published only with those bytes (a replaced object: the test below).
    sizes = {key: len(body(int(key.split("obj-")[1].split(".")[0]))) for key in expected}
    assert sorted((seen.path.split("/data/", 1)[1], seen.headers.get("Range")) for seen in gets) == [
        (key, f"bytes=0-{sizes[key] - 1}") for key in expected
    ]


def test_store_dataset_from_a_snapshot(bucket, snapshot, proxy, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    for name, value in bucket.items():
        if name != "AWS_ENDPOINT_URL":
            monkeypatch.setenv(name, value)
    dataset = StoreDataset(str(snapshot))
    assert len(dataset) == COUNT
    assert dataset[7] == body(sorted(range(COUNT), key=key)[7])
    assert listings_and_heads(proxy) == 0


def test_mount_from_a_snapshot(bucket, snapshot, proxy, tmp_path):
    env = {**bucket, "AWS_ENDPOINT_URL": proxy.url}
    with mounted(str(snapshot), tmp_path / "mnt", env=env) as handle:
        assert len(os.listdir(handle.path / "part-1")) == 1000
        assert (handle.path / key(2210)).read_bytes() == body(2210)
    assert listings_and_heads(proxy) == 0


def test_a_replaced_or_removed_object_is_an_error_naming_it(lading, bucket, tmp_path):
    client = client_for(bucket)
    for i in range(5):
        client.put_object(Bucket=BUCKET, Key=f"small/k{i}.bin", Body=b"v1")
    snap = tmp_path / "small.snap.jsonl"
    assert lading("snapshot", f"s3://{BUCKET}/small", "-o", str(snap), env=bucket).returncode == 0
    client.put_object(Bucket=BUCKET, Key="small/k1.bin", Body=b"version two")
    client.delete_object(Bucket=BUCKET, Key="small/k3.bin")
    result = lading("sync", str(snap), str(tmp_path / "out"), env=bucket)
    assert result.returncode == 1, result.stderr
    assert "k1.bin" in result.stderr and "k3.bin" in result.stderr and "since the snapshot" in result.stderr
    assert (tmp_path / "out" / "k0.bin").read_bytes() == b"v1"
    assert not (tmp_path / "out" / "k1.bin").exists()  # never the newer bytes


def test_a_mirror_with_the_same_etags_syncs_from_the_snapshot(lading, bucket, tmp_path):
    client = client_for(bucket)
    for i in range(6):
        client.put_object(Bucket=BUCKET, Key=f"orig/f{i}.bin", Body=body(i))
        client.put_object(Bucket=MIRROR, Key=f"copy/f{i}.bin", Body=body(i))
    snap = tmp_path / "orig.snap.jsonl.gz"
    assert lading("snapshot", f"s3://{BUCKET}/orig", "-o", str(snap), env=bucket).returncode == 0
    with gzip.open(snap, "rt") as handle:
        assert json.loads(handle.readline())["lading_snapshot"] == 1
    result = lading("sync", f"s3://{MIRROR}/copy", str(tmp_path / "out"), "--snapshot", str(snap), env=bucket)
    assert result.returncode == 0, result.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").glob("*.bin")} == {
        f"f{i}.bin": body(i) for i in range(6)
    }
    client.put_object(Bucket=MIRROR, Key="copy/f2.bin", Body=b"drifted")
    drifted = lading("sync", f"s3://{MIRROR}/copy", str(tmp_path / "again"), "--snapshot", str(snap), env=bucket)
    assert drifted.returncode == 1 and "f2.bin" in drifted.stderr


def test_diff(lading, bucket, tmp_path):
    client = client_for(bucket)
    for name in ("a", "b", "c"):
        client.put_object(Bucket=BUCKET, Key=f"d/{name}", Body=name.encode())
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    assert lading("snapshot", f"s3://{BUCKET}/d", "-o", str(old), env=bucket).returncode == 0
    client.put_object(Bucket=BUCKET, Key="d/b", Body=b"changed")
    client.delete_object(Bucket=BUCKET, Key="d/c")
    client.put_object(Bucket=BUCKET, Key="d/e", Body=b"new")
    assert lading("snapshot", f"s3://{BUCKET}/d", "-o", str(new), env=bucket).returncode == 0
    result = lading("snapshot", "diff", str(old), str(new), "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout) == {"added": ["e"], "removed": ["c"], "changed": ["b"]}
    same = lading("snapshot", "diff", str(old), str(old))
    assert same.returncode == 0 and same.stdout == ""
    assert diff_snapshots(new, old).added == ["c"]


def test_stat_finds_keys_by_binary_search_and_refuses_bad_files(snapshot, tmp_path):
    store = SnapshotStore(
        open_store(SOURCE, StoreConfig(endpoint_url="http://127.0.0.1:9", region="us-east-1")), snapshot
    )
    for i in (0, 1, COUNT // 2 - 1, COUNT - 1):
        assert store.stat(key(i)).size == len(body(i))  # no request: the endpoint is dead
    from lading.core.errors import NotFound, UnsafeKey, UsageError

    with pytest.raises(NotFound):
        store.stat("part-9/zzz")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"lading_snapshot": 1, "source": "s3://b/p/"}\n{"key": "../etc/passwd", "size": 1}\n')
    with pytest.raises(UnsafeKey):
        list(read_snapshot(bad))
    bad.write_text("not json\n")
    with pytest.raises(UsageError):
        list(read_snapshot(bad))


def test_cli_errors_are_one_line(lading, bucket, tmp_path):
    empty = lading("snapshot", f"s3://{BUCKET}/no-such-prefix", "-o", str(tmp_path / "e.jsonl"), env=bucket)
    assert empty.returncode == 3 and "nothing at" in empty.stderr and not (tmp_path / "e.jsonl").exists()
    (tmp_path / "x.jsonl").write_text("hello\n")
    bad = lading("snapshot", "diff", str(tmp_path / "x.jsonl"), str(tmp_path / "x.jsonl"))
    assert bad.returncode == 2 and "not a lading snapshot" in bad.stderr and "Traceback" not in bad.stderr


def test_binary_search_agrees_with_the_file_for_random_key_sets(tmp_path):
    import random

    rng = random.Random(1)
    for trial in range(150):
        keys = sorted(
            {
                "/".join(rng.choice(["a", "b", "ab", "ba", "x"]) for _ in range(rng.randint(1, 4)))
                for _ in range(rng.randint(0, 50))
            }
        )
        path = tmp_path / f"t{trial}.jsonl"
        path.write_text(
            '{"lading_snapshot": 1, "source": "/tmp"}\n'
            + "".join(
                json.dumps({"key": k, "size": rng.randint(0, 10 ** rng.randint(0, 9)), "version": "v"}) + "\n"
                for k in keys
            )
        )
        store = SnapshotStore(open_store(str(tmp_path)), path)
        for k in keys:
            assert store.stat(k).key == k
        for probe in ("a/a/a/a/a", "0", "zz", "ab/x/b"):
            if probe not in keys:
                with pytest.raises(Exception, match="not in the snapshot"):
                    store.stat(probe)


def test_fetch_takes_a_snapshot_as_source(lading, bucket, tmp_path):
    client = client_for(bucket)
    for i in range(4):
        client.put_object(Bucket=BUCKET, Key=f"hook/h{i}.bin", Body=body(i))
    snap = tmp_path / "hook.snap.jsonl"
    assert lading("snapshot", f"s3://{BUCKET}/hook", "-o", str(snap), env=bucket).returncode == 0
    client.put_object(Bucket=BUCKET, Key="hook/late.bin", Body=b"not in the snapshot")
    fetched = lading("fetch", str(snap), f"{tmp_path}/fetched/", env=bucket)
    assert fetched.returncode == 0, fetched.stderr
    assert sorted(p.name for p in (tmp_path / "fetched").glob("*.bin")) == [f"h{i}.bin" for i in range(4)]
