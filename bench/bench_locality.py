"""Node locality (issue 19): 4 simulated nodes x 2 ranks read one dataset with lading's ShardDataset,
MosaicML streaming (MDS, ``num_canonical_nodes=4``) and litdata (optimize) on the same samples;
bytes downloaded per node per epoch (counted at one byte-counting TCP proxy per simulated node in
front of the store), samples/s, and the same after a resume onto 2 nodes mid-epoch (the surviving
nodes 0 and 1 keep their caches).

    python3 -m venv /work/benchenv-loc
    /work/benchenv-loc/bin/pip install -c constraints.txt -e . torch 'moto[server]' boto3 litdata mosaicml-streaming
    bash bench/rgw.sh start
    /work/benchenv-loc/bin/python bench/bench_locality.py --endpoint http://127.0.0.1:7480 \\
        --samples 8000 --sample-bytes 10000 --shard-size 2000000

Without ``--endpoint`` a moto server is started here. Every rank is its own process, with the
environment a launcher would give it (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
NODE_RANK), its node's cache folder and its node's proxy as the S3 endpoint. No DataLoader
workers (num_workers=0 everywhere). The ranks of a phase start together; litdata's local ranks
build their datasets one after the other (they otherwise race for the node's index.json: litdata
waits 1 s for the file lock, then fails with "doesn't contain any index.json" when the other
rank's download takes longer; MosaicML's local ranks must be built together, they meet at a
barrier); each says so, then all iterate at once: samples/s is the phase's samples
over the wall time from that start to the last rank's end. Per library:

  lading   ShardDataset(index, rank, world_size, local_world_size, shuffle_buffer=256, seed=1,
           randomize_shard_order=True, cache_dir=node cache, remainder="uneven"), set_epoch(e);
           resume: rank 0's state_dict(samples) loaded by every new rank.
  mosaic   streaming.StreamingDataset(remote=s3://.../mds, local=node cache, shuffle=True,
           shuffle_seed=1, num_canonical_nodes=4, batch_size=16), S3_ENDPOINT_URL = the node's
           proxy; ranks from the env vars above (no process group: mosaic's local barriers are in
           shared memory, so a node's ranks are built together). Epoch e: a
           load_state_dict at sample 0 of epoch e; resume: state_dict(8 * samples, True) of rank 0.
  litdata  litdata.StreamingDataset(Dir(node cache, s3://.../litdata), shuffle=True, seed=1,
           storage_options endpoint = the node's proxy). litdata detects ranks only through
           torch.distributed, and counts nodes only from CUDA devices; the bench gives it what it
           would detect on 4 nodes of 2 GPUs (world 8, global rank, num_nodes 4) by replacing
           ``_DistributedEnv.detect`` in each rank's process. set_epoch(e + 1); resume: rank 0's
           state_dict(samples, 1, 1) with the cache paths replaced by each node's.

Bytes = what each node's proxy relayed from the store (headers and listings included). dataset/N is
the size of that library's own copy (tar shards, MDS shards, litdata chunks) over the node count.
CPU s = the phase's ranks' process CPU time (all threads) while iterating, summed; "vs best peer" =
lading's samples/s over the best peer's in the same phase. ``--profile DIR``: py-spy (from the
peers' venv or PATH) samples rank 0 of each tool's warm epoch at 1 kHz into DIR/TOOL-warm-rank0.txt
(collapsed stacks, one line per stack with its count).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

NODES, PER_NODE = 4, 2
TOOLS = ("lading", "mosaic", "litdata")
LABEL = {
    "lading": "lading ShardDataset",
    "mosaic": "MosaicML streaming (MDS, num_canonical_nodes=4)",
    "litdata": "litdata StreamingDataset (optimize)",
}


# -- a byte-counting TCP proxy, one listener per simulated node ---------------------------------------


class CountingProxy:
    """Relays TCP connections to ``upstream``; counts the bytes sent back to the clients."""

    def __init__(self, upstream: tuple[str, int], listeners: int) -> None:
        self.upstream = upstream
        self.counts = [0] * listeners
        self.ports: list[int] = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(listeners, ready), daemon=True).start()
        ready.wait()

    def _serve(self, listeners: int, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            for index in range(listeners):
                server = await asyncio.start_server(lambda r, w, i=index: self._handle(i, r, w), "127.0.0.1", 0)
                self.ports.append(server.sockets[0].getsockname()[1])

        self.loop.run_until_complete(start())
        ready.set()
        self.loop.run_forever()

    async def _handle(self, index: int, client_r, client_w) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return

        async def pipe(src, dst, count: bool) -> None:
            try:
                while data := await src.read(1 << 18):
                    if count:
                        self.counts[index] += len(data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(client_r, up_w, False), pipe(up_r, client_w, True))

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}"


# -- data --------------------------------------------------------------------------------------------


def read_sample(path: str) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    return {"bin": data, "cls": int(Path(path).stem) % 10}


def make_data(
    root: Path,
    samples: int,
    size: int,
    endpoint: str,
    shard_size: int,
    tools: list[str],
    bucket_prefix: str = "loc-bench",
) -> dict:
    """The samples once on local disk, then each library's copy in one bucket; returns the spec."""
    import boto3
    from lading.pack import PackOptions, plan_pack, run_pack
    from lading.stores import StoreConfig

    source = root / "src"
    source.mkdir()
    rng = random.Random(0)
    for i in range(samples):
        (source / f"{i:06d}.bin").write_bytes(rng.randbytes(size))
        (source / f"{i:06d}.cls").write_text(str(i % 10))
    bucket = f"{bucket_prefix}-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    spec: dict = {"bucket": bucket, "sizes": {}}
    config = StoreConfig.from_env(endpoint_url=endpoint)
    dest = f"s3://{bucket}/ds"
    plan = plan_pack(str(source), dest, PackOptions("ds", shard_size=shard_size), config)
    run_pack(plan, str(source), dest, config)
    spec["index"] = f"{dest}/ds.index.json"
    files = sorted(str(p) for p in source.glob("*.bin"))
    if "mosaic" in tools:
        without_torchvision()
        from streaming import MDSWriter

        local = root / "mds"
        with MDSWriter(out=str(local), columns={"bin": "bytes", "cls": "int"}, size_limit=shard_size) as writer:
            for path in files:
                writer.write(read_sample(path))
        upload(client, bucket, local, "mds")
        spec["mds"] = f"s3://{bucket}/mds"
    if "litdata" in tools:
        import litdata

        local = root / "litdata"
        litdata.optimize(
            fn=read_sample, inputs=files, output_dir=str(local), chunk_bytes=shard_size, num_workers=2, verbose=False
        )
        upload(client, bucket, local, "litdata")
        spec["litdata"] = f"s3://{bucket}/litdata"
    for name, prefix in (("lading", "ds/"), ("mosaic", "mds/"), ("litdata", "litdata/")):
        spec["sizes"][name] = sum(
            item["Size"]
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for item in page.get("Contents", [])
        )
    return spec


def delete_bucket(endpoint: str, bucket: str) -> None:
    """Empty and delete the run's bucket (RGW's memstore holds it in RAM)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
    client.delete_bucket(Bucket=bucket)


def upload(client, bucket: str, local: Path, prefix: str) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local)}")


def without_torchvision() -> None:
    """mosaicml-streaming imports ``streaming.vision`` (torchvision) at import; PyPI's torchvision is
    a CUDA build that does not load here: stand in an empty module (MDS does not need it)."""
    import types

    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))


# -- one rank (its own process) -----------------------------------------------------------------------


def rank_main(job: dict) -> None:
    """Build the dataset, say so (ready file), wait for the go file, iterate, print one JSON line."""
    tool, epoch, stop = job["tool"], job["epoch"], job.get("stop")
    rank, world, nodes = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), job["nodes"]
    state = job.get("state")
    while job.get("after") and not Path(job["after"]).exists():  # the node's previous local rank is built
        time.sleep(0.01)
    if tool == "lading":
        from lading.datasets import ShardDataset
        from lading.stores import StoreConfig

        dataset = ShardDataset(
            job["spec"]["index"],
            rank=rank,
            world_size=world,
            local_world_size=PER_NODE,
            shuffle_buffer=256,
            seed=1,
            randomize_shard_order=True,
            config=StoreConfig.from_env(),
            cache_dir=job["cache"],
            remainder="uneven",
        )
        if state is not None:
            dataset.load_state_dict(state)  # a later epoch's state: the run's partitions and lanes
        dataset.set_epoch(epoch)

        def save(count: int) -> dict:
            return dataset.state_dict(count)
    elif tool == "mosaic":
        without_torchvision()
        from streaming import StreamingDataset

        dataset = StreamingDataset(
            remote=job["spec"]["mds"],
            local=job["cache"],
            shuffle=True,
            shuffle_seed=1,
            num_canonical_nodes=NODES,
            batch_size=16,
        )
        dataset.load_state_dict(
            state
            if state is not None
            else {
                "epoch": epoch,
                "sample_in_epoch": 0,
                "num_canonical_nodes": NODES,
                "shuffle_seed": 1,
                "initial_physical_nodes": NODES,
            }
        )

        def save(count: int) -> dict:
            return dataset.state_dict(count * world, True)
    elif tool == "litdata":
        from litdata.streaming import downloader
        from litdata.utilities import env

        downloader._OBSTORE_CLIENT_OPTIONS = dict(downloader._OBSTORE_CLIENT_OPTIONS, allow_http=True)
        env._DistributedEnv.detect = classmethod(lambda cls: cls(world, rank, nodes))
        import litdata
        from litdata.streaming.resolver import Dir

        dataset = litdata.StreamingDataset(
            Dir(path=job["cache"], url=job["spec"]["litdata"]),
            shuffle=True,
            seed=1,
            storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]},
        )
        dataset.set_epoch(epoch + 1)
        if state is not None:
            dataset.load_state_dict(dict(state, input_dir_path=job["cache"], cache_dir_path=job["cache"]))

        def save(count: int) -> dict:
            return dataset.state_dict(count, 1, 1)
    else:
        raise SystemExit(f"unknown tool {tool}")
    profiler = start_profile(job.get("profile"))
    Path(job["ready"]).write_text("")
    while not Path(job["go"]).exists():
        time.sleep(0.005)
    began, cpu = time.monotonic(), time.process_time()
    count = nbytes = 0
    for sample in dataset:
        if stop is not None and count == stop:
            break
        count += 1
        nbytes += len(sample["bin"])
    seconds, cpu = time.monotonic() - began, time.process_time() - cpu
    out = {"rank": rank, "samples": count, "bytes": nbytes, "seconds": seconds, "end": time.time(), "cpu": cpu}
    if profiler is not None:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
        profiler.wait(timeout=60)
    if rank == 0 and (stop is not None or tool == "lading"):
        out["state"] = save(count)  # lading: also at an epoch's end, as a job's checkpoint would
    Path(job["out"]).write_text(json.dumps(out))


def start_profile(path: str | None) -> subprocess.Popen | None:
    """py-spy sampling this process at 1 kHz into ``path`` (collapsed stacks), attached before the go."""
    if not path:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    profiler = subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(os.getpid()),
            "--rate",
            "1000",
            "--format",
            "raw",
            "--output",
            path,
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # let it attach
    return profiler


# -- the driver ----------------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_phase(
    tool: str,
    spec: dict,
    proxy: CountingProxy,
    caches: list[Path],
    nodes: int,
    epoch: int,
    work: Path,
    state: dict | None = None,
    stop: int | None = None,
    timeout: float = 900,
    profile: str | None = None,
) -> dict:
    """Every rank of ``nodes`` nodes as its own process, started together; each simulated node in
    its own mount namespace with its own /dev/shm (MosaicML names its shared memory per host, as
    on real nodes). Returns bytes per node, samples/s and rank 0's state."""
    phase = work / uuid.uuid4().hex[:8]
    phase.mkdir()
    go = phase / "go"
    before = list(proxy.counts)
    world = nodes * PER_NODE
    master = str(free_port())
    shells = []
    for node in range(nodes):
        commands = []
        for local in range(PER_NODE):
            rank = node * PER_NODE + local
            job = {
                "tool": tool,
                "spec": spec,
                "epoch": epoch,
                "stop": stop,
                "state": state,
                "nodes": nodes,
                "cache": str(caches[node]),
                "ready": str(phase / f"ready-{rank}"),
                "go": str(go),
                "out": str(phase / f"out-{rank}.json"),
                "profile": profile if rank == 0 else None,
                # litdata only: MosaicML's local ranks meet at a shared-memory barrier while built
                "after": str(phase / f"ready-{rank - 1}") if local and tool == "litdata" else None,
            }
            (phase / f"job-{rank}.json").write_text(json.dumps(job))
            env = {
                "RANK": rank,
                "WORLD_SIZE": world,
                "LOCAL_RANK": local,
                "LOCAL_WORLD_SIZE": PER_NODE,
                "GROUP_RANK": node,
                "NODE_RANK": node,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": master,
            }
            assignments = " ".join(f"{k}={v}" for k, v in env.items())
            commands.append(
                f"(env {assignments} {sys.executable} {__file__} --rank-job {phase}/job-{rank}.json "
                f"2>{phase}/err-{rank}.txt || touch {phase}/failed-{rank}) &"
            )
        script = "mount -t tmpfs -o size=512m tmpfs /dev/shm && " + " ".join(commands) + " wait"
        env = dict(
            os.environ,
            AWS_ENDPOINT_URL=proxy.url(node),
            S3_ENDPOINT_URL=proxy.url(node),
            AWS_ALLOW_HTTP="true",
            LADING_CACHE_DIR=str(caches[node]),
            TQDM_DISABLE="1",
        )
        shells.append(subprocess.Popen(["unshare", "--mount", "sh", "-c", script], env=env, start_new_session=True))
    deadline = time.monotonic() + float(os.environ.get("BENCH_START_TIMEOUT", 300))
    while not all((phase / f"ready-{rank}").exists() for rank in range(world)):
        failed = [r for r in range(world) if not (phase / f"ready-{r}").exists() and (phase / f"failed-{r}").exists()]
        if failed or time.monotonic() > deadline:
            for shell in shells:
                os.killpg(shell.pid, signal.SIGKILL)  # the node's ranks too, not only its shell
            late = [r for r in range(world) if not (phase / f"ready-{r}").exists()]
            why = (
                (phase / f"err-{failed[0]}.txt").read_text()[-3000:]
                if failed
                else (
                    f"timeout; not ready: {late}; their stderr: "
                    + " || ".join(f"{r}: {read_tail(phase / f'err-{r}.txt')}" for r in late)
                )
            )
            raise RuntimeError(f"{tool}: rank {(failed or late)[:1]} did not start: {why}")
        time.sleep(0.01)
    began = time.time()
    go.write_text("")
    for shell in shells:
        shell.wait(timeout=timeout)
    outs = []
    for rank in range(world):
        out = phase / f"out-{rank}.json"
        if not out.exists():
            raise RuntimeError(f"{tool}: rank {rank} failed: {(phase / f'err-{rank}.txt').read_text()[-3000:]}")
        outs.append(json.loads(out.read_text()))
    wall = max(out["end"] for out in outs) - began
    got = [proxy.counts[n] - before[n] for n in range(nodes)]
    samples = sum(out["samples"] for out in outs)
    return {
        "bytes": got,
        "samples": samples,
        "seconds": wall,
        "samples_per_s": samples / wall,
        "cpu": sum(out["cpu"] for out in outs),
        "state": next((out.get("state") for out in outs if "state" in out), None),
        "per_rank": [out["samples"] for out in outs],
    }


def read_tail(path: Path, size: int = 600) -> str:
    """The last ``size`` characters of a rank's stderr (empty when it wrote none)."""
    try:
        return path.read_text(errors="replace")[-size:]
    except FileNotFoundError:
        return ""


def run_tool(
    tool: str, spec: dict, proxy: CountingProxy, root: Path, samples: int, profiles: Path | None = None
) -> list[dict]:
    caches = [root / tool / f"node-{n}" for n in range(NODES)]
    for cache in caches:
        cache.mkdir(parents=True)
    work = root / tool / "phases"
    work.mkdir()
    data = spec["sizes"][tool]
    rows = []

    def row(label: str, result: dict, nodes: int) -> None:
        result.update(phase=label, share=data / nodes, tool=tool)
        rows.append(result)
        per_node = " / ".join(f"{b / 1e6:.2f}" for b in result["bytes"])
        print(
            f"  {tool:8s} {label:42s} {per_node:40s} (dataset/N {data / nodes / 1e6:.2f} MB) "
            f"{result['samples']:6d} samples {result['per_rank']} {result['samples_per_s']:8.0f}/s "
            f"cpu {result['cpu']:.2f} s  load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        result["load"] = os.getloadavg()[0]

    row("epoch 1 (cold), 4 nodes", run_phase(tool, spec, proxy, caches, 4, 0, work), 4)
    warm_profile = str(profiles / f"{tool}-warm-rank0.txt") if profiles else None
    row("epoch 2 (warm), 4 nodes", run_phase(tool, spec, proxy, caches, 4, 1, work, profile=warm_profile), 4)
    half = samples // (2 * NODES * PER_NODE)
    first = run_phase(tool, spec, proxy, caches, 4, 2, work, stop=half)
    row("epoch 3, first half, 4 nodes", first, 4)
    try:
        resumed = run_phase(tool, spec, proxy, caches, 2, 2, work, state=first["state"])
        row("epoch 3, rest after resume onto 2 nodes", resumed, 2)
        # lading: epoch 4 starts from the checkpoint taken at the end of epoch 3 (the run's lanes),
        # as the resumed job would; the peers carry no such state across epochs
        later = resumed.get("state") if tool == "lading" else None
        row("epoch 4, 2 nodes", run_phase(tool, spec, proxy, caches, 2, 3, work, state=later), 2)
    except RuntimeError as err:
        print(f"  {tool}: resume failed: {str(err)[-600:]}", flush=True)
        rows.append({"tool": tool, "phase": "resume onto 2 nodes", "error": str(err)[-600:]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--samples", type=int, default=8000)
    parser.add_argument("--sample-bytes", type=int, default=10000)
    parser.add_argument("--shard-size", type=int, default=2_000_000)
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--endpoint", default=None, help="S3 endpoint (default: a moto server started here)")
    parser.add_argument("--out", type=Path, help="results.json here")
    parser.add_argument("--profile", type=Path, help="py-spy profiles (collapsed stacks) of rank 0's warm epoch here")
    parser.add_argument("--bucket-prefix", default="loc-bench", help="the run's bucket is PREFIX-<random>")
    parser.add_argument("--rank-job", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_job:
        rank_main(json.loads(Path(args.rank_job).read_text()))
        return
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
    os.environ.setdefault("AWS_REGION", "us-east-1")
    tools = [t for t in args.tools.split(",") if t]
    root = Path(tempfile.mkdtemp(prefix="lading-locality-"))
    print(f"load average at start: {os.getloadavg()}", flush=True)
    spec = make_data(root, args.samples, args.sample_bytes, args.endpoint, args.shard_size, tools, args.bucket_prefix)
    host, _, port = args.endpoint.rpartition("//")[2].partition(":")
    proxy = CountingProxy((host, int(port or 80)), NODES)
    rows: list[dict] = []
    for tool in tools:
        try:
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
            rows += run_tool(tool, spec, proxy, root, args.samples, args.profile)
        except Exception as err:  # noqa: BLE001 - a peer that fails is a row, not the end of the run
            print(f"  {tool}: FAILED: {str(err)[-1500:]}", flush=True)
            rows.append({"tool": tool, "phase": "run", "error": str(err)[-600:]})
    print(
        f"\ndata: {args.samples} samples x {args.sample_bytes} B; copies: "
        + ", ".join(f"{t} {b / 1e6:.1f} MB" for t, b in spec["sizes"].items())
        + f"; endpoint {args.endpoint}"
    )
    print(f"load average at the end: {os.getloadavg()}")
    best = {}  # the best peer's samples/s per phase
    for r in rows:
        if "error" not in r and r["tool"] != "lading":
            best[r["phase"]] = max(best.get(r["phase"], 0.0), r["samples_per_s"])
    print(
        "| tool | phase | MB downloaded per node | dataset/N (MB) | within 10% | samples/s | CPU s | vs best peer | load |"
    )
    print("| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "error" in r:
            print(f"| {LABEL[r['tool']]} | {r['phase']} | failed: {r['error'][-160:].replace('|', '/')} | | | | | | |")
            continue
        per_node = " / ".join(f"{b / 1e6:.2f}" for b in r["bytes"])
        within = "yes" if all(abs(b - r["share"]) <= 0.1 * r["share"] for b in r["bytes"]) else "no"
        if "warm" in r["phase"] or r["phase"].startswith(("epoch 3, first", "epoch 4")):
            within = "(0 expected)" if all(b < 0.02 * r["share"] for b in r["bytes"]) else "re-downloads"
        ratio = (
            f"{r['samples_per_s'] / best[r['phase']]:.2f}x" if r["tool"] == "lading" and best.get(r["phase"]) else ""
        )
        print(
            f"| {LABEL[r['tool']]} | {r['phase']} | {per_node} | {r['share'] / 1e6:.2f} | {within} | "
            f"{r['samples_per_s']:.0f} | {r['cpu']:.2f} | {ratio} | {r['load']:.1f} |"
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(
            json.dumps(
                {"rows": [{k: v for k, v in r.items() if k != "state"} for r in rows], "sizes": spec["sizes"]}, indent=1
            )
        )
    shutil.rmtree(root, ignore_errors=True)
    delete_bucket(args.endpoint, spec["bucket"])
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main()
