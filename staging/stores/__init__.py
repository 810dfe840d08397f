"""Object stores behind one small protocol. Backends import their SDKs lazily."""

from __future__ import annotations

# The errors a Store raises, key validation and the retry policy are part of the protocol's
# surface: re-exported so that mounts/ depends on staging.stores alone.
from staging.errors import (AccessDenied, LadingError, NotFound, ObjectChanged, ProblemFound,
                            Throttled, TransientError, UnsafeKey, UsageError)
from staging.keys import key_parts, safe_join
from staging.retry import DEFAULT_POLICY, RetryPolicy, with_retries
from staging.stores.base import ObjectInfo, ProgressCallback, Store, StoreConfig
from staging.stores.uri import StoreURI, parse_uri

__all__ = [
    "AccessDenied", "DEFAULT_POLICY", "LadingError", "NotFound", "ObjectChanged", "ObjectInfo",
    "ProblemFound", "ProgressCallback", "RetryPolicy", "Store", "StoreConfig", "StoreURI",
    "Throttled", "TransientError", "UnsafeKey", "UsageError", "key_parts", "open_store",
    "parse_uri", "safe_join", "with_retries",
]


def open_store(location: str | StoreURI, config: StoreConfig | None = None) -> Store:
    """Open the store a URI names. The SDK is imported and the client built only on first use."""
    uri = parse_uri(location) if isinstance(location, str) else location
    config = config or StoreConfig()
    if uri.scheme == "file":
        from staging.stores.local import LocalStore

        return LocalStore(uri.prefix)
    if uri.scheme == "s3":
        from staging.stores.s3_fast import FastS3Store

        return FastS3Store(uri, config)
    from staging.stores.gcs import GCSStore

    return GCSStore(uri, config)
