"""The obstore data plane against real servers and injected faults: resumed bodies cost one Range
request pinned to the version, a full disk is not retried, a truncated listing without a token is
an error, regions are resolved, proxies and the connect timeout are honoured."""

from __future__ import annotations

import os
import subprocess
from datetime import timedelta

import pytest
from lading.core.errors import TransientError
from lading.stores import StoreConfig, open_store
from lading.stores.objstore import client_options
from lading.transfer import TransferItem, TransferOptions, fetch_all
from proxies import FaultProxy
from sync_fixtures import BUCKET, put_objects, read_tree, s3_client, sample_objects

SOURCE = f"s3://{BUCKET}/data"


@pytest.fixture
def proxy(s3_env):
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as running:
        yield running


def gets_of(proxy: FaultProxy, key: str) -> list:
    return [seen for seen in proxy.requests if seen.method == "GET" and seen.path.endswith(key)]


def test_a_cut_small_body_resumes_with_one_range_request(s3_env, proxy, tmp_path):
    body = os.urandom(300_000)
    put_objects(s3_client(s3_env), {"one.bin": body})
    store = open_store(SOURCE, StoreConfig(endpoint_url=proxy.url, region="us-east-1"))
    info = next(iter(store.list()))
    proxy.add_fault("truncate", first=1, method="GET", path_prefix=f"/{BUCKET}/data/one.bin")
    [result] = fetch_all(store, [TransferItem(info, tmp_path / "one.bin")])
    assert result.ok, result.error
    assert (tmp_path / "one.bin").read_bytes() == body
    first, second = gets_of(proxy, "one.bin")
    assert first.fault == "truncate" and first.headers.get("Range") is None
    start = int(second.headers.get("Range").removeprefix("bytes=").split("-")[0])
    assert 0 < start <= len(body) // 2  # from what had arrived (obstore hands over 64 KiB pieces)
    assert second.headers.get("If-Match") == f'"{info.version}"'


def test_a_cut_part_is_asked_for_again_alone_and_pinned(s3_env, proxy, tmp_path):
    # A part's body is collected whole (one buffer, no copy: bench/RESULTS.md session 7), so a cut
    # part costs that part again, nothing more: the parts already on disk are not refetched.
    body = os.urandom(3 * 256 * 1024)
    put_objects(s3_client(s3_env), {"big.bin": body})
    store = open_store(SOURCE, StoreConfig(endpoint_url=proxy.url, region="us-east-1"))
    info = next(iter(store.list()))
    options = TransferOptions(workers=2, part_size=256 * 1024, multipart_threshold=300 * 1024, part_concurrency=1)
    proxy.add_fault("truncate", first=1, method="GET", path_prefix=f"/{BUCKET}/data/big.bin")
    [result] = fetch_all(store, [TransferItem(info, tmp_path / "big.bin")], options)
    assert result.ok, result.error
    assert (tmp_path / "big.bin").read_bytes() == body
    requests = gets_of(proxy, "big.bin")
    assert len(requests) == 4  # three parts, the cut one asked for again once
    cut = next(seen for seen in requests if seen.fault == "truncate")
    ranges = sorted(seen.headers.get("Range") for seen in requests)
    assert ranges == sorted(
        [cut.headers.get("Range")] + [f"bytes={s}-{s + 256 * 1024 - 1}" for s in (0, 262144, 524288)]
    )
    assert all(seen.headers.get("If-Match") == f'"{info.version}"' for seen in requests)


def test_a_replaced_object_is_never_mixed_even_when_resuming(s3_env, proxy, tmp_path):
    client = s3_client(s3_env)
    put_objects(client, {"one.bin": b"a" * 200_000})
    store = open_store(SOURCE, StoreConfig(endpoint_url=proxy.url, region="us-east-1"))
    info = next(iter(store.list()))
    replace = lambda: client.put_object(Bucket=BUCKET, Key="data/one.bin", Body=b"b" * 200_000)  # noqa: E731
    proxy.add_fault("truncate", first=1, method="GET", then=replace)
    [result] = fetch_all(store, [TransferItem(info, tmp_path / "one.bin")])
    assert not result.ok and "changed" in result.error.message
    assert not (tmp_path / "one.bin").exists()


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs (the tests run as root, as CI does); unmounted afterwards."""
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mountpoint)], check=True)
    yield mountpoint
    subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def test_a_full_disk_is_not_retried_and_says_so(lading, s3_env, proxy, tiny_disk):
    put_objects(s3_client(s3_env), {"big.bin": os.urandom(1 << 20)})
    result = lading("sync", SOURCE, str(tiny_disk / "data"), env={"AWS_ENDPOINT_URL": proxy.url})
    assert result.returncode == 6, result.stderr
    assert "No space left on device" in result.stderr and "Traceback" not in result.stderr
    assert len(gets_of(proxy, "big.bin")) == 1  # not retried
    assert not [name for _, _, names in os.walk(tiny_disk) for name in names if ".lading-part" in name]


def test_a_truncated_listing_without_a_token_is_an_error(lading, s3_env, proxy, tmp_path):
    objects = sample_objects(6)
    put_objects(s3_client(s3_env), objects)
    env = {"AWS_ENDPOINT_URL": proxy.url}
    dest = tmp_path / "out"
    assert lading("sync", SOURCE, str(dest), env=env).returncode == 0
    store = open_store(SOURCE, StoreConfig(endpoint_url=proxy.url, region="us-east-1"))
    proxy.add_fault("droptoken", first=1)
    with pytest.raises(TransientError, match="stopped early"):
        list(store.list())
    proxy.add_fault("droptoken", rate=1.0)  # persistently broken: --delete must not act on a short listing
    result = lading("sync", SOURCE, str(dest), "--delete", env={**env, "LADING_RETRIES": "2"})
    assert result.returncode == 5 and "stopped early" in result.stderr
    assert read_tree(dest) == objects


def test_the_bucket_region_is_resolved_once(s3_env):
    client = s3_client(s3_env)
    client.create_bucket(Bucket="far-away", CreateBucketConfiguration={"LocationConstraint": "eu-west-2"})
    client.put_object(Bucket="far-away", Key="x/y", Body=b"hello")
    store = open_store(
        "s3://far-away/x",
        StoreConfig(endpoint_url=s3_env["AWS_ENDPOINT_URL"], env_credentials=("testing", "testing", None)),
    )
    assert [info.key for info in store.list()] == ["y"]
    assert store.region == "eu-west-2"
    assert store.read_range("y", 0, 5) == b"hello"


def test_http_proxy_variables_are_honoured(s3_env, proxy):
    put_objects(s3_client(s3_env), {"p.bin": b"through the proxy"})
    dead = "http://127.0.0.1:9"  # nothing listens: only the proxy can answer
    via_proxy = StoreConfig.from_env({**s3_env, "HTTP_PROXY": proxy.url}, endpoint_url=dead)
    store = open_store(SOURCE, via_proxy)
    assert store.read_range("p.bin", 0, 100) == b"through the proxy"
    assert gets_of(proxy, "p.bin")
    excluded = StoreConfig.from_env(
        {**s3_env, "HTTP_PROXY": proxy.url, "NO_PROXY": "127.0.0.1", "LADING_RETRIES": "1"}, endpoint_url=dead
    )
    with pytest.raises(TransientError):
        open_store(SOURCE, excluded).read_range("p.bin", 0, 100)


def test_connect_timeout_is_the_documented_ten_seconds():
    options = client_options(StoreConfig.from_env({"LADING_TIMEOUT": "60"}), "https://s3.amazonaws.com")
    assert options["connect_timeout"] == timedelta(seconds=10)
    assert options["read_timeout"] == timedelta(seconds=60)
    short = client_options(StoreConfig.from_env({"LADING_TIMEOUT": "3"}), None)
    assert short["connect_timeout"] == timedelta(seconds=3)


def test_endpoints_are_used_as_given(s3_env):
    for endpoint in (
        "https://s3-fips.us-gov-west-1.amazonaws.com",
        "https://s3.dualstack.eu-west-1.amazonaws.com",
        "https://bucket.vpce-0a1b2c3d-abcdefgh.s3.us-east-1.vpce.amazonaws.com",
        "http://[::1]:9000",
    ):
        store = open_store(
            "s3://some-bucket/p",
            StoreConfig(endpoint_url=endpoint, region="us-east-1", env_credentials=("k", "s", None)),
        )
        built = store._store.get()
        assert built.config["endpoint"] == endpoint


def test_folder_markers_empty_objects_and_odd_keys_are_listed_as_stored(s3_env, proxy):
    """obstore renders ``dir/`` as ``dir`` and cannot represent ``a//b``: the listing still
    yields every key exactly as S3 stores it (markers skipped, empty objects kept)."""
    client = s3_client(s3_env)
    put_objects(client, {"dir/": b"", "dir/a.bin": b"a", "lone/": b"", "empty.txt": b"", "z.bin": b"zz"})
    store = open_store(SOURCE, StoreConfig(endpoint_url=proxy.url, region="us-east-1"))
    assert [(info.key, info.size) for info in store.list()] == [("dir/a.bin", 1), ("empty.txt", 0), ("z.bin", 2)]
    client.put_object(Bucket=BUCKET, Key="data/odd//name", Body=b"x")
    assert "odd//name" in [info.key for info in store.list()]  # listed exactly: sync then refuses it by name


def test_a_marker_costs_one_folder_listing_and_no_sdk_page(s3_env, proxy):
    client = s3_client(s3_env)
    put_objects(client, {"dir/": b"", "dir/a.bin": b"a", "dir/b.bin": b"b"})
    store = open_store(SOURCE, StoreConfig(endpoint_url=proxy.url, region="us-east-1"))
    proxy.reset_counts()
    assert [info.key for info in store.list()] == ["dir/a.bin", "dir/b.bin"]
    listings = [seen for seen in proxy.requests if "list-type=2" in seen.query]
    assert all("object_store" in (seen.headers.get("User-Agent") or "") for seen in listings)
    queries = [seen.query for seen in listings]
    assert len(queries) == 3  # the listing, the marker's folder listing, the end-of-listing check
    assert "delimiter=" in queries[1] and "start-after" in queries[2]


def _read_in_child(store, key, queue) -> None:
    queue.put((sorted(info.key for info in store.list()), store.read_range(key, 0, 4), store.stat(key).size))


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_process_forked_after_obstore_started_still_reads(scheme, request, tmp_path):
    """tokio (under obstore) is not fork-safe: a DataLoader worker forked from a process that
    already read through obstore must not hang; it reads through the SDK, with the same checks."""
    import multiprocessing

    if scheme == "s3":
        put_objects(s3_client(request.getfixturevalue("s3_env")), {"a.bin": b"0123456789"})
        store = open_store(SOURCE)
    else:
        request.getfixturevalue("gcs_env")
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(project="test", credentials=AnonymousCredentials())
        client.create_bucket("fork-bucket").blob("data/a.bin").upload_from_string(b"0123456789")
        store = open_store("gs://fork-bucket/data")
    assert store.read_range("a.bin", 0, 4) == b"0123"  # obstore's runtime starts in this process
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(store, "a.bin", queue))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        pytest.fail("a forked child hung reading through the store")
    assert child.exitcode == 0
    assert queue.get(timeout=5) == (["a.bin"], b"0123", 10)


def test_an_empty_object_costs_one_folder_listing_not_an_sdk_page(s3_env, proxy):
    """An empty object costs its folder's delimiter listing (obstore's), not a boto3 page."""
    from concurrent.futures import ThreadPoolExecutor

    client = s3_client(s3_env)
    objects = {"a-empty": b"", **{f"k{i:04d}": b"x" for i in range(1100)}}
    put_objects(client, {}, create=True)
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda item: client.put_object(Bucket=BUCKET, Key=f"data/{item[0]}", Body=item[1]), objects.items()
            )
        )
    store = open_store(SOURCE, StoreConfig(endpoint_url=proxy.url, region="us-east-1"))
    proxy.reset_counts()
    assert [info.key for info in store.list()] == sorted(objects)
    listings = [seen for seen in proxy.requests if "list-type=2" in seen.query]
    assert all("object_store" in (seen.headers.get("User-Agent") or "") for seen in listings)
    folders = [seen.query for seen in listings if "delimiter=" in seen.query]
    assert sum("continuation-token" not in query for query in folders) == 1  # data/'s, for a-empty
