"""S3Store against moto's server over HTTP (and through the fault proxy). No SDK patching.

Reads and listings go through obstore, the rest through boto3 (see lading.stores.s3.store).
obstore always asks for pages of 1000 keys: :class:`SmallPages` makes moto answer a few at a
time, so pagination and continuation tokens run on a handful of small objects."""

from __future__ import annotations

import concurrent.futures
import hashlib
import http.client
import os
import select
import signal
import subprocess
import sys
import urllib.parse
from pathlib import Path

import boto3
import pytest
from lading.core.errors import AccessDenied, NotFound, ObjectChanged, Throttled, TransientError
from lading.core.retry import RetryPolicy
from lading.stores import StoreConfig, open_store, parse_uri
from lading.stores.s3.store import S3Store
from proxies import FaultProxy
from servers import Server, free_port, wait_http

FAST_RETRY = RetryPolicy(attempts=4, base_delay=0.005, max_delay=0.02)
BUCKET = "lading-test"


def _config(endpoint: str, **overrides) -> StoreConfig:
    return StoreConfig(endpoint_url=endpoint, region="us-east-1", retry=FAST_RETRY, timeout=10, **overrides)


def _store(endpoint: str, uri: str = f"s3://{BUCKET}/data", **kwargs) -> S3Store:
    store = S3Store(parse_uri(uri), _config(endpoint), **kwargs)
    return store


class _PagedUpstream(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, page_size: int) -> None:
        super().__init__(host, port, timeout=120)
        self.page_size = page_size

    def request(self, method, url, body=None, headers={}, **kwargs):  # noqa: B006 - http.client's signature
        path, _, query = url.partition("?")
        if "list-type=2" in query:
            pairs = [(k, v) for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True) if k != "max-keys"]
            url = path + "?" + urllib.parse.urlencode(pairs + [("max-keys", str(self.page_size))])
        super().request(method, url, body, headers, **kwargs)


class SmallPages(FaultProxy):
    """A FaultProxy whose ListObjectsV2 requests reach moto asking for ``page_size`` keys (moto
    does not check signatures, so the rewritten query is accepted); continuation tokens are
    left alone, so the client pages through everything."""

    def __init__(self, upstream_url: str, page_size: int) -> None:
        super().__init__(upstream_url)
        self.page_size = page_size

    def _open_upstream(self) -> http.client.HTTPConnection:
        return _PagedUpstream(self.upstream_host, self.upstream_port, self.page_size)

    def listings(self) -> list[str]:
        """The queries of the ListObjectsV2 requests seen, in order."""
        return [seen.query for seen in self.requests if seen.method == "GET" and "list-type=2" in seen.query]


@pytest.fixture
def s3(s3_env):
    """A boto3 client for test setup, and a bucket."""
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture
def endpoint(s3_env) -> str:
    return s3_env["AWS_ENDPOINT_URL"]


def _put(client, key: str, data: bytes) -> None:
    client.put_object(Bucket=BUCKET, Key=key, Body=data)


def test_open_store_gives_s3_store_without_building_a_client(endpoint):
    store = open_store(f"s3://{BUCKET}/data", _config(endpoint))
    assert isinstance(store, S3Store)
    assert store.url == f"s3://{BUCKET}/data"
    # lazy: nothing built until first use (obstore's store, boto3's session and client)
    assert not store._store.built and not store._boto_session.built and not store._boto.built


def test_reads_build_no_boto3_client(s3, endpoint):
    _put(s3, "data/f", b"hello")
    store = _store(endpoint)
    assert [info.key for info in store.list()] == ["f"]
    assert store.read_range("f", 0, 5) == b"hello" and store.stat("f").size == 5
    assert store._store.built and not store._boto.built  # boto3 only for what obstore does not do


def test_listing_is_paged_ordered_and_relative(s3, endpoint):
    keys = [f"k{i:03d}" for i in range(23)] + ["sub/a", "sub/b/c", "z"]
    for key in keys:
        _put(s3, f"data/{key}", key.encode())
    _put(s3, "database/not-mine", b"x")  # shares the string prefix "data", not the directory
    with SmallPages(endpoint, page_size=5) as proxy:
        store = _store(proxy.url)
        listed = list(store.list())
        pages = proxy.listings()
        _put(s3, "data/emptydir/", b"")  # a console-made folder marker: never listed
        assert [info.key for info in store.list()] == sorted(keys)
    assert [info.key for info in listed] == sorted(keys)
    # one request per page of 5 (continuation tokens followed), then one starting after the last
    # key, which must find nothing (a server may mark a page truncated and send no token)
    assert len(pages) == -(-len(keys) // 5) + 1
    assert all("continuation-token" in query for query in pages[1:-1])
    assert "start-after=data%2Fz" in pages[-1]
    first = listed[0]
    assert first.size == 4 and first.md5 == hashlib.md5(b"k000").hexdigest() == first.version
    head = s3.head_object(Bucket=BUCKET, Key="data/k000")
    assert abs(first.mtime - head["LastModified"].timestamp()) < 1  # obstore's timestamps
    assert abs(_store(endpoint).stat("k000").mtime - first.mtime) < 1


def test_a_listing_started_early_is_taken_over_not_repeated(s3, endpoint):
    keys = [f"k{i:03d}" for i in range(8)] + ["sub/a", "sub/b"]
    for key in keys:
        _put(s3, f"data/{key}", key.encode())
    with SmallPages(endpoint, page_size=4) as proxy:
        store = _store(proxy.url)
        store.prefetch_listing()
        store._prefetch.result()
        assert proxy.listings()  # asked for before the listing was
        assert [info.key for info in store.list()] == sorted(keys)
        # the requests of one listing (3 pages, then the check after the last key), none twice
        assert len(proxy.listings()) == 3 + 1 and len(set(proxy.listings())) == 4
        store.prefetch_listing()
        assert [info.key for info in store.list("sub/")] == ["sub/a", "sub/b"]  # not the root's pages
        assert [info.key for info in store.list()] == sorted(keys)


def test_a_listing_started_early_that_failed_starts_again(s3, endpoint):
    _put(s3, "data/f", b"x")
    with SmallPages(endpoint, page_size=4) as proxy:
        proxy.add_fault("403", first=1)  # the early request: access denied, once
        store = _store(proxy.url)
        store.prefetch_listing()
        assert [info.key for info in store.list()] == ["f"]
        assert proxy.injected["403"] == 1
    store = _store(endpoint, "s3://no-such-bucket/x")
    store.prefetch_listing()
    with pytest.raises(NotFound, match="no-such-bucket"):
        list(store.list())


def _pages_taken(count: int, fail_at: int | None = None) -> tuple[list[int], object]:
    """A page stream of ``count`` pages that notes each page taken (and fails at ``fail_at``)."""
    taken: list[int] = []

    def pages():
        for number in range(count):
            if number == fail_at:
                raise TransientError(f"page {number} failed")
            taken.append(number)
            yield [{"path": f"p{number}"}]

    return taken, pages()


def test_an_early_listing_reads_pages_ahead_until_taken_over():
    """The early listing's thread reads the pages after the first too (obstore's pages are 1,000
    keys: a 2,000-key sync's second page was asked for only once the sync's code had loaded), at
    most EARLY_PAGES of them, and hands every page over in order, the rest read on demand."""
    from lading.stores.listing import EARLY_PAGES, _EarlyPages

    taken, pages = _pages_taken(3)
    early = _EarlyPages(pages)
    early._thread.join()  # it ends on its own at the end of the listing
    assert taken == [0, 1, 2]
    assert [page[0]["path"] for page in early.result()] == ["p0", "p1", "p2"]
    taken, pages = _pages_taken(EARLY_PAGES + 2)
    early = _EarlyPages(pages)
    early._thread.join()  # ... or once EARLY_PAGES are in
    assert taken == list(range(EARLY_PAGES))
    assert [page[0]["path"] for page in early.result()] == [f"p{n}" for n in range(EARLY_PAGES + 2)]


def test_a_failed_page_of_an_early_listing_comes_in_its_place():
    """A later page's failure is raised after the pages read before it (the listing then resumes
    after the last key it took); a failed first page leaves the listing to start afresh."""
    from lading.stores.listing import _EarlyPages

    early = _EarlyPages(_pages_taken(3, fail_at=1)[1])
    handed = early.result()
    assert early.error is None and next(handed)[0]["path"] == "p0"
    with pytest.raises(TransientError, match="page 1 failed"):
        next(handed)
    early = _EarlyPages(_pages_taken(3, fail_at=0)[1])
    assert early.result() is None and isinstance(early.error, TransientError)


def test_listing_matches_boto3_key_for_key(s3, endpoint):
    """What the listing reports (key, size, ETag, MD5, mtime) is what boto3 reports, across pages
    and for odd keys, through obstore and through the exact (boto3) listing that takes over
    from the first empty object."""
    keys = [f"p/{i:02d}" for i in range(11)] + ["q/x y+z", "q/ü.txt", "q/a=b&c", "q/100%25", "q/100%"]
    for key in keys:
        _put(s3, "data/" + key, key.encode())

    def reference() -> list[tuple]:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="data/")
        return [
            (
                item["Key"][5:],
                item["Size"],
                item["ETag"].strip('"'),
                item["ETag"].strip('"'),
                int(item["LastModified"].timestamp()),
            )
            for page in pages
            for item in page.get("Contents", ())
            if not item["Key"].endswith("/")
        ]

    with SmallPages(endpoint, page_size=4) as proxy:
        store = _store(proxy.url)
        listed = [(i.key, i.size, i.version, i.md5, int(i.mtime)) for i in store.list()]
        assert listed == reference() and len(listed) == len(keys)
        assert [i.key for i in store.list("q/")] == sorted(key for key in keys if key.startswith("q/"))
        _put(s3, "data/folder/", b"")  # a folder marker: told apart by its folder's delimiter listing
        proxy.reset_counts()
        exact = [(i.key, i.size, i.version, i.md5, int(i.mtime)) for i in store.list()]
        assert exact == listed
        assert sum("continuation-token" in query for query in proxy.listings()) >= 3
        assert store.stat("q/x y+z").size == len("q/x y+z")


def test_empty_objects_and_folder_markers_are_told_apart_without_boto3(s3, endpoint):
    """obstore renders a marker ``dir/`` as ``dir``, like an empty object ``dir``: the folder's
    delimiter listing (obstore's too) tells them apart, so a tree of empty objects never falls back
    to boto3's listing, and every key is what boto3 lists."""
    empty = ["a", "c", "e", "g/h", "g/k/l", "x", "z/0", "z/1", "z/2"]
    markers = ["b/", "c/", "d/", "g/i/", "g/k/", "z/"]
    full = {"c-1": b"1", "d/e": b"2", "f": b"3", "g/j": b"4", "x/y": b"5"}
    for key in [*empty, *markers]:
        _put(s3, f"data/{key}", b"")
    for key, body in full.items():
        _put(s3, f"data/{key}", body)
    _put(s3, "data/", b"")  # the prefix's own marker
    reference = [
        (item["Key"][5:], item["Size"])
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="data/")
        for item in page.get("Contents", ())
        if not item["Key"].endswith("/")
    ]
    assert len(reference) == len(empty) + len(full)
    with SmallPages(endpoint, page_size=3) as proxy:
        store = _store(proxy.url)
        assert [(info.key, info.size) for info in store.list()] == reference
        assert [info.key for info in store.list("g/")] == ["g/h", "g/j", "g/k/l"]
        assert not store._boto.built
        folders = [q for q in proxy.listings() if "delimiter=" in q and "continuation-token" not in q]
        assert 0 < len(folders) <= 4 + 2  # each folder once a listing: data/, g/, g/k/, z/; then g/, g/k/


def test_prefix_with_or_without_slash_and_sub_prefix(s3, endpoint):
    for key in ("data/a", "data/sub/b", "data/sub/c", "datax/d", "data/ünï cödé/ä+b&c.txt"):
        _put(s3, key, b"1")
    with_slash = [i.key for i in _store(endpoint, f"s3://{BUCKET}/data/").list()]
    without = [i.key for i in _store(endpoint, f"s3://{BUCKET}/data").list()]
    assert with_slash == without == ["a", "sub/b", "sub/c", "ünï cödé/ä+b&c.txt"]
    assert [i.key for i in _store(endpoint).list("sub/")] == ["sub/b", "sub/c"]
    whole = [i.key for i in _store(endpoint, f"s3://{BUCKET}").list()]
    assert whole == ["data/a", "data/sub/b", "data/sub/c", "data/ünï cödé/ä+b&c.txt", "datax/d"]
    assert _store(endpoint).read_range("ünï cödé/ä+b&c.txt", 0, 1) == b"1"


def test_single_object_uri_is_addressed_through_its_parent(s3, endpoint):
    _put(s3, "data/one.bin", b"payload")
    uri = parse_uri(f"s3://{BUCKET}/data/one.bin")
    assert list(_store(endpoint, str(uri)).list()) == []  # a URI names a prefix
    parent, name = uri.split_name()
    assert _store(endpoint, str(parent)).stat(name).size == 7


def test_stat_and_missing_objects_and_buckets(s3, endpoint):
    _put(s3, "data/f", b"hello")
    info = _store(endpoint).stat("f")
    assert (info.key, info.size, info.md5) == ("f", 5, hashlib.md5(b"hello").hexdigest())
    with pytest.raises(NotFound):
        _store(endpoint).stat("missing")
    with pytest.raises(NotFound):
        _store(endpoint).read_range("missing", 0, 3)
    with pytest.raises(NotFound, match="no-such-bucket"):
        list(_store(endpoint, "s3://no-such-bucket/x").list())


def test_ranged_reads(s3, endpoint):
    data = bytes(range(256)) * 40
    _put(s3, "data/r", data)
    store = _store(endpoint)
    assert store.read_range("r", 100, 1100) == data[100:1100]
    assert store.read_range("r", len(data) - 10, len(data) + 50) == data[-10:]  # short at the end
    assert store.read_range("r", len(data) + 5, len(data) + 10) == b""
    assert store.read_range("r", 7, 7) == b""


def test_version_guard_detects_a_replaced_object(s3, endpoint, tmp_path):
    _put(s3, "data/v", b"version one")
    store = _store(endpoint)
    old = store.stat("v").version
    assert store.read_range("v", 0, 7, old) == b"version"
    _put(s3, "data/v", b"version two!")
    with pytest.raises(ObjectChanged):
        store.read_range("v", 0, 7, old)
    with pytest.raises(ObjectChanged):
        store.download("v", tmp_path / "v.tmp", version=old)
    assert store.read_range("v", 0, 7, store.stat("v").version) == b"version"


def test_download_streams_and_reports_progress(s3, endpoint, tmp_path):
    data = os.urandom(3 << 20)
    _put(s3, "data/d.bin", data)
    seen: list[int] = []
    dest = tmp_path / "d.tmp"
    _store(endpoint).download("d.bin", dest, progress=seen.append)
    assert dest.read_bytes() == data
    assert sum(seen) == len(data)


def test_upload_single_and_multipart(s3, endpoint, tmp_path):
    store = _store(endpoint, multipart_threshold=5 << 20, part_size=5 << 20)
    small, big = tmp_path / "small", tmp_path / "big"
    small.write_bytes(b"tiny")
    big.write_bytes(os.urandom((11 << 20) + 3))
    info = store.upload(small, "up/small")
    assert (info.key, info.size, info.md5) == ("up/small", 4, hashlib.md5(b"tiny").hexdigest())
    progress: list[int] = []
    info = store.upload(big, "up/big", progress=progress.append)
    assert info.size == big.stat().st_size and sum(progress) == info.size
    assert info.version.endswith("-3") and info.md5 is None  # three parts: a multipart ETag
    body = s3.get_object(Bucket=BUCKET, Key="data/up/big")["Body"].read()
    assert body == big.read_bytes()
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_failed_multipart_upload_is_aborted(s3, endpoint, tmp_path):
    big = tmp_path / "big"
    big.write_bytes(os.urandom(10 << 20))
    with FaultProxy(endpoint) as proxy:
        store = _store(proxy.url, multipart_threshold=5 << 20, part_size=5 << 20)
        proxy.add_fault("slowdown", rate=1.0, method="PUT")  # every UploadPart is throttled
        with pytest.raises(Throttled):
            store.upload(big, "up/big")
        assert proxy.count("DELETE") == 1  # AbortMultipartUpload
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    with pytest.raises(NotFound):
        _store(endpoint).stat("up/big")


def test_throttling_resets_and_truncated_bodies_are_retried(s3, endpoint, tmp_path):
    data = os.urandom(2 << 20)
    _put(s3, "data/f.bin", data)
    for i in range(12):
        _put(s3, f"data/many/{i:02d}", bytes([i]) * 100)
    with SmallPages(endpoint, page_size=4) as proxy:
        store = _store(proxy.url)
        proxy.add_fault("slowdown", first=2)
        proxy.add_fault("reset", first=1)
        assert [i.key for i in store.list("many/")] == [f"many/{i:02d}" for i in range(12)]
        assert len(proxy.listings()) > 3 + 3  # three pages of 4, an end check, the failed attempts
        proxy.add_fault("truncate", first=2, method="GET")
        dest = tmp_path / "f.tmp"
        store.download("f.bin", dest)
        assert dest.read_bytes() == data
        proxy.add_fault("truncate", first=1, method="GET")
        proxy.add_fault("reset", first=1, method="GET")
        assert store.read_range("f.bin", 1000, 900_000) == data[1000:900_000]
        assert proxy.injected == {"slowdown": 2, "reset": 2, "truncate": 3}


def test_download_resumes_after_a_broken_body_without_refetching(s3, endpoint, tmp_path):
    data = os.urandom(1 << 20)
    _put(s3, "data/f.bin", data)
    with FaultProxy(endpoint) as proxy:
        store = _store(proxy.url)
        version = store.stat("f.bin").version
        proxy.add_fault("truncate", first=1, method="GET")
        seen: list[int] = []
        store.download("f.bin", tmp_path / "f.tmp", version=version, progress=seen.append)
        gets = [r for r in proxy.requests if r.method == "GET"]
    assert (tmp_path / "f.tmp").read_bytes() == data
    assert sum(seen) == len(data)  # the kept bytes are not counted twice
    assert len(gets) == 2 and gets[0].fault == "truncate"
    start = int(gets[1].headers.get("Range").removeprefix("bytes=").partition("-")[0])
    assert 0 < start <= len(data) // 2  # from the bytes that had arrived (obstore hands over pieces)
    assert gets[1].headers.get("If-Match") == f'"{version}"'


def test_persistent_failure_gives_up_after_the_configured_attempts(s3, endpoint):
    _put(s3, "data/f", b"x")
    with FaultProxy(endpoint) as proxy:
        store = _store(proxy.url)
        proxy.add_fault("slowdown", rate=1.0)
        with pytest.raises(Throttled):
            store.stat("f")
        assert proxy.count("HEAD") == FAST_RETRY.attempts  # obstore's own retries are off
        proxy.clear_faults()
        proxy.add_fault("reset", rate=1.0)
        with pytest.raises(TransientError) as caught:
            store.read_range("f", 0, 1)
        assert not isinstance(caught.value, Throttled)
        assert proxy.count("GET") == FAST_RETRY.attempts


def test_unreachable_endpoint_is_transient(s3_env):
    store = S3Store(parse_uri(f"s3://{BUCKET}/x"), _config(f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(TransientError, match="network error") as caught:
        store.stat("f")
    assert "endpoint" in (caught.value.hint or "")


def test_missing_credentials_and_unknown_profile_are_access_denied(endpoint, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for operation in (lambda store: store.stat("f"), lambda store: list(store.list())):
        with pytest.raises(AccessDenied, match="no AWS credentials") as caught:
            operation(_store(endpoint))
        assert "--no-sign-request" in (caught.value.hint or "") and caught.value.exit_code == 4
    store = S3Store(parse_uri(f"s3://{BUCKET}/x"), _config(endpoint, profile="nope"))
    with pytest.raises(AccessDenied, match="profile.*nope") as caught:
        store.stat("f")
    assert caught.value.exit_code == 4


def test_no_sign_request_reads_a_public_bucket(s3_env, endpoint, monkeypatch, tmp_path):
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="public-bkt", ACL="public-read")
    client.create_bucket(Bucket="private-bkt")
    client.put_object(Bucket="public-bkt", Key="p/f", Body=b"open", ACL="public-read")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    client.put_object(Bucket="private-bkt", Key="p/f", Body=b"closed")
    with FaultProxy(endpoint) as proxy:
        public = S3Store(parse_uri("s3://public-bkt/p"), _config(proxy.url, no_sign_request=True))
        assert [i.key for i in public.list()] == ["f"]
        assert public.read_range("f", 0, 4) == b"open"
        private = S3Store(parse_uri("s3://private-bkt/p"), _config(proxy.url, no_sign_request=True))
        with pytest.raises(AccessDenied):
            private.read_range("f", 0, 4)
        assert not any("Authorization" in seen.headers for seen in proxy.requests)


@pytest.fixture(scope="module")
def auth_moto(tmp_path_factory) -> Server:
    """A dedicated moto server that checks credentials (INITIAL_NO_AUTH_ACTION_COUNT=0)."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("auth-moto") / "moto.log", "wb")
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    server = Server("moto-auth", port, proc)
    try:
        wait_http(f"{server.url}/moto-api/", proc)
        yield server
    finally:
        server.stop()
        log.close()


def test_bad_credentials_are_access_denied(auth_moto, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    store = S3Store(parse_uri(f"s3://{BUCKET}/x"), _config(auth_moto.url))
    with pytest.raises(AccessDenied, match="InvalidAccessKeyId|not valid|denied") as caught:
        list(store.list())
    assert caught.value.exit_code == 4


def test_shared_by_threads(s3, endpoint):
    data = os.urandom(64 << 10)
    _put(s3, "data/t", data)
    store = _store(endpoint)
    ranges = [(i * 1000, i * 1000 + 4096) for i in range(32)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda r: store.read_range("t", *r), ranges))
    assert results == [data[a:b] for a, b in ranges]


def test_usable_after_fork(s3, endpoint):
    """A child forked after the parent read through obstore (whose tokio runtime does not survive
    fork) reads through boto3, on a client of its own; the parent's clients are untouched."""
    _put(s3, "data/f", b"before and after fork")
    store = _store(endpoint)
    assert store.stat("f").size == 21  # the parent reads through obstore, with open connections
    assert store.etag_is_md5("f")  # and has a boto3 client
    parent_store, parent_boto = store._store.get(), store._boto.get()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must build its own clients, never reuse the parent's sockets
        code = 1
        try:
            os.close(read_fd)
            rebuilt = not store._store.built and not store._boto.built
            data = store.read_range("f", 0, 6, store.stat("f").version)
            fresh = store._boto.get() is not parent_boto and not store._store.built  # boto3 only
            os.write(write_fd, b"%d %d " % (rebuilt, fresh) + data)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], 60)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the forked child hung reading through the store")
        with os.fdopen(read_fd, "rb") as pipe:
            message = pipe.read()
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert message == b"1 1 before"
    assert store.read_range("f", 11, 21) == b"after fork"  # the parent still works
    assert store._store.get() is parent_store and store._boto.get() is parent_boto


def test_sse_kms_etag_is_not_taken_for_an_md5(s3, endpoint):
    s3.put_object(Bucket=BUCKET, Key="data/enc", Body=b"secret", ServerSideEncryption="aws:kms")
    plain = hashlib.md5(b"secret").hexdigest()
    _put(s3, "data/plain", b"secret")
    store = _store(endpoint)
    assert store.stat("plain").md5 == plain
    # obstore's HEAD does not say whether an object is encrypted: boto3's does, and the transfer
    # engine asks it (etag_is_md5) when the bytes do not match the listed MD5 (test_transfer_s3)
    assert store.etag_is_md5("plain") and not store.etag_is_md5("enc")
    assert store._sdk_stat("plain").md5 == plain and store._sdk_stat("enc").md5 is None  # forked children


def test_multipart_parts_are_retried_one_by_one(s3, endpoint, tmp_path):
    big = tmp_path / "big"
    big.write_bytes(os.urandom((10 << 20) + 1))
    with FaultProxy(endpoint) as proxy:
        store = _store(proxy.url, multipart_threshold=5 << 20, part_size=5 << 20, upload_workers=1)
        proxy.add_fault("slowdown", first=1, method="PUT")
        proxy.add_fault("reset", first=1, method="PUT")
        progress: list[int] = []
        info = store.upload(big, "up/big", progress=progress.append)
        part_puts = proxy.count("PUT", where=lambda seen: "partNumber=" in seen.query)
    assert part_puts == 3 + 2  # three parts, two of the attempts failed and were retried alone
    assert info.size == big.stat().st_size == sum(progress)
    assert s3.get_object(Bucket=BUCKET, Key="data/up/big")["Body"].read() == big.read_bytes()


def test_empty_object_round_trip(s3, endpoint, tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    store = _store(endpoint)
    info = store.upload(empty, "e")
    assert info.size == 0 and info.md5 == hashlib.md5(b"").hexdigest()
    store.download("e", tmp_path / "e.tmp", version=info.version)
    assert (tmp_path / "e.tmp").read_bytes() == b""
    assert store.read_range("e", 0, 10) == b""


def test_servers_that_ignore_range_still_give_the_right_bytes(s3, endpoint, tmp_path):
    data = os.urandom(600_000)
    _put(s3, "data/f.bin", data)
    with FaultProxy(endpoint) as proxy:
        store = _store(proxy.url)
        version = store.stat("f.bin").version
        proxy.add_fault("truncate", first=1, method="GET")
        proxy.add_fault("norange", first=1)  # the resumed request gets the whole object back
        seen: list[int] = []
        store.download("f.bin", tmp_path / "f.tmp", progress=seen.append)
        assert proxy.injected == {"truncate": 1, "norange": 1}
        proxy.reset_counts()
        assert store.read_range("f.bin", 1000, 2000) == data[1000:2000]
        assert store.read_range("f.bin", 599_990, 700_000, version) == data[599_990:]
        gets = [seen for seen in proxy.requests if seen.method == "GET"]
    assert (tmp_path / "f.tmp").read_bytes() == data
    assert sum(seen) == len(data) and min(seen) > 0  # the whole answer was sliced: nothing counted twice
    # from then on the store asks for whole objects (pinned) and keeps the range asked for
    assert len(gets) == 2 and [seen.headers.get("Range") for seen in gets] == [None, None]
    assert [seen.headers.get("If-Match") for seen in gets] == [None, f'"{version}"']


def test_the_bounded_ranged_read_tries_once_and_leaves_whole_objects_to_the_retried_read(s3, endpoint):
    """``attempt_reader`` (a random miss on the mount's FUSE thread, which must answer within
    --timeout): one GET and no retry; a server that answers a range with the whole object makes
    it return None, and the retried read (``range_reader``) slices it."""
    from lading.core.errors import TransientError
    from lading.stores.ranged import RangeRequest, attempt_reader, range_reader

    data = os.urandom(300_000)
    _put(s3, "data/h.bin", data)
    with FaultProxy(endpoint) as proxy:
        store = _store(proxy.url)
        version = store.stat("h.bin").version
        attempt = attempt_reader(store)
        assert bytes(attempt(RangeRequest("h.bin", 1000, 5000, version)) or b"") == data[1000:5000]
        proxy.reset_counts()
        proxy.add_fault("slowdown", first=1)
        with pytest.raises(TransientError):
            attempt(RangeRequest("h.bin", 0, 10, version))
        assert proxy.count("GET") == 1  # not retried
        proxy.add_fault("norange", first=1)
        assert attempt(RangeRequest("h.bin", 2000, 3000, version)) is None
        assert bytes(range_reader(store)(RangeRequest("h.bin", 2000, 3000, version))) == data[2000:3000]


def test_the_blocking_ranged_read_slices_whole_objects_from_servers_that_ignore_range(s3, endpoint):
    """The mount's path (``range_reader``: obstore's blocking GET) on a server that answers a
    range with the whole object: the bytes asked for, and later ranges asked as whole objects."""
    from lading.stores.ranged import RangeRequest, range_reader

    data = os.urandom(300_000)
    _put(s3, "data/g.bin", data)
    with FaultProxy(endpoint) as proxy:
        store = _store(proxy.url)
        version = store.stat("g.bin").version
        proxy.add_fault("norange", first=1)
        read = range_reader(store)
        assert bytes(read(RangeRequest("g.bin", 1000, 5000, version))) == data[1000:5000]
        assert bytes(read(RangeRequest("g.bin", 299_000, 400_000, version))) == data[299_000:]
        ranges = [seen.headers.get("Range") for seen in proxy.requests if seen.method == "GET"]
    # the refused range, its whole object, then the whole object again for the second read
    assert ranges == ["bytes=1000-4999", None, None]


def test_a_large_folder_of_empty_objects_is_read_a_page_at_a_time(s3, endpoint, monkeypatch):
    """obstore's delimiter listing cannot page: a folder whose entries in the listing are more
    than the window is looked up a boto3 page at a time (memory: one page), never listed whole;
    a small folder still takes obstore's one listing."""
    from lading.stores import listing

    whole = listing._Folders.WHOLE
    monkeypatch.setattr(listing._Folders, "WHOLE", 6)
    flat = [f"flat/e{i:03d}" for i in range(40)]
    for key in [*flat, "small/a", "small/b"]:
        _put(s3, f"data/{key}", b"")
    for key in ["flat/m/", "small/c/", "flat/z/"]:
        _put(s3, f"data/{key}", b"")  # markers, one in the middle of the flat folder's pages
    _put(s3, "data/flat/m/x", b"x")
    reference = [
        (item["Key"][5:], item["Size"])
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="data/")
        for item in page.get("Contents", ())
        if not item["Key"].endswith("/")
    ]
    with SmallPages(endpoint, page_size=4) as proxy:
        store = _store(proxy.url)
        assert [(info.key, info.size) for info in store.list()] == reference
        folders = [
            (seen.query, "object_store" in (seen.headers.get("User-Agent") or ""))
            for seen in proxy.requests
            if "list-type=2" in seen.query and "delimiter=" in seen.query
        ]
    flat_queries = [by_obstore for query, by_obstore in folders if "prefix=data%2Fflat%2F&" in query + "&"]
    small_queries = [by_obstore for query, by_obstore in folders if "prefix=data%2Fsmall%2F&" in query + "&"]
    assert flat_queries and not any(flat_queries)  # the SDK's pages, never obstore's whole listing
    assert len(flat_queries) <= 40 // 4 + 2  # each page asked for once
    assert small_queries and all(small_queries)
    guide = (Path(__file__).parent.parent / "docs" / "guides" / "stores.md").read_text()
    assert f"more than {whole:,} entries around it" in guide  # the documented window is the code's
