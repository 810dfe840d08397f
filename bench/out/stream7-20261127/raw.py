"""Raw download floor (dev): every shard of the dev pack through lading's Store.download, N at a time."""
import os, sys, time, resource, tempfile, shutil
from concurrent.futures import ThreadPoolExecutor
from lading.stores import StoreConfig, open_store

def cpu():
    a = resource.getrusage(resource.RUSAGE_SELF)
    return a.ru_utime + a.ru_stime

store = open_store("s3://bench-stream7-dev/lading", StoreConfig.from_env(endpoint_url="http://127.0.0.1:7480"))
infos = [i for i in store.list() if i.key.endswith(".tar")]
for n in [int(x) for x in sys.argv[1:]]:
    d = tempfile.mkdtemp(dir="/tmp/stream7")
    c0, t0 = cpu(), time.monotonic()
    def one(i):
        p = os.path.join(d, i.key.replace("/", "_"))
        store.download(i.key, p, version=i.version, size=i.size)
        os.unlink(p)
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(one, infos))
    dt = time.monotonic() - t0
    total = sum(i.size for i in infos)
    print(f"concurrency {n}: {total/1e6:.0f} MB in {dt:.2f}s = {total/dt/1e6:.0f} MB/s, cpu {cpu()-c0:.2f}s, load {os.getloadavg()[0]:.1f}", flush=True)
    shutil.rmtree(d)
