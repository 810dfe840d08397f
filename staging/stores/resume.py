"""Whole-object reads that resume a cut body from the bytes received, pinned to one version."""

from __future__ import annotations

from typing import Any, Callable

from lading.core.errors import TransientError
from lading.core.retry import RetryPolicy, with_retries
from lading.stores.base import Fetched, ProgressCallback


def resume_into(stream: Callable[..., Fetched], where: str, policy: RetryPolicy, key: str,
                write: Callable[[memoryview], Any], version: str | None,
                progress: ProgressCallback | None) -> int:
    """Fetch a whole object through ``write`` with ``stream`` (a store's one-GET stream), resuming
    a cut body with Range requests pinned to the version of the first answer; returns the size."""
    written = 0
    pinned = version
    size: int | None = None

    def sink(chunk: memoryview) -> None:
        nonlocal written
        write(chunk)
        written += len(chunk)
        if progress is not None:
            progress(len(chunk))

    def pin(version: str) -> None:
        nonlocal pinned
        pinned = pinned or version or None

    def attempt() -> None:
        nonlocal size
        if size is not None and written >= size:
            return
        fetched = stream(key, sink, pinned, written, on_version=pin)
        size = fetched.size
        if written != size:
            raise TransientError(f"{where}: got {written} of {size} bytes")

    with_retries(attempt, policy)
    return written


__all__ = ["resume_into"]
