"""Issue 17, items 1-4 and 6: locations with empty segments, relative mount sources in detached
mode, write failures of `snapshot -o` and `pack`, malformed endpoints, and the suite's own node
cache. Every test here runs the real CLI (or library) against moto on 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_mount_support import alive, force_unmount, wait_for
from conftest import one_line_error, run_unprivileged, tmpfs

REPO = Path(__file__).resolve().parent.parent
BUCKET = "paths"
OBJECTS = {"train/img-000.jpg": b"jpeg bytes", "train/labels.csv": b"file,label\nimg-000.jpg,cat\n"}


@pytest.fixture
def s3(s3_env):
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    for key, body in OBJECTS.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
    return s3_env


# -- 1. an empty segment in a bucket location --------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["s3://bkt//train", "s3://bkt/train//", "gs://bkt/a//b/", "s3://bkt//", "s3://bkt/a///b"]
)
def test_an_empty_segment_is_a_usage_error(text):
    from lading.core.errors import UsageError
    from lading.stores.uri import parse_uri

    with pytest.raises(UsageError, match="empty segment"):
        parse_uri(text)


@pytest.mark.parametrize(
    "text, prefix", [("s3://bkt/train/", "train/"), ("s3://bkt/", ""), ("s3://bkt", ""), ("gs://bkt/a/b", "a/b")]
)
def test_locations_without_empty_segments_still_parse(text, prefix):
    from lading.stores.uri import parse_uri

    assert parse_uri(text).prefix == prefix


@pytest.mark.parametrize(
    "command",
    [
        ("snapshot", f"s3://{BUCKET}//train", "-o", "{tmp}/f.snap.jsonl"),
        ("snapshot", f"s3://{BUCKET}/train//", "-o", "{tmp}/f.snap.jsonl"),
        ("cat", "--dry-run", f"s3://{BUCKET}//train"),
        ("sync", f"s3://{BUCKET}//train", "{tmp}/dest"),
        ("sync", f"s3://{BUCKET}/train//", "{tmp}/dest"),
        ("mount", f"s3://{BUCKET}//train", "{tmp}/mnt"),
    ],
)
def test_an_empty_segment_is_refused_by_every_command(s3, lading, tmp_path, command):
    (tmp_path / "mnt").mkdir()
    result = lading(*[part.format(tmp=tmp_path) for part in command])
    one_line_error(result, 2, "empty segment")
    assert sorted(os.listdir(tmp_path)) == ["mnt"] and not os.path.ismount(tmp_path / "mnt")


def test_a_listed_key_outside_the_prefix_is_an_error_never_cut(s3):
    """Second guard: a store whose prefix the listing normalises (obstore drops the empty segment)
    must not cut keys by the raw prefix's length."""
    from lading.core.errors import LadingError
    from lading.stores import StoreConfig, StoreURI
    from lading.stores.s3.store import S3Store

    store = S3Store(StoreURI("s3", BUCKET, "/train"), StoreConfig.from_env())  # bypasses parse_uri
    with pytest.raises(LadingError, match="outside the prefix"):
        list(store.list())


# -- 2. a relative source in the default (detached) mode ---------------------------------------------


def _mount_in(cwd: Path, source: str, mountpoint: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lading", "mount", source, mountpoint, "--json"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **env},
        timeout=120,
    )


def _unmounted(mountpoint: Path, result: subprocess.CompletedProcess) -> None:
    force_unmount(mountpoint)
    if result.returncode == 0:
        pid = json.loads(result.stdout)["pid"]
        wait_for(lambda: not alive(pid), 20, "the mount daemon to exit")


def test_mount_a_relative_snapshot_file_detached(s3, lading, tmp_path):
    made = lading("snapshot", f"s3://{BUCKET}/train", "-o", "train.snap.jsonl", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    (tmp_path / "mnt").mkdir()
    result = _mount_in(tmp_path, "train.snap.jsonl", "mnt", s3)
    try:
        assert result.returncode == 0, result.stderr
        assert (tmp_path / "mnt" / "labels.csv").read_bytes() == OBJECTS["train/labels.csv"]
    finally:
        _unmounted(tmp_path / "mnt", result)


def test_mount_a_relative_local_directory_detached(tmp_path):
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "x.txt").write_bytes(b"local")
    (tmp_path / "mnt").mkdir()
    result = _mount_in(tmp_path, "src", "mnt", {})
    try:
        assert result.returncode == 0, result.stderr
        assert (tmp_path / "mnt" / "sub" / "x.txt").read_bytes() == b"local"
    finally:
        _unmounted(tmp_path / "mnt", result)


def test_mount_options_resolve_a_relative_source(tmp_path, monkeypatch):
    from lading.mounts.lifecycle import MountOptions, resolved

    monkeypatch.chdir(tmp_path)
    assert resolved(MountOptions("train.snap.jsonl", tmp_path)).source == str(tmp_path / "train.snap.jsonl")
    assert resolved(MountOptions("s3://bkt/p", tmp_path)).source == "s3://bkt/p"


# -- 3. write failures of snapshot -o and pack are exit 4 / 6 -----------------------------------------


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs, filled up; skipped where mounting is not allowed."""
    with tmpfs(tmp_path / "full", "size=64k") as where:
        try:
            with open(where / "filler", "wb") as handle:
                handle.write(b"\0" * (1 << 20))
        except OSError:
            pass
        yield where


@pytest.fixture
def shared_dir():
    """A directory under /tmp that every user can read (for a command run as ``nobody``)."""
    parent = Path(tempfile.mkdtemp(prefix="lading-paths-", dir="/tmp"))
    os.chmod(parent, 0o755)
    (parent / "pets").mkdir()
    for i in range(3):
        (parent / "pets" / f"{i:04d}.jpg").write_bytes(os.urandom(100))
        (parent / "pets" / f"{i:04d}.json").write_text(json.dumps({"id": i}))
    (parent / "dest").mkdir(mode=0o755)
    yield parent
    shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.parametrize("output", ["{ro}/f.snap.jsonl", "{ro}/f.snap.jsonl.gz"])
def test_snapshot_onto_a_read_only_file_system_is_exit_4(s3, lading, read_only_mount, output):
    result = lading("snapshot", f"s3://{BUCKET}/train", "-o", output.format(ro=read_only_mount))
    one_line_error(result, 4, "read-only file system", str(read_only_mount))


@pytest.mark.parametrize("mode", [0o755, 0o700])  # 0700: not even searchable, so cleaning up fails too
def test_snapshot_into_a_directory_the_user_cannot_write_is_exit_4(s3, shared_dir, mode):
    os.chmod(shared_dir / "dest", mode if os.geteuid() == 0 else mode & 0o555)
    result = run_unprivileged("snapshot", f"s3://{BUCKET}/train", "-o", str(shared_dir / "dest" / "f.snap.jsonl"))
    one_line_error(result, 4, "permission denied", str(shared_dir / "dest"))
    assert os.listdir(shared_dir / "dest") == []


def test_snapshot_onto_a_full_disk_is_exit_6(s3, lading, full_disk):
    import boto3

    client = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"], region_name="us-east-1")
    for i in range(300):  # a snapshot file larger than the space left
        client.put_object(Bucket=BUCKET, Key=f"many/{i:05d}-{'x' * 200}", Body=b"")
    result = lading("snapshot", f"s3://{BUCKET}/", "-o", str(full_disk / "f.snap.jsonl"))
    one_line_error(result, 6, "No space left")
    assert sorted(os.listdir(full_disk)) == ["filler"]


def test_pack_onto_a_read_only_file_system_is_exit_4(lading, shared_dir, read_only_mount):
    result = lading("pack", str(shared_dir / "pets"), str(read_only_mount / "shards"))
    one_line_error(result, 4, "read-only file system")


def test_pack_into_a_directory_the_user_cannot_write_is_exit_4(shared_dir):
    if os.geteuid() != 0:
        os.chmod(shared_dir / "dest", 0o555)
    for dest in (shared_dir / "dest", shared_dir / "dest" / "new"):
        result = run_unprivileged("pack", str(shared_dir / "pets"), str(dest))
        one_line_error(result, 4, "permission denied")
    assert os.listdir(shared_dir / "dest") == []


def test_pack_onto_a_full_disk_is_exit_6(lading, shared_dir, full_disk):
    for i in range(20):
        (shared_dir / "pets" / f"big{i:02d}.jpg").write_bytes(os.urandom(64 << 10))
    result = lading("pack", str(shared_dir / "pets"), str(full_disk / "shards" / "v1"))
    one_line_error(result, 6, "No space left")
    assert sorted(os.listdir(full_disk)) == ["filler"], "the DEST folders pack made were left behind"
    (full_disk / "mine").mkdir()  # a DEST that was there before stays, empty as it was
    one_line_error(lading("pack", str(shared_dir / "pets"), str(full_disk / "mine")), 6, "No space left")
    assert os.listdir(full_disk / "mine") == []


# -- 4. a malformed endpoint is a usage error naming where it came from --------------------------------


@pytest.mark.parametrize("endpoint", ["not-a-url", "ftp://127.0.0.1:1", "http://", "http://host:port"])
def test_a_malformed_endpoint_is_a_usage_error_in_the_library(endpoint):
    from lading.core.errors import UsageError
    from lading.stores import StoreConfig

    with pytest.raises(UsageError, match="AWS_ENDPOINT_URL"):
        StoreConfig.from_env({"AWS_ENDPOINT_URL": endpoint})
    with pytest.raises(UsageError, match="AWS_ENDPOINT_URL_S3"):
        StoreConfig.from_env({"AWS_ENDPOINT_URL_S3": endpoint})
    with pytest.raises(UsageError, match="--endpoint-url"):
        StoreConfig.from_env({}, endpoint_url=endpoint)


def test_good_endpoints_still_resolve():
    from lading.stores import StoreConfig

    for endpoint in ("http://127.0.0.1:9000", "https://s3.example.com", "http://[::1]:9000/", "https://minio"):
        assert StoreConfig.from_env({"AWS_ENDPOINT_URL": endpoint}).endpoint_url == endpoint


_EVERY_COMMAND = [
    ("sync", f"s3://{BUCKET}/train", "{tmp}/dest"),
    ("fetch", f"s3://{BUCKET}/train/labels.csv", "{tmp}/"),
    ("snapshot", f"s3://{BUCKET}/train", "-o", "{tmp}/f.snap.jsonl"),
    ("cat", "--dry-run", f"s3://{BUCKET}/train"),
    ("mount", f"s3://{BUCKET}/train", "{tmp}/mnt"),
    ("pack", f"s3://{BUCKET}/train", "{tmp}/shards"),
    ("datasets", "list", f"s3://{BUCKET}/"),
]


@pytest.mark.parametrize("command", _EVERY_COMMAND)
def test_a_malformed_endpoint_flag_is_exit_2_in_every_command(s3, lading, tmp_path, command):
    (tmp_path / "mnt").mkdir()
    args = [part.format(tmp=tmp_path) for part in command]
    result = lading(*args, "--endpoint-url", "not-a-url")
    one_line_error(result, 2, "--endpoint-url", "not-a-url")


@pytest.mark.parametrize("command", _EVERY_COMMAND)
def test_a_malformed_endpoint_variable_is_exit_2_in_every_command(s3, lading, tmp_path, command):
    (tmp_path / "mnt").mkdir()
    result = lading(*[part.format(tmp=tmp_path) for part in command], env={"AWS_ENDPOINT_URL": "not-a-url"})
    one_line_error(result, 2, "AWS_ENDPOINT_URL", "not-a-url")
    assert sorted(os.listdir(tmp_path)) == ["mnt"]


# -- 6. the suite never writes into the user's node cache ------------------------------------------


def test_the_suite_points_the_node_cache_away_from_home():
    from lading.datasets import default_cache_root

    home_cache = Path(os.path.expanduser("~")) / ".cache" / "lading"
    ours = default_cache_root()
    assert ours != home_cache and home_cache not in ours.parents
    assert Path(tempfile.gettempdir()) in ours.resolve().parents or "pytest" in str(ours)
    shown = subprocess.run(
        [sys.executable, "-c", "from lading.datasets import default_cache_root as d; print(d())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(shown) == ours  # subprocesses (the CLI, DataLoader workers) inherit it


def test_a_dataset_read_leaves_the_home_cache_alone(s3, tmp_path):
    """A ShardDataset over S3 in a subprocess fills the suite's cache, not ``~/.cache/lading``."""
    from lading.datasets import default_cache_root

    pets = tmp_path / "pets"
    pets.mkdir()
    (pets / "0001.txt").write_text("one")
    packed = subprocess.run(
        [
            sys.executable,
            "-m",
            "lading",
            "pack",
            str(pets),
            f"s3://{BUCKET}/suite-cache-check",
            "--name",
            "pets",
            "--version",
            "v1",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert packed.returncode == 0, packed.stderr
    index = json.loads(packed.stdout)["index"]
    code = "import sys; from lading.datasets import ShardDataset; print(sum(1 for _ in ShardDataset(sys.argv[1])))"
    read = subprocess.run([sys.executable, "-c", code, index], capture_output=True, text=True)
    assert read.returncode == 0 and read.stdout.strip() == "1", read.stderr
    entry = "*paths_suite-cache-check_pets_v1-*"  # this test's shard folder (location_folder)
    home_cache = Path(os.path.expanduser("~")) / ".cache" / "lading"
    assert not list((home_cache / "datasets").glob(entry))
    assert list((default_cache_root() / "datasets").glob(entry)), "the read should fill the suite's cache"


def test_the_demo_leaves_home_alone(tmp_path):
    """`.ci/demo` (README command 1) reads a packed dataset through the node cache: with HOME an
    empty directory and no cache variables, it must leave HOME empty and remove what it made."""
    home = tmp_path / "home"
    home.mkdir()
    env = {name: value for name, value in os.environ.items() if name not in ("XDG_CACHE_HOME", "LADING_CACHE_DIR")}
    env["HOME"] = str(home)
    demos_before = set(Path("/tmp").glob("lading-demo.*"))
    result = subprocess.run(["bash", str(REPO / ".ci" / "demo")], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    assert "every sample exactly once" in result.stdout
    assert "\x1b" not in result.stdout + result.stderr, "terminal escapes written into redirected output"
    assert list(home.rglob("*")) == []
    assert set(Path("/tmp").glob("lading-demo.*")) <= demos_before
