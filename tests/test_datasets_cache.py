"""The node cache behind ShardDataset, against moto (S3) and the GCS emulator: one GET per shard
per node however many processes read at once, zero GETs in the second epoch, eviction under
``cache_limit`` that never takes a shard in use or a file it did not download, the ETag check,
the root safety check, and ``lading cache``."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import urllib.parse
import uuid
from collections import Counter
from pathlib import Path

import pytest
from lading.core.errors import AccessDenied
from lading.datasets import NodeCache, ShardDataset
from lading.datasets.cache import ShardSource, iter_entries, summarize
from lading.pack import PackOptions, plan_pack, run_pack
from lading.stores import StoreConfig, open_store
from proxies import FaultProxy

NSAMPLES = 40


def expected() -> dict[str, bytes]:
    return {f"s{i:03d}": bytes([i]) * (300 + 11 * i) for i in range(NSAMPLES)}


def pack_into(bucket_uri: str, tmp_path: Path, config: StoreConfig) -> tuple[str, list[str]]:
    """40 samples in ~6 shards under ``bucket_uri/ds``; returns (index URI, shard names)."""
    source = tmp_path / "src"
    source.mkdir()
    for key, data in expected().items():
        (source / f"{key}.bin").write_bytes(data)
        (source / f"{key}.cls").write_text(str(int(key[1:]) % 3))
    dest = f"{bucket_uri}/ds"
    plan = plan_pack(str(source), dest, PackOptions("ds", shard_size=16_000), config)
    run_pack(plan, str(source), dest, config)
    assert len(plan.shards) >= 5
    return f"{dest}/ds.index.json", [shard.name for shard in plan.shards]


def make_bucket(scheme: str, config: StoreConfig) -> str:
    name = f"cache-{uuid.uuid4().hex[:10]}"
    if scheme == "s3":
        import boto3

        boto3.client("s3", endpoint_url=config.endpoint_url, region_name="us-east-1").create_bucket(Bucket=name)
    else:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        storage.Client(
            project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": config.gcs_endpoint}
        ).create_bucket(name)
    return f"{scheme}://{name}"


def shard_gets(proxy: FaultProxy) -> Counter[str]:
    """Whole-object GETs of shards seen by the proxy, by shard name (S3 paths and GCS media URLs)."""
    gets: Counter[str] = Counter()
    for seen in proxy.requests:
        if seen.method != "GET" or seen.fault is not None:
            continue
        name = urllib.parse.unquote(seen.path).rsplit("/", 1)[-1]
        if name.endswith(".tar") and ("alt=media" in seen.query or "/o/" not in seen.path):
            gets[name] += 1
    return gets


@pytest.fixture(params=["s3", "gs"])
def store_env(request, tmp_path):
    """(scheme, upstream URL, StoreConfig through a counting proxy, proxy) for moto or the GCS emulator."""
    env = request.getfixturevalue("s3_env" if request.param == "s3" else "gcs_env")
    upstream = env["AWS_ENDPOINT_URL"] if request.param == "s3" else env["STORAGE_EMULATOR_HOST"]
    with FaultProxy(upstream) as proxy:
        if request.param == "s3":
            config = StoreConfig.from_env(endpoint_url=proxy.url)
        else:
            config = StoreConfig.from_env({**os.environ, "STORAGE_EMULATOR_HOST": proxy.url})
        yield request.param, proxy, config


READER = r"""
import json, sys
sys.modules["torch"] = None  # not needed to iterate by hand; importing it would only slow the start
from lading.datasets import ShardDataset
from lading.stores import StoreConfig
index, cache, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
dataset = ShardDataset(index, rank=rank, world_size=world, cache_dir=cache, batch_size=4, shuffle_buffer=8,
                       seed=1, randomize_shard_order=True, remainder="uneven")
print("ready", flush=True)
sys.stdin.readline()                      # the barrier: every reader starts together
print(json.dumps({s["__key__"]: s["bin"].hex() for s in dataset}), flush=True)
"""


def test_four_processes_at_once_make_one_get_per_shard(store_env, tmp_path):
    scheme, proxy, config = store_env
    index, shards = pack_into(make_bucket(scheme, config), tmp_path, config)
    cache = tmp_path / "cache"
    env = dict(os.environ)
    if scheme == "s3":
        env["AWS_ENDPOINT_URL"] = proxy.url
    else:
        env["STORAGE_EMULATOR_HOST"] = proxy.url
    proxy.reset_counts()
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", READER, index, str(cache), str(rank), "4"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(4)
    ]
    try:
        for reader in readers:  # each has read the index and is waiting
            assert reader.stdout.readline().strip() == "ready"
        for reader in readers:
            reader.stdin.write("go\n")
            reader.stdin.flush()
        results = [json.loads(reader.stdout.readline()) for reader in readers]
    finally:
        for reader in readers:
            reader.stdin.close()
            assert reader.wait(timeout=120) == 0
    merged = {key: bytes.fromhex(data) for part in results for key, data in part.items()}
    assert sum(len(part) for part in results) == NSAMPLES and merged == expected()
    assert shard_gets(proxy) == Counter({name: 1 for name in shards}), "a shard was downloaded twice on one node"


def keys_of(batch):
    return [sample["__key__"] for sample in batch]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_second_epoch_makes_no_get(store_env, tmp_path):
    torch_data = pytest.importorskip("torch.utils.data")
    scheme, proxy, config = store_env
    index, shards = pack_into(make_bucket(scheme, config), tmp_path, config)
    dataset = ShardDataset(
        index,
        config=config,
        cache_dir=tmp_path / "cache",
        batch_size=4,
        shuffle_buffer=6,
        seed=2,
        randomize_shard_order=True,
    )
    proxy.reset_counts()
    epochs = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        loader = torch_data.DataLoader(
            dataset, batch_size=4, num_workers=2, collate_fn=keys_of, multiprocessing_context="fork"
        )
        epochs.append([key for batch in loader for key in batch])
        if epoch == 0:
            assert shard_gets(proxy) == Counter({name: 1 for name in shards})
            proxy.reset_counts()
    assert proxy.count("GET") == 0 and proxy.count("HEAD") == 0, "epoch two went to the store"
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(expected()) and epochs[0] != epochs[1]
    # what a spawned worker gets: a pickled copy, without the offsets table, which it reads again
    # from the node cache, not from the store
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone.index._table is None
    assert [s["__key__"] for s in clone] == epochs[1]
    assert proxy.count("GET") == 0 and proxy.count("HEAD") == 0


def test_eviction_under_a_small_limit_while_reading(s3_env, tmp_path):
    config = StoreConfig.from_env()
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        config = StoreConfig.from_env(endpoint_url=proxy.url)
        index, shards = pack_into(make_bucket("s3", config), tmp_path, config)
        sizes = {info.key.rsplit("/", 1)[-1]: info.size for info in open_store(index.rsplit("/", 1)[0], config).list()}
        offsets = sizes["ds.offsets.safetensors"]  # in the cache while the dataset is read
        limit = 2 * max(sizes[name] for name in shards) + offsets + 1000  # two shards, and a bit
        cache = tmp_path / "cache"
        # unshuffled: a node reads its lanes shard by shard
        dataset = ShardDataset(index, config=config, cache_dir=cache, cache_limit=limit, prefetch=0)
        proxy.reset_counts()
        peak = 0
        got = {}
        for sample in dataset:  # reading order: shard after shard; the cache must stay small
            got[sample["__key__"]] = sample["bin"]
            peak = max(peak, sum(entry.size for entry in iter_entries(cache / "datasets")))
        assert got == expected()
        assert peak <= limit, f"cache reached {peak} bytes, limit {limit}"
        assert sum(shard_gets(proxy).values()) == len(shards)
        assert len(list(iter_entries(cache / "datasets"))) <= 2 + 1  # and the offsets file


def test_eviction_skips_shards_in_use_and_files_it_did_not_download(s3_env, tmp_path):
    config = StoreConfig.from_env()
    index, shards = pack_into(make_bucket("s3", config), tmp_path, config)
    cache = NodeCache(tmp_path / "cache")
    store = open_store(index.rsplit("/", 1)[0], config)
    sources = [ShardSource(f"{index.rsplit('/', 1)[0]}/{name}", lambda: store, name, None, None) for name in shards]
    held = cache.open(sources[0])  # "a process is reading it"
    for source in sources[1:3]:
        cache.open(source).close()
    foreign = held.path.parent / "notes.txt"
    foreign.write_text("mine")
    small = NodeCache(tmp_path / "cache", limit=1)
    small.make_room(10)  # wants everything gone
    left = {entry.path.name for entry in iter_entries(tmp_path / "cache" / "datasets")}
    assert left == {shards[0]}, "only the shard in use may stay"
    assert foreign.read_text() == "mine"
    assert bytes(held.buffer[:0]) == b"" and len(held.buffer) > 0
    held.close()
    small.make_room(10)
    assert not list(iter_entries(tmp_path / "cache" / "datasets"))
    assert foreign.exists(), "a file the cache did not download was removed"


def test_a_record_with_another_version_is_downloaded_again(s3_env, tmp_path):
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        config = StoreConfig.from_env(endpoint_url=proxy.url)
        index, shards = pack_into(make_bucket("s3", config), tmp_path, config)
        cache = tmp_path / "cache"
        assert sorted(s["__key__"] for s in ShardDataset(index, config=config, cache_dir=cache)) == sorted(expected())
        record = next(entry.path for entry in iter_entries(cache / "datasets") if entry.path.name == shards[1])
        meta_path = record.with_name(record.name + ".lading-meta")
        meta = json.loads(meta_path.read_text())
        meta["version"] = "not-the-indexed-etag"
        meta_path.write_text(json.dumps(meta))
        proxy.reset_counts()
        again = {s["__key__"]: s["bin"] for s in ShardDataset(index, config=config, cache_dir=cache)}
        assert again == expected()
        assert shard_gets(proxy) == Counter({shards[1]: 1})


def test_unsafe_cache_roots_are_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(AccessDenied, match="others can write to it"):
        NodeCache(shared)
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    os.chown(foreign, 4242, -1)
    with pytest.raises(AccessDenied, match="owned by uid 4242"):
        NodeCache(foreign)
    with pytest.raises(AccessDenied, match="owned by uid 4242"):
        ShardDataset([f"s3://bucket/{name}.tar" for name in "ab"], cache_dir=foreign)


def test_default_root_follows_lading_cache_dir(tmp_path, monkeypatch):
    from lading.datasets import default_cache_root

    monkeypatch.setenv("LADING_CACHE_DIR", str(tmp_path / "here"))
    assert default_cache_root() == tmp_path / "here"
    assert default_cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/lading")
    assert NodeCache().root == tmp_path / "here" and (tmp_path / "here" / "datasets").is_dir()


def test_lading_cache_lists_and_clears(s3_env, tmp_path, lading):
    config = StoreConfig.from_env()
    index, shards = pack_into(make_bucket("s3", config), tmp_path, config)
    cache = tmp_path / "cache"
    list(ShardDataset(index, cache_dir=cache))
    (cache / "datasets" / "stray.bin").write_bytes(b"not lading's")
    listed = lading("cache", "list", "--cache-dir", str(cache), "--json")
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert [d["uri"] for d in document["datasets"]] == [index.rsplit("/", 1)[0] + "/"]
    # the shards and the offsets file
    assert document["datasets"][0]["files"] == len(shards) + 1 and document["bytes"] == summarize(cache)[0].bytes
    table = lading("cache", "--cache-dir", str(cache))
    assert table.returncode == 0 and index.rsplit("/", 1)[0] in table.stdout and "files" in table.stdout
    cleared = lading("cache", "clear", "--cache-dir", str(cache), "--json")
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(cleared.stdout) == {"files": len(shards) + 1, "bytes": document["bytes"], "busy": 0}
    assert summarize(cache) == [] and (cache / "datasets" / "stray.bin").exists()
    refused = lading("cache", "list", "--cache-dir", str(tmp_path))
    assert refused.returncode == 0  # tmp_path is the user's own, not writable by others
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    bad = lading("cache", "list", "--cache-dir", str(tmp_path / "open"))
    assert bad.returncode == 4 and "others can write" in bad.stderr


def test_a_list_of_shards_is_checked_against_the_store(s3_env, tmp_path):
    """Without an index there is no recorded version: each process stats the shard (a HEAD, no
    GET) and a cached copy is reused only at the object's current version."""
    import boto3

    config = StoreConfig.from_env()
    bucket = make_bucket("s3", config)
    index, shards = pack_into(bucket, tmp_path, config)
    uris = [f"{bucket}/ds/{name}" for name in shards]
    cache = tmp_path / "cache"
    first = {s["__key__"]: s["bin"] for s in ShardDataset(uris, cache_dir=cache)}
    assert first == expected()
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        settings = StoreConfig.from_env(endpoint_url=proxy.url)
        assert {s["__key__"] for s in ShardDataset(uris, cache_dir=cache, config=settings)} == set(expected())
        assert proxy.count("GET") == 0 and proxy.count("HEAD") == len(shards)
        # replace one shard with another (a copy of its neighbour): the cache must not serve the old one
        client = boto3.client("s3")
        name = bucket.split("://")[1]
        replacement = client.get_object(Bucket=name, Key=f"ds/{shards[1]}")["Body"].read()
        client.put_object(Bucket=name, Key=f"ds/{shards[0]}", Body=replacement)
        proxy.reset_counts()
        keys = Counter(s["__key__"] for s in ShardDataset(uris, cache_dir=cache, config=settings))
        assert shard_gets(proxy) == Counter({shards[0]: 1})
        assert max(keys.values()) == 2  # shards[1]'s samples now come twice


def test_a_reader_holding_a_shard_never_blocks_its_download(s3_env, tmp_path):
    """DataLoader workers hold shards (shared lock) while they wait for work: a worker that finds
    a shard missing must still download it, not wait for an exclusive lock the readers keep from
    being granted (the deadlock bench_datasets.py hit with 4 workers)."""
    import fcntl
    import threading

    config = StoreConfig.from_env()
    index, shards = pack_into(make_bucket("s3", config), tmp_path, config)
    cache = NodeCache(tmp_path / "cache")
    store = open_store(index.rsplit("/", 1)[0], config)
    source = ShardSource(f"{index.rsplit('/', 1)[0]}/{shards[0]}", lambda: store, shards[0], None, None)
    _, _, lock = cache.paths(source.uri)
    reader = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(reader, fcntl.LOCK_SH)  # another worker is "reading" the shard
    opened: list = []
    worker = threading.Thread(target=lambda: opened.append(cache.open(source)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    try:
        assert not worker.is_alive(), "opening a missing shard waited on the readers' lock"
        assert opened and len(opened[0].buffer) == opened[0].path.stat().st_size > 0
    finally:
        os.close(reader)
        for shard in opened:
            shard.close()


def test_a_prefetched_shard_stays_until_read_and_a_warm_epoch_prefetches_nothing(s3_env, tmp_path):
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        config = StoreConfig.from_env(endpoint_url=proxy.url)
        index, shards = pack_into(make_bucket("s3", config), tmp_path, config)
        cache = tmp_path / "cache"
        dataset = ShardDataset(index, config=config, cache_dir=cache, prefetch=2)
        reader = dataset.reader()
        reader.upcoming([0, 1, 2])
        reader.open(0)  # prefetches shards 1 and 2 on the reader's threads
        for warming in list(reader._warming.values()):
            warming.result()
        NodeCache(cache, limit=1).make_room(10)  # another process wants everything gone
        left = {entry.path.name for entry in iter_entries(cache / "datasets")}
        in_use = {shards[0], shards[1], shards[2], "ds.offsets.safetensors"}  # the offsets file too: read on
        assert left == in_use, "a prefetched shard was evicted before it was read"
        proxy.reset_counts()
        assert reader.sample(1, 0)["__key__"] and reader.sample(2, 0)["__key__"]
        assert not shard_gets(proxy), "a prefetched shard was downloaded again"
        reader.close()
        assert sorted(s["__key__"] for s in dataset) == sorted(expected())  # the rest, into the cache
        warm = ShardDataset(index, config=config, cache_dir=cache, prefetch=2)
        proxy.reset_counts()
        assert sorted(s["__key__"] for s in warm) == sorted(expected())
        assert not shard_gets(proxy)
        assert warm.reader()._pool is None, "a warm epoch started prefetch threads"


CUT_SHORT = r"""
import os, sys
sys.modules["torch"] = None
from lading.core.errors import ProblemFound
from lading.datasets import ShardDataset
dataset = ShardDataset(sys.argv[1], cache_dir=sys.argv[2], prefetch=0)
reader = dataset.reader()
shard = reader.open(0)
os.truncate(shard._closer.path, 0)  # cut short on disk while it is read (not lading's doing)
try:
    reader.sample(0, 0)
except ProblemFound as err:
    print("refused:", err)
"""


def test_a_cached_shard_cut_short_while_read_is_an_error_not_a_crash(s3_env, tmp_path):
    """Samples of a cached shard are read with pread: a file cut short under the reader is a
    clear error (a slice of its mapping died of SIGBUS)."""
    config = StoreConfig.from_env()
    index, _ = pack_into(make_bucket("s3", config), tmp_path, config)
    done = subprocess.run(
        [sys.executable, "-c", CUT_SHORT, index, str(tmp_path / "cache")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert "refused:" in done.stdout and "past the end of its cached file" in done.stdout


def test_a_shard_is_claimed_for_download_by_one_process_at_a_time(s3_env, tmp_path):
    """Prefetch claims a shard's download without waiting (NodeCache.claim): while one process
    holds the claim, another's is refused; once downloaded, nobody claims it; a claim given up
    is free again, and spent claims release their locks."""
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        config = StoreConfig.from_env(endpoint_url=proxy.url)
        index, shards = pack_into(make_bucket("s3", config), tmp_path, config)
        store = open_store(index.rsplit("/", 1)[0], config)
        sources = [ShardSource(f"{index.rsplit('/', 1)[0]}/{n}", lambda: store, n, None, None) for n in shards[:2]]
        mine = NodeCache(tmp_path / "cache")
        theirs = NodeCache(tmp_path / "cache")  # another process's: flock locks are per open file
        claim = mine.claim(sources[0])
        assert claim is not None
        assert theirs.claim(sources[0]) is None, "a shard being downloaded was claimed again"
        shard = mine.fetch(claim)
        assert len(shard.buffer) == shard.path.stat().st_size > 0
        assert theirs.claim(sources[0]) is None, "a cached shard was claimed for download"
        given_up = theirs.claim(sources[1])
        assert given_up is not None
        given_up.release()
        again = mine.claim(sources[1])
        assert again is not None, "a claim given up stayed taken"
        mine.fetch(again).close()
        shard.close()
        NodeCache(tmp_path / "cache", limit=1).make_room(10)  # nothing held: everything may go
        assert not [entry for entry in iter_entries(tmp_path / "cache" / "datasets") if entry.path.name in shards]
    assert shard_gets(proxy) == Counter({shards[0]: 1, shards[1]: 1})
