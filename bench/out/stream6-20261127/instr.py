"""Dev instrumentation (not a result): where a DataLoader worker's wall time goes, per epoch.
Usage: dev.py run, with this imported first (python -c 'import instr; ...')."""
import os, re, sys, time, collections
from lading.datasets import reader as R, shards as S
from lading.sync import cache as C

T = collections.Counter()
N = collections.Counter()

def timed(cls, name, key=None):
    orig = getattr(cls, name)
    key = key or f"{cls.__name__}.{name}"
    def wrap(*a, **k):
        t = time.monotonic()
        try:
            return orig(*a, **k)
        finally:
            T[key] += time.monotonic() - t; N[key] += 1
    setattr(cls, name, wrap)

timed(R.ShardReader, "_map")
timed(R.ShardReader, "release")
timed(R.ShardReader, "_warm_after")
timed(C.NodeCache, "make_room")
timed(C.NodeCache, "_download")
timed(C.NodeCache, "open")
timed(R.OpenShard, "sample")
orig_iter = S.ShardDataset.iter_worker
def iter_worker(self, w, n):
    T.clear(); N.clear()
    t0 = time.monotonic(); c0 = time.process_time()
    first = None
    try:
        for x in orig_iter(self, w, n):
            if first is None: first = time.monotonic() - t0
            yield x
    finally:
        wall = time.monotonic() - t0
        parts = " ".join(f"{k}={T[k]:.2f}s/{N[k]}" for k in sorted(T))
        import glob, collections as _c
        by = _c.Counter()
        for st in glob.glob(f"/proc/{os.getpid()}/task/*/stat"):
            try:
                txt = open(st).read()
            except OSError:
                continue
            name = txt[txt.index("(") + 1: txt.rindex(")")]
            f = txt[txt.rindex(")") + 2:].split()
            by[re.sub(r"[0-9]+$", "", name)] += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        parts += " threads: " + " ".join(f"{k}={v:.2f}" for k, v in by.most_common())
        sys.stderr.write(f"[worker {w} pid {os.getpid()} epoch {self.epoch}] wall {wall:.2f} cpu(all threads) {time.process_time()-c0:.2f} first {first:.2f} {parts}\n")
S.ShardDataset.iter_worker = iter_worker

EV = os.environ.get("INSTR_EVENTS")
if EV:
    def ev(kind, what, t0, t1):
        with open(EV, "a") as f:
            f.write(f"{os.getpid()} {kind} {what} {t0:.4f} {t1:.4f}\n")
    _dl = C.NodeCache._download
    def _download(self, source, path, record):
        t = time.monotonic()
        try:
            return _dl(self, source, path, record)
        finally:
            ev("dl", source.uri.rsplit("/", 1)[1], t, time.monotonic())
    C.NodeCache._download = _download
    _mp = R.ShardReader._map
    def _map(self, number):
        t = time.monotonic()
        warm = number in self._warming
        try:
            return _mp(self, number)
        finally:
            ev("map" + ("W" if warm else ""), number, t, time.monotonic())
    R.ShardReader._map = _map
    _mr = C.NodeCache.make_room
    def make_room(self, *a, **k):
        t = time.monotonic()
        try:
            return _mr(self, *a, **k)
        finally:
            ev("room", "-", t, time.monotonic())
    C.NodeCache.make_room = make_room

if os.environ.get("NOINPLACE"):
    from lading.core import checksums as _ck
    _ck.IN_PLACE = 1 << 62
