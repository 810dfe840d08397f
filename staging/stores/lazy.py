"""SDK call translation; per-process clients live in :mod:`lading.stores.process`."""

from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


def translated(operation: Callable[[], T], translate: Callable[[BaseException, str], BaseException], what: str) -> T:
    """Run ``operation`` once; an SDK error comes out as the backend's translation (no retry)."""
    try:
        return operation()
    except Exception as err:
        mapped = translate(err, what)
        if mapped is err:
            raise
        raise mapped from err
