"""The one retry routine: exponential backoff with full jitter, for transient failures only.

Every retried operation counts its attempts in an :class:`Attempts` (what to wait, when to give
up); :func:`with_retries` drives one from a thread, :func:`with_retries_async` from a coroutine
on the I/O core. Resuming a cut body (:mod:`lading.stores.download`) counts its failures in an
``Attempts`` too.

An endpoint that has never answered a single request in this process (a load balancer with no
targets accepts connections and never answers) gets at most :data:`SILENT_ATTEMPTS` attempts in
all, not the policy's per request, and each retry after a request went unanswered is said once
on the ``lading.core.retry`` logger at WARNING (which endpoint, attempt n of m), so a command does
not sit silent for minutes.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

from lading.core.errors import NoAnswer, TransientError

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Attempts in all (across requests) against an endpoint that has never answered in this process.
SILENT_ATTEMPTS = 3


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient failure. ``endpoint`` names where the requests
    go (an URL, for messages and for :data:`SILENT_ATTEMPTS`; empty: not tracked)."""

    attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 10.0
    endpoint: str = ""

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based), with full jitter."""
        import random  # only when a retry happens: it costs start-up otherwise

        return random.uniform(0, min(self.max_delay, self.base_delay * (2 ** (attempt - 1))))


DEFAULT_POLICY = RetryPolicy()


class _Endpoints:
    """Per endpoint: whether it ever answered, and how many requests it left unanswered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answered: set[str] = set()
        self._silent: dict[str, int] = {}
        self._said: set[tuple[str, int]] = set()

    def answered(self, endpoint: str) -> None:
        if endpoint and endpoint not in self._answered:
            with self._lock:
                self._answered.add(endpoint)

    def ever_answered(self, endpoint: str) -> bool:
        return endpoint in self._answered

    def unanswered(self, endpoint: str) -> int:
        """Count one more unanswered request; return the count."""
        with self._lock:
            self._silent[endpoint] = self._silent.get(endpoint, 0) + 1
            return self._silent[endpoint]

    def first_time(self, endpoint: str, attempt: int) -> bool:
        """Whether "retrying, attempt ``attempt``" is news for this endpoint (said once each)."""
        with self._lock:
            if (endpoint, attempt) in self._said:
                return False
            self._said.add((endpoint, attempt))
            return True


_ENDPOINTS = _Endpoints()


def note_answer(endpoint: str) -> None:
    """``endpoint`` answered a request (any HTTP response, an error status included)."""
    _ENDPOINTS.answered(endpoint)


class Attempts:
    """The attempts of one operation under ``policy``: :meth:`failed` after each transient
    failure says how long to wait before the next attempt, or re-raises when none is left."""

    def __init__(self, policy: RetryPolicy = DEFAULT_POLICY) -> None:
        self.policy = policy
        self.failures = 0

    def succeeded(self) -> None:
        """The operation got its answer (its endpoint is alive)."""
        note_answer(self.policy.endpoint)

    def failed(self, err: TransientError) -> float:
        """Seconds to wait before trying again after ``err``; raises ``err`` when out of attempts."""
        self.failures += 1
        endpoint = self.policy.endpoint
        limit = self.policy.attempts
        attempt = self.failures + 1  # the one about to start
        if isinstance(err, NoAnswer) and endpoint and not _ENDPOINTS.ever_answered(endpoint):
            limit = min(limit, SILENT_ATTEMPTS)
            attempt = _ENDPOINTS.unanswered(endpoint) + 1  # counted across requests
            if attempt > limit:
                raise err
            if _ENDPOINTS.first_time(endpoint, attempt):
                log.warning(
                    "no answer from %s (%s); retrying, attempt %d of %d", endpoint, _reason(err), attempt, limit
                )
            return self.policy.delay(self.failures)
        if not isinstance(err, NoAnswer):
            note_answer(endpoint)  # an error status is an answer
        if self.failures >= limit:
            raise err
        log.info("retrying after a transient error (attempt %d of %d): %s", attempt, limit, err)
        return self.policy.delay(self.failures)


def with_retries(
    operation: Callable[[], T],
    policy: RetryPolicy = DEFAULT_POLICY,
    on_retry: Callable[[int, TransientError], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``operation``; retry it on :class:`TransientError` (incl. throttling) only.

    The last error is re-raised once the attempts are used up (see :class:`Attempts`).
    """
    attempts = Attempts(policy)
    while True:
        try:
            result = operation()
        except TransientError as err:
            delay = attempts.failed(err)
            if on_retry is not None:
                on_retry(attempts.failures, err)
            sleep(delay)
            continue
        attempts.succeeded()
        return result


async def with_retries_async(operation: Callable[[], Awaitable[T]], policy: RetryPolicy = DEFAULT_POLICY) -> T:
    """:func:`with_retries` for a coroutine (each attempt a fresh ``operation()``), waiting on the loop."""
    import asyncio  # here: a command that never reads objects does not import it

    attempts = Attempts(policy)
    while True:
        try:
            result = await operation()
        except TransientError as err:
            await asyncio.sleep(attempts.failed(err))
            continue
        attempts.succeeded()
        return result


def _reason(err: BaseException) -> str:
    text = str(err)
    return text if len(text) <= 160 else text[:157] + "..."


__all__ = [
    "Attempts",
    "DEFAULT_POLICY",
    "RetryPolicy",
    "SILENT_ATTEMPTS",
    "note_answer",
    "with_retries",
    "with_retries_async",
]
