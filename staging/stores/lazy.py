"""SDK call translation; per-process clients live in :mod:`lading.stores.process`."""

from __future__ import annotations

from typing import Callable, TypeVar

from lading.stores.process import ProcessLocal

T = TypeVar("T")


#: Former name of :class:`lading.stores.process.ProcessLocal` (one registry reset at fork).
LazyClient = ProcessLocal


def translated(operation: Callable[[], T], translate: Callable[[Exception, str], Exception], what: str) -> T:
    """Run ``operation`` once; an SDK error comes out as the backend's translation (no retry)."""
    try:
        return operation()
    except Exception as err:
        mapped = translate(err, what)
        if mapped is err:
            raise
        raise mapped from err
