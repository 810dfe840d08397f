"""What the mount shows and what it costs: sharded views, manifests, the tree's rules, and the
requests it makes (one GET per small file, none on a warm disk cache)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from lading.mounts.tree import Tree
from lading.selection.sharding import select_for_rank
from lading.stores.base import ObjectInfo
from proxies import FaultProxy
from test_mount_support import cli, mounted, put_objects

BUCKET = "mount-view"
RNG = random.Random(5)
OBJECTS = {f"train/{c}/{i:03d}.jpg": RNG.randbytes(RNG.randrange(100, 3000)) for c in ("cat", "dog") for i in range(13)}
OBJECTS["README"] = b"read me\n"


@pytest.fixture(scope="module")
def bucket(moto_server) -> dict[str, str]:
    put_objects(moto_server.env, BUCKET, OBJECTS)
    return moto_server.env


def _files(root: Path) -> set[str]:
    return {str(Path(d, f).relative_to(root)) for d, _, files in os.walk(root) for f in files}


@pytest.mark.parametrize("balance", ["count", "bytes"])
def test_sharded_view_shows_exactly_this_ranks_keys(bucket, tmp_path: Path, balance: str) -> None:
    infos = [ObjectInfo(k, len(v), "") for k, v in OBJECTS.items()]
    seen: set[str] = set()
    for rank in range(3):
        expected = {o.key for o in select_for_rank(infos, rank, 3, "sharded", balance)}
        with mounted(
            f"s3://{BUCKET}",
            tmp_path / f"r{rank}",
            "--distribution",
            "sharded",
            "--balance",
            balance,
            "--rank",
            str(rank),
            "--world-size",
            "3",
            env=bucket,
        ) as mnt:
            shown = _files(mnt.path)
            assert shown == expected
            for key in shown:
                assert (mnt.path / key).read_bytes() == OBJECTS[key]
        assert not seen & shown
        seen |= shown
    assert seen == set(OBJECTS)


def test_rank_comes_from_the_launcher_environment(bucket, tmp_path: Path) -> None:
    env = {**bucket, "RANK": "1", "WORLD_SIZE": "2"}
    expected = {o.key for o in select_for_rank([ObjectInfo(k, 1, "") for k in OBJECTS], 1, 2, "sharded")}
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", "--distribution", "sharded", env=env) as mnt:
        assert _files(mnt.path) == expected


def test_manifest_shows_only_listed_keys(bucket, tmp_path: Path) -> None:
    manifest = tmp_path / "keys.txt"
    manifest.write_text("# two samples\ntrain/cat/001.jpg\ntrain/dog/012.jpg\n")
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", "--manifest", str(manifest), env=bucket) as mnt:
        assert _files(mnt.path) == {"train/cat/001.jpg", "train/dog/012.jpg"}
        assert (mnt.path / "train/dog/012.jpg").read_bytes() == OBJECTS["train/dog/012.jpg"]
    manifest.write_text("train/cat/001.jpg\ntrain/cat/999.jpg\n")
    result = cli("mount", f"s3://{BUCKET}", str(tmp_path / "mnt"), "--manifest", str(manifest), env=bucket)
    assert result.returncode == 3 and "train/cat/999.jpg" in result.stderr
    assert not os.path.ismount(tmp_path / "mnt")


def test_one_get_per_small_file_and_a_warm_disk_cache_skips_the_store(moto_server, tmp_path: Path) -> None:
    bucket = "mount-requests"
    files = {f"s/{i:02d}.bin": RNG.randbytes(64 * 1024) for i in range(12)}
    put_objects(moto_server.env, bucket, files)
    cache = tmp_path / "cache"
    with FaultProxy(moto_server.url) as proxy:
        env = {**moto_server.env, "AWS_ENDPOINT_URL": proxy.url}
        for epoch in range(2):
            proxy.reset_counts()
            with mounted(f"s3://{bucket}", tmp_path / f"mnt{epoch}", "--cache-dir", str(cache), env=env) as mnt:
                listed = proxy.count("GET")
                for key, body in files.items():
                    assert (mnt.path / key).read_bytes() == body
                object_gets = proxy.count("GET") - listed
                assert proxy.count("HEAD") == 0
                assert object_gets == (len(files) if epoch == 0 else 0), (epoch, object_gets)
                if epoch == 1:
                    assert mnt.stats()["disk_hits"] >= len(files)


def test_tree_rules_markers_shadowing_and_unsafe_keys() -> None:
    infos = [
        ObjectInfo(k, s, "v")
        for k, s in [
            ("a", 1),
            ("a/b", 2),
            ("empty/", 0),
            ("m/", 0),
            ("m/x", 3),
            ("bad/../x", 1),
            ("c//d", 1),
            ("notempty/", 5),
            ("z", 4),
        ]
    ]
    tree = Tree(infos)
    assert tree.children("") == ("a", "empty", "m", "z")
    assert tree.is_dir("a") and tree.file_index("a") is None  # the directory wins
    assert tree.children("empty") == ()
    assert tree.children("m") == ("x",)
    assert tree.hidden.counts == {"shadowed": 1, "unsafe": 3}
    assert tree.entry(tree.file_index("a/b")).size == 2 and tree.total_bytes == 2 + 3 + 4
