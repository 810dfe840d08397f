"""Timeline of one `lading sync`: python run.py T0 args... ; prints ms since T0 (parent's time.time() before spawn)."""
import sys, time, os, importlib.abc, importlib.machinery, functools
T0 = float(sys.argv[1]); sys.argv = ["lading"] + sys.argv[2:]
EV = []
def mark(name):
    EV.append((time.time(), name, time.process_time()))
mark("wrapper start (interpreter up)")
def wrap(mod, attr, label=None, first_only=False, cls=None):
    owner = getattr(mod, cls) if cls else mod
    fn = getattr(owner, attr)
    label = label or f"{mod.__name__.split('.')[-1]}.{(cls + '.') if cls else ''}{attr}"
    import inspect
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def w(*a, **k):
            mark(label + " start")
            try: return await fn(*a, **k)
            finally: mark(label + " end")
    else:
        @functools.wraps(fn)
        def w(*a, **k):
            mark(label + " start")
            try: return fn(*a, **k)
            finally: mark(label + " end")
    if isinstance(owner.__dict__.get(attr), classmethod):
        w = classmethod(w.__wrapped__ and (lambda c, *a, **k: (mark(label+" start"), fn(*a, **k), mark(label+" end"))[1]))
    setattr(owner, attr, w)
HOOKS = {
    "lading.cli.main": lambda m: (mark("cli.main imported"), wrap(m, "main")),
    "lading.cli.cmd_sync": lambda m: mark("cmd_sync imported"),
    "lading.stores": lambda m: wrap(m, "open_store"),
    "lading.stores.listing": lambda m: None,
    "lading.sync.run": lambda m: wrap(m, "run_sync"),
    "lading.sync.into": lambda m: (wrap(m, "_plan_and_apply"), wrap(m, "exclusive_lock")),
    "lading.sync.plan": lambda m: wrap(m, "plan_listing"),
    "lading.transfer.files": lambda m: (wrap(m, "save", cls="ResumeRecord"), wrap(m, "remove_temporaries"), wrap(m, "ensure_parent", cls="DirectoryMaker")),
    "lading.stores.iocore": lambda m: (wrap(m, "shutdown"), wrap(m, "io_core")),
    "lading.sync.apply": lambda m: (wrap(m, "apply_plan"), wrap(m, "_batches"), wrap(m, "_fetch_batch")),
    "lading.transfer.engine": lambda m: (wrap(m, "preallocate"), wrap(m, "_open_large", cls="_Engine"), wrap(m, "remove_temporaries"), wrap(m, "fetch_all"), wrap(m, "download_parts"), wrap(m, "publish"), wrap(m, "_large", cls="_Engine"), wrap(m, "_check", cls="_Engine")),
    "lading.sync.state": lambda m: (wrap(m, "save", cls="SyncState"), wrap(m, "close", cls="SyncState"), wrap(m, "begin", cls="SyncState")),
}
N = {"pw": 0}
def hook_download(m):
    orig = m.pwrite_all
    def pw(fd, data, off):
        if N["pw"] == 0: mark("first pwrite_all")
        N["pw"] += 1
        orig(fd, data, off)
        N["last"] = time.time()
    m.pwrite_all = pw
HOOKS["lading.stores.download"] = hook_download
class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in HOOKS: return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None: return None
        orig = spec.loader.exec_module
        def exec_module(module):
            orig(module); HOOKS[name](module)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Finder())
real_exit = os._exit
def _exit(code):
    mark("os._exit")
    if "last" in N: EV.append((N["last"], f"last pwrite_all ({N['pw']} calls)", 0.0))
    out = "\n".join(f"{(t - T0) * 1000:8.1f} ms  cpu {c*1000:7.1f}  {n}" for t, n, c in sorted(EV))
    os.write(2, (out + "\n").encode())
    real_exit(code)
os._exit = _exit
import atexit
import runpy
runpy.run_module("lading", run_name="__main__", alter_sys=True)
