"""Progress pieces shared by the commands: a tqdm byte bar on a terminal, a periodic line in logs.

``lading sync``, ``lading hook`` and ``lading pack`` each show "a bar on a TTY, a line every few
seconds otherwise"; the bar factory, the interval setting and the throttle live here.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Mapping

from lading.core.sizes import format_size
from lading.core.errors import UsageError

#: Seconds between progress lines when stderr is not a terminal (``LADING_PROGRESS_SECONDS``).
DEFAULT_INTERVAL = 5.0


def human(nbytes: float) -> str:
    """A size (or a rate) in binary units: ``"95.0 MiB"``."""
    return format_size(int(nbytes))


def counted(n: int, noun: str) -> str:
    """``1 file``, ``2 files``, ``3 directories``: the count and its noun, plural when needed."""
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{n:,} {noun if n == 1 else plural}"


def line_interval(env: Mapping[str, str] = os.environ) -> float:
    """Seconds between progress lines: ``LADING_PROGRESS_SECONDS`` or 5; a bad value is a usage error."""
    text = env.get("LADING_PROGRESS_SECONDS")
    if text is None:
        return DEFAULT_INTERVAL
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"LADING_PROGRESS_SECONDS={text!r} is not a number") from None
    if value < 0:
        raise UsageError(f"LADING_PROGRESS_SECONDS={text!r} must not be negative")
    return value


def byte_bar(total: int, desc: str) -> Any:
    """A transient tqdm bar of bytes on stderr (removed when closed)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=desc,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=False,
    )


class Throttle:
    """Says when the next periodic line is due, and the rate since the start. Not thread-safe."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.restart()

    def restart(self) -> None:
        """Start timing again (a new phase)."""
        self.started = self.last = time.monotonic()

    def due(self) -> bool:
        """True (and the clock reset) when ``interval`` seconds have passed since the last line."""
        now = time.monotonic()
        if now - self.last < self.interval:
            return False
        self.last = now
        return True

    def rate(self, nbytes: int) -> float:
        """Bytes per second since :meth:`restart`."""
        return nbytes / max(time.monotonic() - self.started, 1e-6)
