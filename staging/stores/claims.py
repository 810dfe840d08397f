"""Conditional writes for coordinating processes through a store: create an object only if it is
absent, replace or delete it only if it is still the version read, and delete a prefix.

Electing one writer among many processes on many nodes needs the store itself to refuse the
second writer. Each backend implements the conditional writes of the Store contract
(:meth:`~lading.stores.base.Store.put` with ``if_absent`` / ``if_version``,
:meth:`~lading.stores.base.Store.delete` with ``version``) with the SDK it already uses for
writes; this module is the protocol on top of them:

=======  =====================================  ======================================  ==========================
backend  create if absent                       replace / delete if unchanged           version
=======  =====================================  ======================================  ==========================
S3       PutObject ``If-None-Match: *``         PutObject / DeleteObject ``If-Match``   ETag
GCS      upload ``ifGenerationMatch=0``         upload / delete ``ifGenerationMatch``   generation
local    ``link(2)`` of a complete temporary    ``flock`` on the current file, same     SHA-256 of the content
         file (fails when the name exists)      inode and content, then rename/unlink
=======  =====================================  ======================================  ==========================

What the test servers honour (tests/test_datalayer_claims.py): moto honours all three S3
conditions; fake-gcs-server honours ``ifGenerationMatch`` on uploads but deletes whatever the
generation (so a conditional delete on GCS is checked against a fresh read first, which leaves
a small window on the emulator only); ``rclone serve s3`` ignores ``If-None-Match`` and
``If-Match`` altogether, which :func:`check_conditional_writes` detects so that callers can
refuse such a server instead of electing two writers.

A write retried after a transient failure may have succeeded the first time; its retry then
fails the condition. Each function therefore reads the object back on a failed condition: an
object holding exactly the bytes being written is this caller's own write (callers put a unique
owner id in ``data``).
"""

from __future__ import annotations

import logging
import uuid
from typing import Callable

from lading.core.errors import LadingError, NotFound, ObjectChanged, UsageError
from lading.stores.base import Store

log = logging.getLogger(__name__)

__all__ = ["check_conditional_writes", "create", "delete", "delete_prefix", "read", "replace"]


def _writable(store: Store) -> Store:
    if not store.writable:
        raise UsageError(
            f"{store.url} cannot take conditional writes",
            "use an s3://, gs:// or local location (not a snapshot or a read-only view)",
        )
    return store


def read(store: Store, key: str) -> tuple[bytes, str] | None:
    """The object's bytes and version, or None when it does not exist (one GET)."""
    return store.read_object(key)


def create(store: Store, key: str, data: bytes) -> str | None:
    """Write ``key`` only if no object has that name; its version, or None when one exists."""
    try:
        return _writable(store).put(key, data, if_absent=True)
    except ObjectChanged:
        return _own_write(store, key, data)


def replace(store: Store, key: str, data: bytes, version: str) -> str | None:
    """Overwrite ``key`` only if it is still at ``version``; the new version, or None when it was
    replaced or removed meanwhile."""
    try:
        return _writable(store).put(key, data, if_version=version)
    except (ObjectChanged, NotFound):
        return _own_write(store, key, data)


def delete(store: Store, key: str, version: str | None = None) -> bool:
    """Delete ``key`` (only if still at ``version``, when given); False when it is gone already
    or at another version."""
    return _writable(store).delete(key, version)


def delete_prefix(store: Store, prefix: str, keep: Callable[[str], bool] | None = None) -> int:
    """Delete every object under ``prefix`` (keys relative to the store) except those ``keep``
    accepts; the number deleted. Local directories left empty are removed."""
    keys = [info.key for info in _writable(store).list(prefix) if keep is None or not keep(info.key)]
    for start in range(0, len(keys), 1000):
        store.delete_many(keys[start : start + 1000])
    return len(keys)


def check_conditional_writes(store: Store, probe_key: str | None = None) -> None:
    """Refuse (UsageError) a store whose server ignores conditional writes: create a probe
    object, create it again with other bytes (which must fail), delete it. Three requests."""
    if _writable(store).scheme == "file":
        return
    key = probe_key or f"_lading_probe-{uuid.uuid4().hex}"
    first = create(store, key, b"first " + uuid.uuid4().hex.encode())
    try:
        second = create(store, key, b"second " + uuid.uuid4().hex.encode())
    finally:
        try:
            delete(store, key)
        except LadingError as err:  # best effort: the probe is a few bytes
            log.warning("could not delete the probe object %s/%s: %s", store.url, key, err)
    if first is None or second is not None:
        raise UsageError(
            f"the server behind {store.url} ignores conditional writes (If-None-Match / ifGenerationMatch)",
            "lading needs them to let exactly one process build; use "
            "AWS S3, GCS, MinIO or another server that honours them",
        )


def _own_write(store: Store, key: str, data: bytes) -> str | None:
    """After a failed condition: the version of ``key`` if it holds exactly ``data`` (a retried
    write of ours that had succeeded), else None."""
    current = store.read_object(key)
    if current is not None and current[0] == data:
        return current[1]
    return None
