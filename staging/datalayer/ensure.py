"""Build a version once, whoever asks first; everyone else waits for its index, then reads it.

:func:`ensure` is what every call of a ``@cached`` function runs, in every process:

1. the index exists: check it was built by the same function (fingerprint) and that the store
   still holds every object it names at the recorded ETag / generation and size; done;
2. no claim: create it (conditional create); the winner builds (:mod:`lading.datalayer.build`);
3. a live claim: wait, polling the index and the claim with growing intervals, up to
   ``wait_timeout``; a claim of another fingerprint is refused at once (the build would be);
4. an expired claim (its holder died) or a failed one: take it over (conditional replace of the
   version seen), remove the dead build's folder, build.

See :mod:`lading.datalayer.claim` for expiry and failures.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from lading.core.errors import LadingError, ProblemFound, TransientError, UsageError
from lading.datalayer.build import build_version
from lading.datalayer.claim import DEFAULT_TTL, Claim, ClaimLost, ClaimRecord, Observer, read_claim
from lading.datalayer.layout import Location, block_of, check_against_listing, read_index
from lading.pack.plan import DEFAULT_SHARD_SIZE
from lading.stores import claims, open_store
from lading.stores.base import Store
from lading.stores.config import StoreConfig

log = logging.getLogger(__name__)
#: Stores (by URL) whose conditional writes this process has checked.
_CHECKED: set[str] = set()


class VersionConflict(UsageError):
    """The name and version hold (or are being built with) another build: versions are immutable."""


class BuildFailed(ProblemFound):
    """The process building the version this one waited for failed."""


class WaitTimeout(TransientError):
    """Another process held the claim for longer than ``wait_timeout``."""


@dataclass(frozen=True)
class BuildOptions:
    """How to build and wait (see :func:`lading.datalayer.cached`)."""

    claim_ttl: float = DEFAULT_TTL
    wait_timeout: float = 3600.0
    max_poll: float = 5.0
    shard_size: int = DEFAULT_SHARD_SIZE
    spool_dir: str | None = None

    def __post_init__(self) -> None:
        if not self.claim_ttl > 0:
            raise UsageError(f"claim_ttl={self.claim_ttl} must be positive (seconds)")
        if not self.wait_timeout >= 0:
            raise UsageError(f"wait_timeout={self.wait_timeout} must not be negative (seconds)")
        if not self.max_poll > 0:
            raise UsageError(f"max_poll={self.max_poll} must be positive (seconds)")


@dataclass(frozen=True)
class Outcome:
    """What :func:`ensure` did: the index, whether this call ran the function, and the seconds it
    waited for another process's build or removal (0.0 when it waited for nobody)."""

    location: Location
    index: dict[str, Any]
    built: bool
    waited: float = 0.0

    @property
    def encoding(self) -> dict[str, Any]:
        """The sample encoding the index records."""
        return block_of(self.index).get("encoding", {})


#: ``builder(store, location, claim) -> index``: publishes the version while the claim is held
#: (the default spools ``produce()``'s samples and packs them here; lading.datalayer.ray writes
#: a Ray Dataset from the cluster's workers).
Builder = Callable[[Store, Location, Claim], dict[str, Any]]


def ensure(
    location: Location,
    produce: Callable[[], Iterable[Any]],
    fingerprint: str,
    *,
    function: str,
    options: BuildOptions | None = None,
    config: StoreConfig | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    builder: Builder | None = None,
) -> Outcome:
    """Make sure ``location`` holds a complete build of ``fingerprint``; run ``produce`` (or
    ``builder``) only if this process is the one elected to build it."""
    options = options or BuildOptions()
    store = open_store(location.uri, config or StoreConfig.from_env())
    started = clock()
    deadline = started + options.wait_timeout
    observer = Observer(clock=clock)
    waited_on: str | None = None
    waiting_since: float | None = None  # when another process's claim first made this one wait

    def waited() -> float:
        return 0.0 if waiting_since is None else clock() - waiting_since

    delay = 0.1
    while True:
        index = read_index(store, location)
        if index is not None:
            return _reused(store, location, index, fingerprint, waited())
        found = read_claim(store)
        claim: Claim | None = None
        stale_build: str | None = None
        mine = ClaimRecord(fingerprint=fingerprint, ttl=options.claim_ttl)
        if found is None:
            _check_conditional_writes(store)
            claim = Claim.create(store, mine)
        else:
            other, version = found
            _refuse_other_build(location, other, fingerprint)
            if other.state == "failed" and other.owner == waited_on:
                raise BuildFailed(
                    f"the build of {location} by {other.describe()} failed: {other.error}",
                    "fix the function and call it again (the next call builds again)",
                )
            if other.state == "failed" or observer.expired(other, version):
                _check_conditional_writes(store)
                claim = Claim.take_over(store, mine, version)
                if claim is not None:
                    why = "failed" if other.state == "failed" else f"expired (no heartbeat for {other.ttl:g}s)"
                    log.warning("%s: the claim of %s %s; building it here", location, other.describe(), why)
                    stale_build = other.build
            elif waited_on != other.owner:
                waited_on = other.owner
                log.info(
                    "%s is being %s by %s; waiting for its index",
                    location,
                    "removed" if other.purpose == "remove" else "built",
                    other.describe(),
                )
            if claim is None:
                delay = min(delay, max(0.05, other.ttl / 4))
        if claim is not None:
            if builder is None:
                builder = _spooled(produce, function, options)
            return _build(store, location, claim, builder, fingerprint, stale_build, waited())
        now = clock()
        if waiting_since is None:
            waiting_since = now
        if now >= deadline:
            holder = found[0].describe() if found is not None else "another process"
            raise WaitTimeout(
                f"gave up waiting for {location} after {now - started:.0f}s: {holder} still holds its claim",
                f"raise wait_timeout=, or check on that process (lading datasets show {location})",
            )
        sleep(min(delay * random.uniform(0.8, 1.2), max(0.0, deadline - now)))
        delay = min(delay * 1.5, options.max_poll)


def _check_conditional_writes(store: Store) -> None:
    """Once per process and store: refuse a server that ignores conditional writes."""
    if store.url not in _CHECKED:
        claims.check_conditional_writes(store)
        _CHECKED.add(store.url)


def _refuse_other_build(location: Location, other: ClaimRecord, fingerprint: str) -> None:
    """A live build of another fingerprint would be refused once published: refuse it now. (A
    claim whose heartbeat is not fresh may be a dead builder's: wait and take it over instead.)"""
    if other.purpose != "build" or other.state == "failed" or other.fingerprint in ("", fingerprint):
        return
    if other.heartbeat_age() <= other.ttl:
        raise VersionConflict(
            f"{location} is being built by {other.describe()} from another function or "
            f"arguments (fingerprint {other.fingerprint}, this call's {fingerprint})",
            "versions are immutable: use a new version for new data",
        )


def _reused(store: Store, location: Location, index: dict[str, Any], fingerprint: str, waited: float) -> Outcome:
    block = block_of(index)
    if not block:
        raise VersionConflict(
            f"{location} holds a dataset that lading.datalayer did not build (lading pack?)",
            "use another name or version for the cached dataset",
        )
    if block.get("fingerprint") != fingerprint:
        raise VersionConflict(
            f"{location} was built by another function or arguments (fingerprint "
            f"{block.get('fingerprint')}, this call's {fingerprint})",
            "versions are immutable: use a new version for new data (or pass the "
            "recorded fingerprint= if the change does not alter the data)",
        )
    check_content(store, location, index)
    return Outcome(location, index, built=False, waited=waited)


def check_content(store: Store, location: Location, index: dict[str, Any]) -> None:
    """ProblemFound unless one listing of the version shows every object the index names at the
    recorded version (ETag / generation) and size."""
    listing = {info.key: info for info in store.list()}
    problems = check_against_listing(index, listing, location.uri)
    if problems:
        raise ProblemFound(
            f"{location} was changed after it was built: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            f"remove it (lading datasets rm {location} --yes) and build it again, or use a new version",
        )


def _spooled(produce: Callable[[], Iterable[Any]], function: str, options: BuildOptions) -> Builder:
    """The default builder: ``produce()``'s samples spooled and packed in this process."""

    def build(store: Store, location: Location, claim: Claim) -> dict[str, Any]:
        return build_version(
            store,
            location,
            produce(),
            claim,
            function=function,
            shard_size=options.shard_size,
            spool_dir=options.spool_dir,
        )

    return build


def _build(
    store: Store,
    location: Location,
    claim: Claim,
    builder: Builder,
    fingerprint: str,
    stale_build: str | None,
    waited: float,
) -> Outcome:
    """Holding the claim: build unless the index appeared meanwhile."""
    try:
        index = read_index(store, location)
    except BaseException:
        claim.release()
        raise
    if index is not None:  # the previous holder published and released between our two reads
        claim.release()
        return _reused(store, location, index, fingerprint, waited)
    if stale_build:
        _remove_build(store, stale_build)
    claim.start()
    try:
        index = builder(store, location, claim)
    except ClaimLost:
        claim.stop()
        _remove_unpublished(store, location, claim.record.build)
        raise
    except Exception as err:
        claim.fail(err.message if isinstance(err, LadingError) else f"{type(err).__name__}: {err}")
        _remove_unpublished(store, location, claim.record.build)
        raise
    except BaseException:
        claim.release()
        _remove_unpublished(store, location, claim.record.build)
        raise
    claim.release()
    log.info("%s: built %s samples", location, block_of(index).get("samples"))
    return Outcome(location, index, built=True, waited=waited)


def _remove_unpublished(store: Store, location: Location, build: str) -> None:
    """After a failed build: remove its folder, unless an index naming it was published (a failure
    after the index was created must not take the shards of a complete version)."""
    try:
        index = read_index(store, location)
    except LadingError as err:
        log.warning("%s: could not check the index before removing %s: %s", location, build, err)
        return
    if index is None or block_of(index).get("build") != build:
        _remove_build(store, build)


def _remove_build(store: Store, build: str) -> None:
    """Remove a build folder (best effort: leftovers only cost space, ``rm`` removes them)."""
    try:
        removed = claims.delete_prefix(store, build.rstrip("/") + "/")
    except LadingError as err:
        log.warning("could not remove %s/%s: %s", store.url, build, err)
        return
    if removed:
        log.info("removed %d objects of the unfinished build %s/%s", removed, store.url, build)
