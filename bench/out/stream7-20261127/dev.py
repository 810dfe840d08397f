"""Dev loop (not a result): pack once into bucket bench-stream7-dev, then run lading epochs with options.
python dev.py setup | delete | run '{json options}'; lading comes from PYTHONPATH (A/B: /tmp/stream7/ab/{main,new})."""
import json, os, sys, time, resource, tempfile, shutil
from pathlib import Path
sys.path.insert(0, "/work/wt-stream7/bench")
import bench_streaming as bs

EP = "http://127.0.0.1:7480"
BUCKET = "bench-stream7-dev"

def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime

def setup():
    os.makedirs("/tmp/stream7", exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="s7-", dir="/tmp/stream7"))
    files = bs.make_source(root, 20000, 100_000)
    c = bs.s3_client(EP)
    c.create_bucket(Bucket=BUCKET)
    info = bs.publish("lading", root, files, EP, BUCKET, 20_000_000)
    shutil.rmtree(root)
    print(info)

def run(opts):
    import lading
    from lading.datasets import DataLoader, ShardDataset
    from lading.stores import StoreConfig
    epochs = opts.pop("epochs", 2)
    workers = opts.pop("workers", 2)
    cache = tempfile.mkdtemp(prefix="cache-", dir="/tmp/stream7")
    options = dict(rank=0, world_size=1, local_world_size=1, shuffle_buffer=1000, seed=1, randomize_shard_order=True,
                   cache_dir=cache, cache_limit=int(2037e6 * 0.1), config=StoreConfig.from_env(endpoint_url=EP))
    options.update(opts)
    ds = ShardDataset(f"s3://{BUCKET}/lading/ds.index.json", **options)
    print(lading.__file__, "block", ds.shuffle_block, "prefetch", ds.prefetch, flush=True)
    loader = DataLoader(ds, batch_size=64, num_workers=workers, collate_fn=bs.touch)
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        c0, t0 = cpu(), time.monotonic()
        n = 0; first = None
        for b in loader:
            n += b
            if first is None: first = time.monotonic() - t0
        dt = time.monotonic() - t0
        print(f"epoch {epoch}: {n} in {dt:.2f}s = {n/dt:.0f}/s cpu {cpu()-c0:.2f}s first {first:.2f}s load {os.getloadavg()[0]:.1f}", flush=True)
    shutil.rmtree(cache)

if __name__ == "__main__":
    if sys.argv[1] == "setup":
        setup()
    elif sys.argv[1] == "delete":
        c = bs.s3_client(EP); bs.delete_prefix(c, BUCKET, ""); c.delete_bucket(Bucket=BUCKET)
    else:
        run(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
