"""Conditional writes for coordinating processes through a store: create an object only if it is
absent, replace or delete it only if it is still the version read, and delete a prefix.

The Store protocol reads and uploads; electing one writer among many processes on many nodes
needs the store itself to refuse the second writer. Each backend does it with the SDK it already
uses for writes:

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

import errno
import fcntl
import hashlib
import logging
import os
import uuid
from pathlib import Path
from typing import Any, Callable

from lading.core.errors import LadingError, NotFound, ObjectChanged, UsageError
from lading.core.keys import safe_join
from lading.core.names import hidden_sibling
from lading.stores.base import Store

log = logging.getLogger(__name__)

__all__ = ["check_conditional_writes", "create", "delete", "delete_prefix", "read", "replace"]


# -- dispatch --------------------------------------------------------------------------------------


def _kind(store: Store) -> str:
    from lading.stores.local import LocalStore

    if isinstance(store, LocalStore):
        return "local"
    scheme = getattr(store, "scheme", "")
    if scheme in ("s3", "gs") and hasattr(store, "_path"):
        return scheme
    raise UsageError(f"{store.url} cannot take conditional writes",
                     "use an s3://, gs:// or local location (not a snapshot or a read-only view)")


def read(store: Store, key: str) -> tuple[bytes, str] | None:
    """The object's bytes and version, or None when it does not exist (one GET)."""
    kind = _kind(store)
    if kind == "local":
        path = safe_join(Path(store.root), key)  # type: ignore[attr-defined]
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise _local_error(err, path) from err
        return data, _digest(data)
    pieces: list[bytes] = []
    try:
        fetched = store.stream(key, lambda chunk: pieces.append(bytes(chunk)), None)  # type: ignore[attr-defined]
    except NotFound:
        return None
    return b"".join(pieces), fetched.version


def create(store: Store, key: str, data: bytes) -> str | None:
    """Write ``key`` only if no object has that name; its version, or None when one exists."""
    kind = _kind(store)
    try:
        if kind == "local":
            return _local_create(store, key, data)
        if kind == "s3":
            return _s3_put(store, key, data, {"IfNoneMatch": "*"})
        return _gcs_put(store, key, data, 0)
    except (ObjectChanged, _Conflict):
        return _own_write(store, key, data)


def replace(store: Store, key: str, data: bytes, version: str) -> str | None:
    """Overwrite ``key`` only if it is still at ``version``; the new version, or None when it was
    replaced or removed meanwhile."""
    kind = _kind(store)
    try:
        if kind == "local":
            return _local_replace(store, key, data, version)
        if kind == "s3":
            return _s3_put(store, key, data, {"IfMatch": f'"{version}"'})
        return _gcs_put(store, key, data, int(version))
    except (ObjectChanged, NotFound, _Conflict):
        return _own_write(store, key, data)


def delete(store: Store, key: str, version: str | None = None) -> bool:
    """Delete ``key`` (only if still at ``version``, when given); False when it is gone already
    or at another version."""
    kind = _kind(store)
    if kind == "local":
        return _local_delete(store, key, version)
    if version is not None:
        current = read(store, key)
        if current is None or current[1] != version:
            return False
    else:
        try:
            store.stat(key)  # S3 and GCS answer a delete of a missing key as a success
        except NotFound:
            return False
    try:
        if kind == "s3":
            _s3_delete(store, key, version)
        else:
            _gcs_delete(store, key, version)
    except NotFound:
        return False
    except (ObjectChanged, _Conflict):
        return False
    return True


def delete_prefix(store: Store, prefix: str, keep: Callable[[str], bool] | None = None) -> int:
    """Delete every object under ``prefix`` (keys relative to the store) except those ``keep``
    accepts; the number deleted. Local directories left empty are removed."""
    keys = [info.key for info in store.list(prefix) if keep is None or not keep(info.key)]
    kind = _kind(store)
    if kind == "local":
        root = Path(store.root)  # type: ignore[attr-defined]
        for key in keys:
            path = safe_join(root, key)
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as err:
                raise _local_error(err, path) from err
        _remove_empty_dirs(root, prefix)
        return len(keys)
    if kind == "s3":
        for start in range(0, len(keys), 1000):
            _s3_delete_many(store, keys[start:start + 1000])
        return len(keys)
    for key in keys:
        try:
            _gcs_delete(store, key, None)
        except NotFound:
            pass
    return len(keys)


def check_conditional_writes(store: Store, probe_key: str | None = None) -> None:
    """Refuse (UsageError) a store whose server ignores conditional writes: create a probe
    object, create it again with other bytes (which must fail), delete it. Three requests."""
    if _kind(store) == "local":
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
        raise UsageError(f"the server behind {store.url} ignores conditional writes (If-None-Match / "
                         "ifGenerationMatch)", "lading needs them to let exactly one process build; use "
                         "AWS S3, GCS, MinIO or another server that honours them")


def _own_write(store: Store, key: str, data: bytes) -> str | None:
    """After a failed condition: the version of ``key`` if it holds exactly ``data`` (a retried
    write of ours that had succeeded), else None."""
    current = read(store, key)
    if current is not None and current[0] == data:
        return current[1]
    return None


class _Conflict(Exception):
    """S3's 409 ConditionalRequestConflict: another conditional write to the key was in flight."""


# -- S3 ----------------------------------------------------------------------------------------------


def _s3_call(store: Any, key: str, operation: Callable[[Any], Any]) -> Any:
    try:
        return store._boto_call(store._where(key), operation)
    except LadingError as err:
        from lading.stores.s3.errors import client_error_code

        code, status = client_error_code(err.__cause__) if err.__cause__ is not None else ("", 0)
        if status == 409 or code == "ConditionalRequestConflict":
            raise _Conflict(code) from err
        raise


def _s3_put(store: Any, key: str, data: bytes, condition: dict[str, str]) -> str:
    from lading.stores.s3.store import plain_etag

    path = store._path(key)
    response = _s3_call(store, key, lambda client: client.put_object(
        Bucket=store.bucket, Key=path, Body=data, ContentLength=len(data), **condition))
    return plain_etag(response.get("ETag"))


def _s3_delete(store: Any, key: str, version: str | None) -> None:
    path = store._path(key)
    condition = {"IfMatch": f'"{version}"'} if version is not None else {}
    try:
        _s3_call(store, key, lambda client: client.delete_object(Bucket=store.bucket, Key=path, **condition))
    except LadingError as err:
        from lading.stores.s3.errors import client_error_code

        code, status = client_error_code(err.__cause__) if err.__cause__ is not None else ("", 0)
        if not condition or (status != 501 and code != "NotImplemented"):
            raise
        # A server without conditional deletes: the version was checked by the caller's read.
        _s3_call(store, key, lambda client: client.delete_object(Bucket=store.bucket, Key=path))


def _s3_delete_many(store: Any, keys: list[str]) -> None:
    objects = [{"Key": store._path(key)} for key in keys]
    response = _s3_call(store, keys[0], lambda client: client.delete_objects(
        Bucket=store.bucket, Delete={"Objects": objects, "Quiet": True}))
    failed = [error for error in response.get("Errors", ()) if error.get("Code") != "NoSuchKey"]
    if failed:
        from lading.stores.s3.errors import from_response

        first = failed[0]
        raise from_response(str(first.get("Code", "")), 0, str(first.get("Message", "")),
                            f"s3://{store.bucket}/{first.get('Key', '')}")


# -- GCS ---------------------------------------------------------------------------------------------


def _gcs_put(store: Any, key: str, data: bytes, generation: int) -> str:
    path = store._path(key)

    def attempt(bucket: Any) -> str:
        blob = bucket.blob(path)
        blob.upload_from_string(data, content_type="application/octet-stream", if_generation_match=generation,
                                retry=None, timeout=store._timeout())
        return str(blob.generation)

    return store._gcs_call(store._where(key), attempt)


def _gcs_delete(store: Any, key: str, version: str | None) -> None:
    path = store._path(key)
    generation = int(version) if version is not None else None
    store._gcs_call(store._where(key), lambda bucket: bucket.blob(path).delete(
        if_generation_match=generation, retry=None, timeout=store._timeout()))


# -- local -------------------------------------------------------------------------------------------


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _local_error(err: OSError, path: Path) -> LadingError:
    from lading.stores.local import _translate

    mapped = _translate(err, str(path))
    return mapped if isinstance(mapped, LadingError) else LadingError(str(mapped))


def _temporary(path: Path, data: bytes) -> Path:
    tmp = path.with_name(hidden_sibling(path.name, f".lading-tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def _local_create(store: Any, key: str, data: bytes) -> str | None:
    path = safe_join(Path(store.root), key)
    try:
        tmp = _temporary(path, data)
    except OSError as err:
        raise _local_error(err, path) from err
    try:
        os.link(tmp, path)  # atomic, and fails when the name exists: readers never see a partial file
    except FileExistsError:
        return _own_write(store, key, data)
    except OSError as err:
        raise _local_error(err, path) from err
    finally:
        tmp.unlink(missing_ok=True)
    return _digest(data)


def _locked_current(path: Path) -> int | None:
    """An fd holding ``flock(LOCK_EX)`` on the file ``path`` names now, or None when there is none.

    Replacements rename a new file over the name while holding the lock on the old one: after
    locking, the name must still be the locked file (else the lock is taken again on the new one)."""
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _read_fd(fd: int) -> bytes:
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _local_replace(store: Any, key: str, data: bytes, version: str) -> str | None:
    path = safe_join(Path(store.root), key)
    try:
        fd = _locked_current(path)
        if fd is None:
            return None
        try:
            current = _read_fd(fd)
            if _digest(current) != version:
                return _digest(current) if current == data else None
            tmp = _temporary(path, data)
            os.replace(tmp, path)  # while holding the old file's lock
        finally:
            os.close(fd)
    except OSError as err:
        raise _local_error(err, path) from err
    return _digest(data)


def _local_delete(store: Any, key: str, version: str | None) -> bool:
    path = safe_join(Path(store.root), key)
    try:
        fd = _locked_current(path)
        if fd is None:
            return False
        try:
            if version is not None and _digest(_read_fd(fd)) != version:
                return False
            path.unlink()
        finally:
            os.close(fd)
    except FileNotFoundError:
        return False
    except OSError as err:
        raise _local_error(err, path) from err
    _remove_empty_dirs(Path(store.root), key.rpartition("/")[0])
    return True


def _remove_empty_dirs(root: Path, prefix: str) -> None:
    """Remove directories under ``root/prefix`` (deepest first), and ``prefix``'s own folders up to
    ``root``, when they are empty."""
    base = safe_join(root, prefix.rstrip("/")) if prefix.strip("/") else root
    if base.is_dir():
        for directory, _, _ in sorted(os.walk(base), key=lambda entry: -len(entry[0])):
            if Path(directory) != root:  # the store's own root stays
                _rmdir(Path(directory))
    current = base
    while current != root and root in current.parents:
        if not _rmdir(current):
            break
        current = current.parent


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except OSError as err:
        if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
            return False
        raise
