"""CPU per GET (issue 18): lading's StoreDataset inside a forked DataLoader worker against a bare
obstore asyncio loop (``asyncio.gather`` over ``get_async`` + ``bytes_async``), on the same objects.

    bash bench/rgw.sh start
    .venv/bin/python bench/bench_cpu_per_get.py                       # 16 KiB and 100 KiB, 3 rounds
    .venv/bin/python bench/bench_cpu_per_get.py --sizes 16384 --count 2000 --rounds 1

Rows, each in its own fresh process (``--mode``), each reading every object of a prefix once in a
random order, in batches of ``--batch`` (64):
  dataset  StoreDataset(prefix) built in the training process, DataLoader(num_workers=1,
           batch_size=64, RandomSampler), torch's default start method (fork), no other option.
           The collate function runs in the worker and returns the worker's CPU seconds
           (getrusage(RUSAGE_SELF): every thread, obstore's runtime included) and whether the
           worker started obstore itself (else it fell back to the SDK). CPU per GET = the
           worker's CPU from the end of its first batch to the end of its last, over the GETs in
           between (start-up and the first batch's connection set-up excluded).
  bare     one process: obstore S3Store, one asyncio loop, per batch ``asyncio.gather`` of
           ``get_async(...)`` then ``await result.bytes_async()`` for each key; CPU from the end
           of the first batch to the end of the last, likewise. Same TOKIO_WORKER_THREADS (2) as
           lading sets in its own processes.
Output: one line per run (CPU us per GET, GETs/s), then a table of medians [min-max] and the
ratio dataset / bare per size (issue 18's bar: within 1.5x). ``--profile`` runs each dataset row
under ``py-spy record --subprocesses`` (raw collapsed stacks in OUT/profile-SIZE.txt).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUCKET = "lading-bench-cpu"


def cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- the dataset row ------------------------------------------------------------------------------


def worker_collate(batch):
    """Runs in the DataLoader worker: counts, the worker's CPU so far, and which client it used."""
    from lading.stores.process import obstore_started_here

    return len(batch), sum(len(b) for b in batch), cpu_now(), os.getpid(), obstore_started_here()


def run_dataset(prefix: str, batch: int) -> dict:
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from lading.datasets import StoreDataset

    torch.set_num_threads(1)
    dataset = StoreDataset(prefix)
    loader = DataLoader(
        dataset,
        batch_size=batch,
        num_workers=1,
        collate_fn=worker_collate,
        sampler=RandomSampler(dataset, generator=torch.Generator().manual_seed(0)),
    )
    marks = []
    began = time.monotonic()
    for count, nbytes, cpu, pid, obstore in loader:
        marks.append((count, nbytes, cpu, time.monotonic(), pid, obstore))
    return summarize(
        marks,
        began,
        client="obstore" if all(m[5] for m in marks) else "SDK fallback",
        workers=len({m[4] for m in marks}),
    )


# -- the bare loop ---------------------------------------------------------------------------------


def run_bare(prefix: str, batch: int, endpoint: str) -> dict:
    os.environ.setdefault("TOKIO_WORKER_THREADS", "2")
    import boto3
    import obstore
    from obstore.store import S3Store

    bucket, _, root = prefix[len("s3://") :].partition("/")
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    keys = [
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root)
        for item in page.get("Contents", [])
    ]
    random.Random(0).shuffle(keys)
    store = S3Store(
        bucket,
        endpoint=endpoint,
        region="us-east-1",
        access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
    )

    async def one(key: str):
        result = await obstore.get_async(store, key)
        return await result.bytes_async()

    async def main() -> list:
        marks = []
        for start in range(0, len(keys), batch):
            bodies = await asyncio.gather(*(one(key) for key in keys[start : start + batch]))
            marks.append((len(bodies), sum(len(b) for b in bodies), cpu_now(), time.monotonic(), os.getpid(), True))
        return marks

    began = time.monotonic()
    marks = asyncio.run(main())
    return summarize(marks, began, client="obstore", workers=1)


def summarize(marks: list, began: float, client: str, workers: int) -> dict:
    """CPU and wall from the end of the first batch to the end of the last."""
    gets = sum(m[0] for m in marks[1:])
    cpu = marks[-1][2] - marks[0][2]
    wall = marks[-1][3] - marks[0][3]
    return {
        "gets": gets,
        "total_gets": sum(m[0] for m in marks),
        "bytes": sum(m[1] for m in marks),
        "cpu_us_per_get": cpu / gets * 1e6,
        "gets_per_s": gets / wall,
        "cpu": cpu,
        "wall": wall,
        "client": client,
        "workers": workers,
        "first_batch_s": marks[0][3] - began,
    }


# -- the driver ------------------------------------------------------------------------------------


def seed(endpoint: str, prefix: str, count: int, size: int) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=Config(max_pool_connections=32))
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.ClientError:
        pass
    present = sum(
        page.get("KeyCount", 0)
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    )
    if present == count:
        return
    print(f"seeding {count} x {size} bytes under s3://{BUCKET}/{prefix}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        list(
            pool.map(
                lambda i: client.put_object(Bucket=BUCKET, Key=f"{prefix}o{i:06d}.bin", Body=os.urandom(size)),
                range(count),
            )
        )


def child(mode: str, prefix: str, args: argparse.Namespace, env: dict, profile: Path | None) -> dict:
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--mode",
        mode,
        "--prefix",
        prefix,
        "--batch",
        str(args.batch),
        "--endpoint",
        args.endpoint,
    ]
    if profile is not None:
        spy = str(Path(sys.executable).parent / "py-spy")
        argv = [
            spy,
            "record",
            "--subprocesses",
            "--nonblocking",
            "-r",
            "100",
            "-f",
            "raw",
            "-o",
            str(profile),
            "--",
            *argv,
        ]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        raise SystemExit(f"{mode} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--endpoint", default="http://127.0.0.1:7480")
    parser.add_argument("--sizes", default="16384,102400")
    parser.add_argument("--count", type=int, default=4000, help="objects per size")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="one more dataset run per size under py-spy")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        result = (
            run_dataset(args.prefix, args.batch)
            if args.mode == "dataset"
            else run_bare(args.prefix, args.batch, args.endpoint)
        )
        print(json.dumps(result), flush=True)
        return

    sys.path.insert(0, str(HERE))
    from benchtools import Log, default_out, git_state, load, machine_lines

    out = args.out or default_out("cpu-per-get")
    log = Log(out)
    log("== CPU per GET: StoreDataset in a forked DataLoader worker vs a bare obstore asyncio loop ==")
    for line in machine_lines():
        log(line)
    log(f"lading: {git_state(HERE.parent)}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": args.endpoint,
        }
    )
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    results: dict = {}
    for size in (int(s) for s in args.sizes.split(",")):
        prefix = f"s{size}/"
        seed(args.endpoint, prefix, args.count, size)
        for round_ in range(args.rounds):
            for mode in ("dataset", "bare") if round_ % 2 == 0 else ("bare", "dataset"):
                got = child(mode, f"s3://{BUCKET}/{prefix}", args, env, None)
                got["load"] = os.getloadavg()[0]
                results.setdefault(str(size), {}).setdefault(mode, []).append(got)
                log(
                    f"  {size:>7} B  {mode:8s} round {round_ + 1}: {got['cpu_us_per_get']:7.0f} us CPU/GET, "
                    f"{got['gets_per_s']:7.0f} GETs/s, client {got['client']}, {got['total_gets']} GETs, "
                    f"load {got['load']:.2f}"
                )
        if args.profile:
            got = child("dataset", f"s3://{BUCKET}/{prefix}", args, env, out / f"profile-{size}.txt")
            log(
                f"  {size:>7} B  dataset under py-spy: {got['cpu_us_per_get']:.0f} us CPU/GET -> "
                f"{out}/profile-{size}.txt"
            )
    lines = [
        "| object size | StoreDataset, forked worker: CPU us/GET | bare obstore loop: CPU us/GET | "
        "ratio | StoreDataset GETs/s | bare GETs/s | worker's client |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for size, rows in results.items():

        def cell(mode: str, key: str) -> str:
            values = [r[key] for r in rows[mode]]
            return f"{statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"

        ratio = statistics.median(r["cpu_us_per_get"] for r in rows["dataset"]) / statistics.median(
            r["cpu_us_per_get"] for r in rows["bare"]
        )
        lines.append(
            f"| {int(size) // 1024} KiB | {cell('dataset', 'cpu_us_per_get')} | {cell('bare', 'cpu_us_per_get')} "
            f"| **{ratio:.2f}x** {'ok' if ratio <= 1.5 else 'ABOVE 1.5x'} | {cell('dataset', 'gets_per_s')} "
            f"| {cell('bare', 'gets_per_s')} | {', '.join(sorted({r['client'] for r in rows['dataset']}))} |"
        )
    log(f"\nload average at the end: {load()}")
    log("\n== table ==")
    for line in lines:
        log(line)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
