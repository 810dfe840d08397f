"""A client built on first use, shared by threads, and rebuilt in a forked child."""

from __future__ import annotations

import os
import threading
from typing import Callable, Generic, TypeVar

C = TypeVar("C")
T = TypeVar("T")


class LazyClient(Generic[C]):
    """Holds one SDK client per process.

    Threads share the client (boto3 clients and requests sessions are safe to share). After
    ``fork`` the child must not reuse the parent's connection pool (the sockets are shared with
    the parent), so a change of ``os.getpid()`` triggers a rebuild. The lock is recreated in the
    child too: a lock held by another thread at fork time would stay locked forever.
    """

    def __init__(self, factory: Callable[[], C]) -> None:
        self._factory = factory
        self._client: C | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def get(self) -> C:
        """The client for this process, building it if needed."""
        pid = os.getpid()
        if pid != self._pid:
            self._lock = threading.Lock()
            self._client = None
            self._pid = pid
        client = self._client
        if client is None:
            with self._lock:
                client = self._client
                if client is None:
                    client = self._factory()
                    self._client = client
        return client

    @property
    def built(self) -> bool:
        """Whether a client exists for this process (for tests and diagnostics)."""
        return self._client is not None and self._pid == os.getpid()


def translated(operation: Callable[[], T], translate: Callable[[Exception, str], Exception], what: str) -> T:
    """Run ``operation`` once; an SDK error comes out as the backend's translation (no retry)."""
    try:
        return operation()
    except Exception as err:
        mapped = translate(err, what)
        if mapped is err:
            raise
        raise mapped from err
