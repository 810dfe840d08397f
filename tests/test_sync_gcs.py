"""`lading sync` from the GCS emulator: complete, byte-identical, and a re-run makes no media GET."""

from __future__ import annotations

import json

import pytest
from proxies import FaultProxy
from sync_fixtures import read_tree, sample_objects

BUCKET = "sync-gcs-bucket"


@pytest.fixture
def gcs_dataset(gcs_env):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(
        project="test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": gcs_env["STORAGE_EMULATOR_HOST"]},
    )
    bucket = client.bucket(BUCKET)
    if not bucket.exists():
        client.create_bucket(BUCKET)
    for blob in client.list_blobs(BUCKET):
        blob.delete()
    objects = sample_objects(12, seed=5)
    for key, body in objects.items():
        bucket.blob(f"data/{key}").upload_from_string(body)
    return objects


def media_gets(proxy) -> int:
    # obstore's media GETs are /BUCKET/OBJECT (the JSON API's are /download/...?alt=media)
    return proxy.count(
        "GET",
        where=lambda seen: (
            "alt=media" in seen.query or not seen.path.startswith(("/storage/", "/download/", "/upload/"))
        ),
    )


def test_gcs_sync_and_noop_rerun(gcs_dataset, gcs_env, tmp_path, lading):
    with FaultProxy(gcs_env["STORAGE_EMULATOR_HOST"]) as proxy:
        env = {"STORAGE_EMULATOR_HOST": proxy.url}
        dest = tmp_path / "out"
        result = lading("sync", f"gs://{BUCKET}/data", str(dest), "--json", env=env)
        assert result.returncode == 0, result.stderr
        assert read_tree(dest) == gcs_dataset
        assert media_gets(proxy) == len(gcs_dataset)
        proxy.reset_counts()
        result = lading("sync", f"gs://{BUCKET}/data", str(dest), "--json", env=env)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["skipped"] == len(gcs_dataset)
        assert media_gets(proxy) == 0 and proxy.count("GET") >= 1


def test_gcs_missing_bucket_exits_3(gcs_env, tmp_path, lading):
    result = lading("sync", "gs://no-such-gcs-bucket/x", str(tmp_path / "out"))
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
