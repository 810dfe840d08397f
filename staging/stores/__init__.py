"""Object stores behind one small protocol. Backends import their SDKs lazily."""

from __future__ import annotations

import os
from pathlib import Path

# The errors a Store raises, key validation and the retry policy are part of the protocol's
# surface: re-exported so that mounts/ depends on lading.stores alone.
from lading.core.errors import (
    AccessDenied,
    LadingError,
    NotFound,
    ObjectChanged,
    ProblemFound,
    Throttled,
    TransientError,
    UnsafeKey,
    UsageError,
)
from lading.core.keys import key_parts, safe_join
from lading.core.retry import DEFAULT_POLICY, RetryPolicy, with_retries
from lading.stores.base import ObjectInfo, ProgressCallback, Store
from lading.stores.config import StoreConfig
from lading.stores.uri import StoreURI, parse_uri

__all__ = [
    "AccessDenied",
    "DEFAULT_POLICY",
    "LadingError",
    "NotFound",
    "ObjectChanged",
    "ObjectInfo",
    "ProblemFound",
    "ProgressCallback",
    "RetryPolicy",
    "Store",
    "StoreConfig",
    "StoreURI",
    "Throttled",
    "TransientError",
    "UnsafeKey",
    "UsageError",
    "key_parts",
    "open_store",
    "parse_uri",
    "refuse_an_object",
    "safe_join",
    "with_retries",
]


def open_store(
    location: str | StoreURI, config: StoreConfig | None = None, *, snapshot: str | Path | None = None
) -> Store:
    """Open the store a URI names. The SDK is imported and the client built only on first use.

    A snapshot file (``lading snapshot``) in place of the URI opens its source, pinned to the
    recorded versions; ``snapshot=`` pins another location (a mirror with the same versions).
    """
    if snapshot is not None:
        from lading.stores.snapshot import SnapshotStore

        return SnapshotStore(open_store(location, config), snapshot)
    uri = parse_uri(location) if isinstance(location, str) else location
    config = config or StoreConfig.from_env()
    if uri.scheme == "file" and os.path.isfile(uri.prefix):
        from lading.stores.snapshot import SnapshotStore, is_snapshot, read_header

        if is_snapshot(uri.prefix):
            return SnapshotStore(open_store(read_header(uri.prefix).source, config), uri.prefix)
    if uri.scheme == "file":
        from lading.stores.local import LocalStore

        return LocalStore(uri.prefix)
    if uri.scheme == "s3":
        from lading.stores.s3.store import S3Store

        return S3Store(uri, config)
    from lading.stores.gcs.store import GCSStore

    return GCSStore(uri, config)


def refuse_an_object(store: Store, hint: str = "name the prefix that holds it, {parent}") -> None:
    """After an empty listing: raise :class:`UsageError` (exit 2) when the store's location
    names one object rather than a prefix (``s3://b/data/b.txt``), as a local SOURCE that is
    a file is refused; return otherwise (the caller then says "nothing at ..."). ``hint`` may
    use ``{url}``, ``{parent}`` (the prefix that holds the object) and ``{name}``.

    One HEAD, on the failure path only: nothing is asked when the location ends in ``/`` or is
    local (listing a file is refused already), and a HEAD that fails (no such object, access
    denied, the network) leaves the caller's own error to be raised.
    """
    uri = parse_uri(store.url)
    if uri.scheme == "file":
        return
    parent, name = uri.split_name()
    if not name:
        return
    try:
        open_store(parent, store.config).stat(name)
    except LadingError:
        return
    raise UsageError(f"{store.url} is an object, not a prefix", hint.format(url=store.url, parent=parent, name=name))
