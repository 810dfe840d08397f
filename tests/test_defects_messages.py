"""Issue 26, item 5: messages. Access denied is one clean line; a listing answered by a plain HTTP
404 (no S3 error) says the endpoint is not S3; a changed object of a snapshot names its URI once;
a full disk during sync is one line per distinct cause. The CLI runs in a subprocess against the
suite's real servers. Each test failed before its fix."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from conftest import tmpfs
from servers import Server, free_port, wait_http


def error_line(result: subprocess.CompletedProcess, code: int) -> str:
    """The one stderr line of a failed command, its hint cut off."""
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lading: error: "), result.stderr
    assert "internal error" not in lines[0] and "Traceback" not in result.stderr
    return lines[0].partition(" (hint: ")[0]


def commands(uri: str, tmp_path: Path) -> list[list[str]]:
    return [
        ["sync", uri, str(tmp_path / "dest")],
        ["cat", uri],
        ["fetch", uri, str(tmp_path / "fetched")],
        ["snapshot", uri, "-o", str(tmp_path / "s.snap.jsonl")],
    ]


# --- access denied ---------------------------------------------------------------------------------


def test_access_denied_is_one_clean_line(lading, rclone_env, tmp_path):
    wrong = {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    for args in commands("s3://denied26/train/", tmp_path):
        line = error_line(lading(*args, env=wrong), 4)
        assert line.startswith("lading: error: access denied to s3://denied26/train/"), line
        for noise in ("<", "Generic", "http://", "Error performing", "status code"):
            assert noise not in line, (noise, line)
        assert len(line) < 200, line


def test_the_server_s_reason_for_a_denial_is_kept():
    from lading.stores.s3.errors import from_response

    explicit = "User: arn:aws:iam::1:user/u is not authorized to perform: s3:ListBucket with an explicit deny"
    assert (
        from_response("AccessDenied", 403, explicit, "s3://b/x/").message == f"access denied to s3://b/x/: {explicit}"
    )
    assert from_response("AccessDenied", 403, "Access Denied", "s3://b/x/").message == "access denied to s3://b/x/"
    assert (
        from_response("InvalidAccessKeyId", 403, "", "s3://b/x/").message
        == "access denied to s3://b/x/: InvalidAccessKeyId"
    )


# --- an endpoint that is not S3 --------------------------------------------------------------------


@pytest.fixture
def web_server(tmp_path: Path) -> Iterator[Server]:
    """A plain web server (Python's http.server over an empty directory): every path is a 404
    page, as a wrong --endpoint-url (a web site, a load balancer's default page) answers."""
    root = tmp_path / "www"
    root.mkdir()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    server = Server("http.server", port, proc)
    try:
        wait_http(server.url + "/", proc)
        yield server
    finally:
        server.stop()


def test_a_plain_404_from_a_listing_says_the_endpoint_is_not_s3(lading, web_server, s3_env, tmp_path):
    import boto3

    boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1").create_bucket(Bucket="here26")
    for uri in ("s3://here26/train/a.bin", "s3://nothere26/train/"):  # S3's own answers: as before
        assert "did not answer as S3" not in error_line(lading("cat", uri), 3)
    env = {
        "AWS_ENDPOINT_URL": web_server.url,
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_REGION": "us-east-1",
    }
    for args in commands("s3://bucket26/train/", tmp_path):
        line = error_line(lading(*args, env=env), 3)
        assert "did not answer as S3" in line and "s3://bucket26/train/" in line, line
        assert "object not found" not in line


# --- a full disk during sync -----------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of the test's own, removed after it; skipped where mounting is not allowed."""
    with tmpfs(tmp_path / "small", "size=1m") as where:
        yield where


def test_a_full_disk_during_sync_is_one_line_per_cause(lading, s3_env, small_tmpfs):
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket="full26")
    for i in range(40):  # 4 MB for a 1 MiB file system
        client.put_object(Bucket="full26", Key=f"train/part-{i:03d}.bin", Body=os.urandom(100_000))
    result = lading("sync", "s3://full26/train/", str(small_tmpfs / "dest"))
    assert result.returncode == 1, result.stderr  # some keys arrived, the others failed
    failed = int(re.search(r"(\d+) key\(s\) failed:", result.stderr).group(1))
    causes = [line for line in result.stderr.splitlines() if line.startswith("  ") and "(hint:" not in line]
    assert len(causes) == 1 and failed > 1, result.stderr
    assert re.match(rf"  {failed} keys, e\.g\. part-\d{{3}}\.bin: ", causes[0]), causes[0]
    assert "No space left on device" in causes[0]


# --- an object changed since its snapshot ----------------------------------------------------------


def test_an_object_changed_since_the_snapshot_is_named_once(lading, s3_env, tmp_path):
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket="snap26")
    client.put_object(Bucket="snap26", Key="train/a.bin", Body=b"first")
    snapshot = tmp_path / "train.snap.jsonl"
    assert lading("snapshot", "s3://snap26/train/", "-o", str(snapshot)).returncode == 0
    client.put_object(Bucket="snap26", Key="train/a.bin", Body=b"second")
    line = error_line(lading("cat", str(snapshot)), 1)
    assert line.count("s3://snap26/train/a.bin") == 1, line
    assert "changed since the snapshot" in line and str(snapshot) in line
