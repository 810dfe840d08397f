"""The claim on a dataset version: one store object that elects one builder (or remover).

``_lading_claim.json`` in the version's folder is created only if absent (see
:mod:`lading.stores.claims`), so among any number of processes on any number of nodes exactly
one creates it. Its holder rewrites it every ``ttl / 4`` seconds (the heartbeat), each time only
if it is still the version it wrote last: a holder that finds it replaced has lost the claim
and stops before publishing anything.

**Expiry without trusting clocks.** A waiter judges a claim expired when it has seen the same
version of the object (ETag / generation / digest) for longer than the claim's TTL by its own
monotonic clock, so nodes' clocks never need to agree. A claim whose recorded heartbeat is more
than two TTLs old by the waiter's wall clock is expired at once (a builder that died long ago
costs no wait). An expired claim is taken over by a conditional replace of exactly the version
seen: of many waiters, one wins.

**Failure.** A builder whose function raises rewrites its claim as ``failed`` with the error:
the processes that were waiting for that build raise it too (a bug fails every rank at once);
a process that comes later takes the failed claim over at once and builds again.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from lading.core.errors import LadingError, ProblemFound
from lading.datalayer.layout import BUILD_PREFIX, CLAIM_KEY
from lading.stores import claims
from lading.stores.base import Store

log = logging.getLogger(__name__)

FORMAT = "lading-claim-1"
DEFAULT_TTL = 60.0


class ClaimLost(ProblemFound):
    """This process's claim was taken over (it stalled for longer than the TTL)."""


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return str(os.getuid())


@dataclass
class ClaimRecord:
    """What the claim object holds."""

    owner: str = field(default_factory=lambda: uuid.uuid4().hex)
    purpose: str = "build"  # or "remove"
    state: str = "building"  # "building" (or removing) while held, "failed" after a failed build
    fingerprint: str = ""
    ttl: float = DEFAULT_TTL
    build: str = field(default_factory=lambda: BUILD_PREFIX + uuid.uuid4().hex[:12])
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    user: str = field(default_factory=_user)
    started_at: float = field(default_factory=time.time)
    heartbeat_at: float = field(default_factory=time.time)
    beats: int = 0
    error: str | None = None
    format: str = FORMAT

    def to_bytes(self) -> bytes:
        """The object's bytes (JSON)."""
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def parse(cls, data: bytes) -> "ClaimRecord":
        """A record from the object's bytes; an unreadable one is a live claim of unknown owner."""
        try:
            document = json.loads(data)
            known = {name: document[name] for name in cls.__dataclass_fields__ if name in document}
            record = cls(**known)
            record.ttl = float(record.ttl)
            record.heartbeat_at = float(record.heartbeat_at)
            return record
        except (ValueError, TypeError, AttributeError):
            return cls(owner="unknown", fingerprint="", host="?", pid=0, user="?", heartbeat_at=time.time())

    def describe(self) -> str:
        """``pid 123 on host by user``."""
        return f"pid {self.pid} on {self.host} (user {self.user})"

    def heartbeat_age(self, now: float | None = None) -> float:
        """Seconds since the last heartbeat, by this machine's wall clock."""
        return max(0.0, (time.time() if now is None else now) - self.heartbeat_at)


class Observer:
    """Decides whether other processes' claims are expired (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.clock, self.wall = clock, wall
        self._first_seen: dict[str, float] = {}

    def expired(self, record: ClaimRecord, version: str) -> bool:
        """Whether the claim at ``version`` may be taken over now."""
        first = self._first_seen.setdefault(version, self.clock())
        if self.clock() - first >= record.ttl:
            return True
        return record.heartbeat_age(self.wall()) > 2 * record.ttl

    def remaining(self, record: ClaimRecord, version: str) -> float:
        """Seconds until the claim at ``version`` expires unless its holder beats."""
        first = self._first_seen.setdefault(version, self.clock())
        return max(0.0, record.ttl - (self.clock() - first))


class Claim:
    """A claim this process holds: beats, confirms, fails or releases it."""

    def __init__(self, store: Store, record: ClaimRecord, version: str) -> None:
        self.store, self.record, self.version = store, record, version
        self.lost = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def create(cls, store: Store, record: ClaimRecord) -> "Claim | None":
        """Claim a version nobody has claimed; None when another process was first."""
        version = claims.create(store, CLAIM_KEY, record.to_bytes())
        return None if version is None else cls(store, record, version)

    @classmethod
    def take_over(cls, store: Store, record: ClaimRecord, seen: str) -> "Claim | None":
        """Replace an expired (or failed) claim seen at version ``seen``; None when another
        process replaced (or removed) it first."""
        version = claims.replace(store, CLAIM_KEY, record.to_bytes(), seen)
        return None if version is None else cls(store, record, version)

    # -- heartbeat ---------------------------------------------------------------------------------

    def beat(self) -> None:
        """Rewrite the claim now (if still ours); ClaimLost when it was taken over."""
        with self._lock:
            if self.lost:
                raise self._lost_error()
            record = replace(self.record, heartbeat_at=time.time(), beats=self.record.beats + 1)
            version = claims.replace(self.store, CLAIM_KEY, record.to_bytes(), self.version)
            if version is None:
                self.lost = True
                raise self._lost_error()
            self.record, self.version = record, version

    def _lost_error(self) -> ClaimLost:
        return ClaimLost(
            f"lost the claim on {self.store.url}: another process took it over after this one "
            f"missed its heartbeats for {self.record.ttl:g}s",
            "nothing was published by this process; the other one builds the version",
        )

    def check(self) -> None:
        """Raise ClaimLost if the heartbeat found the claim taken over."""
        if self.lost:
            raise self._lost_error()

    def start(self) -> None:
        """Beat every ``ttl / 4`` seconds on a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return
        interval = max(0.05, self.record.ttl / 4)

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    self.beat()
                except ClaimLost:
                    log.warning("%s/%s was taken over by another process", self.store.url, CLAIM_KEY)
                    return
                except LadingError as err:  # transient, after retries: try again at the next beat
                    log.warning("heartbeat of %s/%s failed: %s", self.store.url, CLAIM_KEY, err)

        self._thread = threading.Thread(target=run, name="lading-claim-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the heartbeat thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- endings -----------------------------------------------------------------------------------

    def fail(self, error: str) -> None:
        """Mark the claim failed with ``error`` (best effort): processes waiting for it raise it."""
        self.stop()
        with self._lock:
            if self.lost:
                return
            record = replace(self.record, state="failed", error=error[:2000], heartbeat_at=time.time())
            try:
                version = claims.replace(self.store, CLAIM_KEY, record.to_bytes(), self.version)
            except LadingError as err:
                log.warning("could not mark %s/%s failed: %s", self.store.url, CLAIM_KEY, err)
                return
            if version is not None:
                self.record, self.version = record, version

    def release(self) -> None:
        """Delete the claim if it is still ours (best effort: an expired claim is harmless)."""
        self.stop()
        with self._lock:
            if self.lost:
                return
            try:
                claims.delete(self.store, CLAIM_KEY, self.version)
            except LadingError as err:
                log.warning("could not release %s/%s: %s", self.store.url, CLAIM_KEY, err)


def read_claim(store: Store) -> tuple[ClaimRecord, str] | None:
    """The version's claim and its version, or None when it is not claimed."""
    found = claims.read(store, CLAIM_KEY)
    if found is None:
        return None
    return ClaimRecord.parse(found[0]), found[1]


def is_live(record: ClaimRecord, now: float | None = None) -> bool:
    """For one-shot callers that cannot watch a claim (``lading datasets rm``): a claim is live
    unless it failed or its heartbeat is more than two TTLs old by this machine's clock."""
    if record.state == "failed":
        return False
    return record.heartbeat_age(now) <= 2 * record.ttl


def as_json(record: ClaimRecord, now: float | None = None) -> dict[str, Any]:
    """The record for ``--json`` output, with its heartbeat age and liveness."""
    return {**asdict(record), "heartbeat_age": round(record.heartbeat_age(now), 3), "live": is_live(record, now)}
