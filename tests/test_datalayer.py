"""lading.datalayer in one process: types round-trip, reuse, immutability, content checks, the node
cache's copy, topology, refused samples. Against moto, fake-gcs-server and local directories."""

from __future__ import annotations

import base64
import json
import math
import pickle
from pathlib import Path

import lading.datalayer as dl
import numpy as np
import bucket_fixtures
import google_crc32c
import pytest
import torch
from lading.core.errors import ProblemFound, UsageError
from lading.datalayer.encoding import Encoder
from lading.datalayer.fingerprint import fingerprint
from lading.datasets import PackedDataset, ShardDataset
from lading.stores import open_store
from lading.stores.config import StoreConfig


def make_bucket(scheme: str, config: StoreConfig) -> str:
    return bucket_fixtures.make_bucket(scheme, config, "dl", "cache")


@pytest.fixture(autouse=True)
def node_cache_root(tmp_path, monkeypatch):
    """Datasets read through a node cache of this test's own (not ~/.cache/lading)."""
    monkeypatch.setenv("LADING_CACHE_DIR", str(tmp_path / "default-node-cache"))


@pytest.fixture(params=["s3", "gs", "local"])
def where(request, tmp_path):
    """(store URI, config) on moto, fake-gcs-server or a local directory."""
    if request.param == "local":
        return str(tmp_path / "cache"), StoreConfig.from_env({})
    env = request.getfixturevalue("s3_env" if request.param == "s3" else "gcs_env")
    config = StoreConfig.from_env(env)
    return make_bucket(request.param, config), config


def every_type(position: int) -> dict:
    return {
        "raw": bytes([position % 256]) * (position + 1),
        "text": f"sample {position} \u00e9\u4e2d",
        "label": position - 3,
        "big": 2**70 + position,
        "score": position / 7,
        "nan": float("nan"),
        "flag": position % 2 == 0,
        "none": None,
        "meta": {"tags": ["a", position], "nested": {"x": 1.5}},
        "image": np.arange(position * 6, dtype=np.uint8).reshape(position, 6)
        if position
        else np.zeros((0, 6), np.uint8),
        "matrix": np.linspace(0, 1, 12, dtype=np.float64).reshape(3, 4) * position,
        "scalar": np.float32(position) / 2,
        "tensor": torch.arange(position, dtype=torch.int64),
        "view": torch.arange(100.0)[position : position + 3],  # a view: only its own values are stored
        "half": torch.full((2, 2), float(position), dtype=torch.bfloat16),
        "CamelCase": "kept",
    }


def same(a, b) -> bool:
    """Equal values of equal types (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a == b
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def test_types_round_trip(where, tmp_path):
    uri, config = where
    runs = []

    @dl.cached(uri, "types", "v1", config=config, cache_dir=tmp_path / "node-cache", shard_size=4000)
    def make():
        runs.append(1)
        return [every_type(position) for position in range(12)]

    dataset = make()
    assert isinstance(dataset, ShardDataset) and runs == [1]
    got = sorted(dataset, key=lambda sample: sample["__key__"])
    assert [sample["__key__"] for sample in got] == [f"{n:012d}" for n in range(12)]
    for position, sample in enumerate(got):
        del sample["__key__"]
        assert same(sample, every_type(position)), position
    assert got[5]["view"].untyped_storage().nbytes() == 3 * 4  # not the whole 100-value storage

    packed = dl.cached(uri, "types", "v1", config=config, random_access=True)(make.function)()
    assert isinstance(packed, PackedDataset) and len(packed) == 12 and runs == [1]
    sample = packed[7]
    assert sample.pop("__key__") == "000000000007"
    assert same(sample, every_type(7))


def test_a_later_call_runs_the_function_zero_times(where):
    uri, config = where
    runs = []

    @dl.cached(uri, "once", "v1", config=config)
    def make(count=5):
        runs.append(count)
        for n in range(count):
            yield {"n": n}

    first = make.ensure()
    assert first.built and runs == [5]
    again = make.ensure()
    assert not again.built and runs == [5]
    assert sorted(sample["n"] for sample in make()) == list(range(5))
    assert runs == [5]


def test_keys_of_any_text_round_trip_and_order(tmp_path):
    keys = ["b.jpg", "a/b/c", "../escape", ".hidden", "ü nicode %41", "x" * 300, "UPPER", "upper"]

    @dl.cached(str(tmp_path), "keys", "v1")
    def make():
        return [{"__key__": key, "value": index} for index, key in enumerate(keys)]

    got = {sample["__key__"]: sample["value"] for sample in make()}
    assert got == {key: index for index, key in enumerate(keys)}
    assert not any(".." in path.name for path in tmp_path.rglob("*"))


def test_versions_are_immutable(tmp_path):
    @dl.cached(str(tmp_path), "data", "v1")
    def make():
        return [{"n": 1}]

    make()

    @dl.cached(str(tmp_path), "data", "v1")
    def make():  # another build under the same name and version
        return [{"n": 2}]

    with pytest.raises(dl.VersionConflict, match="immutable|new version"):
        make()
    assert [s["n"] for s in dl.cached(str(tmp_path), "data", "v2")(make.function)()] == [2]

    # Arguments are part of the build.
    @dl.cached(str(tmp_path), "args", "v1")
    def ranged(count):
        return [{"n": n} for n in range(count)]

    assert len(ranged(3)) == 3
    assert len(ranged(count=3)) == 3  # the same call, spelled otherwise
    with pytest.raises(dl.VersionConflict):
        ranged(4)


def test_comments_and_formatting_do_not_change_the_fingerprint():
    def one(x=1):
        return [{"n": x}]

    def two(x=1):  # a comment
        # and another

        return [{"n": x}]

    def three(x=2):
        return [{"n": x}]

    # ``def one`` and ``def two`` differ in the name only: compare the tokens after it.
    from lading.datalayer.fingerprint import code_text

    assert code_text(one).split("\n", 2)[2] == code_text(two).split("\n", 2)[2]
    assert fingerprint(three, (), {}) != fingerprint(one, (), {})
    assert fingerprint(one, (), {}) != fingerprint(one, (2,), {})
    assert fingerprint(one, (), {}, explicit="mine") == "explicit:mine"
    with pytest.raises(UsageError, match="fingerprint"):
        fingerprint(one, (object(),), {})


def test_an_explicit_fingerprint_replaces_the_code(tmp_path):
    @dl.cached(str(tmp_path), "explicit", "v1", fingerprint="mnist-2024")
    def make():
        return [{"n": 1}]

    make()

    @dl.cached(str(tmp_path), "explicit", "v1", fingerprint="mnist-2024")
    def make():  # refactored code, same data: the recorded fingerprint says so
        return [{"n": 1} for _ in range(1)]

    assert not make.ensure().built


def test_reuse_is_checked_by_content(s3_env, tmp_path):
    config = StoreConfig.from_env(s3_env)
    uri = make_bucket("s3", config)

    @dl.cached(uri, "checked", "v1", config=config, shard_size=100)
    def make():
        return [{"n": n, "pad": b"x" * 200} for n in range(4)]

    outcome = make.ensure()
    shard = outcome.index["shardlist"][1]["url"]
    store = open_store(make.uri, config)
    replacement = tmp_path / "replacement"
    replacement.write_bytes(b"not the shard")
    store.upload(replacement, shard)
    with pytest.raises(ProblemFound, match="changed after it was built"):
        make()


def test_the_node_cache_copy_is_checked_against_the_index(s3_env, tmp_path):
    config = StoreConfig.from_env(s3_env)
    uri = make_bucket("s3", config)
    cache = tmp_path / "node-cache"

    @dl.cached(uri, "cached", "v1", config=config, cache_dir=cache, shard_size=500)
    def make():
        return [{"n": n, "pad": b"y" * 300} for n in range(6)]

    first = sorted(s["n"] for s in make())
    status = dl.describe(make.uri, config, cache_dir=cache)["node_cache"]
    shards = len(make.ensure().index["shardlist"])
    assert status == {"root": str(cache), "current": shards + 1, "stale": 0, "absent": 0}  # + the offsets file

    # A copy whose record names another version is not used: it is downloaded again.
    meta = next(cache.rglob("*.tar.lading-meta"))
    record = json.loads(meta.read_text())
    record["version"] = "0123456789abcdef"
    meta.write_text(json.dumps(record))
    assert dl.describe(make.uri, config, cache_dir=cache)["node_cache"]["stale"] == 1
    assert sorted(s["n"] for s in make()) == first
    assert dl.describe(make.uri, config, cache_dir=cache)["node_cache"]["stale"] == 0


def test_rank_and_world_size(tmp_path, monkeypatch):
    @dl.cached(str(tmp_path), "ranks", "v1")
    def make():
        return [{"n": n} for n in range(10)]

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dataset = make()  # torchrun's (and Determined's launcher's) variables, as `lading topology` reads them
    assert (dataset.rank, dataset.world_size) == (1, 2)
    other = dl.cached(str(tmp_path), "ranks", "v1", rank=0)(make.function)()
    assert (other.rank, other.world_size) == (0, 2)
    assert sorted([s["n"] for s in dataset] + [s["n"] for s in other]) == list(range(10))

    class DeterminedDistributed:  # det.core.DistributedContext's interface
        def get_rank(self):
            return 2

        def get_size(self):
            return 3

    trial = dl.cached(str(tmp_path), "ranks", "v1", distributed=DeterminedDistributed())(make.function)()
    assert (trial.rank, trial.world_size) == (2, 3)


def test_shuffle_seed_and_resume(tmp_path):
    @dl.cached(str(tmp_path), "shuffled", "v1", shuffle=True, seed=3, shard_size=200, rank=0, world_size=1)
    def make():
        return [{"n": n, "pad": b"z" * 100} for n in range(30)]

    dataset = make()
    order = [s["n"] for s in dataset]
    assert sorted(order) == list(range(30)) and order != list(range(30))
    assert [s["n"] for s in make()] == order  # the same seed, the same order
    state = dataset.state_dict(samples_seen=10)
    resumed = make()
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    assert [s["n"] for s in resumed] == order[10:]


def test_samples_that_cannot_round_trip_are_refused(tmp_path):
    def fails(samples, match):
        encoder = Encoder()
        with pytest.raises(UsageError, match=match):
            for sample in samples:
                encoder.encode(sample)

    fails([{"t": (1, 2)}], "tuple")
    fails([{"t": {"k": (1,)}}], "tuple")
    fails([{"o": np.array([object()])}], "objects")
    fails([{"x": object()}], "not stored")
    fails(["not a dict"], "not a dict")
    fails([{"__key__": "a", "n": 1}, {"n": 2}], "__key__")
    fails([{"__key__": "a", "n": 1}, {"__key__": "a", "n": 2}], "used by an earlier")
    fails([{"__url__": "x", "n": 1}], "reserves")
    fails([{"__key__": "a"}], "no fields")
    fails([{"Label": 1}, {"label": 2}], "case")

    @dl.cached(str(tmp_path), "empty", "v1")
    def empty():
        return []

    with pytest.raises(UsageError, match="no samples"):
        empty()
    assert dl.list_versions(str(tmp_path))[0].state == "failed"  # the failed build is visible; the next
    with pytest.raises(UsageError, match="no samples"):  # call takes the failed claim over and runs again
        empty()


def test_bad_options_are_refused_up_front(tmp_path):
    with pytest.raises(UsageError):
        dl.cached(str(tmp_path), "bad name!", "v1")
    with pytest.raises(UsageError, match="random_access"):
        dl.cached(str(tmp_path), "x", "v1", random_access=True, shuffle=True)
    with pytest.raises(UsageError, match="decode"):
        dl.cached(str(tmp_path), "x", "v1", decode=True)
    with pytest.raises(UsageError, match="claim_ttl"):
        dl.cached(str(tmp_path), "x", "v1", claim_ttl=0)


def test_the_index_records_the_build(tmp_path):
    @dl.cached(str(tmp_path), "recorded", "v1")
    def make():
        yield {"image": np.zeros(2), "label": 1}

    make()
    index = json.loads((Path(make.uri) / "recorded.index.json").read_text())
    block = index["datalayer"]
    assert block["encoding"] == {
        "format": "lading-datalayer-1",
        "keys": "position",
        "fields": {"image.npy": {"field": "image", "type": "numpy"}, "label.cls": {"field": "label", "type": "int"}},
    }
    assert block["samples"] == 1 and block["fingerprint"].startswith("code:")
    assert block["function"].endswith("make") and block["built_by"]["pid"] > 0 and block["built_at"]
    assert index["lading"]["version"] == "v1"
    assert all(shard["url"].startswith(block["build"] + "/") for shard in index["shardlist"])
    crc32c = google_crc32c.value((Path(make.uri) / index["shardlist"][0]["url"]).read_bytes())
    assert index["shardlist"][0]["crc32c"] == base64.b64encode(crc32c.to_bytes(4, "big")).decode()


def test_the_readme_example_with_a_dataloader_and_elastic_resume(s3_env, tmp_path):
    from torch.utils.data import DataLoader

    config = StoreConfig.from_env(s3_env)
    uri = make_bucket("s3", config)

    @dl.cached(
        uri,
        "mnist",
        "v1",
        shuffle=True,
        seed=0,
        batch_size=4,
        config=config,
        shard_size=2000,
        cache_dir=tmp_path / "node-cache",
        rank=0,
        world_size=1,
    )
    def mnist():
        for index in range(24):
            yield {"image": np.full((28, 28), index, np.uint8), "label": index % 10}

    train = mnist()
    loader = DataLoader(train, batch_size=4, num_workers=2, multiprocessing_context="fork")
    seen, state = [], None
    for step, batch in enumerate(loader, start=1):
        assert batch["image"].dtype == torch.uint8 and batch["image"].shape == (4, 28, 28)
        assert torch.equal(batch["label"], batch["image"][:, 0, 0].long() % 10)
        seen += batch["image"][:, 0, 0].tolist()
        if step == 3:
            state = train.state_dict(samples_seen=step * 4)
    assert sorted(seen) == list(range(24))

    resumed = mnist()  # another process after a restart: reuses the version, resumes the epoch
    resumed.load_state_dict(state)
    rest = [
        v
        for batch in DataLoader(resumed, batch_size=4, num_workers=1, multiprocessing_context="fork")
        for v in batch["image"][:, 0, 0].tolist()
    ]
    assert sorted(seen[:12] + rest) == list(range(24))
