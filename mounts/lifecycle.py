"""Start, serve and stop a mount.

``mount()`` returns only once the kernel serves the mount point. By default the daemon runs
detached (double fork); ``foreground=True`` serves in the calling process. The daemon creates
its store client, thread pool and tree *after* forking, so no SDK state crosses a fork.

The detached daemon's fork and report pipe live in :mod:`lading.mounts.daemon`. libfuse's
``auto_unmount`` (a ``fusermount3`` helper watching the daemon) unmounts if the daemon dies;
SIGTERM/SIGINT unmount cleanly (libfuse's handlers); SIGUSR1 logs the stats.
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
from dataclasses import replace
from pathlib import Path
from typing import Callable

from lading import stores as errors
from lading.mounts.cache import DiskCache
from lading.mounts.daemon import spawn_daemon, start_unmount_watchdog
from lading.mounts.listing import build_tree
from lading.mounts.memory import rss_bytes
from lading.mounts.options import DEFAULT_MAX_MEMORY, MountOptions, MountReady, buffer_budget
from lading.mounts.reader import Reader
from lading.mounts.stats import Stats
from lading.stores import open_store

log = logging.getLogger("lading.mount")

__all__ = ["DEFAULT_MAX_MEMORY", "MountOptions", "MountReady", "check_mountpoint", "mount", "resolved", "unmount"]

ATTR_TIMEOUT = 3600.0  # the tree is immutable: the kernel may cache names and attributes
READAHEAD_KIB = 4096  # the kernel then keeps several 1 MiB requests (256 pages) in flight
READAHEAD_WAIT = 2.0  # seconds to find the mount's device in /proc/self/mountinfo (there once mounted)
SWITCH_INTERVAL = 0.0005
# glibc mallopt parameters and the daemon's values (see _steady_allocator).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD = 32 << 20  # GET buffers (at most 8 MiB) come from the heap, reused
# A sequential reader's parts (4 MiB, about eight in flight) are freed and allocated again at the
# top of the heap: at 16 MiB glibc gave them back and faulted them in again, 52,000-97,000 page
# faults per cold GiB against 16,000-19,000 at 32 MiB, ~0.15 CPU-s (RGW, 2026-11-27, session 11).
# Peak RSS is the same (what is kept free was in use just before); OVERHEAD in options.py counts it.
TRIM_THRESHOLD = 32 << 20
ARENA_MAX = 2  # the store client's threads share two heaps: what each keeps free counts twice, not per core


def check_mountpoint(path: Path) -> None:
    """Refuse a mount point that is missing, not a directory, already mounted, or under a
    directory this user may not enter."""
    try:
        path.stat()
    except PermissionError:
        raise errors.AccessDenied(f"permission denied: cannot reach the mount point {path}") from None
    except OSError:
        pass  # missing: said below
    if not path.exists():
        raise errors.NotFound(f"mount point {path} does not exist", f"create it: mkdir -p {path}")
    if not path.is_dir():
        raise errors.UsageError(f"mount point {path} is not a directory")
    if os.path.ismount(path):
        raise errors.UsageError(f"{path} is already a mount point", f"lading unmount {path}")


def _check_cache_dir(path: Path) -> None:
    """Refuse a cache directory this user may not read, write or enter (exit 4), before detaching."""
    if path.exists() and not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise errors.AccessDenied(f"permission denied: cannot use the cache directory {path}")


def _check_log_file(path: Path) -> None:
    """Refuse a log file that cannot be appended to (the daemon could not say why it failed)."""
    try:
        with open(path, "a"):
            pass
    except PermissionError as err:
        raise errors.AccessDenied(f"permission denied: cannot write the log file {path}") from err
    except OSError as err:
        raise errors.UsageError(f"cannot write the log file {path}: {err.strerror or err}") from err


def resolved(options: MountOptions) -> MountOptions:
    """``options`` with a local source (a directory or a snapshot file) as an absolute path, and
    every other path absolute: the detached daemon runs in ``/``, where a relative path names
    something else. The mount point also without symlinks: the kernel mounts on a link's target,
    and a symlink itself is never a mount point (waiting for one timed out)."""
    uri = errors.parse_uri(options.source)
    source = uri.prefix if uri.scheme == "file" else options.source

    def absolute(path: Path | None) -> Path | None:
        return None if path is None else path.absolute()

    view = options.view
    if view.manifest is not None:
        view = replace(view, manifest=view.manifest.absolute())
    return replace(
        options,
        source=source,
        mountpoint=Path(os.path.realpath(options.mountpoint)),
        view=view,
        cache_dir=absolute(options.cache_dir),
        log_file=absolute(options.log_file),
    )


def mount(options: MountOptions, on_ready: Callable[[MountReady], None] | None = None) -> MountReady:
    """Mount and return once ready (daemon), or serve until unmounted (foreground). Relative
    paths in ``options`` are resolved against the caller's working directory first."""
    options = resolved(options)
    check_mountpoint(options.mountpoint)
    if options.log_file is not None:
        _check_log_file(options.log_file)
    if options.cache_dir is not None:
        _check_cache_dir(options.cache_dir)
    from lading.mounts.fuse_lib import load_mfusepy

    load_mfusepy()  # fail here, in the caller, when libfuse is missing
    if options.foreground:
        return _serve_foreground(options, on_ready)
    return spawn_daemon(options, lambda on_ready: _run_daemon(options, on_ready))


def _run_daemon(options: MountOptions, on_ready: Callable[[], None]) -> None:
    _configure_logging(options, to_stderr=options.log_file is not None)
    _steady_allocator()
    _serve(options, on_ready)


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
    # lading's own loggers and mfusepy's, never the root logger (a caller's logging stays theirs).
    for name in ("lading", "fuse"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
        logger.setLevel(level)
    if not options.debug:
        logging.getLogger("fuse").setLevel(logging.WARNING)  # mfusepy logs every errno at DEBUG


def _serve(options: MountOptions, on_init: Callable[[], None]) -> None:
    """List, build the tree and the reader, and run FUSE until unmounted."""
    from lading.mounts.fs import make_fuse_class, make_operations
    from lading.mounts.fuse_lib import load_mfusepy

    mfusepy = load_mfusepy()
    # SIGUSR1 goes to the stats thread's sigwait only: block it before any thread starts (FUSE's,
    # and obstore's runtime threads, which the listing below starts), so every thread inherits it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    # FUSE callbacks wait for the GIL while fetch threads hold it; hand it over sooner.
    sys.setswitchinterval(SWITCH_INTERVAL)
    started = time.monotonic()
    # Before listing, which can take minutes: a bad cache directory fails at once.
    disk = DiskCache(options.cache_dir, options.cache_size) if options.cache_dir else None
    store = open_store(options.source, options.store)
    tree = build_tree(store, options.source, options.view, options.reader.concurrency)
    _return_listing_memory()
    log.info(
        "listed %s: %d files, %d directories, %d bytes in %.2fs",
        options.source,
        tree.file_count,
        tree.dir_count,
        tree.total_bytes,
        time.monotonic() - started,
    )
    for reason, count in tree.hidden.counts.items():
        if count:
            examples = ", ".join(repr(k) for k in getattr(tree.hidden, reason))
            log.warning("%d %s key(s) hidden, e.g. %s", count, reason, examples)
    stats = Stats()
    daemon_rss = rss_bytes()
    buffers = buffer_budget(options.max_memory, daemon_rss)
    log.info(
        "memory budget %d MiB: %d MiB for file data (the daemon holds %d MiB once listed)%s",
        options.max_memory >> 20,
        buffers >> 20,
        daemon_rss >> 20,
        "; raise --max-memory" if buffers > options.max_memory - daemon_rss else "",
    )
    reader = Reader(store, replace(options.reader, max_memory=buffers), disk, stats, tree.entry, tree.file_count)
    start_unmount_watchdog(options.mountpoint)

    def dump() -> None:
        snapshot = stats.snapshot()
        snapshot.update(
            memory_held=reader.held,
            memory_buffers=reader.budget,
            memory_budget=options.max_memory,
            rss=rss_bytes(),
            disk_held=disk.held if disk is not None else 0,
        )
        log.info("stats %s", json.dumps(snapshot, sort_keys=True))

    threading.Thread(target=_stats_on_signal, args=(dump,), daemon=True, name="lading-stats").start()
    served = threading.Event()

    def initialised() -> None:
        served.set()
        on_init()

    # On the first request, not at init: the kernel lowers the readahead to libfuse's answer to
    # INIT after init returns, and the first request (the waiting command's stat) comes after that
    # and before any file is opened (each file keeps the readahead it was opened with). Set on a
    # thread after init, it lost the race to the first open in one of two cold 1 GiB reads at load
    # 15: 8,192 FUSE reads of 128 KiB (bench/RESULTS.md, issue 28, session 7).
    operations = make_operations(
        mfusepy,
        tree,
        reader,
        on_init=initialised,
        on_first_request=lambda: tune_readahead(options.mountpoint, timeout=READAHEAD_WAIT),
    )
    fuse_options = _fuse_options(options, mfusepy)
    log.info(
        "mounting %s on %s (libfuse %d, options %s)",
        options.source,
        options.mountpoint,
        mfusepy.fuse_version_major,
        fuse_options,
    )
    try:
        make_fuse_class(mfusepy)(operations, str(options.mountpoint), foreground=True, **fuse_options)
    except RuntimeError as err:
        if served.is_set():  # libfuse's loop returns an error code when a signal stops it
            log.info("stopped by a signal (libfuse code %s)", err)
            return
        raise errors.ProblemFound(
            f"FUSE failed to mount {options.mountpoint}: {err}", "is /dev/fuse available, and fusermount3 installed?"
        ) from err
    finally:
        reader.close()
        dump()
        if served.is_set():
            log.info("unmounted %s", options.mountpoint)


def tune_readahead(mountpoint: Path, kib: int = READAHEAD_KIB, timeout: float = 10.0) -> bool:
    """Raise the mount's kernel readahead so sequential reads arrive as 1 MiB requests.

    The default (128 KiB) costs eight Python callbacks per MiB. Needs root; best effort. The
    mount's device number comes from /proc/self/mountinfo, never from a stat of the mount point:
    the daemon stat-ing its own mount waits on its own FUSE loop, and if the daemon is killed
    meanwhile that thread sleeps in the kernel forever, holding the dead mount's connection open.
    """
    deadline = time.monotonic() + timeout
    while (device := mount_device(mountpoint)) is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    knob = Path(f"/sys/class/bdi/{device}/read_ahead_kb")
    try:
        knob.write_text(str(kib))
    except OSError as err:
        log.info("kernel readahead left at its default (%s: %s)", knob, err.strerror)
        return False
    log.info("kernel readahead set to %d KiB", kib)
    return True


def mount_device(mountpoint: Path) -> str | None:
    """The ``major:minor`` of the lading mount at ``mountpoint`` from /proc/self/mountinfo (no
    file system request), or None when it is not mounted there."""
    target = os.path.abspath(mountpoint).replace("\\", "\\134").replace(" ", "\\040")
    try:
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) > 4 and fields[4] == target and " - fuse" in line:
                    return fields[2]
    except OSError:
        pass
    return None


def mount_type(mountpoint: Path) -> str | None:
    """The file system type (``fuse.lading``, ``tmpfs``...) of the topmost mount at ``mountpoint``
    from /proc/self/mountinfo, or None when it is not found there."""
    target = os.path.realpath(mountpoint).replace("\\", "\\134").replace(" ", "\\040")
    kind = None
    try:
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:  # in mount order: the last one at the path is the one on top
                fields = line.split()
                _, dash, after = line.partition(" - ")
                if len(fields) > 4 and fields[4] == target and dash:
                    kind = after.split()[0]
    except OSError:
        pass
    return kind


def _steady_allocator() -> None:
    """Have glibc reuse freed GET buffers instead of mapping fresh memory for each (first touch of
    fresh memory costs a page fault per 4 KiB) and hand back what it keeps beyond a few MiB, so
    the daemon's RSS follows the bytes it holds. Only in the detached daemon, our own process
    (a foreground mount runs in the caller's)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        libc.mallopt(M_ARENA_MAX, ARENA_MAX)
    except (OSError, AttributeError):  # not glibc
        pass


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
    mountpoint = Path(os.path.realpath(mountpoint))  # a symlink to it names the mount too
    if not os.path.ismount(mountpoint):
        raise errors.NotFound(f"{mountpoint} is not a mount point")
    kind = mount_type(mountpoint)
    if kind is not None and kind != "fuse" and not kind.startswith("fuse."):  # root's fusermount unmounts anything
        raise errors.UsageError(
            f"{mountpoint} is a {kind} mount, not a FUSE mount: lading unmount only unmounts FUSE mounts",
            f"umount {mountpoint} if you mean it",
        )
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        raise errors.ProblemFound(
            "neither fusermount3 nor fusermount is installed", "install fuse3 (Debian/Ubuntu: apt-get install fuse3)"
        )
    argv = [tool, "-u", *(["-z"] if lazy else []), str(mountpoint)]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        detail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}"
        busy = "busy" in detail.lower()
        raise errors.ProblemFound(
            f"cannot unmount {mountpoint}: {detail}", "close the files open under it, or use --lazy" if busy else None
        )
    deadline = time.monotonic() + timeout
    while os.path.ismount(mountpoint):
        if time.monotonic() > deadline:
            raise errors.ProblemFound(f"{mountpoint} is still mounted {timeout:g}s after unmounting")
        time.sleep(0.01)
