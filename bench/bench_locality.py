"""Node locality (issue 19): 4 simulated nodes x 2 ranks read one packed dataset with ShardDataset;
bytes downloaded per node per epoch (the growth of each node's cache directory: one cache per
simulated node), samples/s, and the same after a resume onto 2 nodes mid-epoch (the surviving
nodes 0 and 1 keep their caches).

    python3 -m venv /work/benchenv-loc && /work/benchenv-loc/bin/pip install -e . torch 'moto[server]' boto3
    /work/benchenv-loc/bin/python bench/bench_locality.py --samples 4000 --sample-bytes 20000

S3 is a moto server started here (``--endpoint`` for RGW: ``bash bench/rgw.sh start``, then
``--endpoint http://127.0.0.1:7480`` with keys test/test). Ranks of a node run one after the other
in this process (each through its own iterator, no DataLoader workers), so samples/s is the whole
job's samples over the sum of its ranks' times: a per-rank rate, comparable between rows.

The peers (MosaicML streaming with num_canonical_nodes=4, litdata) are not run here yet: both need
their ranks as separate processes with a process group per simulated node (local barriers, shared
memory); see RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import uuid
from pathlib import Path

NODES, PER_NODE = 4, 2


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path``, each inode once."""
    seen, total = set(), 0
    for root, _, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(root, name))
            if (st.st_dev, st.st_ino) not in seen and not name.endswith((".lading-meta", ".lading-lock")):
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def make_data(root: Path, samples: int, size: int, endpoint: str, shard_size: int) -> str:
    import boto3
    from lading.pack import PackOptions, plan_pack, run_pack
    from lading.stores import StoreConfig

    source = root / "src"
    source.mkdir()
    rng = random.Random(0)
    for i in range(samples):
        (source / f"{i:06d}.bin").write_bytes(rng.randbytes(size))
        (source / f"{i:06d}.cls").write_text(str(i % 10))
    bucket = f"loc-bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    config = StoreConfig.from_env(endpoint_url=endpoint)
    dest = f"s3://{bucket}/ds"
    plan = plan_pack(str(source), dest, PackOptions("ds", shard_size=shard_size), config)
    run_pack(plan, str(source), dest, config)
    return f"{dest}/ds.index.json"


def run_nodes(index: str, caches: list[Path], nodes: int, epoch: int, state: dict | None = None,
              stop: int | None = None) -> tuple[list[int], float, int, dict | None]:
    """Every rank of ``nodes`` nodes reads its share; returns (bytes downloaded per node, seconds,
    samples, the state saved when stopped after ``stop`` samples per rank)."""
    from lading.datasets import ShardDataset
    from lading.stores import StoreConfig

    config = StoreConfig.from_env()
    before = [dir_bytes(cache) for cache in caches[:nodes]]
    seconds, samples, saved = 0.0, 0, None
    for node in range(nodes):
        for local in range(PER_NODE):
            dataset = ShardDataset(index, rank=node * PER_NODE + local, world_size=nodes * PER_NODE,
                                   local_world_size=PER_NODE, shuffle_buffer=256, seed=1, randomize_shard_order=True,
                                   config=config, cache_dir=caches[node], remainder="uneven")
            dataset.set_epoch(epoch)
            if state is not None:
                dataset.load_state_dict(state)
            began = time.monotonic()
            count = 0
            for sample in dataset:
                if stop is not None and count == stop:
                    break
                count += len(sample["bin"]) > 0
            seconds += time.monotonic() - began
            samples += count
            if stop is not None:
                saved = dataset.state_dict(count)
    after = [dir_bytes(cache) for cache in caches[:nodes]]
    return [a - b for a, b in zip(after, before)], seconds, samples, saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--sample-bytes", type=int, default=20000)
    parser.add_argument("--shard-size", type=int, default=2_000_000)
    parser.add_argument("--endpoint", default=None, help="S3 endpoint (default: a moto server started here)")
    args = parser.parse_args()
    server = None
    if args.endpoint is None:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        server.start()
        host, port = server.get_host_and_port()
        args.endpoint = f"http://{host}:{port}"
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ["AWS_ENDPOINT_URL"] = args.endpoint
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    root = Path(tempfile.mkdtemp(prefix="lading-locality-"))
    index = make_data(root, args.samples, args.sample_bytes, args.endpoint, args.shard_size)
    caches = [root / f"node-{n}" for n in range(NODES)]
    from lading.datasets import load_index
    from lading.stores import StoreConfig

    data = sum(ref.filesize for ref in load_index(index, StoreConfig.from_env()).shards)
    rows = []
    for label, nodes, epoch in (("epoch 1 (cold), 4 nodes", 4, 0), ("epoch 2 (warm), 4 nodes", 4, 1)):
        got, seconds, samples, _ = run_nodes(index, caches, nodes, epoch)
        rows.append((label, got, samples / seconds, data / nodes))
    half = args.samples // (2 * NODES * PER_NODE)
    got, seconds, samples, state = run_nodes(index, caches, 4, 2, stop=half)
    rows.append(("epoch 3, first half, 4 nodes", got, samples / seconds, data / 4))
    got, seconds, samples, _ = run_nodes(index, caches, 2, 2, state=state)
    rows.append(("epoch 3, rest after resume onto 2 nodes", got, samples / seconds, data / 2))
    got, seconds, samples, _ = run_nodes(index, caches, 2, 3)
    rows.append(("epoch 4, 2 nodes", got, samples / seconds, data / 2))
    print(f"dataset {data / 1e6:.1f} MB, {args.samples} samples, endpoint {args.endpoint}")
    print("| tool | phase | MB downloaded per node | dataset/N (MB) | samples/s |")
    print("| --- | --- | --- | --- | --- |")
    for label, got, rate, share in rows:
        per_node = " / ".join(f"{b / 1e6:.2f}" for b in got)
        print(f"| lading ShardDataset | {label} | {per_node} | {share / 1e6:.2f} | {rate:.0f} |")
    print(json.dumps({"rows": [{"phase": r[0], "bytes": r[1], "samples_per_s": r[2]} for r in rows]}))
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main()
