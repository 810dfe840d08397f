"""Streaming a dataset larger than the node cache (issue 24), lading against MosaicML streaming and
litdata, in one run:

  stream   (a) one node streams a ~2 GB pack whose cache limit is 10% of it, for two epochs: bytes
           downloaded per epoch (at a byte-counting proxy in front of the store), the cache
           folder's peak bytes, time to first batch, samples/s and CPU seconds.
  shuffle  (b) the order only (no I/O): distinct shards per window of 1,000 consecutive samples and
           label run lengths, for lading and MosaicML's py1e/py1br/py1s at equal block size,
           on 100 samples and on 10^6, data packed class by class (the worst case a shuffle meets).
  scale    (c) the 10^8-sample / 10^5-shard order for rank 0 of 64 nodes x 8 ranks: time and peak
           RSS of building the dataset and choosing its first sample's shard (index synthesized in
           a temporary folder), next to MosaicML's partition + py1e shuffle for the same job.

Setup (the peers in their own venv; torch pinned to the CPU build so pip never pulls CUDA):
    python3 -m venv /work/bench-venv
    echo 'torch==2.13.0+cpu' > /work/bench-venv/constraints.txt
    /work/bench-venv/bin/pip install -c /work/bench-venv/constraints.txt torch==2.13.0+cpu \\
        mosaicml-streaming litdata boto3 py-spy psutil numpy
    /work/bench-venv/bin/pip install -e .        # lading, this checkout
Runs (RGW at 127.0.0.1:7480, keys test/test; the bucket is made and deleted by the run):
    AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \\
        /work/bench-venv/bin/python bench/bench_streaming.py stream --endpoint http://127.0.0.1:7480
    /work/bench-venv/bin/python bench/bench_streaming.py shuffle
    /work/bench-venv/bin/python bench/bench_streaming.py scale

stream, per tool (each its own process, DataLoader(batch_size=64, num_workers=--workers), the
collate touches every sample's bytes and passes only counts back; one copy of the data in the
store at a time: lading's tar shards (``lading pack`` straight into the bucket), MDS shards
(``MDSWriter``) or litdata chunks (``litdata.optimize``), each ~--shard-bytes, uploaded before the
tool's rows and deleted after):
  lading   ShardDataset(index, shuffle_buffer=--block-samples, seed=1, randomize_shard_order=True,
           cache_dir=fresh, cache_limit=10% of the pack) (+ shuffle_block when the engine has it:
           --lading-block, else its default) through lading.datasets.DataLoader
  mosaic   StreamingDataset(remote, local=fresh, shuffle=True, shuffle_algo="py1e",
           shuffle_block_size=--block-samples, shuffle_seed=1, cache_limit=10% of its copy,
           batch_size=64) through torch's DataLoader; the parent's S3 clients are dropped before
           the workers fork (forked workers otherwise share its keep-alive connection and can
           read each other's responses)
  litdata  StreamingDataset(Dir(fresh, remote), shuffle=True, seed=1, max_cache_size=10% of its
           copy) through StreamingDataLoader (plain HTTP switched on in every worker by its
           worker_init_fn; --litdata-workers 1 where 2 workers deadlock on its cache slots)
Bytes are what the proxy relayed (headers, listings and index included); "x data" divides them by
that tool's own copy. The cache's peak is sampled every 0.2 s by the driver. CPU seconds are the
tool process's user + system time and its reaped children's (the DataLoader workers).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

TOOLS = ("lading", "mosaic", "litdata")
BATCH = 64


# -- (a) stream ---------------------------------------------------------------------------------------


def s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def make_source(root: Path, samples: int, size: int) -> list[str]:
    """``samples`` files of random bytes (sizes 0.8-1.2x ``size``) and their labels, on local disk."""
    source = root / "src"
    source.mkdir(parents=True)
    rng = random.Random(0)
    block = os.urandom(4 << 20)
    files = []
    for i in range(samples):
        length = rng.randint(size * 4 // 5, size * 6 // 5)
        start = rng.randrange(0, len(block) - length)
        path = source / f"{i:07d}.bin"
        path.write_bytes(block[start : start + length] + i.to_bytes(8, "little"))  # every sample distinct
        (source / f"{i:07d}.cls").write_text(str(i % 10))
        files.append(str(path))
    return files


def read_sample(path: str) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    return {"bin": data, "cls": int(Path(path).stem) % 10}


def prefix_bytes(client, bucket: str, prefix: str) -> int:
    return sum(
        item["Size"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for item in page.get("Contents", [])
    )


def delete_prefix(client, bucket: str, prefix: str) -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys})


def upload_tree(client, bucket: str, local: Path, prefix: str) -> None:
    from boto3.s3.transfer import TransferConfig

    single = TransferConfig(multipart_threshold=1 << 30)  # one PUT per file: plain MD5 ETags
    for path in sorted(local.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local)}", Config=single)


def publish(tool: str, root: Path, files: list[str], endpoint: str, bucket: str, shard_bytes: int) -> dict:
    """Write ``tool``'s copy of the samples into the bucket; returns where, its bytes and the seconds."""
    client = s3_client(endpoint)
    began = time.monotonic()
    if tool == "lading":
        from lading.pack import PackOptions, plan_pack, run_pack
        from lading.stores import StoreConfig

        config = StoreConfig.from_env(endpoint_url=endpoint)
        dest = f"s3://{bucket}/lading"
        plan = plan_pack(str(root / "src"), dest, PackOptions("ds", shard_size=shard_bytes), config)
        run_pack(plan, str(root / "src"), dest, config)
        where = f"{dest}/ds.index.json"
    elif tool == "mosaic":
        from bench_locality import without_torchvision

        without_torchvision()
        from streaming import MDSWriter

        local = root / "mds"
        with MDSWriter(out=str(local), columns={"bin": "bytes", "cls": "int"}, size_limit=shard_bytes) as writer:
            for path in files:
                writer.write(read_sample(path))
        upload_tree(client, bucket, local, "mds")
        shutil.rmtree(local)
        where = f"s3://{bucket}/mds"
    else:
        import litdata

        local = root / "litdata"
        litdata.optimize(
            fn=read_sample, inputs=files, output_dir=str(local), chunk_bytes=shard_bytes, num_workers=2, verbose=False
        )
        upload_tree(client, bucket, local, "litdata")
        shutil.rmtree(local)
        where = f"s3://{bucket}/litdata"
    prefix = where.split("/", 3)[3].split("/")[0] + "/"
    return {
        "uri": where,
        "bytes": prefix_bytes(client, bucket, prefix),
        "prefix": prefix,
        "seconds": time.monotonic() - began,
    }


def touch(batch: list) -> int:
    """Collate: read one byte per 4 KiB page of each sample's bytes; pass back only a count."""
    total = 0
    for sample in batch:
        data = sample["bin"]
        total += len(data) + sum(data[::4096])
    return len(batch)


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def litdata_allow_http(_worker: int | None = None) -> None:
    """Let litdata's obstore client speak plain HTTP to the local RGW, in this process.

    litdata builds its obstore stores with explicit client options (``_OBSTORE_CLIENT_OPTIONS``),
    which override ``AWS_ALLOW_HTTP`` from the environment, and a module global set in the parent is
    not seen by spawned workers: so this also runs as the DataLoader's ``worker_init_fn``."""
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS = dict(downloader._OBSTORE_CLIENT_OPTIONS, allow_http=True)


def drop_mosaic_clients(dataset) -> None:
    """Drop the parent's S3 clients of a MosaicML ``StreamingDataset`` before workers fork."""
    for stream in dataset.streams:
        stream._downloader.clean_up()


def stream_child(job: dict) -> None:
    """One tool's epochs in this process; after each epoch, waits for the driver to read the proxy."""
    import torch.utils.data as tud

    tool, cache, limit, workers = job["tool"], job["cache"], job["limit"], job["workers"]
    info: dict = {}
    if tool == "lading":
        from lading.datasets import DataLoader, ShardDataset
        from lading.stores import StoreConfig

        began = time.monotonic()  # "built": from here (imports done) to a ready DataLoader
        options = dict(
            rank=0,
            world_size=1,
            local_world_size=1,
            shuffle_buffer=job["block_samples"],
            seed=1,
            randomize_shard_order=True,
            cache_dir=cache,
            cache_limit=limit,
            config=StoreConfig.from_env(),
        )
        if "shuffle_block" in inspect.signature(ShardDataset).parameters and job.get("lading_block"):
            options["shuffle_block"] = job["lading_block"]
        dataset = ShardDataset(job["uri"], **options)
        info["shuffle_block"] = getattr(dataset, "shuffle_block", None)
        loader = DataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=touch)
    elif tool == "mosaic":
        from bench_locality import without_torchvision

        without_torchvision()
        from streaming import StreamingDataset

        began = time.monotonic()
        dataset = StreamingDataset(
            remote=job["uri"],
            local=cache,
            shuffle=True,
            shuffle_algo="py1e",
            shuffle_block_size=job["block_samples"],
            shuffle_seed=1,
            cache_limit=limit,
            batch_size=BATCH,
            num_canonical_nodes=1,
        )
        # MosaicML's S3 downloader keeps the boto3 client it fetched index.json with, and that client's
        # keep-alive connection; forked DataLoader workers inherit both and then share one TCP
        # connection, so a worker can be handed the other's bytes (run a1's IndexError; a 60 s read
        # timeout in r1's epoch 2). Its pickling drops the client (spawn is safe); under fork, drop it
        # here, as a fork-safe library would: each worker then makes its own.
        drop_mosaic_clients(dataset)
        loader = tud.DataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=touch)
    else:
        litdata_allow_http()
        import litdata
        from litdata.streaming.resolver import Dir

        began = time.monotonic()
        dataset = litdata.StreamingDataset(
            Dir(path=cache, url=job["uri"]),
            shuffle=True,
            seed=1,
            max_cache_size=limit,
            storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]},
        )
        extra = {"multiprocessing_context": job["litdata_context"]} if job.get("litdata_context") else {}
        if job.get("litdata_out_of_order"):
            extra["in_order"] = False
        loader = litdata.StreamingDataLoader(
            dataset,
            batch_size=BATCH,
            num_workers=job.get("litdata_workers") or workers,
            collate_fn=touch,
            worker_init_fn=litdata_allow_http,
            **extra,
        )
    built = time.monotonic() - began
    work = Path(job["work"])
    for epoch in range(job["epochs"]):
        if tool == "mosaic":
            drop_mosaic_clients(dataset)
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        elif hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch + (1 if tool == "litdata" else 0))
        cpu0, start = cpu_seconds(), time.monotonic()
        first = None
        count = 0
        for batch in loader:
            if first is None:
                first = time.monotonic() - start
            count += batch
        seconds = time.monotonic() - start
        out = {
            "epoch": epoch,
            "samples": count,
            "seconds": seconds,
            "first_batch": first,
            "cpu": cpu_seconds() - cpu0,
            "built": built if epoch == 0 else 0.0,
            "workers": loader.num_workers,
            **info,
        }
        (work / f"epoch-{epoch}.json").write_text(json.dumps(out))
        while not (work / f"ack-{epoch}").exists():  # the driver reads the proxy's count between epochs
            time.sleep(0.005)


class SpliceProxy:
    """Relays TCP connections to ``upstream`` and counts the bytes sent back to the clients, as
    bench_locality's CountingProxy does, but with ``os.splice`` through a pipe on two threads per
    connection: the bytes never enter Python. CountingProxy's asyncio relay costs 1.6-1.9 CPU-s
    per GB relayed on one Python thread (bench/RESULTS.md, 2026-11-27 session 9), about as much
    as a tool's own CPU per epoch, on the same 2 cores as the tools."""

    PIECE = 1 << 20

    def __init__(self, upstream: tuple[str, int], listeners: int) -> None:
        import socket

        self.upstream = upstream
        self.counts = [0] * listeners
        self.ports: list[int] = []
        self._lock = threading.Lock()
        for index in range(listeners):
            server = socket.create_server(("127.0.0.1", 0))
            self.ports.append(server.getsockname()[1])
            threading.Thread(target=self._accept, args=(server, index), daemon=True).start()

    def _accept(self, server, index: int) -> None:
        import socket

        while True:
            client, _ = server.accept()
            try:
                up = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for sock in (client, up):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            open_ends = [2]  # the last direction to end closes both sockets
            threading.Thread(target=self._pipe, args=(client, up, None, open_ends), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, client, index, open_ends), daemon=True).start()

    def _pipe(self, src, dst, index: int | None, open_ends: list[int]) -> None:
        import socket

        read_end, write_end = os.pipe()
        try:
            while True:
                moved = os.splice(src.fileno(), write_end, self.PIECE)
                if not moved:
                    break
                if index is not None:
                    with self._lock:
                        self.counts[index] += moved
                while moved:
                    moved -= os.splice(read_end, dst.fileno(), moved)
        except OSError:
            pass
        finally:
            os.close(read_end)
            os.close(write_end)
            for sock in (dst, src):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                open_ends[0] -= 1
                last = not open_ends[0]
            if last:
                dst.close()
                src.close()

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}"


def folder_bytes(path: Path) -> int:
    total = 0
    for folder, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


class PeakSampler:
    """The largest total size of the files under ``path``, sampled every ``interval`` seconds."""

    def __init__(self, path: Path, interval: float = 0.2) -> None:
        self.path, self.interval, self.peak = path, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, folder_bytes(self.path))

    def take(self) -> int:
        """The peak since the last take, and start again."""
        peak, self.peak = max(self.peak, folder_bytes(self.path)), 0
        return peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def audit_cache(cache: Path, spec: dict) -> str:
    """After a failure: every shard or chunk file left in the cache against its object in the store
    (size and MD5, the ETag of a single-PUT upload), to tell a bad download from a bad read."""
    import hashlib

    bucket = spec["uri"].split("/")[2]
    client = s3_client(os.environ["AWS_ENDPOINT_URL"])
    lines = []
    for path in sorted(cache.rglob("*")):
        if not path.is_file() or path.suffix not in (".mds", ".bin") or path.name == "index.json":
            continue
        key = spec["prefix"] + str(path.relative_to(cache))
        try:
            head = client.head_object(Bucket=bucket, Key=key)
        except Exception as err:  # noqa: BLE001 - a diagnostic: report, do not fail on it
            lines.append(f"{path.name}: no object {key} ({err})")
            continue
        data = path.read_bytes()
        same = len(data) == head["ContentLength"] and hashlib.md5(data).hexdigest() == head["ETag"].strip('"')
        lines.append(f"{path.name}: {len(data)} bytes, store {head['ContentLength']}, {'same' if same else 'DIFFERS'}")
    return "cache audit:\n" + ("\n".join(lines) or "(no shard files left)")


def stream_tool(tool: str, spec: dict, args: argparse.Namespace, proxy, root: Path) -> list[dict]:
    """Run ``tool``'s epochs in a child process; one row per epoch."""
    work = root / f"run-{tool}"
    cache = root / f"cache-{tool}"
    work.mkdir()
    cache.mkdir()
    limit = int(spec["bytes"] * args.cache_fraction)
    job = {
        "tool": tool,
        "uri": spec["uri"],
        "cache": str(cache),
        "limit": limit,
        "workers": args.workers,
        "epochs": args.epochs,
        "block_samples": args.block_samples,
        "lading_block": args.lading_block,
        "litdata_context": args.litdata_context,
        "litdata_out_of_order": args.litdata_out_of_order,
        "litdata_workers": args.litdata_workers,
        "work": str(work),
    }
    (work / "job.json").write_text(json.dumps(job))
    env = dict(
        os.environ,
        AWS_ENDPOINT_URL=proxy.url(0),
        S3_ENDPOINT_URL=proxy.url(0),
        AWS_ALLOW_HTTP="true",
        TQDM_DISABLE="1",
        LADING_CACHE_DIR=str(cache),
    )
    peak = PeakSampler(cache)
    before = proxy.counts[0]
    command = [sys.executable, __file__, "child", str(work / "job.json")]
    if args.profile:  # py-spy over the tool's process and its DataLoader workers, collapsed stacks
        args.profile.mkdir(parents=True, exist_ok=True)
        spy = Path(sys.executable).with_name("py-spy")
        command = [str(spy), "record", "--subprocesses", "--format", "raw", "--rate", "200", "--nonblocking"]
        command += ["--output", str(args.profile / f"{tool}.txt"), "--", sys.executable, __file__, "child"]
        command += [str(work / "job.json")]
    child = subprocess.Popen(command, env=env, stderr=open(work / "stderr.txt", "w"))
    rows = []
    for epoch in range(args.epochs):
        mark = work / f"epoch-{epoch}.json"
        deadline = time.monotonic() + args.epoch_timeout
        while not mark.exists():
            if time.monotonic() > deadline:
                child.kill()
                child.wait()
                peak.stop()
                raise RuntimeError(
                    f"{tool}: epoch {epoch + 1} did not finish in {args.epoch_timeout:.0f} s "
                    f"({(proxy.counts[0] - before) / 1e6:.0f} MB downloaded by then)"
                )
            if child.poll() is not None:
                peak.stop()
                audit = audit_cache(cache, spec)
                raise RuntimeError(f"{tool} failed: {(work / 'stderr.txt').read_text()[-2000:]}\n{audit}")
            time.sleep(0.01)
        time.sleep(0.05)  # the file is written in one call; let it land
        row = json.loads(mark.read_text())
        row.update(
            tool=tool,
            downloaded=proxy.counts[0] - before,
            cache_peak=peak.take(),
            limit=limit,
            data=spec["bytes"],
            load=os.getloadavg()[0],
        )
        before = proxy.counts[0]
        rows.append(row)
        print(
            f"  {tool:8s} epoch {epoch}: {row['samples']} samples in {row['seconds']:.1f} s "
            f"({row['samples'] / row['seconds']:.0f}/s, cpu {row['cpu']:.1f} s), first batch "
            f"{row['first_batch']:.2f} s, {row['downloaded'] / 1e6:.0f} MB downloaded "
            f"({row['downloaded'] / spec['bytes']:.2f}x data), cache peak {row['cache_peak'] / 1e6:.0f} MB "
            f"(limit {limit / 1e6:.0f} MB), load {row['load']:.1f}",
            flush=True,
        )
        (work / f"ack-{epoch}").write_text("")
    child.wait(timeout=600)
    peak.stop()
    shutil.rmtree(cache, ignore_errors=True)
    return rows


@contextlib.contextmanager
def bench_lock(path: str | None):
    """Hold the machine's benchmark lock (flock on ``path``) for one tool's copy and epochs, so that
    other benchmarks run between the tools rather than beside them; no lock without a path."""
    if not path:
        yield
        return
    import fcntl

    with open(path, "a") as handle:
        began = time.monotonic()
        fcntl.flock(handle, fcntl.LOCK_EX)
        print(f"  (bench lock taken after {time.monotonic() - began:.0f} s; load {os.getloadavg()[0]:.1f})", flush=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def stream_main(args: argparse.Namespace) -> None:
    from bench_locality import CountingProxy

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_REGION", "us-east-1")
    os.environ["AWS_ENDPOINT_URL"] = args.endpoint
    root = Path(tempfile.mkdtemp(prefix="lading-streaming-", dir=args.tmp))
    samples = int(args.gb * 1e9 // args.sample_bytes)
    if args.block_samples is None:
        args.block_samples = max(1, int(args.gb * 1e9 * args.cache_fraction / 2 // args.sample_bytes))
    print(
        f"load average at start: {os.getloadavg()}; {samples} samples x ~{args.sample_bytes} B, "
        f"shards of {args.shard_bytes / 1e6:.0f} MB, cache limit {args.cache_fraction:.0%}, "
        f"block {args.block_samples} samples",
        flush=True,
    )
    files = make_source(root, samples, args.sample_bytes)
    bucket = f"{args.bucket_prefix}-{uuid.uuid4().hex[:8]}"
    client = s3_client(args.endpoint)
    client.create_bucket(Bucket=bucket)
    host, _, port = args.endpoint.rpartition("//")[2].partition(":")
    proxy = (SpliceProxy if args.proxy == "splice" else CountingProxy)((host, int(port or 80)), 1)
    rows: list[dict] = []
    try:
        for tool in args.tools.split(","):
            with bench_lock(args.lock):
                spec = publish(tool, root, files, args.endpoint, bucket, args.shard_bytes)
                print(f"  {tool:8s} copy: {spec['bytes'] / 1e6:.0f} MB in {spec['seconds']:.0f} s", flush=True)
                try:
                    rows += stream_tool(tool, spec, args, proxy, root)
                except Exception as err:  # noqa: BLE001 - a peer that fails is a row, not the end of the run
                    print(f"  {tool}: FAILED: {str(err)[-3000:]}", flush=True)
                    rows.append({"tool": tool, "error": str(err).partition("cache audit:")[0].strip()[-400:]})
                delete_prefix(client, bucket, spec["prefix"])
    finally:
        delete_prefix(client, bucket, "")
        client.delete_bucket(Bucket=bucket)
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()}")
    print(stream_table(rows))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "stream.json").write_text(json.dumps(rows, indent=1))


def stream_table(rows: list[dict]) -> str:
    lines = [
        "| tool | epoch | MB downloaded (x its data) | cache peak MB (limit) | built s | first batch s "
        "| samples/s | CPU s | load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['tool']} | failed: {r['error'][-200:].replace('|', '/')} | | | | | | | |")
            continue
        lines.append(
            f"| {r['tool']} ({r.get('workers', '?')} workers) | {r['epoch'] + 1} | {r['downloaded'] / 1e6:,.0f} ({r['downloaded'] / r['data']:.2f}x) "
            f"| {r['cache_peak'] / 1e6:,.0f} ({r['limit'] / 1e6:,.0f}) | {r['built']:.2f} | {r['first_batch']:.2f} "
            f"| {r['samples'] / r['seconds']:,.0f} | {r['cpu']:.1f} | {r['load']:.1f} |"
        )
    return "\n".join(lines)


# -- (b) shuffle quality --------------------------------------------------------------------------------


def lading_order(counts: list[int], block_samples: int, seed: int, epoch: int, block_shards: int) -> "list[int]":
    """Global sample ids (pack order) of one rank of one node, in lading's order for ``epoch``."""
    from lading.datasets import NodeLocalSampler

    options = dict(
        shuffle_buffer=block_samples, seed=seed, randomize_shard_order=True, rank=0, world_size=1, local_world_size=1
    )
    if "shuffle_block" in inspect.signature(NodeLocalSampler).parameters:
        options["shuffle_block"] = block_shards
    sampler = NodeLocalSampler(counts, **options)
    sampler.set_epoch(epoch)
    return list(sampler)


def mosaic_order(counts: list[int], block_samples: int, seed: int, epoch: int, algo: str):
    import numpy as np
    from bench_locality import without_torchvision

    without_torchvision()
    from streaming.base.shuffle import get_shuffle

    return get_shuffle(algo, np.array(counts, dtype=np.int64), 1, seed, epoch, block_samples)


def quality(order, counts: list[int], classes: int, window: int) -> dict:
    """Distinct shards per window of ``window`` consecutive samples (mean, min) and label run lengths
    (mean, max), with labels by shard (data packed class by class: shards of a class are contiguous)."""
    import numpy as np

    order = np.asarray(order, dtype=np.int64)
    starts = np.cumsum([0] + counts[:-1])
    shard = np.searchsorted(starts, order, side="right") - 1
    label = shard * classes // len(counts)
    window = min(window, len(order))
    distinct = [len(np.unique(shard[i : i + window])) for i in range(0, len(order) - window + 1, window)]
    change = np.flatnonzero(np.diff(label)) + 1
    runs = np.diff(np.concatenate([[0], change, [len(label)]]))
    assert sorted(order.tolist()) == list(range(sum(counts))), "not a permutation of the epoch"
    return {
        "distinct_mean": float(np.mean(distinct)),
        "distinct_min": int(min(distinct)),
        "windows": len(distinct),
        "run_mean": float(runs.mean()),
        "run_max": int(runs.max()),
        "first_labels": label[:10].tolist(),
    }


def shuffle_main(args: argparse.Namespace) -> None:
    cases = [
        ("100 samples, 10 shards of 10, block 2 shards (20 samples)", [10] * 10, 2),
        ("10^6 samples, 1,000 shards of 1,000, block 10 shards (10,000 samples)", [1000] * 1000, 10),
    ]
    print(
        f"load average at start: {os.getloadavg()}; 10 classes, packed class by class "
        "(shard s holds class s*10//shards); ideal: 10 distinct shards of 10 per window on 100, "
        "mean label run 1.11",
        flush=True,
    )
    lines = [
        "| case | order | distinct shards per 1,000 (mean / min) | label run (mean / max) | first labels | s |",
        "| --- | --- | ---: | ---: | --- | ---: |",
    ]
    for name, counts, block_shards in cases:
        block = block_shards * counts[0]
        makers = [("lading", lambda e: lading_order(counts, block, 1, e, block_shards))]
        makers += [
            (f"MosaicML {algo}", lambda e, a=algo: mosaic_order(counts, block, 1, e, a))
            for algo in ("py1e", "py1br", "py1s")
        ]
        for label, make in makers:
            began = time.monotonic()
            order = make(0)
            seconds = time.monotonic() - began
            q = quality(order, counts, 10, 1000)
            lines.append(
                f"| {name} | {label} | {q['distinct_mean']:.1f} / {q['distinct_min']} "
                f"| {q['run_mean']:.2f} / {q['run_max']} | {q['first_labels']} | {seconds:.2f} |"
            )
            print(lines[-1], flush=True)
    # one epoch of one seed is a noisy sample (on 100 samples especially): the same statistics
    # averaged over seeds (for lading, a seed also draws the run's shard order)
    lines += [
        "",
        "| case | order | seeds | distinct shards per 1,000 (mean / mean of mins / min) | label run (mean / mean of maxes) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for (name, counts, block_shards), seeds in zip(cases, (args.seeds_small, args.seeds_large)):
        block = block_shards * counts[0]
        for label, make in [
            ("lading", lambda s: lading_order(counts, block, s, 0, block_shards)),
            ("MosaicML py1e", lambda s: mosaic_order(counts, block, s, 0, "py1e")),
        ]:
            found = [quality(make(seed), counts, 10, 1000) for seed in range(1, seeds + 1)]
            mean = lambda key: sum(q[key] for q in found) / len(found)  # noqa: E731
            lines.append(
                f"| {name} | {label} | {seeds} | {mean('distinct_mean'):.2f} / {mean('distinct_min'):.1f} / "
                f"{min(q['distinct_min'] for q in found)} | {mean('run_mean'):.3f} / {mean('run_max'):.1f} |"
            )
            print(lines[-1], flush=True)
    print("\n".join(lines))


# -- (c) the order at scale -------------------------------------------------------------------------------


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def scale_child(job: dict) -> None:
    """Build the order in this fresh process: seconds and RSS (baseline after imports, peak). torch
    is imported first, as in a training process (the datasets are torch IterableDatasets)."""
    import numpy as np
    import torch.utils.data  # noqa: F401

    if job["tool"] == "lading":
        from lading.datasets import ShardDataset

        base = rss_mb()
        began = time.monotonic()
        dataset = ShardDataset(
            job["index"],
            rank=0,
            world_size=job["nodes"] * job["per_node"],
            local_world_size=job["per_node"],
            shuffle_buffer=job["buffer"],
            seed=1,
            randomize_shard_order=True,
        )
        built = time.monotonic() - began
        first = first_shard(dataset)
        seconds = time.monotonic() - began
        state = len(json.dumps(dataset.state_dict(0)))
    else:
        from bench_locality import without_torchvision

        without_torchvision()
        from streaming.base.partition import get_partitions
        from streaming.base.shuffle import get_shuffle

        counts = np.full(job["shards"], job["samples"] // job["shards"], dtype=np.int64)
        base = rss_mb()
        began = time.monotonic()
        ids = get_partitions("orig", int(counts.sum()), job["nodes"], job["nodes"], job["per_node"], 1, BATCH)
        shuffle = get_shuffle("py1e", counts, job["nodes"], 1, 0, job["buffer"])
        built = time.monotonic() - began
        first = int(np.searchsorted(np.cumsum(counts), shuffle[int(ids[0, 0].flat[0])], side="right"))
        seconds = time.monotonic() - began
        state = 0
    print(
        json.dumps(
            {
                "tool": job["tool"],
                "built": built,
                "seconds": seconds,
                "first_shard": first,
                "rss_base": base,
                "rss_peak": peak_mb(),
                "state_bytes": state,
            }
        )
    )


def first_shard(dataset) -> int:
    """The shard of the rank's first sample (today's engine: ``locations()``)."""
    if hasattr(dataset, "locations"):
        return next(iter(dataset.locations()))[0]
    deal = dataset.deal()
    return deal.group.locate(deal.position(0))[0]


def synth_index(folder: Path, samples: int, shards: int) -> str:
    per = samples // shards
    document = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": "synthetic",
        "shardlist": [{"url": f"shard-{i:06d}.tar", "nsamples": per, "filesize": per * 1024} for i in range(shards)],
    }
    path = folder / "synthetic.index.json"
    path.write_text(json.dumps(document))
    return str(path)


def scale_main(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="lading-scale-", dir=args.tmp))
    index = synth_index(folder, args.samples, args.shards)
    print(
        f"load average at start: {os.getloadavg()}; {args.samples:,} samples in {args.shards:,} shards, "
        f"rank 0 of {args.nodes} nodes x {args.per_node} ranks",
        flush=True,
    )
    lines = [
        "| tool | build s | + first shard s | RSS after imports MB | peak RSS MB | state bytes | load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for _ in range(args.rounds):  # rounds alternate between the tools, so the load hits both alike
        for tool in args.tools.split(","):
            job = {
                "tool": tool,
                "index": index,
                "samples": args.samples,
                "shards": args.shards,
                "nodes": args.nodes,
                "per_node": args.per_node,
                "buffer": args.block_samples,
            }
            try:
                done = subprocess.run(
                    [sys.executable, __file__, "scale-child", json.dumps(job)],
                    capture_output=True,
                    text=True,
                    timeout=args.timeout,
                )
            except subprocess.TimeoutExpired:
                lines.append(f"| {tool} | did not finish in {args.timeout:.0f} s | | | | | {os.getloadavg()[0]:.1f} |")
                print(lines[-1], flush=True)
                continue
            if done.returncode:
                lines.append(f"| {tool} | failed: {done.stderr[-300:].replace(chr(10), ' ')} | | | | | |")
                print(lines[-1], flush=True)
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            lines.append(
                f"| {tool} | {r['built']:.2f} | {r['seconds']:.2f} | {r['rss_base']:.0f} | {r['rss_peak']:.0f} "
                f"| {r['state_bytes']} | {os.getloadavg()[0]:.1f} |"
            )
            print(lines[-1], flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    print("\n".join(lines))


# -- command line ---------------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        stream_child(json.loads(Path(sys.argv[2]).read_text()))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "scale-child":
        scale_child(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    sub = parser.add_subparsers(dest="part", required=True)
    stream = sub.add_parser("stream")
    stream.add_argument("--endpoint", default="http://127.0.0.1:7480")
    stream.add_argument("--gb", type=float, default=2.0)
    stream.add_argument("--sample-bytes", type=int, default=100_000)
    stream.add_argument("--shard-bytes", type=int, default=20_000_000)
    stream.add_argument("--cache-fraction", type=float, default=0.1)
    stream.add_argument(
        "--block-samples",
        type=int,
        default=None,
        help="MosaicML's shuffle_block_size and lading's shuffle_buffer, in samples "
        "(default: the samples in half the cache limit)",
    )
    stream.add_argument("--lading-block", default=None, help="lading's shuffle_block (default: its own)")
    stream.add_argument("--epochs", type=int, default=2)
    stream.add_argument("--workers", type=int, default=2)
    stream.add_argument("--epoch-timeout", type=float, default=1200, help="give up on a tool's epoch after this")
    stream.add_argument("--tools", default=",".join(TOOLS))
    stream.add_argument("--tmp", default=None)
    stream.add_argument(
        "--litdata-context",
        default=None,
        help="litdata's DataLoader multiprocessing_context (e.g. spawn; default: torch's, fork)",
    )
    stream.add_argument(
        "--litdata-out-of-order",
        action="store_true",
        help="DataLoader(in_order=False) for litdata: a worker whose batches wait is not stalled behind another",
    )
    stream.add_argument(
        "--litdata-workers",
        type=int,
        default=None,
        help="litdata's DataLoader workers (default --workers; with 2, litdata 0.2.76 deadlocks on its shared "
        "cache slots when max_cache_size holds 10 chunks)",
    )
    stream.add_argument("--profile", type=Path, default=None, help="py-spy each tool's epochs into DIR/TOOL.txt")
    stream.add_argument(
        "--proxy",
        choices=("splice", "asyncio"),
        default="splice",
        help="the byte-counting relay: os.splice on threads (default), or bench_locality's asyncio CountingProxy "
        "(sessions 5-8; 1.6-1.9 CPU-s per GB relayed)",
    )
    stream.add_argument("--lock", default=None, help="take this flock for each tool's copy and epochs")
    stream.add_argument("--bucket-prefix", default="bench-loader-streaming", help="the run's bucket is PREFIX-<random>")
    stream.add_argument("--out", type=Path)
    shuffle = sub.add_parser("shuffle")
    shuffle.add_argument("--seeds-small", type=int, default=20, help="seeds averaged on 100 samples")
    shuffle.add_argument("--seeds-large", type=int, default=4, help="seeds averaged on 10^6 samples")
    shuffle.add_argument("--tmp", default=None)
    scale = sub.add_parser("scale")
    scale.add_argument("--samples", type=int, default=10**8)
    scale.add_argument("--shards", type=int, default=10**5)
    scale.add_argument("--nodes", type=int, default=64)
    scale.add_argument("--per-node", type=int, default=8)
    scale.add_argument(
        "--block-samples",
        type=int,
        default=1 << 18,
        help="shuffle window / block in samples (MosaicML's default for 64 nodes)",
    )
    scale.add_argument("--tools", default="lading,mosaic")
    scale.add_argument("--rounds", type=int, default=2)
    scale.add_argument("--timeout", type=float, default=900, help="give up on one build after this")
    scale.add_argument("--tmp", default=None)
    args = parser.parse_args()
    {"stream": stream_main, "shuffle": shuffle_main, "scale": scale_main}[args.part](args)


if __name__ == "__main__":
    main()
