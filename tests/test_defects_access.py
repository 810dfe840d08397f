"""Issue 26, item 4: a directory the user may not write or enter is exit 4 in `pack` and for a
`--cache-dir`, and a missing directory is exit 3 in `hook init` as in `check`. The CLI runs as
``nobody`` (when the suite runs as root) where permissions matter. Each test failed before its fix."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
from conftest import one_line_error, run_unprivileged

NOBODY = 65534


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory under /tmp that every user can read, holding a small source ``pets`` and
    ``locked``, a directory the unprivileged user may not enter."""
    parent = Path(tempfile.mkdtemp(prefix="lading-access-", dir="/tmp"))
    os.chmod(parent, 0o755)
    (parent / "pets").mkdir(mode=0o755)
    for i in range(3):
        (parent / "pets" / f"{i:04d}.jpg").write_bytes(os.urandom(100))
        (parent / "pets" / f"{i:04d}.json").write_text(json.dumps({"id": i}))
    for path in (parent / "pets").iterdir():
        os.chmod(path, 0o644)
    (parent / "locked").mkdir()
    os.chmod(parent / "locked", 0o700 if os.geteuid() == 0 else 0o000)  # root owns it; else no bits
    yield parent
    os.chmod(parent / "locked", 0o700)
    shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.parametrize("dest", ["locked", "locked/shards", "locked/shards/deeper"])
def test_pack_under_a_directory_the_user_cannot_enter_is_exit_4(shared, dest):
    result = run_unprivileged("pack", str(shared / "pets"), str(shared / dest))
    one_line_error(result, 4, "permission denied", str(shared / dest))


@pytest.mark.parametrize("command", [("cache", "list"), ("cache", "clear"), ("cache",)])
def test_a_cache_dir_the_user_cannot_read_is_exit_4(shared, command):
    own = shared / "own-cache"
    (own / "datasets").mkdir(parents=True)
    if os.geteuid() == 0:
        os.chown(own, NOBODY, NOBODY)
        os.chown(own / "datasets", NOBODY, NOBODY)
    os.chmod(own, 0o000)  # the user's own cache, but unreadable
    try:
        for root in (own, shared / "locked" / "cache"):
            one_line_error(run_unprivileged(*command, "--cache-dir", str(root)), 4, "permission denied", str(root))
    finally:
        os.chmod(own, 0o700)


def test_a_missing_directory_is_exit_3_in_hook_init_as_in_check(lading, tmp_path):
    missing = str(tmp_path / "no-such-model")
    for args in (
        ("hook", "init", missing),
        ("hook", "init", missing, "s3://b/train/", "/tmp/train"),
        ("check", missing),
    ):
        one_line_error(lading(*args), 3, "does not exist", "no-such-model")


def test_fetch_of_one_object_under_a_directory_the_user_cannot_enter_is_exit_4(shared, s3_env):
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket="access26")
    client.put_object(Bucket="access26", Key="train/a.bin", Body=b"a")
    for dest in ("locked/a.bin", "locked/sub/"):
        result = run_unprivileged("fetch", "s3://access26/train/a.bin", str(shared / dest))
        one_line_error(result, 4, "permission denied", str(shared / "locked"))


def test_a_snapshot_the_user_cannot_read_is_exit_4(shared, lading):
    snapshot = shared / "private.snap.jsonl"
    assert lading("snapshot", str(shared / "pets"), "-o", str(snapshot)).returncode == 0
    os.chmod(snapshot, 0o600 if os.geteuid() == 0 else 0o000)
    for args in (("cat", str(snapshot)), ("snapshot", "diff", str(snapshot), str(snapshot))):
        one_line_error(run_unprivileged(*args), 4, "permission denied", str(snapshot))


def test_mount_onto_a_mountpoint_we_may_not_reach_is_exit_4(shared):
    result = run_unprivileged("mount", str(shared / "pets"), str(shared / "locked" / "mnt"))
    one_line_error(result, 4, "permission denied", "locked")


def test_mount_with_a_cache_dir_we_may_not_use_is_exit_4(shared):
    (shared / "mnt").mkdir(mode=0o777)
    os.chmod(shared / "mnt", 0o777)
    result = run_unprivileged("mount", str(shared / "pets"), str(shared / "mnt"), "--cache-dir", str(shared / "locked"))
    one_line_error(result, 4, "permission denied", "locked")


@pytest.mark.parametrize("command", ["sync", "cat"])
def test_a_manifest_we_may_not_read_is_exit_4(shared, command):
    manifest = shared / "locked" / "manifest.json"
    manifest.write_text('["0000.jpg"]')
    args = [command, str(shared / "pets"), "--manifest", str(manifest)]
    if command == "sync":
        args.insert(2, str(shared / "out"))
    one_line_error(run_unprivileged(*args), 4, "permission denied", "manifest")
