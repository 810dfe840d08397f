"""lading.stores.claims (conditional create / replace / delete) against the real test servers, and
the claim protocol's expiry rules (lading.datalayer.claim) on a fake clock."""

from __future__ import annotations

import threading
import uuid

import bucket_fixtures
import pytest
from lading.core.errors import UsageError
from lading.datalayer.claim import Claim, ClaimLost, ClaimRecord, Observer, is_live, read_claim
from lading.stores import claims, open_store
from lading.stores.config import StoreConfig


def make_bucket(scheme: str, config: StoreConfig) -> str:
    return bucket_fixtures.make_bucket(scheme, config, "claims", "prefix")


@pytest.fixture(params=["s3", "gs", "local"])
def store(request, tmp_path):
    if request.param == "local":
        (tmp_path / "store").mkdir()
        return open_store(str(tmp_path / "store"))
    env = request.getfixturevalue("s3_env" if request.param == "s3" else "gcs_env")
    config = StoreConfig.from_env(env)
    return open_store(make_bucket(request.param, config), config)


def test_create_is_exclusive(store):
    first = claims.create(store, "a/claim.json", b"one")
    assert first is not None
    assert claims.create(store, "a/claim.json", b"two") is None
    assert claims.read(store, "a/claim.json") == (b"one", first)


def test_create_retried_after_success_is_recognised_as_own(store):
    version = claims.create(store, "k", b"mine: owner 1234")
    # The same bytes again (a retry whose first attempt had succeeded): still this caller's.
    assert claims.create(store, "k", b"mine: owner 1234") == version


def test_replace_only_at_the_version_read(store):
    version = claims.create(store, "k", b"v1")
    newer = claims.replace(store, "k", b"v2", version)
    assert newer is not None and newer != version
    assert claims.replace(store, "k", b"v3", version) is None  # stale version: refused
    assert claims.read(store, "k") == (b"v2", newer)
    assert claims.replace(store, "absent", b"x", newer) is None


def test_delete_only_at_the_version_read(store):
    version = claims.create(store, "k", b"v1")
    newer = claims.replace(store, "k", b"v2", version)
    assert claims.delete(store, "k", version) is False
    assert claims.read(store, "k") is not None
    assert claims.delete(store, "k", newer) is True
    assert claims.read(store, "k") is None
    assert claims.delete(store, "k") is False


def test_one_of_many_concurrent_creators_wins(store):
    results: list[str | None] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def attempt(number: int) -> None:
        barrier.wait()
        got = claims.create(store, "race", f"owner {number}".encode())
        with lock:
            results.append(got)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(result is not None for result in results) == 1


def test_delete_prefix_keeps_what_it_is_told_to(store):
    for key in ("v/a.tar", "v/b/c.tar", "v/_lading_claim.json", "w/other"):
        claims.create(store, key, key.encode())
    assert claims.delete_prefix(store, "v/", keep=lambda key: key.endswith("_lading_claim.json")) == 2
    assert sorted(info.key for info in store.list()) == ["v/_lading_claim.json", "w/other"]


def test_conditional_writes_are_honoured_here(store):
    claims.check_conditional_writes(store)  # moto, fake-gcs-server and local files honour them
    assert [info.key for info in store.list()] == []  # the probe removed itself


def test_a_server_that_ignores_conditions_is_refused(rclone_env):
    import boto3

    config = StoreConfig.from_env(rclone_env)
    name = f"claims-{uuid.uuid4().hex[:10]}"
    boto3.client(
        "s3",
        endpoint_url=config.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=rclone_env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=rclone_env["AWS_SECRET_ACCESS_KEY"],
    ).create_bucket(Bucket=name)
    store = open_store(f"s3://{name}/p", config)
    with pytest.raises(UsageError, match="ignores conditional writes"):
        claims.check_conditional_writes(store)


# -- the claim protocol ------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_expiry_is_judged_by_the_observers_clock_not_the_holders():
    clock = FakeClock()
    wall = FakeClock()
    observer = Observer(clock=clock, wall=wall)
    record = ClaimRecord(ttl=10, heartbeat_at=wall.now + 3600)  # a holder whose clock runs an hour ahead
    assert not observer.expired(record, "v1")
    clock.now += 9.9
    assert not observer.expired(record, "v1")
    assert observer.expired(record, "v2") is False  # a heartbeat (new version): watched afresh
    clock.now += 10
    assert observer.expired(record, "v2")


def test_a_heartbeat_older_than_two_ttls_expires_at_once():
    wall = FakeClock()
    observer = Observer(clock=FakeClock(), wall=wall)
    assert observer.expired(ClaimRecord(ttl=10, heartbeat_at=wall.now - 21), "v")
    assert not observer.expired(ClaimRecord(ttl=10, heartbeat_at=wall.now - 19), "w")
    assert not is_live(ClaimRecord(ttl=10, heartbeat_at=wall.now - 21), now=wall.now)
    assert not is_live(ClaimRecord(ttl=10, state="failed"))


def test_a_holder_that_was_taken_over_finds_out_at_its_next_beat(tmp_path):
    store = open_store(str(tmp_path))
    holder = Claim.create(store, ClaimRecord(ttl=5))
    assert holder is not None
    holder.beat()
    assert Claim.create(store, ClaimRecord(ttl=5)) is None
    record, version = read_claim(store)
    assert record.beats == 1
    taker = Claim.take_over(store, ClaimRecord(ttl=5), version)
    assert taker is not None
    assert Claim.take_over(store, ClaimRecord(ttl=5), version) is None  # one winner
    with pytest.raises(ClaimLost):
        holder.beat()
    holder.release()  # not ours any more: leaves the taker's claim alone
    assert read_claim(store)[0].owner == taker.record.owner
    taker.release()
    assert read_claim(store) is None
