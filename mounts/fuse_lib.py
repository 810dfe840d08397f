"""Load mfusepy bound to libfuse 3 when it is installed.

mfusepy looks for ``libfuse.so`` (FUSE 2) first. FUSE 2 caps kernel reads at 128 KiB, which
costs a Python daemon eight callbacks per MiB, so we point it at libfuse 3 before importing it.
"""

from __future__ import annotations

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
        raise ProblemFound(f"cannot load libfuse: {err}",
                           "install FUSE 3 (Debian/Ubuntu: apt-get install fuse3 libfuse3-3)") from err
    return mfusepy

