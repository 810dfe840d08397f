"""The node cache: concurrent ranks on one node download once, each DEST is built from links."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO
from proxies import FaultProxy
from sync_fixtures import BUCKET, object_gets, put_objects, read_tree, s3_client, sample_objects, stray_temporaries

SOURCE = f"s3://{BUCKET}/data"


@pytest.fixture
def dataset(s3_env):
    objects = sample_objects(40, seed=7)
    put_objects(s3_client(s3_env), objects)
    return objects


def start_rank(rank: int, world: int, dest: str, cache: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    full_env = {**os.environ, **env}
    args = [
        sys.executable,
        "-m",
        "lading",
        "sync",
        SOURCE,
        dest,
        "--rank",
        str(rank),
        "--local-rank",
        str(rank),
        "--world-size",
        str(world),
        "--local-world-size",
        str(world),
        "--cache-dir",
        str(cache),
        "--json",
        *extra,
    ]
    return subprocess.Popen(args, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_ranks(world: int, dest: str, cache: Path, env: dict[str, str]) -> list[dict]:
    procs = [start_rank(rank, world, dest, cache, env) for rank in range(world)]
    summaries = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        summaries.append(json.loads(out))
    return summaries


def test_four_concurrent_ranks_download_once(dataset, s3_env, tmp_path):
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        env = {"AWS_ENDPOINT_URL": proxy.url}
        cache = tmp_path / "cache"
        summaries = run_ranks(4, str(tmp_path / "rank{rank}"), cache, env)
        assert object_gets(proxy) == len(dataset)  # once per node, not once per rank
        assert sorted(s["downloaded_bytes"] > 0 for s in summaries) == [False, False, False, True]
        for rank in range(4):
            dest = tmp_path / f"rank{rank}"
            assert read_tree(dest) == dataset
            assert stray_temporaries(dest) == []
            assert summaries[rank]["files"] == len(dataset) and summaries[rank]["cache"]
        sample = tmp_path / "rank2" / sorted(dataset)[0]
        assert sample.stat().st_nlink == 6  # cache entry + 4 ranks + the datasets' view of the cache: one inode

        proxy.reset_counts()
        summaries = run_ranks(4, str(tmp_path / "rank{rank}"), cache, env)
        assert object_gets(proxy) == 0
        assert all(s["files"] == 0 and s["skipped"] == len(dataset) for s in summaries)


def test_cache_on_another_filesystem_copies(dataset, s3_env, tmp_path, lading):
    if os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a different filesystem than the test tmp dir")
    dest = Path(tempfile.mkdtemp(prefix="lading-exdev-", dir="/dev/shm"))
    try:
        result = lading(
            "sync",
            SOURCE,
            str(dest / "r{rank}"),
            "--local-world-size",
            "2",
            "--world-size",
            "2",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--json",
        )
        assert result.returncode == 0, result.stderr
        assert read_tree(dest / "r0") == dataset
        assert (dest / "r0" / sorted(dataset)[0]).stat().st_nlink == 1  # a copy, not a link
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def test_sharded_ranks_bypass_sharing_and_no_cache_flag(dataset, s3_env, tmp_path, lading):
    result = lading(
        "sync",
        SOURCE,
        str(tmp_path / "s{rank}"),
        "--distribution",
        "sharded",
        "--rank",
        "1",
        "--world-size",
        "2",
        "--local-rank",
        "1",
        "--local-world-size",
        "2",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert set(read_tree(tmp_path / "s1")) == set(sorted(dataset)[1::2])
    result = lading(
        "sync", SOURCE, str(tmp_path / "n"), "--local-world-size", "2", "--world-size", "2", "--no-cache", "--json"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["cache"] is None
    assert read_tree(tmp_path / "n") == dataset
