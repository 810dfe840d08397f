"""Per-process set-up done once and off the I/O core's loop, and process globals left alone.

- The bucket's region (S3 HeadBucket) is discovered once per process, whatever the number of
  stores, and never on the I/O core's loop thread (where it would stall every request in flight).
- obstore's runtime thread cap (``TOKIO_WORKER_THREADS``) is a DataLoader worker's affair: it is
  set in a child forked from a process that uses lading, never in the process itself, so that
  ``lading sync`` runs its runtime on every core and processes it starts are not capped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import textwrap

import boto3
import pytest

from lading.core.retry import RetryPolicy
from lading.stores import StoreConfig, open_store
from lading.stores.base import ObjectInfo, RangeRequest
from lading.transfer import TransferItem, fetch_all
from proxies import FaultProxy


def test_the_region_is_discovered_once_per_process_and_off_the_loop(s3_env, caplog):
    boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="regions")
    boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"]).put_object(Bucket="regions", Key="a/x", Body=b"x")
    caplog.set_level(logging.DEBUG, logger="lading.stores.s3.store")
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        config = dataclasses.replace(
            StoreConfig.from_env(),
            endpoint_url=proxy.url,
            region=None,
            retry=RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02),
        )
        for prefix in ("a", "a/", "b"):  # three stores on one bucket
            store = open_store(f"s3://regions/{prefix}", config)
            store.read_many([RangeRequest("x")]) if prefix.startswith("a") else list(store.list())
        heads = proxy.count("HEAD", where=lambda seen: seen.path.rstrip("/") == "/regions")
    assert heads == 1
    found = [record for record in caplog.records if "the bucket is in" in record.getMessage()]
    assert len(found) == 1 and found[0].threadName != "lading-io"


def test_a_transfer_that_builds_the_client_finds_the_region_off_the_loop(s3_env, caplog, tmp_path):
    # No listing first (a snapshot's objects, say): the engine's first read builds the client.
    s3 = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"])
    s3.create_bucket(Bucket="regions-engine")
    s3.put_object(Bucket="regions-engine", Key="a/x", Body=b"x")
    caplog.set_level(logging.DEBUG, logger="lading.stores.s3.store")
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        config = dataclasses.replace(StoreConfig.from_env(), endpoint_url=proxy.url, region=None)
        store = open_store("s3://regions-engine/a", config)
        info = ObjectInfo("x", 1, s3.head_object(Bucket="regions-engine", Key="a/x")["ETag"].strip('"'))
        results = fetch_all(store, [TransferItem(info, tmp_path / "x")])
    assert [result.ok for result in results] == [True] and (tmp_path / "x").read_bytes() == b"x"
    found = [record for record in caplog.records if "the bucket is in" in record.getMessage()]
    assert len(found) == 1 and found[0].threadName != "lading-io"


SCRIPT = textwrap.dedent("""
    import os, sys
    from lading.stores import open_store
    store = open_store(sys.argv[1])
    store.read_many([])
    list(store.list())  # obstore's runtime runs in this process now
    print("parent", os.environ.get("TOKIO_WORKER_THREADS"), flush=True)
    pid = os.fork()
    if pid == 0:
        print("child", os.environ.get("TOKIO_WORKER_THREADS"), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
""")


def test_the_runtime_thread_cap_is_for_forked_workers_only(s3_env):
    boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="cap")
    env = {name: value for name, value in os.environ.items() if name != "TOKIO_WORKER_THREADS"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, "s3://cap/data"], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["parent None", "child 2"]


@pytest.mark.parametrize("preset", ["6"])
def test_a_cap_the_user_set_wins(s3_env, preset):
    boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="cap")
    env = dict(os.environ, TOKIO_WORKER_THREADS=preset)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, "s3://cap/data"], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == [f"parent {preset}", f"child {preset}"]


INTERRUPTED = textwrap.dedent("""
    import os, signal, sys, threading
    from lading.stores import open_store
    from lading.stores.base import RangeRequest
    store = open_store(sys.argv[1])
    store.read_many([RangeRequest("warm")])  # the client is built; the proxy holds each request from here
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        store.read_many([RangeRequest(f"o{n}") for n in range(4)])
        print("not interrupted", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


def test_ctrl_c_lets_requests_in_flight_finish(s3_env):
    """Ctrl-C in a caller waiting on a batch: the caller gets KeyboardInterrupt at once, the GETs
    already sent run to their end on the I/O core (never cancelled half-way, which would leave
    obstore to complete them into an interpreter that may be finalizing), and the process exits
    normally once they have."""
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"])
    client.create_bucket(Bucket="ctrlc")
    size = 4 << 20
    for key in ("warm", *(f"o{n}" for n in range(4))):
        client.put_object(Bucket="ctrlc", Key=key, Body=os.urandom(size if key != "warm" else 10))
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        env = dict(os.environ, AWS_ENDPOINT_URL=proxy.url)
        proxy.latency = 1.0
        result = subprocess.run(
            [sys.executable, "-c", INTERRUPTED, "s3://ctrlc"], capture_output=True, text=True, env=env, timeout=120
        )
        relayed = {path: proxy.body_bytes[path] for path in (f"/ctrlc/o{n}" for n in range(4))}
    assert (result.returncode, result.stdout.strip()) == (0, "interrupted"), result.stderr
    assert relayed == {path: size for path in relayed}  # every body went out whole


WORKERS = textwrap.dedent("""
    import os, sys
    from lading.stores import open_store
    from lading.stores.process import control_plane
    store = open_store(sys.argv[1])
    with control_plane():  # a dataset's construction: the SDK reads the index
        assert store.read_range("x", 0, 1) == b"x"
    for _ in range(2):  # DataLoader workers, forked after it: they read through obstore
        pid = os.fork()
        if pid == 0:
            os._exit(0 if store.read_range("x", 0, 1) == b"x" else 1)
        assert os.waitpid(pid, 0)[1] == 0
    print(store.region, flush=True)
""")


def test_forked_workers_use_the_region_their_parent_found(s3_env):
    """A process that builds a dataset finds the bucket's region once; the DataLoader workers it
    forks read through obstore without asking again (each built a boto3 client for it: 14% of a
    streaming epoch's worker time)."""
    boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="workers")
    boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"]).put_object(Bucket="workers", Key="x", Body=b"x")
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        env = {name: value for name, value in s3_env.items() if name not in ("AWS_REGION", "AWS_DEFAULT_REGION")}
        env = {**{k: v for k, v in os.environ.items() if k not in ("AWS_REGION", "AWS_DEFAULT_REGION")}, **env}
        result = subprocess.run(
            [sys.executable, "-c", WORKERS, "s3://workers"],
            capture_output=True,
            text=True,
            env={**env, "AWS_ENDPOINT_URL": proxy.url},
            timeout=120,
        )
        heads = proxy.count("HEAD", where=lambda seen: seen.path.rstrip("/") == "/workers")
        gets = proxy.count("GET", where=lambda seen: seen.path == "/workers/x")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "us-east-1" and gets == 3
    assert heads == 1


def test_a_forked_child_never_drops_a_value_it_inherited(tmp_path):
    """Dropping an inherited obstore object runs its destructor in the child, where a lock the
    parent's runtime held at the fork is never released (a DataLoader worker hung in CI)."""
    from lading.stores.process import ProcessLocal

    class Noisy:
        def __del__(self) -> None:
            (tmp_path / f"dropped-in-{os.getpid()}").write_text("")

    holder: ProcessLocal[Noisy] = ProcessLocal(Noisy)
    holder.get()
    pid = os.fork()
    if pid == 0:  # the child: the value is forgotten (a new one built on use) but not dropped
        fresh = not holder.built
        os._exit(0 if fresh else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not (tmp_path / f"dropped-in-{pid}").exists()
