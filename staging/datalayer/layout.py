"""Where a cached dataset lives: ``STORE_URI/NAME/VERSION/`` and the objects in it.

::

    s3://bucket/cache/mnist/v1/
        mnist.index.json                 written last, created only if absent: the version is complete
        _lading_claim.json               while a process builds (or removes) the version
        build-<id>/mnist-000000.tar      the shards of the build that published the index
        build-<id>/mnist.offsets.safetensors
        build-<id>/mnist.manifest.json

Each build writes into a folder of its own, so a build that was killed (or lost its claim)
can never overwrite the shards of another, and the next builder removes its leftovers by prefix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lading.core.errors import ProblemFound, UsageError
from lading.pack.index import parse_index
from lading.pack.plan import check_name
from lading.stores import claims
from lading.stores.base import Store
from lading.stores.uri import StoreURI, parse_uri

CLAIM_KEY = "_lading_claim.json"
BUILD_PREFIX = "build-"
#: The block a datalayer build adds to the pack index.
BLOCK = "datalayer"
FORMAT = 1


@dataclass(frozen=True)
class Location:
    """A dataset version: the store URI it is cached under, its name and its version."""

    root: str
    name: str
    version: str

    @classmethod
    def of(cls, store_uri: str, name: str, version: str) -> "Location":
        """Check the parts (name and version are file-name-safe words) and normalise the root."""
        if not isinstance(name, str) or not isinstance(version, str):
            raise UsageError("name and version are strings", 'e.g. cached("s3://bucket/cache", "mnist", "v1")')
        check_name(name, "name")
        check_name(version, "version")
        root = parse_uri(store_uri)
        text = str(root).rstrip("/") if root.scheme != "file" else root.prefix.rstrip("/") or "/"
        return cls(text, name, version)

    @classmethod
    def parse(cls, uri: str) -> "Location":
        """``STORE_URI/NAME/VERSION`` (what ``lading datasets show`` and ``rm`` take)."""
        text = uri.rstrip("/")
        head, _, version = text.rpartition("/")
        root, _, name = head.rpartition("/")
        if not root or not name or not version or root.endswith((":/", ":")):
            raise UsageError(
                f"{uri!r} does not name a dataset version",
                "write STORE_URI/NAME/VERSION, e.g. s3://bucket/cache/mnist/v1",
            )
        return cls.of(root, name, version)

    @property
    def uri(self) -> str:
        """The version's folder, ``STORE_URI/NAME/VERSION``."""
        return f"{self.root.rstrip('/')}/{self.name}/{self.version}"

    @property
    def index_key(self) -> str:
        """The index's key in the version's folder."""
        return f"{self.name}.index.json"

    @property
    def index_uri(self) -> str:
        """The index's URI (what ShardDataset and PackedDataset open)."""
        return f"{self.uri}/{self.index_key}"

    def store_uri(self) -> StoreURI:
        """The version's folder as a parsed URI."""
        return parse_uri(self.uri)

    def __str__(self) -> str:
        return self.uri


def read_document(store: Store, key: str) -> dict[str, Any] | None:
    """A JSON object in the store, or None when absent."""
    found = claims.read(store, key)
    if found is None:
        return None
    try:
        document = json.loads(found[0])
    except (ValueError, UnicodeDecodeError) as err:
        raise ProblemFound(f"{store.url}/{key} is not valid JSON: {err}") from err
    if not isinstance(document, dict):
        raise ProblemFound(f"{store.url}/{key} is not a JSON object")
    return document


def read_index(store: Store, location: Location) -> dict[str, Any] | None:
    """The version's index (a wids shard index), or None while there is none."""
    found = claims.read(store, location.index_key)
    if found is None:
        return None
    return parse_index(found[0], f"{store.url}/{location.index_key}")


def block_of(index: dict[str, Any]) -> dict[str, Any]:
    """The index's datalayer block ({} for a dataset ``lading pack`` wrote)."""
    block = index.get(BLOCK)
    return block if isinstance(block, dict) else {}


def shard_entries(index: dict[str, Any]) -> list[dict[str, Any]]:
    """The shards (and the offsets file) an index names, each ``{url, filesize, etag}``."""
    entries = [dict(shard) for shard in index.get("shardlist", [])]
    offsets = index.get("lading", {}).get("offsets") if isinstance(index.get("lading"), dict) else None
    if isinstance(offsets, dict) and isinstance(offsets.get("url"), str):
        entries.append(dict(offsets))
    return entries


def check_against_listing(index: dict[str, Any], listing: dict[str, Any], where: str) -> list[str]:
    """Objects the index names that the listing shows missing, or at another version or size:
    the reuse check is by content (ETag / generation), never by timestamps."""
    problems = []
    for entry in shard_entries(index):
        url = entry.get("url")
        if not isinstance(url, str) or "://" in url or url.startswith("/"):
            problems.append(f"{url!r}: not a shard of this folder")
            continue
        info = listing.get(url)
        if info is None:
            problems.append(f"{where}/{url} is missing")
        elif entry.get("etag") not in (None, info.version):
            problems.append(f"{where}/{url} is at version {info.version}, the index recorded {entry.get('etag')}")
        elif isinstance(entry.get("filesize"), int) and entry["filesize"] != info.size:
            problems.append(f"{where}/{url} has {info.size} bytes, the index recorded {entry['filesize']}")
    return problems
