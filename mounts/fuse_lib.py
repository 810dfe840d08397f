"""Load mfusepy bound to libfuse 3 when it is installed.

mfusepy looks for ``libfuse.so`` (FUSE 2) first. FUSE 2 caps kernel reads at 128 KiB, which
costs a Python daemon eight callbacks per MiB, so we point it at libfuse 3 before importing it.
"""

from __future__ import annotations

import ctypes
import os
from ctypes.util import find_library
from types import ModuleType

from lading.stores import ProblemFound


def load_mfusepy() -> ModuleType:
    """Import mfusepy, preferring libfuse 3; one-line error when no libfuse is installed."""
    if not os.environ.get("FUSE_LIBRARY_PATH") and not os.environ.get("FUSE_LIBRARY_NAME"):
        path = find_library("fuse3")
        if path:
            os.environ["FUSE_LIBRARY_PATH"] = path
    try:
        import mfusepy
    except OSError as err:
        raise ProblemFound(
            f"cannot load libfuse: {err}", "install FUSE 3 (Debian/Ubuntu: apt-get install fuse3 libfuse3-3)"
        ) from err
    _quiet_libfuse_log(mfusepy)
    return mfusepy


#: Formats of libfuse log messages that mean nothing to a user. libfuse >= 3.12 started through
#: fuse_main (as mfusepy does) fills its unset thread limit with UINT_MAX, then logs that it
#: ignores that value and uses its default.
LIBFUSE_NOISE = (b"Ignoring invalid max threads value",)
_log_callback: object = None  # the installed callback, kept alive for libfuse


def _quiet_libfuse_log(mfusepy: ModuleType) -> None:
    """Install a libfuse log function (``fuse_set_log_func``, libfuse >= 3.7) that drops
    :data:`LIBFUSE_NOISE` and prints everything else on stderr as libfuse would."""
    global _log_callback
    if _log_callback is not None:
        return
    libfuse = getattr(mfusepy, "_libfuse", None)
    set_log_func = getattr(libfuse, "fuse_set_log_func", None)
    if set_log_func is None:  # libfuse 2, or before 3.7: nothing to quiet
        return
    try:
        libc = ctypes.CDLL(find_library("c") or "libc.so.6")
        vfprintf, stderr = libc.vfprintf, ctypes.c_void_p.in_dll(libc, "stderr")
    except (OSError, AttributeError, ValueError):
        return
    vfprintf.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]  # va_list: passed as a pointer
    log_func = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

    def log(level: int, fmt: bytes | None, args: int | None) -> None:
        if fmt is None or fmt.startswith(LIBFUSE_NOISE):
            return
        vfprintf(stderr, fmt, args)

    _log_callback = log_func(log)
    set_log_func.argtypes = [log_func]
    set_log_func.restype = None
    set_log_func(_log_callback)
