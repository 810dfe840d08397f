"""Counters the daemon keeps and dumps on SIGUSR1 and at unmount."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class Stats:
    """Request, byte and cache counters; latencies in seconds (a bounded sample)."""

    started: float = field(default_factory=time.monotonic)
    requests: int = 0
    request_errors: int = 0
    bytes_fetched: int = 0
    reads: int = 0
    bytes_served: int = 0
    read_errors: int = 0
    read_timeouts: int = 0
    opens: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    wait_us: int = 0  # total time readers waited for the store
    ttfb: list[float] = field(default_factory=list)  # open -> first read answered
    get_latency: list[float] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        """Increment counters by name."""
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def sample(self, name: str, seconds: float) -> None:
        """Record a latency (the first 100,000 of each kind are kept)."""
        values = getattr(self, name)
        if len(values) < 100_000:
            values.append(seconds)

    def snapshot(self) -> dict[str, object]:
        """A JSON-able summary."""
        with self._lock:
            out: dict[str, object] = {
                name: getattr(self, name)
                for name in (
                    "requests",
                    "request_errors",
                    "bytes_fetched",
                    "reads",
                    "bytes_served",
                    "read_errors",
                    "read_timeouts",
                    "opens",
                    "memory_hits",
                    "disk_hits",
                    "misses",
                    "wait_us",
                )
            }
            out["uptime_s"] = round(time.monotonic() - self.started, 3)
            out["ttfb_ms"] = _percentiles(self.ttfb)
            out["get_ms"] = _percentiles(self.get_latency)
        return out


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {"n": len(ordered), "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": pick(1.0)}
