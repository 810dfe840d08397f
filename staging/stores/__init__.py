"""Object stores behind one small protocol. Backends import their SDKs lazily."""

from __future__ import annotations

from staging.stores.base import ObjectInfo, ProgressCallback, Store, StoreConfig
from staging.stores.uri import StoreURI, parse_uri

__all__ = ["ObjectInfo", "ProgressCallback", "Store", "StoreConfig", "StoreURI", "open_store", "parse_uri"]


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
