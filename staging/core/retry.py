"""Exponential backoff with full jitter, for transient and throttled failures only."""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from lading.core.errors import TransientError

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient failure."""

    attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 10.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based), with full jitter."""
        return random.uniform(0, min(self.max_delay, self.base_delay * (2 ** (attempt - 1))))


DEFAULT_POLICY = RetryPolicy()


def with_retries(
    operation: Callable[[], T],
    policy: RetryPolicy = DEFAULT_POLICY,
    on_retry: Callable[[int, TransientError], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``operation``; retry it on :class:`TransientError` (incl. throttling) only.

    The last error is re-raised once ``policy.attempts`` are used up.
    """
    attempt = 1
    while True:
        try:
            return operation()
        except TransientError as err:
            if attempt >= policy.attempts:
                raise
            log.info("retrying after a transient error (attempt %d of %d): %s", attempt, policy.attempts, err)
            if on_retry is not None:
                on_retry(attempt, err)
            sleep(policy.delay(attempt))
            attempt += 1
