"""GCSStore against the GCS emulator over HTTP, plus a small fake of the JSON API for the paths
the emulator gets wrong (it returns one listing page only and ignores ifGenerationMatch).

No SDK patching: the real google-cloud-storage client talks HTTP to both servers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import urllib.parse
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import google_crc32c
import pytest

from proxies import FaultProxy
from lading.core.errors import AccessDenied, NotFound, ObjectChanged, Throttled, TransientError
from lading.core.retry import RetryPolicy
from lading.stores import StoreConfig, open_store, parse_uri
from lading.stores.gcs.store import GCSStore

FAST_RETRY = RetryPolicy(attempts=4, base_delay=0.005, max_delay=0.02)


def _config(endpoint: str) -> StoreConfig:
    return StoreConfig(gcs_anonymous=True, gcs_endpoint=endpoint, retry=FAST_RETRY, timeout=10)


def _store(endpoint: str, uri: str, **kwargs) -> GCSStore:
    return GCSStore(parse_uri(uri), _config(endpoint), **kwargs)


def _crc32c(data: bytes) -> str:
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


@pytest.fixture
def bucket(gcs_env, request):
    """A fresh emulator bucket (named after the test) and a raw client bucket for setup."""
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


def test_emulator_gap_one_listing_page_only(bucket, emulator):
    """The emulator ignores maxResults (one page); pagination is covered by the fake below."""
    for i in range(5):
        _put(bucket, f"p/{i}", b"x")
    with FaultProxy(emulator) as proxy:
        store = _store(proxy.url, f"gs://{bucket.name}/p", page_size=2)
        assert [i.key for i in store.list()] == ["0", "1", "2", "3", "4"]
        assert proxy.count("GET", path_prefix=f"/storage/v1/b/{bucket.name}/o") == 1  # the gap


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
        resumable = _store(proxy.url, f"gs://{bucket.name}/u", resumable_threshold=1 << 20,
                           chunk_size=512 << 10)
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
        proxy.add_fault("truncate", first=2, method="GET", path_prefix="/download/")
        store.download("data.bin", tmp_path / "d.tmp", version=version)
        assert (tmp_path / "d.tmp").read_bytes() == data
        downloads = [r for r in proxy.requests if r.path.startswith("/download/")]
        assert downloads[1].headers.get("Range") == f"bytes={len(data) // 2}-"  # resumed, not restarted
        assert all(f"ifGenerationMatch={version}" in r.query for r in downloads)
        proxy.add_fault("truncate", first=1, path_prefix="/download/")
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


# -- a fake of the GCS JSON API, for pagination and generation preconditions ------------------


class FakeGCS:
    """Serves ``/storage/v1/b/B/o`` (paged with maxResults/pageToken), object metadata and
    ``/download/...`` media with ``Range`` and ``ifGenerationMatch`` (412 on mismatch), from
    an in-memory dict. Bucket ``forbidden`` answers 403. Records each request's path?query.
    Also resumable uploads: POST creates a session; PUT chunks and ``bytes */N`` status
    queries answer 308 with ``Range`` only once something is committed (as real GCS does); the
    final chunk's ``X-Goog-Hash: crc32c=`` is checked (400 on mismatch)."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, int]] = {}
        self.requests: list[str] = []
        self._generation = 1000
        self.sessions: dict[str, tuple[str, bytearray]] = {}
        self.hash_headers: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                fake.requests.append(self.path)
                fake.serve(self)

            def do_POST(self) -> None:
                fake.requests.append("POST " + self.path)
                fake.create_session(self)

            def do_PUT(self) -> None:
                fake.requests.append("PUT " + self.path)
                fake.upload_chunk(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def put(self, name: str, data: bytes) -> str:
        self._generation += 1
        self.objects[name] = (data, self._generation)
        return str(self._generation)

    def _meta(self, name: str) -> dict:
        data, generation = self.objects[name]
        return {"kind": "storage#object", "bucket": "fake", "name": name, "size": str(len(data)),
                "generation": str(generation), "metageneration": "1",
                "updated": datetime(2026, 11, 21, tzinfo=timezone.utc).isoformat().replace("+00:00", "Z"),
                "md5Hash": base64.b64encode(hashlib.md5(data).digest()).decode(), "crc32c": _crc32c(data)}

    def serve(self, handler: BaseHTTPRequestHandler) -> None:
        parsed = urllib.parse.urlsplit(handler.path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        parts = parsed.path.split("/")
        if "/b/forbidden/" in parsed.path:
            return self._json(handler, 403, {"error": {"code": 403, "message": "forbidden"}})
        if parsed.path.startswith("/storage/v1/b/") and parsed.path.endswith("/o"):
            return self._list(handler, query)
        name = urllib.parse.unquote(parts[-1])
        if name not in self.objects:
            return self._json(handler, 404, {"error": {"code": 404, "message": "No such object"}})
        data, generation = self.objects[name]
        if "ifGenerationMatch" in query and query["ifGenerationMatch"] != str(generation):
            return self._json(handler, 412, {"error": {"code": 412, "message": "Precondition Failed"}})
        if parsed.path.startswith("/download/"):
            return self._media(handler, data, generation)
        return self._json(handler, 200, self._meta(name))

    def create_session(self, handler: BaseHTTPRequestHandler) -> None:
        body = json.loads(handler.rfile.read(int(handler.headers.get("Content-Length") or 0)) or b"{}")
        upload_id = f"u{len(self.sessions)}"
        self.sessions[upload_id] = (body["name"], bytearray())
        handler.send_response(200)
        handler.send_header("Location", f"http://{handler.headers['Host']}/upload/storage/v1/b/fake/o"
                                        f"?uploadType=resumable&upload_id={upload_id}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def upload_chunk(self, handler: BaseHTTPRequestHandler) -> None:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(handler.path).query))
        name, received = self.sessions[query["upload_id"]]
        chunk = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        span, _, total = handler.headers["Content-Range"].removeprefix("bytes ").partition("/")
        if span != "*":
            first = int(span.split("-")[0])
            if first != len(received):
                return self._json(handler, 400, {"error": {"code": 400, "message": "bad offset"}})
            received.extend(chunk)
        if len(received) == int(total):
            digest = handler.headers.get("X-Goog-Hash", "")
            self.hash_headers.append(digest)
            if digest and digest != f"crc32c={_crc32c(bytes(received))}":
                return self._json(handler, 400, {"error": {"code": 400, "message": "crc32c mismatch"}})
            self.put(name, bytes(received))
            return self._json(handler, 200, self._meta(name))
        handler.send_response(308)
        if received:
            handler.send_header("Range", f"bytes=0-{len(received) - 1}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def _list(self, handler: BaseHTTPRequestHandler, query: dict) -> None:
        names = sorted(n for n in self.objects if n.startswith(query.get("prefix", "")))
        after = base64.urlsafe_b64decode(query["pageToken"]).decode() if "pageToken" in query else None
        if after is not None:
            names = [n for n in names if n > after]
        size = int(query.get("maxResults", 1000))
        page, rest = names[:size], names[size:]
        body: dict = {"kind": "storage#objects", "items": [self._meta(n) for n in page]}
        if rest:
            body["nextPageToken"] = base64.urlsafe_b64encode(page[-1].encode()).decode()
        self._json(handler, 200, body)

    def _media(self, handler: BaseHTTPRequestHandler, data: bytes, generation: int) -> None:
        start, end = 0, len(data) - 1
        status = 200
        spec = handler.headers.get("Range")
        if spec:
            first, _, last = spec.removeprefix("bytes=").partition("-")
            start, end, status = int(first), min(int(last) if last else end, len(data) - 1), 206
        chunk = data[start:end + 1]
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(chunk)))
        handler.send_header("x-goog-generation", str(generation))
        if status == 206:
            handler.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        handler.end_headers()
        handler.wfile.write(chunk)

    def _json(self, handler: BaseHTTPRequestHandler, status: int, body: dict) -> None:
        payload = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def __enter__(self) -> "FakeGCS":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_fake_pagination_follows_page_tokens():
    with FakeGCS() as fake:
        for i in range(7):
            fake.put(f"data/{i}", b"x" * i)
        fake.put("other/z", b"z")
        store = _store(fake.url, "gs://fake/data", page_size=3)
        listed = [(i.key, i.size) for i in store.list()]
        pages = [r for r in fake.requests if r.startswith("/storage/v1/b/fake/o?")]
    assert listed == [(str(i), i) for i in range(7)]
    assert len(pages) == 3
    assert "pageToken" not in pages[0] and all("pageToken=" in p for p in pages[1:])
    assert all("maxResults=3" in p and "prefix=data%2F" in p for p in pages)


def test_fake_generation_precondition_gives_object_changed(tmp_path):
    with FakeGCS() as fake:
        old = fake.put("d/v", b"first version")
        store = _store(fake.url, "gs://fake/d")
        assert store.read_range("v", 0, 5, old) == b"first"
        fake.put("d/v", b"second version")
        with pytest.raises(ObjectChanged):
            store.read_range("v", 0, 5, old)
        with pytest.raises(ObjectChanged):
            store.download("v", tmp_path / "v.tmp", version=old)
        assert any(f"ifGenerationMatch={old}" in r for r in fake.requests)
        store.download("v", tmp_path / "v.tmp")  # no version: pins the current generation
        assert (tmp_path / "v.tmp").read_bytes() == b"second version"


def test_emulator_gap_generation_precondition_is_ignored(bucket, emulator):
    """The emulator serves new data for a stale generation; the fake above covers the 412 path."""
    _put(bucket, "g/v", b"first")
    store = _store(emulator, f"gs://{bucket.name}/g")
    old = store.stat("v").version
    _put(bucket, "g/v", b"second")
    assert store.stat("v").version != old
    assert store.read_range("v", 0, 6, old) == b"second"  # a real GCS would answer 412


def test_forbidden_is_access_denied():
    with FakeGCS() as fake:
        with pytest.raises(AccessDenied):
            list(_store(fake.url, "gs://forbidden/x").list())


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


def test_resumable_upload_resumes_from_the_committed_bytes(bucket, emulator, tmp_path):
    big = tmp_path / "big"
    big.write_bytes(os.urandom((2 << 20) + 5))
    chunk = 512 << 10
    with FaultProxy(emulator) as proxy:
        store = _store(proxy.url, f"gs://{bucket.name}/r", resumable_threshold=1 << 20, chunk_size=chunk)
        uploads = f"/upload/storage/v1/b/{bucket.name}/o"
        # Faults after the first chunk: the emulator wrongly answers a status query with
        # "Range: bytes=0-0" (one byte) when nothing is committed; real GCS omits Range.
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


def test_fake_resumable_upload_restarts_when_nothing_was_committed(tmp_path):
    """Real GCS omits Range in a 308 when nothing is committed (the emulator says bytes=0-0)."""
    data = os.urandom((1 << 20) + 3)
    (tmp_path / "big").write_bytes(data)
    with FakeGCS() as fake, FaultProxy(fake.url) as proxy:
        store = _store(proxy.url, "gs://fake/up", resumable_threshold=512 << 10, chunk_size=256 << 10)
        proxy.add_fault("reset", first=1, method="PUT")  # the very first chunk is lost
        progress: list[int] = []
        info = store.upload(tmp_path / "big", "big", progress=progress.append)
        ranges = [r.headers.get("Content-Range") for r in proxy.requests if r.method == "PUT"]
    total = len(data)
    assert ranges[:3] == [f"bytes 0-{(256 << 10) - 1}/{total}", f"bytes */{total}",
                          f"bytes 0-{(256 << 10) - 1}/{total}"]
    assert len(ranges) == 2 + 5  # five chunks, one lost, one status query
    assert fake.objects["up/big"][0] == data and info.size == total == sum(progress)
    assert fake.hash_headers == [f"crc32c={_crc32c(data)}"]


def test_no_sign_request_is_anonymous_on_gcs_too(monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with FakeGCS() as fake:
        fake.put("pub/f", b"public")
        config = StoreConfig(no_sign_request=True, gcs_endpoint=fake.url, retry=FAST_RETRY)
        store = GCSStore(parse_uri("gs://fake/pub"), config)
        assert store.read_range("f", 0, 6) == b"public"
