"""Defects a reviewer found in session 12 (user-facing messages and leftovers). Each test failed
before its fix. The CLI runs in a subprocess, as users run it; stores are the suite's real
servers (moto for S3, fake-gcs-server for GCS)."""

from __future__ import annotations

import pytest
from conftest import one_line_error
from sync_fixtures import gcs_client, s3_client

BUCKET = "review12"


@pytest.fixture
def s3_bucket(s3_env: dict[str, str]) -> dict[str, str]:
    """s3://review12/data/ holding b.txt and c.txt, on a freshly reset moto."""
    client = s3_client(s3_env)
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="data/b.txt", Body=b"bee\n")
    client.put_object(Bucket=BUCKET, Key="data/c.txt", Body=b"sea\n")
    return s3_env


@pytest.fixture
def gcs_bucket(gcs_env: dict[str, str]) -> dict[str, str]:
    """gs://review12/data/b.txt on the suite's fake-gcs-server."""
    client = gcs_client(gcs_env)
    bucket = client.bucket(BUCKET)
    if not bucket.exists():
        client.create_bucket(BUCKET)
    bucket.blob("data/b.txt").upload_from_string(b"bee\n")
    return gcs_env


# --- 1: a SOURCE that names one object ------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "hint"),
    [
        (("sync", "{uri}", "{dest}"), "lading fetch s3://review12/data/b.txt DEST"),
        (("sync", "{uri}", "{dest}", "--distribution", "sharded", "--balance", "bytes"), "--include 'b.txt'"),
        (("mount", "{uri}", "{dest}", "-f"), "mount the prefix that holds it, s3://review12/data/"),
        (("snapshot", "{uri}", "-o", "{dest}/s.jsonl"), "snapshot the prefix that holds it, s3://review12/data/"),
    ],
)
def test_an_object_as_source_is_named_an_object(s3_bucket, lading, tmp_path, command, hint):
    dest = tmp_path / "dest"
    dest.mkdir()
    args = [part.format(uri=f"s3://{BUCKET}/data/b.txt", dest=dest) for part in command]
    line = one_line_error(lading(*args), 2, f"s3://{BUCKET}/data/b.txt is an object, not a prefix", hint)
    assert "nothing at" not in line


def test_an_object_as_gcs_source_is_named_an_object(gcs_bucket, lading, tmp_path):
    one_line_error(lading("sync", f"gs://{BUCKET}/data/b.txt", str(tmp_path / "dest")), 2, "is an object, not a prefix")


def test_an_empty_prefix_is_still_nothing_at(s3_bucket, lading, tmp_path):
    """Only an object of that very name changes the message: a missing one, or a prefix ending
    in '/', is still "nothing at" (exit 3)."""
    for source in (f"s3://{BUCKET}/data/b.tx", f"s3://{BUCKET}/data/b.txt/"):
        one_line_error(lading("sync", source, str(tmp_path / "dest")), 3, "nothing at", "no objects under this prefix")
    assert lading("sync", f"s3://{BUCKET}/data/b.txt", str(tmp_path / "dest"), "--allow-empty").returncode == 0


def test_store_dataset_of_an_object_says_so(s3_bucket):
    from lading.core.errors import UsageError
    from lading.datasets import StoreDataset

    with pytest.raises(UsageError, match="is an object, not a prefix"):
        StoreDataset(f"s3://{BUCKET}/data/b.txt")


# --- 2: a relative local SOURCE in a generated hook ------------------------------------------------


@pytest.mark.parametrize("args", [("ctx", "src", "/tmp/x"), ("ctx", "./data/src", "/tmp/x")])
def test_hook_init_refuses_a_relative_local_source(lading, tmp_path, args):
    """The hook runs in the container's working directory, so a relative SOURCE would name
    another place there: refused as a relative DEST is, and nothing is written."""
    (tmp_path / "ctx").mkdir()
    line = one_line_error(lading("hook", "init", *args, cwd=tmp_path), 2, "absolute path inside the container")
    assert repr(args[1]) in line
    assert not (tmp_path / "ctx" / "startup-hook.sh").exists()


def test_hook_init_keeps_an_absolute_local_source(lading, tmp_path):
    for source in ("/data/src", "file:///data/src"):
        result = lading("hook", "init", str(tmp_path), source, "/tmp/x", "--dry-run")
        assert result.returncode == 0 and f"lading fetch {source} /tmp/x" in result.stdout, result.stderr


# --- 3: minor inconsistencies -------------------------------------------------------------------


@pytest.mark.parametrize("option, value, shown", [("--rank", "-1", "x>=0"), ("--world-size", "0", "x>=1")])
def test_mount_rank_is_checked_as_other_commands_check_it(lading, tmp_path, option, value, shown):
    """click's range check, the message sync, cat and topology give: not "rank -1 is outside 0..0"."""
    (tmp_path / "m").mkdir()
    for command in ("mount", "sync"):
        result = lading(command, "s3://bucket/data", str(tmp_path / "m"), option, value)
        line = one_line_error(result, 2, f"Invalid value for '{option}': {value} is not in the range {shown}")
        assert "outside" not in line


def test_a_bad_value_from_the_environment_names_the_variable(lading, tmp_path):
    """LADING_CACHE_DIR=somefile blamed '--cache-dir', which the user did not type."""
    (tmp_path / "somefile").write_text("x\n")
    env = {"LADING_CACHE_DIR": str(tmp_path / "somefile")}
    result = lading("sync", "s3://bucket/data", str(tmp_path / "d"), env=env)
    one_line_error(result, 2, "Invalid value for LADING_CACHE_DIR (the environment variable behind '--cache-dir')")
    typed = lading("sync", "s3://bucket/data", str(tmp_path / "d"), "--cache-dir", str(tmp_path / "somefile"), env=env)
    line = one_line_error(typed, 2, "Invalid value for '--cache-dir'")
    assert "LADING_CACHE_DIR" not in line
    debug = lading("topology", env={"LADING_DEBUG": "maybe"})
    one_line_error(debug, 2, "Invalid value for LADING_DEBUG")


def test_pack_says_one_file_not_one_files(lading, tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "x.txt").write_text("a\n")
    result = lading("pack", str(tmp_path / "one"), str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "packed 1 file (1 sample, " in result.stderr and " into 1 shard of " in result.stderr, result.stderr
    (tmp_path / "one" / "y.txt").write_text("b\n")
    dry = lading("pack", str(tmp_path / "one"), str(tmp_path / "out2"), "--dry-run")
    assert "would pack 2 files (2 samples, " in dry.stderr + dry.stdout
