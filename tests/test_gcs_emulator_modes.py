"""Reads from fake-gcs-server however it was started (issue 17, item 5).

fake-gcs-server serves path-style object GETs (``/bucket/object``, what obstore sends) only to
requests whose Host is its ``-public-host``. Three set-ups, each with the route lading must pick:

- ``public-host``: ``-public-host 127.0.0.1`` (the suite's usual server): obstore as configured;
- ``default``: started as its documentation shows, no ``-public-host``: obstore with
  ``Host: storage.googleapis.com`` (its default public host);
- ``foreign-host``: ``-public-host`` naming some other host: the JSON media download
  (``/download/storage/v1/...``) through google-cloud-storage.

Before the fix, every read from the last two reported "changed while lading read it".
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Iterator

import pytest
from lading.core.errors import LadingError, ObjectChanged
from lading.stores import StoreConfig, open_store
from lading.stores.gcs.store import MEDIA, XML, XML_PUBLIC_HOST
from proxies import FaultProxy
from servers import Server, start_fake_gcs
from sync_fixtures import read_tree, sample_objects
from test_mount_support import mounted

BUCKET = "gcsmodes"  # no characters obstore percent-encodes: the proxy rules below match its paths
MODES = ("public-host", "default", "foreign-host")
ROUTE = {"public-host": XML, "default": XML_PUBLIC_HOST, "foreign-host": MEDIA}
#: What the route choice logs (once per store), by route.
ROUTE_LOG = {XML: None, XML_PUBLIC_HOST: logging.INFO, MEDIA: logging.WARNING}


@pytest.fixture(scope="module")
def gcs_server_foreign(server_logs: Path) -> Iterator[Server]:
    """fake-gcs-server whose public host is neither the address clients use nor GCS's."""
    server = start_fake_gcs(server_logs, public_host="gcs.invalid")
    yield server
    server.stop()


@pytest.fixture(params=MODES)
def emulator(request: pytest.FixtureRequest) -> tuple[str, Server]:
    """(mode, server) for each way of starting fake-gcs-server."""
    name = {"public-host": "gcs_server", "default": "gcs_server_default", "foreign-host": "gcs_server_foreign"}[
        request.param
    ]
    return request.param, request.getfixturevalue(name)


def sdk_bucket(endpoint: str):
    """The test bucket through google-cloud-storage, emptied (test set-up only)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(
        project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
    )
    bucket = client.bucket(BUCKET)
    if not bucket.exists():
        client.create_bucket(BUCKET)
    for blob in client.list_blobs(BUCKET):
        blob.delete()
    return bucket


def put(bucket, objects: dict[str, bytes]) -> None:
    for key, body in objects.items():
        bucket.blob(key).upload_from_string(body)


def store_at(endpoint: str, prefix: str = "data"):
    return open_store(f"gs://{BUCKET}/{prefix}", StoreConfig(gcs_anonymous=True, gcs_endpoint=endpoint))


def media_path(route: str) -> str:
    """The path prefix of object GETs on ``route`` (as the proxy records them)."""
    return "/download/" if route == MEDIA else f"/{BUCKET}/"


def test_sync_of_a_prefix(emulator, tmp_path: Path, lading) -> None:
    mode, server = emulator
    bucket = sdk_bucket(server.url)
    objects = sample_objects(10, seed=17)
    put(bucket, {f"data/{key}": body for key, body in objects.items()})
    put(bucket, {"elsewhere/x.bin": b"not synced"})
    with FaultProxy(server.url) as proxy:
        result = lading(
            "sync", f"gs://{BUCKET}/data", str(tmp_path / "out"), "--json", env={"STORAGE_EMULATOR_HOST": proxy.url}
        )
        assert result.returncode == 0, result.stderr
        assert read_tree(tmp_path / "out") == objects
        gets = proxy.count("GET", path_prefix=media_path(ROUTE[mode]))
        assert gets >= len(objects)


def test_ranged_reads_choose_the_route_once(emulator, caplog: pytest.LogCaptureFixture) -> None:
    mode, server = emulator
    bucket = sdk_bucket(server.url)
    body = random.Random(3).randbytes(700_000)
    put(bucket, {"data/big.bin": body, "data/small.txt": b"small\n"})
    caplog.set_level(logging.INFO, logger="lading")
    with FaultProxy(server.url) as proxy:
        store = store_at(proxy.url)
        info = store.stat("big.bin")
        for start, end in ((0, 10), (123_456, 300_000), (699_990, 800_000), (900_000, 900_010)):
            assert store.read_range("big.bin", start, end, info.version) == body[start:end]
            assert store.read_range("big.bin", start, end) == body[start:end]
        assert store.read_range("small.txt", 1, 4) == b"mal"
        assert store.route == ROUTE[mode]
        assert proxy.count("HEAD") <= 2  # the route was probed once, not per read
        assert proxy.count("GET", path_prefix=media_path(ROUTE[mode])) >= 9
    notes = [
        record for record in caplog.records if "reading" in record.getMessage() and record.name.startswith("lading")
    ]
    expected = ROUTE_LOG[ROUTE[mode]]
    assert [record.levelno for record in notes] == ([] if expected is None else [expected])


def test_media_route_streams_in_pieces(gcs_server_foreign: Server) -> None:
    bucket = sdk_bucket(gcs_server_foreign.url)
    body = random.Random(4).randbytes(3_000_000)
    put(bucket, {"data/big.bin": body})
    store = store_at(gcs_server_foreign.url)
    pieces: list[bytes] = []
    fetched = store.stream("big.bin", lambda view: pieces.append(bytes(view)), None)
    assert store.route == MEDIA
    assert b"".join(pieces) == body and (fetched.nbytes, fetched.size) == (len(body), len(body))
    assert len(pieces) > 5 and max(map(len, pieces)) < 1 << 20  # streamed, never one whole buffer


def test_store_dataset_with_only_the_emulator_variable(emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    from lading.datasets import StoreDataset

    _, server = emulator
    bucket = sdk_bucket(server.url)
    objects = {f"data/{i:02d}.bin": bytes([i]) * (1000 + i) for i in range(6)}
    put(bucket, objects)
    for name in list(os.environ):
        if name.startswith(("GOOGLE_", "GCLOUD", "CLOUDSDK_")) or name == "STORAGE_EMULATOR_HOST":
            monkeypatch.delenv(name)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
    dataset = StoreDataset(f"gs://{BUCKET}/data")
    assert [dataset[i] for i in range(len(dataset))] == [objects[key] for key in sorted(objects)]


def test_mount_reads(emulator, tmp_path: Path) -> None:
    _, server = emulator
    bucket = sdk_bucket(server.url)
    rng = random.Random(5)
    objects = {"a/one.bin": rng.randbytes(70_000), "a/b/two.bin": rng.randbytes(1_500_000), "top.txt": b"top\n"}
    put(bucket, {f"data/{key}": body for key, body in objects.items()})
    with mounted(f"gs://{BUCKET}/data", tmp_path / "mnt", env={"STORAGE_EMULATOR_HOST": server.url}) as mnt:
        for key, body in objects.items():
            assert (mnt.path / key).read_bytes() == body
        fd = os.open(mnt.path / "a/b/two.bin", os.O_RDONLY)
        try:
            for offset in (0, 999_999, 1_400_000):
                assert os.pread(fd, 50_000, offset) == objects["a/b/two.bin"][offset : offset + 50_000]
        finally:
            os.close(fd)


@pytest.mark.parametrize("decided", [False, True], ids=["first-read", "route-decided"])
def test_stale_generation_is_object_changed(emulator, decided: bool) -> None:
    mode, server = emulator
    bucket = sdk_bucket(server.url)
    put(bucket, {"data/obj.bin": b"first version", "data/other.bin": b"other"})
    store = store_at(server.url)
    if decided:
        assert store.read_range("other.bin", 0, 5) == b"other"
        assert store.route == ROUTE[mode]
    stale = store.stat("obj.bin").version
    put(bucket, {"data/obj.bin": b"second version, longer"})
    with pytest.raises(ObjectChanged):
        store.read_range("obj.bin", 0, 5, stale)
    assert store.read_range("obj.bin", 0, 6) == b"second"
    assert store.route == ROUTE[mode]


def test_overwrite_mid_read_is_object_changed(emulator, tmp_path: Path) -> None:
    mode, server = emulator
    bucket = sdk_bucket(server.url)
    body = random.Random(6).randbytes(2_000_000)
    put(bucket, {"data/obj.bin": body, "data/other.bin": b"other"})
    with FaultProxy(server.url) as proxy:
        store = store_at(proxy.url)
        assert store.read_range("other.bin", 0, 5) == b"other"  # the route is decided
        assert store.route == ROUTE[mode]
        replace = lambda: put(bucket, {"data/obj.bin": b"replaced while read"})  # noqa: E731
        proxy.add_fault("truncate", first=1, method="GET", path_prefix=media_path(ROUTE[mode]), then=replace)
        with pytest.raises(ObjectChanged):
            store.download("obj.bin", tmp_path / "obj.bin")
        assert proxy.injected["truncate"] == 1


def test_a_404_for_the_current_generation_is_not_a_change(gcs_server_default: Server) -> None:
    bucket = sdk_bucket(gcs_server_default.url)
    put(bucket, {"data/obj.bin": b"unchanged"})
    store = store_at(gcs_server_default.url)
    store.route = XML  # as if no route had been chosen: the server answers obstore's paths with 404
    version = store.stat("obj.bin").version
    with pytest.raises(LadingError) as caught:
        store.read_range("obj.bin", 0, 5, version)
    assert not isinstance(caught.value, ObjectChanged)
    assert "answered 404 for generation" in str(caught.value)
