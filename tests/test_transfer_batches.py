"""Small objects are fetched concurrently as coroutines on the I/O core: one object's failure stays
that object's, and a corrupted body is fetched again on its own."""

from __future__ import annotations

import hashlib
import os

import pytest
from lading.core.errors import AccessDenied
from lading.stores import StoreConfig, open_store
from lading.transfer import TransferItem, fetch_all
from proxies import FaultProxy
from sync_fixtures import BUCKET, put_objects, s3_client

SMALL_BATCH = 16  # objects in flight together, for the size of the tests


@pytest.fixture
def proxy(s3_env):
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as running:
        yield running


def fetch(proxy: FaultProxy, tmp_path):
    store = open_store(f"s3://{BUCKET}/data", StoreConfig(endpoint_url=proxy.url, region="us-east-1"))
    infos = sorted(store.list(), key=lambda info: info.key)
    proxy.reset_counts()
    return fetch_all(store, [TransferItem(info, tmp_path / info.key) for info in infos])


def test_a_corrupted_small_body_is_fetched_again_on_its_own(s3_env, proxy, tmp_path):
    objects = {f"o{i:02d}.bin": os.urandom(2000 + i) for i in range(3 * SMALL_BATCH)}
    put_objects(s3_client(s3_env), objects)
    proxy.add_fault("corrupt", first=1, method="GET", path_prefix=f"/{BUCKET}/data/o05")
    results = fetch(proxy, tmp_path)
    assert all(result.ok for result in results) and len(results) == len(objects)
    for key, body in objects.items():
        assert hashlib.md5((tmp_path / key).read_bytes()).digest() == hashlib.md5(body).digest(), key
    gets = [seen.path for seen in proxy.requests if seen.method == "GET" and "list-type" not in seen.query]
    assert proxy.injected["corrupt"] == 1 and gets.count(f"/{BUCKET}/data/o05.bin") == 2
    assert len(gets) == len(objects) + 1


def test_a_failure_in_a_batch_is_only_that_objects(s3_env, proxy, tmp_path):
    objects = {f"o{i:02d}.bin": os.urandom(100 + i) for i in range(SMALL_BATCH)}
    put_objects(s3_client(s3_env), objects)
    proxy.add_fault("403", rate=1.0, method="GET", path_prefix=f"/{BUCKET}/data/o03")
    results = {result.key: result for result in fetch(proxy, tmp_path)}
    assert isinstance(results["o03.bin"].error, AccessDenied) and not (tmp_path / "o03.bin").exists()
    assert all(result.ok for key, result in results.items() if key != "o03.bin")
    assert (tmp_path / "o04.bin").read_bytes() == objects["o04.bin"]
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".")]  # no temporaries left
