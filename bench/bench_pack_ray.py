"""Benchmark packing on Ray (issue 20): the same small files packed by
  (1) ``lading pack --engine local`` (the CLI, a subprocess),
  (2) ``lading pack --engine ray`` (the library's run_pack_ray, on a local Ray started once here;
      plus one CLI run that starts and stops its own Ray, to show the start-up cost),
  (3) litdata ``optimize`` (from the peers' venv, a subprocess; skipped when absent),
  (4) a Ray Data pipeline (files -> rows) written by ``write_webdataset``, plus the separate pass
      that reads every tar back to count its samples for a wids index,
  (5) the same pipeline written by ``lading.pack.ray.ShardSink`` (index and offsets included).

    .venv/bin/python bench/bench_pack_ray.py --size-mb 300            # data under bench/out/pack_ray
    .venv/bin/python bench/bench_pack_ray.py --size-mb 2000 --skip litdata

Rows/s = samples (a 16 KiB .jpg and a small .cls) per wall second. CPU seconds = user + system of
every process involved: subprocesses through RUSAGE_CHILDREN; for Ray, this process plus every
live descendant (the raylet, the GCS and the workers, read from /proc before and after; the
workers stay up between runs). The driver's per-shard overhead is measured twice: its own CPU
seconds per shard, and the wall time per extra shard between two packs of the same files into
few large and many small shards.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out" / "pack_ray"
LITDATA_VENV = os.environ.get("LADING_BENCH_LITDATA_VENV", "/work/benchenv-loc")
sys.path.insert(0, str(REPO))
TICK = os.sysconf("SC_CLK_TCK")


def make_files(root: Path, size_mb: int, file_kb: int) -> int:
    """Samples of a ``file_kb`` KiB .jpg and a .cls, 500 per directory, about ``size_mb`` MB; returns samples."""
    samples = size_mb * 1_000_000 // (file_kb << 10)
    marker = root.parent / f".{root.name}-complete-{samples}-{file_kb}"
    if marker.exists():
        return samples
    shutil.rmtree(root, ignore_errors=True)
    for i in range(samples):
        folder = root / f"d{i // 500:04d}"
        if i % 500 == 0:
            folder.mkdir(parents=True)
        (folder / f"{i:07d}.jpg").write_bytes(os.urandom(file_kb << 10))
        (folder / f"{i:07d}.cls").write_bytes(str(i % 1000).encode())
    marker.touch()
    return samples


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants (their own and their reaped children's)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(value) for value in fields[11:15]) / TICK  # utime stime cutime cstime
    total, stack = 0.0, [root]
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    while stack:
        pid = stack.pop()
        total += times.get(pid, 0.0)
        stack += children.get(pid, [])
    return total


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of a subprocess (and its children)."""
    before, started = children_cpu(), time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - started, children_cpu() - before


def in_ray(action) -> tuple[float, float, float]:
    """Wall, CPU (this process and every descendant) and this process's own CPU seconds of ``action()``."""

    def own() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    cpu0, own0, started = tree_cpu(os.getpid()), own(), time.perf_counter()
    action()
    return time.perf_counter() - started, tree_cpu(os.getpid()) - cpu0, own() - own0


def sample_rows(source: Path):
    """A Ray Dataset of rows {__key__, jpg, cls}, read from the files by Ray tasks."""
    import ray

    keys = sorted(str(p.relative_to(source))[:-4] for p in source.glob("*/*.jpg"))

    def load(batch):
        out = {"__key__": [], "jpg": [], "cls": []}
        for key in batch["key"]:
            out["__key__"].append(key)
            out["jpg"].append((source / f"{key}.jpg").read_bytes())
            out["cls"].append((source / f"{key}.cls").read_bytes())
        return out

    return ray.data.from_items(
        [{"key": key} for key in keys], override_num_blocks=max(2, len(keys) // 2000)
    ).map_batches(load, batch_size=500)


def index_pass(folder: Path) -> None:
    """What write_webdataset leaves to do: count each tar's samples for a wids index."""
    shards = []
    for tar in sorted(folder.glob("*.tar")):
        with tarfile.open(tar) as archive:
            keys = {member.name.split(".", 1)[0] for member in archive}
        shards.append({"url": tar.name, "nsamples": len(keys), "filesize": tar.stat().st_size})
    (folder / "index.json").write_text(json.dumps({"wids_version": 1, "shardlist": shards}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=300, help="input size (default 300; the issue asks 2000)")
    parser.add_argument("--file-kb", type=int, default=16)
    parser.add_argument("--shard-size", default="64MB")
    parser.add_argument("--small-shard-size", default="1MB", help="for the per-shard overhead")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--skip", action="append", default=[], choices=["litdata", "cli-ray", "rows"])
    args = parser.parse_args()
    from lading.core.sizes import parse_size

    shard_size, small = parse_size(args.shard_size), parse_size(args.small_shard_size)
    source = args.out / "src"
    samples = make_files(source, args.size_mb, args.file_kb)
    lading = [str(REPO / ".venv" / "bin" / "lading")]
    results: list[tuple[str, float, float, str]] = []

    def fresh(name: str) -> Path:
        path = args.out / name
        shutil.rmtree(path, ignore_errors=True)
        return path

    subprocess.run(["sync"], check=True)
    wall, cpu = run(
        lading + ["pack", str(source), str(fresh("local")), "--name", "ds", "--shard-size", str(shard_size), "--json"]
    )
    results.append(("lading pack --engine local (CLI)", wall, cpu, ""))

    import ray
    from lading.pack import PackOptions, plan_pack
    from lading.pack.ray import ShardSink, run_pack_ray

    started = time.perf_counter()
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False, logging_level="ERROR")
    ray_start = time.perf_counter() - started
    ray.data.DataContext.get_current().enable_progress_bars = False
    ray.get([ray.remote(lambda: 0).remote() for _ in range(4)])  # workers up before the first timing
    ray.data.range(1000, override_num_blocks=4).map_batches(lambda b: b).materialize()  # Ray Data warm

    def pack_on_ray(name: str, size: int) -> int:
        plan = plan_pack(str(source), str(fresh(name)), PackOptions("ds", shard_size=size))
        run_pack_ray(plan, str(source), str(args.out / name))
        return len(plan.shards)

    box: dict[str, int] = {}
    wall, cpu, own = in_ray(lambda: box.__setitem__("n", pack_on_ray("ray", shard_size)))
    results.append(("lading pack --engine ray (library, Ray up)", wall, cpu, f"{box['n']} shards"))
    same = all((args.out / "local" / p.name).read_bytes() == p.read_bytes() for p in (args.out / "ray").glob("*.tar"))
    wall_s, cpu_s, own_s = in_ray(lambda: box.__setitem__("m", pack_on_ray("ray-small", small)))
    results.append((f"lading pack --engine ray, {args.small_shard_size} shards", wall_s, cpu_s, f"{box['m']} shards"))
    per_shard_wall = (wall_s - wall) / max(1, box["m"] - box["n"])
    per_shard_driver = own_s / box["m"]

    if "rows" not in args.skip:
        wall_w, cpu_w, _ = in_ray(lambda: sample_rows(source).write_webdataset(str(fresh("wds")), encoder=None))
        wall_i, cpu_i, _ = in_ray(lambda: index_pass(args.out / "wds"))
        results.append(("Ray write_webdataset", wall_w, cpu_w, f"{len(list((args.out / 'wds').glob('*.tar')))} tars"))
        results.append(("Ray write_webdataset + index pass", wall_w + wall_i, cpu_w + cpu_i, ""))
        wall_k, cpu_k, _ = in_ray(
            lambda: sample_rows(source).write_datasink(ShardSink(str(fresh("sink")), name="ds", shard_size=shard_size))
        )
        results.append(
            (
                "lading ShardSink (index + offsets)",
                wall_k,
                cpu_k,
                f"{len(list((args.out / 'sink').glob('*.tar')))} shards",
            )
        )
    ray.shutdown()

    if "cli-ray" not in args.skip:
        wall, cpu = run(
            lading
            + [
                "pack",
                str(source),
                str(fresh("ray-cli")),
                "--name",
                "ds",
                "--shard-size",
                str(shard_size),
                "--engine",
                "ray",
                "--json",
            ]
        )
        results.append(("lading pack --engine ray (CLI, starts its own Ray)", wall, cpu, "CPU: driver + reaped only"))

    litdata = Path(LITDATA_VENV) / "bin" / "python"
    if "litdata" not in args.skip and litdata.exists():
        script = (
            "import sys, os\nfrom litdata import optimize\n"
            "src, out = sys.argv[1], sys.argv[2]\n"
            "keys = sorted(os.path.join(d, f[:-4]) for d in sorted(os.listdir(src)) for f in os.listdir(os.path.join(src, d)) if f.endswith('.jpg'))\n"
            "def fn(key):\n"
            "    return {'jpg': open(os.path.join(src, key + '.jpg'), 'rb').read(), 'cls': open(os.path.join(src, key + '.cls'), 'rb').read()}\n"
            "if __name__ == '__main__':\n"
            f"    optimize(fn=fn, inputs=keys, output_dir=out, chunk_bytes='{args.shard_size}', num_workers=os.cpu_count())\n"
        )
        path = args.out / "litdata_optimize.py"
        path.write_text(script)
        wall, cpu = run([str(litdata), str(path), str(source), str(fresh("litdata"))])
        results.append(("litdata optimize", wall, cpu, f"num_workers={os.cpu_count()}"))

    mb = sum(p.stat().st_size for p in source.glob("*/*")) / 1e6
    print(
        f"{samples:,} samples ({2 * samples:,} files, {mb:.0f} MB), shards of {args.shard_size}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; Ray start-up {ray_start:.1f} s; "
        f"ray shards byte-identical to local: {same}"
    )
    print("| tool | wall s | rows/s | CPU s | note |\n| --- | --- | --- | --- | --- |")
    for name, wall, cpu, note in results:
        print(f"| {name} | {wall:.2f} | {samples / wall:,.0f} | {cpu:.1f} | {note} |")
    print(
        f"driver CPU per shard: {1000 * per_shard_driver:.2f} ms ({args.small_shard_size} shards); "
        f"wall per extra shard: {1000 * per_shard_wall:.1f} ms"
    )


if __name__ == "__main__":
    main()
