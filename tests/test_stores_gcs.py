"""GCSStore against fake-gcs-server over HTTP; faults and request counts through FaultProxy.

No SDK patching: the real google-cloud-storage client talks HTTP to a real server. Where
fake-gcs-server differs from GCS the tests say so: it ignores ``ifGenerationMatch`` on reads
(it does send ``X-Goog-Generation``, which the store must compare: issue 10), and it finalises a
resumable upload on a status query (``Content-Range: bytes */N``) instead of answering 308.
"""

from __future__ import annotations

import base64
import hashlib
import os
import urllib.error
import urllib.request

import google_crc32c
import pytest
from urllib.parse import unquote
from lading.core.errors import AccessDenied, NotFound, ObjectChanged, Throttled, TransientError
from lading.core.retry import RetryPolicy
from lading.stores import StoreConfig, open_store, parse_uri
from lading.stores.gcs.store import GCSStore
from proxies import FaultProxy

FAST_RETRY = RetryPolicy(attempts=4, base_delay=0.005, max_delay=0.02)


def _config(endpoint: str) -> StoreConfig:
    return StoreConfig(gcs_anonymous=True, gcs_endpoint=endpoint, retry=FAST_RETRY, timeout=10)


def _store(endpoint: str, uri: str, **kwargs) -> GCSStore:
    return GCSStore(parse_uri(uri), _config(endpoint), **kwargs)


def _crc32c(data: bytes) -> str:
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


@pytest.fixture
def bucket(gcs_env, request):
    """A fresh fake-gcs-server bucket (named after the test) and a raw client bucket for setup."""
    name = "t-" + hashlib.md5(request.node.name.encode()).hexdigest()[:20]
    store = _store(gcs_env["STORAGE_EMULATOR_HOST"], f"gs://{name}")
    client = store._client.get()
    handle = client.bucket(name)
    if not handle.exists():
        client.create_bucket(name)
    for blob in client.list_blobs(name):
        blob.delete()
    return handle


@pytest.fixture
def emulator(gcs_env) -> str:
    return gcs_env["STORAGE_EMULATOR_HOST"]


def _put(bucket, name: str, data: bytes) -> None:
    bucket.blob(name).upload_from_string(data)


def test_open_store_gives_gcs_store_lazily(emulator):
    store = open_store("gs://some-bucket/p", _config(emulator))
    assert isinstance(store, GCSStore) and not store._client.built


def test_listing_prefixes_and_metadata(bucket, emulator):
    for name in ("data/a", "data/sub/b", "data/sub/c", "datax/d"):
        _put(bucket, name, name.encode())
    _put(bucket, "data/folder/", b"")
    store = _store(emulator, f"gs://{bucket.name}/data")
    listed = list(store.list())
    assert [i.key for i in listed] == ["a", "sub/b", "sub/c"]
    assert [i.key for i in _store(emulator, f"gs://{bucket.name}/data/").list("sub/")] == ["sub/b", "sub/c"]
    first = listed[0]
    assert first.md5 == hashlib.md5(b"data/a").hexdigest()
    assert first.crc32c == _crc32c(b"data/a")
    assert first.version == str(bucket.get_blob("data/a").generation) and first.mtime > 0


def test_pagination_follows_page_tokens(bucket, emulator):
    for i in range(7):
        _put(bucket, f"data/{i}", b"x" * i)
    _put(bucket, "other/z", b"z")
    with FaultProxy(emulator) as proxy:
        store = _store(proxy.url, f"gs://{bucket.name}/data", page_size=3)
        listed = [(i.key, i.size) for i in store.list()]
        pages = [r.query for r in proxy.requests if r.path == f"/storage/v1/b/{bucket.name}/o"]
    assert listed == [(str(i), i) for i in range(7)]
    assert len(pages) == 3
    assert "pageToken" not in pages[0] and all("pageToken=" in p for p in pages[1:])
    assert all("maxResults=3" in p and "prefix=data%2F" in p for p in pages)


def test_stat_ranges_and_missing(bucket, emulator):
    data = bytes(range(256)) * 20
    _put(bucket, "d/r", data)
    store = _store(emulator, f"gs://{bucket.name}/d")
    info = store.stat("r")
    assert (info.size, info.md5, info.crc32c) == (len(data), hashlib.md5(data).hexdigest(), _crc32c(data))
    assert store.read_range("r", 100, 1100, info.version) == data[100:1100]
    assert store.read_range("r", len(data) - 5, len(data) + 20) == data[-5:]
    assert store.read_range("r", 3, 3) == b""
    with pytest.raises(NotFound):
        store.stat("missing")
    with pytest.raises(NotFound):
        store.read_range("missing", 0, 10)
    with pytest.raises(NotFound):
        list(_store(emulator, "gs://no-such-bucket-here/x").list())


def test_download_and_uploads(bucket, emulator, tmp_path):
    store = _store(emulator, f"gs://{bucket.name}/u")
    small, big = tmp_path / "small", tmp_path / "big"
    small.write_bytes(b"small file")
    big.write_bytes(os.urandom((2 << 20) + 17))
    info = store.upload(small, "s")
    assert (info.key, info.size, info.md5) == ("s", 10, hashlib.md5(b"small file").hexdigest())
    progress: list[int] = []
    with FaultProxy(emulator) as proxy:
        resumable = _store(proxy.url, f"gs://{bucket.name}/u", resumable_threshold=1 << 20, chunk_size=512 << 10)
        info = resumable.upload(big, "deep/big", progress=progress.append)
        chunk_puts = proxy.count("PUT", path_prefix="/upload/")
    assert chunk_puts == 5  # 2 MiB + 17 bytes in 512 KiB chunks: a resumable session
    assert info.size == big.stat().st_size == sum(progress)
    assert info.crc32c == _crc32c(big.read_bytes())
    seen: list[int] = []
    store.download("deep/big", tmp_path / "big.tmp", progress=seen.append)
    assert (tmp_path / "big.tmp").read_bytes() == big.read_bytes() and sum(seen) == info.size


def test_faults_are_retried_byte_identical(bucket, emulator, tmp_path):
    data = os.urandom(1 << 20)
    _put(bucket, "f/data.bin", data)
    for i in range(6):
        _put(bucket, f"f/many/{i}", bytes([i]))
    with FaultProxy(emulator) as proxy:
        store = _store(proxy.url, f"gs://{bucket.name}/f")
        proxy.add_fault("slowdown", first=1)
        proxy.add_fault("429", first=1)
        proxy.add_fault("reset", first=1)
        assert [i.key for i in store.list("many/")] == [f"many/{i}" for i in range(6)]
        version = store.stat("data.bin").version
        assert store.read_range("many/0", 0, 1) == b"\x00"  # the first read chooses the route (a stat, a HEAD)
        proxy.add_fault("truncate", first=2, method="GET")  # only media GETs from here on
        store.download("data.bin", tmp_path / "d.tmp", version=version)
        assert (tmp_path / "d.tmp").read_bytes() == data
        # GETs only: with an emulator the store HEADs the object path once to choose its route
        downloads = [r for r in proxy.requests if r.method == "GET" and unquote(r.path) == f"/{bucket.name}/f/data.bin"]
        first = int(downloads[1].headers.get("Range").removeprefix("bytes=").split("-")[0])
        assert 0 < first <= len(data) // 2  # resumed from what had arrived, not restarted
        assert all(f"generation={version}" in r.query for r in downloads)
        proxy.add_fault("truncate", first=1, method="GET")
        assert store.read_range("data.bin", 10, 500_000) == data[10:500_000]
        assert proxy.injected == {"slowdown": 1, "429": 1, "reset": 1, "truncate": 3}


def test_persistent_failure_gives_up_after_the_configured_attempts(bucket, emulator):
    _put(bucket, "x/f", b"1")
    with FaultProxy(emulator) as proxy:
        store = _store(proxy.url, f"gs://{bucket.name}/x")
        proxy.add_fault("slowdown", rate=1.0)
        with pytest.raises(Throttled):
            store.stat("f")
        assert proxy.count() == FAST_RETRY.attempts, proxy.requests  # the library's retries are off
        proxy.clear_faults()
        proxy.add_fault("reset", rate=1.0)
        with pytest.raises(TransientError):
            store.read_range("f", 0, 1)


def test_missing_credentials_are_access_denied(monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    store = GCSStore(parse_uri("gs://some-bucket/x"), StoreConfig(retry=FAST_RETRY))
    with pytest.raises(AccessDenied) as caught:
        store.stat("f")
    assert caught.value.exit_code == 4 and "credentials" in (caught.value.hint or "")


def test_usable_after_fork(bucket, emulator):
    _put(bucket, "k/f", b"forked read")
    store = _store(emulator, f"gs://{bucket.name}/k")
    assert store.stat("f").size == 11
    parent_client = store._client.get()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            rebuilt = not store._client.built
            data = store.read_range("f", 0, 6)
            fresh = store._client.get() is not parent_client
            os.write(write_fd, b"%d %d " % (rebuilt, fresh) + data)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        message = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0 and message == b"1 1 forked"
    assert store.read_range("f", 7, 11) == b"read"


# -- generations: fake-gcs-server ignores ifGenerationMatch on reads --------------------------


def test_generation_precondition_gives_object_changed(bucket, emulator, tmp_path):
    _put(bucket, "d/v", b"first version")
    store = _store(emulator, f"gs://{bucket.name}/d")
    old = store.stat("v").version
    assert store.read_range("v", 0, 5, old) == b"first"
    _put(bucket, "d/v", b"second version")
    with pytest.raises(ObjectChanged):
        store.read_range("v", 0, 5, old)
    with pytest.raises(ObjectChanged):
        store.download("v", tmp_path / "v.tmp", version=old)
    store.download("v", tmp_path / "v.tmp")  # no version: pins the current generation
    assert (tmp_path / "v.tmp").read_bytes() == b"second version"


def test_pinned_reads_ask_for_the_generation(bucket, emulator, tmp_path):
    _put(bucket, "d/v", b"first version")
    with FaultProxy(emulator) as proxy:
        store = _store(proxy.url, f"gs://{bucket.name}/d")
        old = store.stat("v").version
        assert store.read_range("v", 0, 5, old) == b"first"
        store.download("v", tmp_path / "v.tmp", version=old)
        media = [r.query for r in proxy.requests if r.method == "GET" and unquote(r.path) == f"/{bucket.name}/d/v"]
    assert len(media) == 2 and all(f"generation={old}" in q for q in media)


def test_server_gap_generation_precondition_is_ignored(bucket, emulator):
    """fake-gcs-server answers a stale ifGenerationMatch with 200 and the new bytes, but names the
    generation it sent in X-Goog-Generation: what a client must compare (real GCS answers 412)."""
    _put(bucket, "g/v", b"first")
    old = bucket.get_blob("g/v").generation
    _put(bucket, "g/v", b"second")
    new = bucket.get_blob("g/v").generation
    assert new != old
    url = f"{emulator}/download/storage/v1/b/{bucket.name}/o/g%2Fv?alt=media&ifGenerationMatch={old}"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200 and response.read() == b"second"
        assert response.headers["X-Goog-Generation"] == str(new)


def test_forbidden_is_access_denied(emulator):
    with FaultProxy(emulator) as proxy:
        proxy.add_fault("403", rate=1.0, path_prefix="/storage/v1/b/forbidden/")
        with pytest.raises(AccessDenied):
            list(_store(proxy.url, "gs://forbidden/x").list())
        assert proxy.injected["403"] == 1  # refused, never retried


def test_small_upload_is_retried_and_progress_taken_back(bucket, emulator, tmp_path):
    small = tmp_path / "small"
    small.write_bytes(os.urandom(300 << 10))
    with FaultProxy(emulator) as proxy:
        store = _store(proxy.url, f"gs://{bucket.name}/r")
        proxy.add_fault("slowdown", first=1, method="POST", path_prefix="/upload/")
        progress: list[int] = []
        info = store.upload(small, "small", progress=progress.append)
        assert proxy.injected["slowdown"] == 1
    assert any(n < 0 for n in progress) and sum(progress) == small.stat().st_size
    assert info.md5 == hashlib.md5(small.read_bytes()).hexdigest()


STATUS_QUERY_GAP = pytest.mark.xfail(
    strict=True,
    reason="fake-gcs-server gap: a resumable-upload status query (Content-Range: "
    "bytes */N) finalises the upload with the bytes it has (200) instead of answering 308 with "
    "the committed Range, so an upload cannot resume against it",
)


@STATUS_QUERY_GAP
def test_resumable_upload_resumes_from_the_committed_bytes(bucket, emulator, tmp_path):
    big = tmp_path / "big"
    big.write_bytes(os.urandom((2 << 20) + 5))
    chunk = 512 << 10
    with FaultProxy(emulator) as proxy:
        store = _store(proxy.url, f"gs://{bucket.name}/r", resumable_threshold=1 << 20, chunk_size=chunk)
        uploads = f"/upload/storage/v1/b/{bucket.name}/o"
        # Faults after the first chunk, so that something is committed when the store asks.
        proxy.add_fault("slowdown", first=1, after=1, method="PUT", path_prefix=uploads)
        proxy.add_fault("reset", first=1, after=1, method="PUT", path_prefix=uploads)
        progress: list[int] = []
        info = store.upload(big, "big", progress=progress.append)
        puts = [r for r in proxy.requests if r.method == "PUT"]
    ranges = [r.headers.get("Content-Range") for r in puts]
    total = big.stat().st_size
    chunks = [f"bytes {i * chunk}-{min((i + 1) * chunk, total) - 1}/{total}" for i in range(5)]
    # chunk 1 is throttled, the status query after it is reset, the next one says chunk 0 is
    # committed, and the upload continues with chunk 1: nothing before it is sent again.
    assert ranges == [chunks[0], chunks[1], f"bytes */{total}", f"bytes */{total}", *chunks[1:]]
    assert [r.fault for r in puts[:4]] == [None, "slowdown", "reset", None]
    assert all(n > 0 for n in progress) and sum(progress) == big.stat().st_size
    assert "x-goog-hash" in puts[-1].headers  # the whole file's CRC32C, on the final chunk
    assert info.crc32c == _crc32c(big.read_bytes())
    assert bucket.blob("r/big").download_as_bytes() == big.read_bytes()


def test_empty_object_round_trip(bucket, emulator, tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    store = _store(emulator, f"gs://{bucket.name}/e")
    info = store.upload(empty, "e")
    assert info.size == 0 and info.md5 == hashlib.md5(b"").hexdigest()
    store.download("e", tmp_path / "e.tmp", version=info.version)
    assert (tmp_path / "e.tmp").read_bytes() == b""


@STATUS_QUERY_GAP
def test_resumable_upload_restarts_when_nothing_was_committed(bucket, emulator, tmp_path):
    """Real GCS omits Range in a 308 when nothing is committed."""
    data = os.urandom((1 << 20) + 3)
    (tmp_path / "big").write_bytes(data)
    with FaultProxy(emulator) as proxy:
        store = _store(proxy.url, f"gs://{bucket.name}/up", resumable_threshold=512 << 10, chunk_size=256 << 10)
        proxy.add_fault("reset", first=1, method="PUT")  # the very first chunk is lost
        progress: list[int] = []
        info = store.upload(tmp_path / "big", "big", progress=progress.append)
        puts = [r for r in proxy.requests if r.method == "PUT"]
    ranges = [r.headers.get("Content-Range") for r in puts]
    total = len(data)
    assert ranges[:3] == [
        f"bytes 0-{(256 << 10) - 1}/{total}",
        f"bytes */{total}",
        f"bytes 0-{(256 << 10) - 1}/{total}",
    ]
    assert len(ranges) == 2 + 5  # five chunks, one lost, one status query
    assert bucket.blob("up/big").download_as_bytes() == data and info.size == total == sum(progress)
    assert [r.headers.get("X-Goog-Hash") for r in puts if "X-Goog-Hash" in r.headers] == [f"crc32c={_crc32c(data)}"]


def test_no_sign_request_is_anonymous_on_gcs_too(bucket, emulator, monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    _put(bucket, "pub/f", b"public")
    config = StoreConfig(no_sign_request=True, gcs_endpoint=emulator, retry=FAST_RETRY)
    store = GCSStore(parse_uri(f"gs://{bucket.name}/pub"), config)
    assert store.read_range("f", 0, 6) == b"public"
