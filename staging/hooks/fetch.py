"""Plan ``lading fetch URI DEST``: one object or a prefix, as a :class:`StagePlan`.

DEST rules (as with ``cp``): a trailing ``/`` or an existing directory means "into this
directory" (``s3://b/data.csv /tmp/d/`` -> ``/tmp/d/data.csv``); otherwise DEST is the file
for one object, or the directory a prefix's keys land under.
A URI ending in ``/`` is always a prefix; otherwise an object of that exact name is preferred
and, when there is none, the URI is read as a prefix (``s3://b/train`` = ``s3://b/train/``).
"""

from __future__ import annotations

from pathlib import Path

from staging.errors import NotFound, UnsafeKey
from staging.hooks.stage import StagePlan
from staging.keys import find_collisions, safe_join
from staging.stores import Store, StoreConfig, StoreURI, open_store, parse_uri
from staging.transfer import TransferItem


def _as_prefix(uri: StoreURI) -> StoreURI:
    if not uri.prefix or uri.prefix.endswith("/"):
        return uri
    return StoreURI(uri.scheme, uri.bucket, uri.prefix + "/")


def _into_directory(dest: str) -> bool:
    return dest.endswith("/") or Path(dest).is_dir()


def plan_fetch(source: str, dest: str, config: StoreConfig | None = None) -> tuple[Store, StagePlan]:
    """Resolve SOURCE (object or prefix) against the store and map it onto DEST."""
    uri = parse_uri(source)
    if uri.scheme == "file":
        maybe_object = not Path(uri.prefix).is_dir()
    else:
        maybe_object = bool(uri.prefix) and not uri.prefix.endswith("/")
    if maybe_object:
        single = _plan_object(uri, dest, config)
        if single is not None:
            return single
    return _plan_prefix(uri, dest, config)


def _plan_object(uri: StoreURI, dest: str, config: StoreConfig | None) -> tuple[Store, StagePlan] | None:
    parent, leaf = uri.split_name()
    store = open_store(parent, config)
    try:
        info = store.stat(leaf)
    except NotFound:
        return None
    if _into_directory(dest):
        root = Path(dest)
        target = root / leaf
    else:
        root = target = Path(dest)
    return store, StagePlan(str(uri), root, target, (TransferItem(info, target),))


def _plan_prefix(uri: StoreURI, dest: str, config: StoreConfig | None) -> tuple[Store, StagePlan]:
    prefix = _as_prefix(uri)
    store = open_store(prefix, config)
    root = Path(dest.rstrip("/") or "/")
    infos = list(store.list())
    if not infos:
        raise NotFound(f"nothing at {uri}: no object of that name and no keys under it",
                       "check the bucket and prefix (keys are case-sensitive)")
    collisions = find_collisions(info.key for info in infos)
    if collisions:
        file_key, other = collisions[0]
        raise UnsafeKey(f"{uri}: key {file_key!r} is both a file and a directory of {other!r}",
                        "such a prefix cannot be laid out as files")
    items = tuple(TransferItem(info, safe_join(root, info.key)) for info in infos)
    return store, StagePlan(str(prefix), root, root, items)
