"""The detached mount daemon: double fork, a pipe back to the waiting command, clean stops.

The daemon reports over the pipe: its pid (written by the intermediate child, so the command
always knows whom to stop), then ``ready <pid>`` or ``error <exit code> <message>``. Ctrl-C in
the command before the mount is ready stops the daemon; nothing is left mounted.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Callable

from lading import stores as errors
from lading.core.locks import process_alive
from lading.mounts.options import MountOptions, MountReady

log = logging.getLogger("lading.mount")


def spawn_daemon(options: MountOptions, run: Callable[[Callable[[], None]], None]) -> MountReady:
    """Fork the detached daemon, which calls ``run(on_ready)``; return once it is mounted."""
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
        _daemon_main(options, write_fd, run)  # never returns
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
    if pid and process_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)  # auto_unmount then removes any mount it left


def _wait_mounted(path: Path, pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.ismount(path):
        if not process_alive(pid):
            raise errors.ProblemFound(f"the mount daemon exited while mounting {path}")
        if time.monotonic() > deadline:
            raise errors.ProblemFound(f"{path} did not appear as a mount point within {timeout:g}s")
        time.sleep(0.01)


def _error_for_code(code: int) -> type[errors.LadingError]:
    return {2: errors.UsageError, 3: errors.NotFound, 4: errors.AccessDenied, 5: errors.TransientError}.get(
        code, errors.ProblemFound
    )


def _daemon_main(options: MountOptions, report_fd: int, run: Callable[[Callable[[], None]], None]) -> None:
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
        run(lambda: report(f"ready {os.getpid()}"))
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


def start_unmount_watchdog(mountpoint: Path) -> int:
    """Fork a tiny process that lazily unmounts ``mountpoint`` if the daemon dies mounted.

    libfuse's ``auto_unmount`` helper does this too, but in about one test run in twenty it
    left the mount behind after SIGKILL; this second line of defence waits for the daemon's end
    of a pipe to close (the daemon exiting, however it exits) and unmounts only if the mount is
    still listed as ours. Call it before FUSE starts: the watchdog must not hold /dev/fuse.
    """
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)  # fusermount3, exec'd later, must not keep it
    pid = os.fork()
    if pid != 0:
        os.close(read_fd)
        _keep.append(write_fd)  # closed by the kernel when the daemon exits
        return pid
    os.close(write_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the daemon's to handle
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.read(read_fd, 1)  # returns when every write end is closed: the daemon is gone
        if _still_mounted_by_us(mountpoint):
            import shutil
            import subprocess

            tool = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount"
            subprocess.run([tool, "-u", "-z", str(mountpoint)], capture_output=True)
    finally:
        os._exit(0)


_keep: list[int] = []


def _still_mounted_by_us(mountpoint: Path) -> bool:
    target = str(mountpoint).replace(" ", "\\040")
    try:
        with open("/proc/self/mounts") as mounts:
            return any(
                fields[1] == target and fields[0].startswith("lading:")
                for fields in (line.split() for line in mounts)
                if len(fields) > 1
            )
    except OSError:
        return False
