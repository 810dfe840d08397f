"""Start, serve and stop a mount.

``mount()`` returns only once the kernel serves the mount point. By default the daemon runs
detached (double fork); ``foreground=True`` serves in the calling process. The daemon creates
its store client, thread pool and tree *after* forking, so no SDK state crosses a fork.

The daemon reports to the waiting parent over a pipe: ``ready`` or ``error <exit code> <message>``.
libfuse's ``auto_unmount`` (a ``fusermount3`` helper watching the daemon) unmounts if the
daemon dies; SIGTERM/SIGINT unmount cleanly (libfuse's handlers); SIGUSR1 logs the stats.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mounts.cache import DiskCache
from mounts.listing import ViewSpec, build_tree
from mounts.reader import Reader, ReaderConfig
from mounts.stats import Stats
from staging import errors
from staging.stores import open_store
from staging.stores.base import StoreConfig

log = logging.getLogger("lading.mount")

ATTR_TIMEOUT = 3600.0  # the tree is immutable: the kernel may cache names and attributes
READAHEAD_KIB = 4096  # the kernel then keeps several 1 MiB requests (256 pages) in flight
SWITCH_INTERVAL = 0.0005


@dataclass(frozen=True)
class MountOptions:
    """Everything ``lading mount`` needs, resolved at the edge."""

    source: str
    mountpoint: Path
    store: StoreConfig = field(default_factory=StoreConfig)
    view: ViewSpec = field(default_factory=ViewSpec)
    reader: ReaderConfig = field(default_factory=ReaderConfig)
    cache_dir: Path | None = None
    cache_size: int = 10 << 30
    foreground: bool = False
    log_file: Path | None = None
    allow_other: bool = False
    debug: bool = False


@dataclass(frozen=True)
class MountReady:
    """What the caller learns once the mount is up."""

    mountpoint: Path
    pid: int
    seconds: float


def default_max_memory() -> int:
    """A modest share of RAM for buffers: 1/16 of it, between 128 MiB and 2 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 << 30
    return max(128 << 20, min(2 << 30, total // 16))


def check_mountpoint(path: Path) -> None:
    """Refuse a mount point that is missing, not a directory, or already mounted."""
    if not path.exists():
        raise errors.NotFound(f"mount point {path} does not exist", f"create it: mkdir -p {path}")
    if not path.is_dir():
        raise errors.UsageError(f"mount point {path} is not a directory")
    if os.path.ismount(path):
        raise errors.UsageError(f"{path} is already a mount point", f"lading unmount {path}")


def mount(options: MountOptions, on_ready: Callable[[MountReady], None] | None = None) -> MountReady:
    """Mount and return once ready (daemon), or serve until unmounted (foreground)."""
    check_mountpoint(options.mountpoint)
    from mounts.fuse_lib import load_mfusepy

    load_mfusepy()  # fail here, in the caller, when libfuse is missing
    if options.foreground:
        return _serve_foreground(options, on_ready)
    return _spawn_daemon(options)


def _serve_foreground(options: MountOptions, on_ready: Callable[[MountReady], None] | None) -> MountReady:
    started = time.monotonic()
    ready = MountReady(options.mountpoint, os.getpid(), 0.0)

    def announce() -> None:
        nonlocal ready
        ready = MountReady(options.mountpoint, os.getpid(), time.monotonic() - started)
        if on_ready is not None:
            on_ready(ready)

    _configure_logging(options, to_stderr=True)
    _serve(options, announce)
    return ready


def _spawn_daemon(options: MountOptions) -> MountReady:
    started = time.monotonic()
    read_fd, write_fd = os.pipe()
    # Ctrl-C waits until the daemon's pid is known, so that it can always be stopped.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    pid = os.fork()
    if pid == 0:  # first child: new session, then fork again so the daemon is no session leader
        os.close(read_fd)
        os.setsid()
        daemon = os.fork()
        if daemon != 0:
            os.write(write_fd, f"pid {daemon}\n".encode())
            os._exit(0)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        _daemon_main(options, write_fd)  # never returns
    os.close(write_fd)
    os.waitpid(pid, 0)
    reports = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace")
    first = reports.readline()
    daemon_pid = int(first.split()[1]) if first.startswith("pid ") else 0
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        message = reports.readline().strip()  # "ready N" or "error CODE MESSAGE"
        if message.startswith("ready "):
            _wait_mounted(options.mountpoint, daemon_pid)
            return MountReady(options.mountpoint, daemon_pid, time.monotonic() - started)
    except BaseException:  # Ctrl-C while listing, or the mount never appeared: leave nothing behind
        _stop_daemon(daemon_pid, options.mountpoint)
        raise
    finally:
        reports.close()
    if message.startswith("error "):
        _, code, text = message.split(" ", 2)
        raise _error_for_code(int(code))(text)
    where = f"; see {options.log_file}" if options.log_file else "; rerun with --foreground to see why"
    raise errors.ProblemFound(f"the mount daemon exited before the mount was ready{where}")


def _stop_daemon(pid: int, mountpoint: Path) -> None:
    """Stop a daemon that has not finished mounting (SIGTERM unmounts if it got that far)."""
    if pid and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)  # auto_unmount then removes any mount it left


def _wait_mounted(path: Path, pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.ismount(path):
        if not _alive(pid):
            raise errors.ProblemFound(f"the mount daemon exited while mounting {path}")
        if time.monotonic() > deadline:
            raise errors.ProblemFound(f"{path} did not appear as a mount point within {timeout:g}s")
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _error_for_code(code: int) -> type[errors.LadingError]:
    return {2: errors.UsageError, 3: errors.NotFound, 4: errors.AccessDenied,
            5: errors.TransientError}.get(code, errors.ProblemFound)


def _daemon_main(options: MountOptions, report_fd: int) -> None:
    """The detached daemon: redirect stdio, serve, report readiness or the failure; exit."""
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    if options.log_file is not None:
        out = os.open(options.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    else:
        out = null
    os.dup2(out, 1)
    os.dup2(out, 2)
    code = 0
    reported = False

    def report(text: str) -> None:
        nonlocal reported
        if not reported:
            reported = True
            os.write(report_fd, (text.replace("\n", " ") + "\n").encode())
            os.close(report_fd)

    try:
        _configure_logging(options, to_stderr=options.log_file is not None)
        _serve(options, lambda: report(f"ready {os.getpid()}"))
    except errors.LadingError as err:
        message = err.message + (f" (hint: {err.hint})" if err.hint else "")
        log.error("%s", message)
        report(f"error {err.exit_code} {message}")
        code = err.exit_code
    except BaseException as err:  # noqa: BLE001 - the daemon must always report and exit
        log.exception("mount daemon failed")
        report(f"error 1 internal error: {type(err).__name__}: {err}")
        code = 1
    finally:
        logging.shutdown()
        os._exit(code)


def _configure_logging(options: MountOptions, to_stderr: bool) -> None:
    level = logging.DEBUG if options.debug else logging.INFO
    handler: logging.Handler
    if options.foreground and options.log_file is not None:
        handler = logging.FileHandler(options.log_file)
    elif to_stderr:
        handler = logging.StreamHandler(sys.stderr)  # the daemon's stderr is the log file
    else:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    if not options.debug:
        logging.getLogger("fuse").setLevel(logging.WARNING)  # mfusepy logs every errno at DEBUG
        logging.getLogger("botocore").setLevel(logging.WARNING)


def _serve(options: MountOptions, on_init: Callable[[], None]) -> None:
    """List, build the tree and the reader, and run FUSE until unmounted."""
    from mounts.fs import make_fuse_class, make_operations
    from mounts.fuse_lib import load_mfusepy

    mfusepy = load_mfusepy()
    # FUSE callbacks wait for the GIL while fetch threads hold it; hand it over sooner.
    sys.setswitchinterval(SWITCH_INTERVAL)
    started = time.monotonic()
    store = open_store(options.source, options.store)
    tree = build_tree(store, options.source, options.view, options.reader.concurrency)
    _return_listing_memory()
    log.info("listed %s: %d files, %d directories, %d bytes in %.2fs", options.source, tree.file_count,
             tree.dir_count, tree.total_bytes, time.monotonic() - started)
    for reason, count in tree.hidden.counts.items():
        if count:
            examples = ", ".join(repr(k) for k in getattr(tree.hidden, reason))
            log.warning("%d %s key(s) hidden, e.g. %s", count, reason, examples)
    disk = DiskCache(options.cache_dir, options.cache_size) if options.cache_dir else None
    stats = Stats()
    reader = Reader(store, options.reader, disk, stats)
    def dump() -> None:
        snapshot = stats.snapshot()
        snapshot.update(memory_held=reader.memory.held, memory_budget=reader.memory.budget,
                        disk_held=disk.held if disk is not None else 0)
        log.info("stats %s", json.dumps(snapshot, sort_keys=True))

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # inherited by every FUSE thread
    threading.Thread(target=_stats_on_signal, args=(dump,), daemon=True, name="lading-stats").start()
    served = threading.Event()

    def initialised() -> None:
        served.set()
        threading.Thread(target=tune_readahead, args=(options.mountpoint,), daemon=True).start()
        on_init()

    operations = make_operations(mfusepy, tree, reader, on_init=initialised)
    fuse_options = _fuse_options(options, mfusepy)
    log.info("mounting %s on %s (libfuse %d, options %s)", options.source, options.mountpoint,
             mfusepy.fuse_version_major, fuse_options)
    try:
        make_fuse_class(mfusepy)(operations, str(options.mountpoint), foreground=True, **fuse_options)
    except RuntimeError as err:
        if served.is_set():  # libfuse's loop returns an error code when a signal stops it
            log.info("stopped by a signal (libfuse code %s)", err)
            return
        raise errors.ProblemFound(f"FUSE failed to mount {options.mountpoint}: {err}",
                                  "is /dev/fuse available, and fusermount3 installed?") from err
    finally:
        reader.close()
        dump()
        if served.is_set():
            log.info("unmounted %s", options.mountpoint)


def tune_readahead(mountpoint: Path, kib: int = READAHEAD_KIB, timeout: float = 10.0) -> bool:
    """Raise the mount's kernel readahead so sequential reads arrive as 1 MiB requests.

    The default (128 KiB) costs eight Python callbacks per MiB. Needs root; best effort.
    """
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mountpoint):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    st = os.stat(mountpoint)
    knob = Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb")
    try:
        knob.write_text(str(kib))
    except OSError as err:
        log.info("kernel readahead left at its default (%s: %s)", knob, err.strerror)
        return False
    log.info("kernel readahead set to %d KiB", kib)
    return True


def _return_listing_memory() -> None:
    """Give the listing's transient memory back to the OS (it is several times the tree's)."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _stats_on_signal(dump: Callable[[], None]) -> None:
    while True:
        signal.sigwait({signal.SIGUSR1})
        dump()


def _fuse_options(options: MountOptions, mfusepy: object) -> dict[str, object]:
    fuse_options: dict[str, object] = {
        "ro": True,
        "fsname": f"lading:{options.source}"[:200].replace(",", "_"),
        "subtype": "lading",
        "kernel_cache": True,
        "attr_timeout": ATTR_TIMEOUT,
        "entry_timeout": ATTR_TIMEOUT,
        "negative_timeout": ATTR_TIMEOUT,
        "default_permissions": True,
    }
    if getattr(mfusepy, "fuse_version_major", 2) == 3:
        fuse_options["auto_unmount"] = True
    if options.allow_other:
        fuse_options["allow_other"] = True
    return fuse_options


def unmount(mountpoint: Path, lazy: bool = False, timeout: float = 10.0) -> None:
    """Unmount a FUSE mount point with fusermount3 (or fusermount), and wait until it is gone."""
    if not os.path.ismount(mountpoint):
        raise errors.NotFound(f"{mountpoint} is not a mount point")
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        raise errors.ProblemFound("neither fusermount3 nor fusermount is installed",
                                  "install fuse3 (Debian/Ubuntu: apt-get install fuse3)")
    argv = [tool, "-u", *(["-z"] if lazy else []), str(mountpoint)]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        detail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}"
        busy = "busy" in detail.lower()
        raise errors.ProblemFound(f"cannot unmount {mountpoint}: {detail}",
                                  "close the files open under it, or use --lazy" if busy else None)
    deadline = time.monotonic() + timeout
    while os.path.ismount(mountpoint):
        if time.monotonic() > deadline:
            raise errors.ProblemFound(f"{mountpoint} is still mounted {timeout:g}s after unmounting")
        time.sleep(0.01)
