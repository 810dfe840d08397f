"""lading pack into a GCS bucket (the emulator over HTTP) and ShardDataset reading it back."""

from __future__ import annotations

import json

from lading.core.retry import RetryPolicy
from lading.datasets import ShardDataset
from lading.pack import PackOptions, plan_pack, run_pack
from lading.stores import StoreConfig, open_store


def test_pack_into_gcs_and_stream_back(gcs_env, tmp_path):
    config = StoreConfig(
        gcs_anonymous=True,
        gcs_endpoint=gcs_env["STORAGE_EMULATOR_HOST"],
        retry=RetryPolicy(attempts=2, base_delay=0.005, max_delay=0.01),
        timeout=10,
    )
    store = open_store("gs://lading-pack-gcs", config)
    client = store._client.get()  # test setup only: create the bucket the emulator starts without
    if not client.bucket("lading-pack-gcs").exists():
        client.create_bucket("lading-pack-gcs")
    source = tmp_path / "src"
    source.mkdir()
    expected = {}
    for i in range(15):
        (source / f"s{i:02d}.bin").write_bytes(bytes([i]) * (2000 + i))
        (source / f"s{i:02d}.txt").write_text(f"label {i}")
        expected[f"s{i:02d}"] = (bytes([i]) * (2000 + i), f"label {i}".encode())
    dest = "gs://lading-pack-gcs/sets"
    plan = plan_pack(str(source), dest, PackOptions("ds", shard_size=16_000, version="v2"), config)
    summary = run_pack(plan, str(source), dest, config).summary()
    assert len(summary["shards"]) >= 3

    listing = {info.key: info for info in open_store(dest, config).list()}
    index = json.loads(
        open_store(dest, config).read_range("ds/v2/ds.index.json", 0, listing["ds/v2/ds.index.json"].size)
    )
    assert [s["etag"] for s in index["shardlist"]] == [listing[f"ds/v2/{s['url']}"].version for s in index["shardlist"]]
    dataset = ShardDataset(summary["index"], config=config, shuffle_buffer=4, seed=3)
    got = {sample["__key__"]: (sample["bin"], sample["txt"]) for sample in dataset}
    assert got == expected
