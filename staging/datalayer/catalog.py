"""What ``lading datasets list | show | rm`` do: the versions under a store URI, one version's
details, and removing a version that no process has claimed."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lading.core.errors import LadingError, NotFound, ProblemFound
from lading.datalayer.claim import Claim, ClaimRecord, as_json, is_live, read_claim
from lading.datalayer.ensure import check_content
from lading.datalayer.layout import CLAIM_KEY, Location, block_of, read_index, shard_entries
from lading.datasets.cache import NodeCache, default_cache_root
from lading.stores import claims, open_store
from lading.stores.base import ObjectInfo
from lading.stores.config import StoreConfig

log = logging.getLogger(__name__)


@dataclass
class VersionSummary:
    """One version found under a store URI."""

    location: Location
    state: str  # complete | building | removing | failed | expired-claim | incomplete
    objects: int = 0
    bytes: int = 0
    samples: int | None = None
    shards: int | None = None
    built_at: str | None = None
    claim: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "uri": self.location.uri,
            "name": self.location.name,
            "version": self.location.version,
            "state": self.state,
            "samples": self.samples,
            "shards": self.shards,
            "objects": self.objects,
            "bytes": self.bytes,
            "built_at": self.built_at,
            "claim": self.claim,
        }


def _state(index: dict[str, Any] | None, record: ClaimRecord | None, now: float) -> str:
    if index is not None:
        return "complete"
    if record is None:
        return "incomplete"
    if record.state == "failed":
        return "failed"
    if not is_live(record, now):
        return "expired-claim"
    return "removing" if record.purpose == "remove" else "building"


def list_versions(store_uri: str, config: StoreConfig | None = None) -> list[VersionSummary]:
    """Every ``NAME/VERSION`` under ``store_uri`` that holds an index or a claim (one listing, then
    one GET per index and per claim)."""
    root = Location.of(store_uri, "x", "x").root
    store = open_store(root, config or StoreConfig.from_env())
    groups: dict[tuple[str, str], list[ObjectInfo]] = {}
    for info in store.list():
        parts = info.key.split("/")
        if len(parts) >= 3:
            groups.setdefault((parts[0], parts[1]), []).append(info)
    found = []
    now = time.time()
    for (name, version), infos in sorted(groups.items()):
        keys = {info.key for info in infos}
        if f"{name}/{version}/{name}.index.json" not in keys and f"{name}/{version}/{CLAIM_KEY}" not in keys:
            continue
        try:
            location = Location.of(root, name, version)
        except LadingError:
            continue
        found.append(_summary(location, config, infos, now))
    return found


def _summary(location: Location, config: StoreConfig | None, infos: list[ObjectInfo], now: float) -> VersionSummary:
    store = open_store(location.uri, config or StoreConfig.from_env())
    index = read_index(store, location)
    claim = read_claim(store)
    record = claim[0] if claim else None
    summary = VersionSummary(
        location,
        _state(index, record, now),
        len(infos),
        sum(info.size for info in infos),
        claim=as_json(record, now) if record else None,
    )
    if index is not None:
        block = block_of(index)
        summary.samples = block.get("samples", index.get("lading", {}).get("nsamples"))
        summary.shards = len(index.get("shardlist", []))
        summary.built_at = block.get("built_at")
    return summary


def describe(
    uri: str | Location, config: StoreConfig | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """One version: state, samples, shards, bytes, encoding, fingerprint, who built it and when,
    its claim, whether the store still holds every object the index names (by ETag), and how
    many shards this node's cache holds at the recorded version."""
    location = uri if isinstance(uri, Location) else Location.parse(uri)
    store = open_store(location.uri, config or StoreConfig.from_env())
    try:
        infos = list(store.list())
    except NotFound:  # a local directory that does not exist
        infos = []
    index = read_index(store, location)
    claim = read_claim(store)
    if index is None and claim is None and not infos:
        raise NotFound(f"no dataset at {location}", f"lading datasets list {location.root}")
    now = time.time()
    record = claim[0] if claim else None
    result: dict[str, Any] = {
        "uri": location.uri,
        "name": location.name,
        "version": location.version,
        "state": _state(index, record, now),
        "objects": len(infos),
        "bytes": sum(info.size for info in infos),
        "claim": as_json(record, now) if record else None,
    }
    if index is None:
        return result
    block = block_of(index)
    shards = index.get("shardlist", [])
    result.update(
        {
            "index": location.index_uri,
            "samples": block.get("samples", index.get("lading", {}).get("nsamples")),
            "shards": len(shards),
            "shard_bytes": sum(int(shard.get("filesize", 0)) for shard in shards),
            "encoding": block.get("encoding"),
            "fingerprint": block.get("fingerprint"),
            "function": block.get("function"),
            "built_by": block.get("built_by"),
            "built_at": block.get("built_at"),
            "build_seconds": block.get("build_seconds"),
            "build": block.get("build"),
            "datalayer": bool(block),
        }
    )
    try:
        check_content(store, location, index)
        result["store_check"] = "ok"
    except ProblemFound as err:
        result["store_check"] = err.message
    result["node_cache"] = node_cache_status(location, index, cache_dir)
    return result


def node_cache_status(
    location: Location, index: dict[str, Any], cache_dir: str | os.PathLike[str] | None = None
) -> dict[str, Any] | None:
    """How many of the version's objects this node's cache holds at the version the index
    recorded (``current``), at another one (``stale``: downloaded again when read), or not at all.
    None for a local store (read in place) or when no cache exists here."""
    if location.store_uri().scheme == "file":
        return None
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    if not (root / "datasets").is_dir():
        return None
    cache = NodeCache(root)
    status: dict[str, Any] = {"root": str(root), "current": 0, "stale": 0, "absent": 0}
    for entry in shard_entries(index):
        uri = f"{location.uri}/{entry['url']}"
        found = cache.find(uri, entry.get("etag"), entry.get("filesize"))
        if found is not None:
            found.close()
            status["current"] += 1
        elif cache.paths(uri)[0].exists():
            status["stale"] += 1
        else:
            status["absent"] += 1
    return status


@dataclass
class Removed:
    """What :func:`remove` deleted."""

    location: Location
    objects: int = 0
    bytes: int = 0
    took_over: dict[str, Any] | None = field(default=None)

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"uri": self.location.uri, "objects": self.objects, "bytes": self.bytes, "took_over": self.took_over}


def remove(uri: str | Location, config: StoreConfig | None = None, ttl: float = 60.0) -> Removed:
    """Remove a version: claim it first (a version another process has claimed, building or
    removing it, is refused: ProblemFound), delete its index, then every other object, then the
    claim. A failed claim, or one whose heartbeat is more than two TTLs old, is taken over."""
    location = uri if isinstance(uri, Location) else Location.parse(uri)
    store = open_store(location.uri, config or StoreConfig.from_env())
    mine = ClaimRecord(purpose="remove", state="removing", ttl=ttl)
    found = read_claim(store)
    took_over = None
    if found is None:
        try:
            infos = list(store.list())
        except NotFound:
            infos = []
        if not infos:
            raise NotFound(f"no dataset at {location}", f"lading datasets list {location.root}")
        claims.check_conditional_writes(store)
        claim = Claim.create(store, mine)
        if claim is None:
            found = read_claim(store)
            raise _claimed(location, found[0] if found else None)
    else:
        other, version = found
        if is_live(other):
            raise _claimed(location, other)
        claims.check_conditional_writes(store)
        claim = Claim.take_over(store, mine, version)
        if claim is None:
            raise _claimed(location, None)
        took_over = as_json(other)
    claim.start()
    try:
        infos = [info for info in store.list() if info.key != CLAIM_KEY]
        result = Removed(location, len(infos), sum(info.size for info in infos), took_over)
        claims.delete(store, location.index_key)  # first: nobody takes the version as complete any more
        claims.delete_prefix(store, "", keep=lambda key: key == CLAIM_KEY)
    except BaseException:
        claim.release()
        raise
    claim.release()
    if location.store_uri().scheme == "file":  # the emptied folders of a local store
        folder = Path(location.store_uri().prefix)
        for path in (folder, folder.parent):
            try:
                path.rmdir()
            except OSError:
                break
    log.info("removed %s (%d objects)", location, result.objects)
    return result


def _claimed(location: Location, record: ClaimRecord | None) -> ProblemFound:
    if record is None:
        return ProblemFound(f"{location} was claimed by another process just now", "try again later")
    doing = "removing" if record.purpose == "remove" else "building"
    return ProblemFound(
        f"{location} is claimed: {record.describe()} is {doing} it (last heartbeat "
        f"{record.heartbeat_age():.0f}s ago, TTL {record.ttl:g}s)",
        f"wait for it to finish, or for its claim to expire ({2 * record.ttl:g}s without a "
        "heartbeat) if that process is gone",
    )
