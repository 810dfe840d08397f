"""`lading fetch URI DEST`: one object or a prefix, skipped when present and unchanged, atomic, retried."""

from __future__ import annotations

import json
import os

import boto3
import pytest
from proxies import FaultProxy

BUCKET = "lading-fetch"


@pytest.fixture
def s3(s3_env):
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="data.csv", Body=b"a,b\n1,2\n")
    client.put_object(Bucket=BUCKET, Key="train/x.bin", Body=os.urandom(70_000))
    client.put_object(Bucket=BUCKET, Key="train/deep/y.bin", Body=b"y" * 10)
    return client


@pytest.fixture
def proxy(s3_env):
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as running:
        yield running


def _object_requests(proxy: FaultProxy, key: str) -> int:
    return proxy.count(path_prefix=f"/{BUCKET}/{key}", where=lambda seen: seen.method in ("GET", "HEAD"))


def test_one_object_into_a_directory_then_skipped(s3, proxy, lading, tmp_path):
    env = {"AWS_ENDPOINT_URL": proxy.url}
    dest = tmp_path / "data-rank0"
    result = lading("fetch", f"s3://{BUCKET}/data.csv", f"{dest}/", env=env)
    assert result.returncode == 0, result.stderr
    assert (dest / "data.csv").read_bytes() == b"a,b\n1,2\n"
    assert proxy.count("GET", path_prefix=f"/{BUCKET}/data.csv") == 1
    inode, mtime = (dest / "data.csv").stat().st_ino, (dest / "data.csv").stat().st_mtime_ns
    proxy.reset_counts()
    again = lading("fetch", f"s3://{BUCKET}/data.csv", f"{dest}/", env=env)
    assert again.returncode == 0 and "up to date" in again.stderr
    assert proxy.count("GET", path_prefix=f"/{BUCKET}/data.csv") == 0  # only a HEAD
    assert ((dest / "data.csv").stat().st_ino, (dest / "data.csv").stat().st_mtime_ns) == (inode, mtime)


def test_changed_object_or_edited_file_is_fetched_again(s3, lading, tmp_path):
    target = tmp_path / "train.csv"
    assert lading("fetch", f"s3://{BUCKET}/data.csv", str(target)).returncode == 0
    s3.put_object(Bucket=BUCKET, Key="data.csv", Body=b"a,b\n3,4\n")
    assert lading("fetch", f"s3://{BUCKET}/data.csv", str(target)).returncode == 0
    assert target.read_bytes() == b"a,b\n3,4\n"
    target.write_bytes(b"local edit")
    assert lading("fetch", f"s3://{BUCKET}/data.csv", str(target)).returncode == 0
    assert target.read_bytes() == b"a,b\n3,4\n"


def test_one_object_to_a_bare_file_name_in_the_working_directory(s3, lading, tmp_path):
    # DEST with no directory part ("data.csv", "./data.csv"): the file goes into the working
    # directory (was: "cannot write data.csv: No such file or directory", exit 3, from mkdir '').
    for dest in ("data.csv", "./copy.csv"):
        result = lading("fetch", f"s3://{BUCKET}/data.csv", dest, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert (tmp_path / dest).read_bytes() == b"a,b\n1,2\n"
        again = lading("fetch", f"s3://{BUCKET}/data.csv", dest, cwd=tmp_path)
        assert again.returncode == 0 and "up to date" in again.stderr, again.stderr


def test_prefix_as_a_tree_with_or_without_slash(s3, lading, tmp_path):
    for uri, dest in ((f"s3://{BUCKET}/train/", tmp_path / "a"), (f"s3://{BUCKET}/train", tmp_path / "b")):
        result = lading("fetch", uri, str(dest), "--json")
        assert result.returncode == 0, result.stderr
        assert (dest / "deep" / "y.bin").read_bytes() == b"y" * 10
        assert (dest / "x.bin").stat().st_size == 70_000


def test_slot_views_are_hard_links(s3, lading, tmp_path):
    dest = tmp_path / "train"
    result = lading("fetch", "--slots", f"s3://{BUCKET}/train/", str(dest), env={"DET_SLOT_IDS": "[0,1]"})
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        view = tmp_path / f"train-rank{rank}" / "deep" / "y.bin"
        assert view.stat().st_ino == (dest / "deep" / "y.bin").stat().st_ino
    missing = lading("fetch", "--slots", f"s3://{BUCKET}/train/", str(dest), env={"DET_SLOT_IDS": ""})
    assert missing.returncode == 2 and "DET_SLOT_IDS" in missing.stderr


def test_truncated_and_throttled_responses_are_retried(s3, proxy, lading, tmp_path):
    proxy.add_fault("truncate", first=1, method="GET", path_prefix=f"/{BUCKET}/data.csv")
    proxy.add_fault("slowdown", first=1, method="GET", path_prefix=f"/{BUCKET}/data.csv")
    result = lading("fetch", f"s3://{BUCKET}/data.csv", str(tmp_path / "d.csv"), env={"AWS_ENDPOINT_URL": proxy.url})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "d.csv").read_bytes() == b"a,b\n1,2\n"
    assert proxy.injected["truncate"] == 1 and proxy.injected["slowdown"] == 1


def test_persistent_failure_leaves_nothing_under_the_final_name(s3, proxy, lading, tmp_path):
    proxy.add_fault("slowdown", rate=1.0, method="GET", path_prefix=f"/{BUCKET}/data.csv")
    result = lading(
        "fetch",
        f"s3://{BUCKET}/data.csv",
        str(tmp_path / "d.csv"),
        env={"AWS_ENDPOINT_URL": proxy.url, "LADING_RETRIES": "2"},
    )
    assert result.returncode == 5 and "lading: error:" in result.stderr
    assert not (tmp_path / "d.csv").exists()


@pytest.mark.parametrize(
    "uri, code",
    [
        (f"s3://{BUCKET}/nothing-here", 3),
        ("s3://no-such-bucket-lading/x", 3),
        ("s3:/malformed", 2),
        ("ftp://host/x", 2),
    ],
)
def test_bad_sources(s3, lading, tmp_path, uri, code):
    result = lading("fetch", uri, str(tmp_path / "out"))
    assert result.returncode == code, result.stderr
    assert result.stderr.startswith("lading: error:") and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_unsafe_keys_are_refused(s3, lading, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="evil/../../escape", Body=b"x")
    result = lading("fetch", f"s3://{BUCKET}/evil/", str(tmp_path / "out"))
    assert result.returncode == 1 and "unsafe" in result.stderr
    assert not (tmp_path / "escape").exists()


def test_json_lists_failed_keys_whatever_the_exit_code(s3, lading, tmp_path):
    # A key too long for a local name fails alone; `fetch --json` printed nothing on stdout then
    # (the error came first), where `sync --json` prints its summary with "failed". Same exit code.
    long_key = "long/" + "k" * 300
    s3.put_object(Bucket=BUCKET, Key=long_key, Body=b"x")
    s3.put_object(Bucket=BUCKET, Key="long/ok.txt", Body=b"ok")
    plain = lading("fetch", f"s3://{BUCKET}/long/", str(tmp_path / "plain"))
    assert plain.returncode == 1 and plain.stdout == "" and "1 of 2 object(s)" in plain.stderr, plain.stderr
    result = lading("fetch", f"s3://{BUCKET}/long/", str(tmp_path / "out"), "--json")
    assert result.returncode == 1 and "1 of 2 object(s)" in result.stderr, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["objects"], summary["files"], summary["view_links"]) == (2, 1, 0)
    assert [failed["key"] for failed in summary["failed"]] == ["k" * 300]
    assert "File name too long" in summary["failed"][0]["error"]
    config = tmp_path / "const.yaml"  # hook run --json: the datasets so far, the failed one's too
    config.write_text(f"data:\n  datasets:\n    - source: s3://{BUCKET}/long/\n      dest: {tmp_path / 'hook'}\n")
    hook = lading("hook", "run", "--config", str(config), "--json")
    assert hook.returncode == 1 and "1 of 2 object(s)" in hook.stderr, hook.stderr
    assert [len(d["failed"]) for d in json.loads(hook.stdout)["datasets"]] == [1]


def test_gcs_object_and_prefix(gcs_env, lading, tmp_path):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(
        project="test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": gcs_env["STORAGE_EMULATOR_HOST"]},
    )
    bucket = client.bucket("fetch-gcs")
    if not bucket.exists():
        client.create_bucket("fetch-gcs")
    bucket.blob("ds/a.bin").upload_from_string(b"A" * 3000)
    bucket.blob("ds/sub/b.txt").upload_from_string(b"bee")
    one = lading("fetch", "gs://fetch-gcs/ds/sub/b.txt", f"{tmp_path}/one/")
    assert one.returncode == 0, one.stderr
    assert (tmp_path / "one" / "b.txt").read_bytes() == b"bee"
    tree = lading("fetch", "gs://fetch-gcs/ds", str(tmp_path / "tree"))
    assert tree.returncode == 0, tree.stderr
    assert (tmp_path / "tree" / "a.bin").read_bytes() == b"A" * 3000
    again = lading("fetch", "gs://fetch-gcs/ds/sub/b.txt", f"{tmp_path}/one/")
    assert again.returncode == 0 and "up to date" in again.stderr
