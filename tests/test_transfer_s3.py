"""The transfer engine against moto's S3 server over HTTP, through the lean signed GET path
(what users run) and through S3Store, with the counting / fault-injecting proxy in between."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import threading
from pathlib import Path

import boto3
import pytest
from lading.core.errors import AccessDenied, LadingError, NotFound, ObjectChanged, TransientError, UsageError
from lading.core.retry import RetryPolicy
from lading.stores import StoreConfig, open_store, parse_uri
from lading.stores.base import ObjectInfo
from lading.stores.s3.fast import FastS3Client, FastS3Store
from lading.stores.s3.sign import Signer
from lading.stores.s3.store import S3Store
from lading.transfer import TransferItem, TransferOptions, TransferResult, fetch_all
from lading.transfer.files import ResumeRecord, is_temporary, sidecar_path
from lading.transfer.readers import StreamingReader, open_reader
from lading.transfer.verify import IntegrityError
from proxies import FaultProxy

BUCKET = "transfer-test"
FAST_RETRY = RetryPolicy(attempts=6, base_delay=0.002, max_delay=0.01)
NO_RETRY = RetryPolicy(attempts=1)
SMALL_PARTS = TransferOptions(workers=4, part_size=4096, multipart_threshold=8192, retry=FAST_RETRY)


@pytest.fixture
def s3(s3_env):
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return client


def _store(endpoint: str, prefix: str = "data"):
    return open_store(f"s3://{BUCKET}/{prefix}", StoreConfig(endpoint_url=endpoint, region="us-east-1",
                                                            retry=FAST_RETRY, timeout=10))


def _seed(s3, files: dict[str, bytes], prefix: str = "data/") -> None:
    for key, data in files.items():
        s3.put_object(Bucket=BUCKET, Key=prefix + key, Body=data)


def _fetch(store, dest: Path, options: TransferOptions = SMALL_PARTS, events=None) -> list[TransferResult]:
    items = [TransferItem(info, dest / info.key) for info in store.list()]
    if events is None:
        return fetch_all(store, items, options)
    return fetch_all(store, items, options, events)


def _files() -> dict[str, bytes]:
    files = {f"dir{i % 2}/obj{i}.bin": os.urandom(300 + 97 * i) for i in range(12)}
    files["large.bin"] = os.urandom(30_000)  # 8 ranged parts of 4 KiB
    files["empty"] = b""
    return files


def _assert_tree(dest: Path, files: dict[str, bytes]) -> None:
    for key, data in files.items():
        assert (dest / key).read_bytes() == data, key
    assert [p for p in dest.rglob("*") if is_temporary(p.name)] == []


def test_s3_stores_use_the_lean_path(s3_env):
    store = _store(s3_env["AWS_ENDPOINT_URL"])
    assert isinstance(open_reader(store, True, FAST_RETRY), StreamingReader)
    assert not isinstance(open_reader(store, False, FAST_RETRY), StreamingReader)


@pytest.mark.parametrize("fast_path", [True, False], ids=["lean-path", "s3store"])
def test_small_and_ranged_downloads_are_byte_identical(s3, s3_env, tmp_path, fast_path):
    files = _files()
    _seed(s3, files)
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        store = _store(proxy.url)
        options = TransferOptions(workers=4, part_size=4096, multipart_threshold=8192, fast_path=fast_path)
        results = _fetch(store, tmp_path, options)
        ranged = [r for r in proxy.requests if r.method == "GET" and r.headers.get("Range")]
        guarded = [r for r in proxy.requests if r.method == "GET" and r.headers.get("If-Match")]

    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    _assert_tree(tmp_path, files)
    assert len(ranged) == 8  # the large object, one request per part
    assert len(guarded) >= 8  # every part is guarded by the ETag
    if fast_path:
        assert len(guarded) == len(files) - 1 + 8  # and so is every whole-object GET


def test_faults_503_resets_and_truncation_still_give_identical_files(s3, s3_env, tmp_path):
    files = _files()
    _seed(s3, files)
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        proxy.add_fault("truncate", first=2, method="GET")
        proxy.add_fault("slowdown", rate=0.2, seed=3, method="GET")
        proxy.add_fault("reset", rate=0.15, seed=4, method="GET")
        store = _store(proxy.url)
        infos = list(store.list())
        results = fetch_all(store, [TransferItem(i, tmp_path / i.key) for i in infos], SMALL_PARTS)
        injected = dict(proxy.injected)

    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    _assert_tree(tmp_path, files)
    assert injected.get("truncate") == 2 and injected.get("slowdown", 0) > 0 and injected.get("reset", 0) > 0


def test_persistent_failure_is_reported_per_item(s3, s3_env, tmp_path):
    _seed(s3, {"a": b"alpha", "b": b"beta"})
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        store = _store(proxy.url)
        infos = list(store.list())
        proxy.add_fault("slowdown", rate=1.0, method="GET", path_prefix=f"/{BUCKET}/data/a")
        results = {r.key: r for r in fetch_all(store, [TransferItem(i, tmp_path / i.key) for i in infos],
                                               SMALL_PARTS)}

    assert isinstance(results["a"].error, TransientError) and not (tmp_path / "a").exists()
    assert results["b"].ok and (tmp_path / "b").read_bytes() == b"beta"


def test_interrupted_ranged_download_resumes_with_only_the_missing_parts(s3, s3_env, tmp_path):
    data = os.urandom(40_000)  # 10 parts
    _seed(s3, {"big": data})
    one_at_a_time = TransferOptions(workers=1, part_size=4096, multipart_threshold=8192, retry=NO_RETRY)
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        store = _store(proxy.url)
        [info] = list(store.list())
        item = TransferItem(info, tmp_path / "big")
        proxy.add_fault("reset", rate=0.3, seed=7, method="GET")
        [first] = fetch_all(store, [item], one_at_a_time)
        record = ResumeRecord.load(sidecar_path(tmp_path / "big"))
        assert not first.ok and not (tmp_path / "big").exists()
        assert record is not None and 0 < len(record.done) < 10  # seed 7: some parts made it

        proxy.clear_faults()
        proxy.reset_counts()
        [second] = fetch_all(store, [item], one_at_a_time)
        ranges = sorted(r.headers.get("Range") for r in proxy.requests if r.method == "GET")

    assert second.ok and (tmp_path / "big").read_bytes() == data
    missing = sorted(set(range(10)) - record.done)
    assert ranges == sorted(f"bytes={i * 4096}-{min(40_000, (i + 1) * 4096) - 1}" for i in missing)
    assert not sidecar_path(tmp_path / "big").exists()


def test_object_replaced_mid_download_gives_object_changed(s3, s3_env, tmp_path):
    _seed(s3, {"big": os.urandom(40_000)})
    store = _store(s3_env["AWS_ENDPOINT_URL"])
    [info] = list(store.list())
    replaced = threading.Event()

    class ReplaceAfterFirstBytes:
        def on_bytes(self, nbytes: int) -> None:
            if nbytes > 0 and not replaced.is_set():
                replaced.set()
                s3.put_object(Bucket=BUCKET, Key="data/big", Body=os.urandom(40_000))

        def on_done(self, result: TransferResult) -> None:
            pass

    one_at_a_time = TransferOptions(workers=1, part_size=4096, multipart_threshold=8192, retry=NO_RETRY)
    [result] = fetch_all(store, [TransferItem(info, tmp_path / "big")], one_at_a_time, ReplaceAfterFirstBytes())

    assert replaced.is_set()
    assert not result.ok and isinstance(result.error, ObjectChanged)
    assert list(tmp_path.iterdir()) == []


def test_small_object_replaced_after_listing_gives_object_changed(s3, s3_env, tmp_path):
    _seed(s3, {"f": b"version one"})
    store = _store(s3_env["AWS_ENDPOINT_URL"])
    infos = list(store.list())
    _seed(s3, {"f": b"version two"})

    [result] = fetch_all(store, [TransferItem(i, tmp_path / i.key) for i in infos], SMALL_PARTS)

    assert isinstance(result.error, ObjectChanged) and not (tmp_path / "f").exists()


def test_checksum_mismatch_fails_without_a_final_file(s3, s3_env, tmp_path):
    _seed(s3, {"f": b"real content"})
    store = _store(s3_env["AWS_ENDPOINT_URL"])
    [info] = list(store.list())
    assert info.md5 == hashlib.md5(b"real content").hexdigest()  # single-part ETag
    wrong = ObjectInfo(info.key, info.size, info.version, md5=hashlib.md5(b"other content").hexdigest())

    [result] = fetch_all(store, [TransferItem(wrong, tmp_path / "f")], SMALL_PARTS)

    assert isinstance(result.error, IntegrityError) and "MD5 mismatch" in result.error.message
    assert list(tmp_path.iterdir()) == []


def test_missing_object_and_missing_bucket_are_not_found(s3, s3_env, tmp_path):
    store = _store(s3_env["AWS_ENDPOINT_URL"])
    ghost = ObjectInfo("ghost", 3, "0" * 32)
    [result] = fetch_all(store, [TransferItem(ghost, tmp_path / "ghost")], SMALL_PARTS)
    assert isinstance(result.error, NotFound) and not (tmp_path / "ghost").exists()

    client = FastS3Client(parse_uri("s3://no-such-bucket-here/x"),
                          StoreConfig(endpoint_url=s3_env["AWS_ENDPOINT_URL"], region="us-east-1"))
    with pytest.raises(NotFound, match="no such bucket"):
        list(client.list())


def test_lean_listing_matches_s3store_listing(s3, s3_env):
    keys = [f"p/{i:02d}" for i in range(11)] + ["q/x y+z", "q/ü.txt", "q/a=b&c"]
    for key in keys:
        s3.put_object(Bucket=BUCKET, Key="data/" + key, Body=key.encode())
    s3.put_object(Bucket=BUCKET, Key="data/folder/", Body=b"")  # a folder marker: not listed
    store = _store(s3_env["AWS_ENDPOINT_URL"])
    client = FastS3Client(store.uri, store.config)
    client.page_size = 4  # several pages, continuation tokens

    lean = [(i.key, i.size, i.version, i.md5, int(i.mtime)) for i in client.list()]
    reference = [(i.key, i.size, i.version, i.md5, int(i.mtime))
                 for i in S3Store(store.uri, store.config, page_size=5).list()]

    assert lean == reference and len(lean) == len(keys)
    assert isinstance(store, FastS3Store) and [i.key for i in store.list("q/")] == ["q/a=b&c", "q/x y+z", "q/ü.txt"]
    assert client.head("q/x y+z").size == len("q/x y+z")


def test_signature_matches_botocore_for_odd_keys_and_session_tokens():
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    when = dt.datetime(2026, 11, 21, 1, 2, 3, tzinfo=dt.timezone.utc)
    for path, query in [("/bucket/data/a%20b%2Bc/%C3%BC.bin", ""),
                        ("/bucket/", "continuation-token=abc%2F%3D&list-type=2&prefix=data%2F")]:
        headers = {"Range": "bytes=0-99", "If-Match": '"abc"'}
        Signer("eu-west-1").sign("GET", "s3.example:9000", path, query, headers, ("AKID", "SECRET", "TOKEN"), when)

        request = AWSRequest(method="GET", url=f"http://s3.example:9000{path}" + (f"?{query}" if query else ""),
                             headers={"Range": "bytes=0-99", "If-Match": '"abc"'})
        auth = S3SigV4Auth(Credentials("AKID", "SECRET", "TOKEN"), "s3", "eu-west-1")
        # botocore's add_auth() with the clock fixed: the same steps, in the same order
        request.context["timestamp"] = when.strftime("%Y%m%dT%H%M%SZ")
        auth._modify_request_before_signing(request)
        string_to_sign = auth.string_to_sign(request, auth.canonical_request(request))
        auth._inject_signature_to_request(request, auth.signature(string_to_sign, request))
        assert headers["Authorization"] == request.headers["Authorization"]


@pytest.mark.parametrize("size", [100, 20_000], ids=["whole", "ranged"])
def test_sse_kms_etag_is_not_taken_for_an_md5(s3, s3_env, tmp_path, size):
    data = os.urandom(size)
    s3.put_object(Bucket=BUCKET, Key="data/enc", Body=data, ServerSideEncryption="aws:kms")
    store = _store(s3_env["AWS_ENDPOINT_URL"])
    [info] = list(store.list())
    # what a real KMS ETag looks like to a lister: 32 hex digits that are not the content's MD5
    listed = ObjectInfo(info.key, info.size, info.version, md5=hashlib.md5(b"not the content").hexdigest())

    [result] = fetch_all(store, [TransferItem(listed, tmp_path / "enc")], SMALL_PARTS)

    assert result.ok, result.error
    assert (tmp_path / "enc").read_bytes() == data


def test_no_sign_request_sends_unsigned_requests(s3, s3_env, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="data/pub", Body=b"public bytes", ACL="public-read")
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        store = open_store(f"s3://{BUCKET}/data", StoreConfig(endpoint_url=proxy.url, region="us-east-1",
                                                              no_sign_request=True, retry=FAST_RETRY))
        results = _fetch(store, tmp_path)
        gets = [r for r in proxy.requests if r.method == "GET"]

    assert [r.ok for r in results] == [True], results
    assert (tmp_path / "pub").read_bytes() == b"public bytes"
    assert gets and all(r.headers.get("Authorization") is None for r in gets)


def test_missing_credentials_and_unknown_profile_are_one_line_errors(s3_env, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata probing
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    config = StoreConfig(endpoint_url=s3_env["AWS_ENDPOINT_URL"], region="us-east-1", retry=NO_RETRY)

    with pytest.raises(AccessDenied, match="no AWS credentials"):
        list(FastS3Client(parse_uri(f"s3://{BUCKET}/x"), config).list())
    profiled = StoreConfig(endpoint_url=s3_env["AWS_ENDPOINT_URL"], region="us-east-1", profile="nope",
                           retry=NO_RETRY)
    with pytest.raises(UsageError, match="nope"):
        list(FastS3Client(parse_uri(f"s3://{BUCKET}/x"), profiled).list())


def test_lean_path_addresses_odd_keys_exactly_like_boto3(s3, s3_env):
    keys = ["a b+c/ü.bin", "x=y&z;(1)!*'~", "deep/./dots/../not-normalised"]
    for key in keys:
        s3.put_object(Bucket=BUCKET, Key="data/" + key, Body=key.encode())
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        store = _store(proxy.url)
        for key in keys:
            assert store.read_range(key, 0, 100) == key.encode()  # boto3 (S3Store)
            got = bytearray()
            store.fast.get(key, got.extend)  # the lean path
            assert bytes(got) == key.encode()
        paths = [r.path for r in proxy.requests if r.method == "GET"]

    assert paths[0::2] == paths[1::2]  # same request path, key by key


class TLSFront:
    """TLS in front of moto (which speaks plain HTTP): what the lean path meets on real S3."""

    def __init__(self, upstream_port: int, cert: Path, key: Path) -> None:
        import socket
        import ssl

        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.upstream_port = upstream_port
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handshakes = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            try:
                client = self.context.wrap_socket(raw, server_side=True)
            except OSError:
                raw.close()
                continue
            self.handshakes += 1
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    @staticmethod
    def _pump(client, upstream) -> None:
        """Relay both ways from ONE thread: an SSLSocket read and written by two threads at
        once can interleave raw TLS records into the plaintext (seen as a flaky body)."""
        import select

        try:
            while True:
                ready = [client] if client.pending() else select.select([client, upstream], [], [])[0]
                for src in ready:
                    data = src.recv(65536)
                    if not data:
                        return
                    (upstream if src is client else client).sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                try:
                    sock.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def test_lean_path_over_tls_trusts_the_configured_ca_bundle(s3, s3_env, tmp_path, monkeypatch):
    import subprocess
    import urllib.parse

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    data = os.urandom(20_000)
    _seed(s3, {"small": b"over tls", "large": data})
    front = TLSFront(urllib.parse.urlsplit(s3_env["AWS_ENDPOINT_URL"]).port, cert, key)
    try:
        endpoint = f"https://localhost:{front.port}"
        monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
        untrusted = _store(endpoint)
        with pytest.raises(LadingError, match="TLS certificate not trusted") as caught:
            list(FastS3Client(untrusted.uri, StoreConfig(endpoint_url=endpoint, region="us-east-1",
                                                         retry=FAST_RETRY)).list())
        assert not isinstance(caught.value, TransientError)  # not retried
        assert "AWS_CA_BUNDLE" in caught.value.hint

        monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))  # botocore's chain, as users configure it
        store = _store(endpoint)
        results = _fetch(store, tmp_path / "out")
    finally:
        front.close()

    assert all(r.ok for r in results), [r.error for r in results]
    assert (tmp_path / "out" / "small").read_bytes() == b"over tls"
    assert (tmp_path / "out" / "large").read_bytes() == data
    assert front.handshakes >= 2


def test_endpoint_addressing_rules():
    from lading.stores.s3.fast import _resolve_endpoint

    aws = _resolve_endpoint("https://s3.eu-west-1.amazonaws.com", "my-bucket", "eu-west-1")
    assert (aws.scheme, aws.host, aws.path_prefix) == ("https", "my-bucket.s3.eu-west-1.amazonaws.com", "")
    dotted = _resolve_endpoint("https://s3.amazonaws.com", "my.bucket", "us-east-1")
    assert (dotted.host, dotted.path_prefix) == ("s3.us-east-1.amazonaws.com", "/my.bucket")
    custom = _resolve_endpoint("http://127.0.0.1:7480", "my-bucket", "us-east-1")
    assert (custom.scheme, custom.host, custom.path_prefix) == ("http", "127.0.0.1:7480", "/my-bucket")


def test_a_retried_truncated_body_is_verified_on_its_own_bytes(s3, s3_env, tmp_path):
    _seed(s3, {"f": os.urandom(50_000)})
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        store = _store(proxy.url)
        infos = list(store.list())
        assert infos[0].md5  # MD5-verified
        proxy.reset_counts()
        proxy.add_fault("truncate", first=1, method="GET")
        whole = TransferOptions(workers=1, retry=FAST_RETRY)  # one whole-object GET
        [result] = fetch_all(store, [TransferItem(i, tmp_path / i.key) for i in infos], whole)
        gets = proxy.count("GET")

    assert result.ok, result.error
    assert gets == 2  # the cut one and one retry: no spurious checksum mismatch and third GET
