"""``lading fetch URI DEST`` (and each hook dataset): one object or a prefix, staged once.

DEST rules (as with ``cp``): a trailing ``/`` or an existing directory means "into this
directory" (``s3://b/data.csv /tmp/d/`` -> ``/tmp/d/data.csv``); otherwise DEST is the file
for one object, or the directory a prefix's keys land under.
A URI ending in ``/`` is always a prefix; otherwise an object of that exact name is preferred
and, when there is none, the URI is read as a prefix (``s3://b/train`` = ``s3://b/train/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lading.core.errors import NotFound, local_error
from lading.core.keys import safe_join
from lading.hooks.stage import (
    QuietStageEvents,
    StageEvents,
    StageResult,
    stage_object,
    stage_prefix,
)
from lading.stores import Store, StoreConfig, StoreURI, open_store, parse_uri
from lading.stores.base import ObjectInfo
from lading.stores.snapshot import is_snapshot
from lading.transfer import TransferOptions


@dataclass(frozen=True)
class Staged:
    """A finished staging: what happened, and the directory (or file) views are built from."""

    result: StageResult
    root: Path


def _into_directory(dest: str) -> bool:
    try:
        return dest.endswith("/") or Path(dest).is_dir()
    except OSError as err:  # under a directory we may not enter: is_dir raises EACCES
        raise local_error(err, f"create DEST {dest}") from None


def _find_object(uri: StoreURI, config: StoreConfig | None) -> tuple[Store, ObjectInfo] | None:
    """The single object ``uri`` names, or None when it names a prefix."""
    if uri.scheme == "file":
        if Path(uri.prefix).is_dir():
            return None
    elif not uri.prefix or uri.prefix.endswith("/"):
        return None
    parent, name = uri.split_name()
    store = open_store(parent, config)
    try:
        return store, store.stat(name)
    except NotFound:
        return None


def stage_source(
    source: str,
    dest: str,
    config: StoreConfig | None = None,
    options: TransferOptions = TransferOptions(),
    events: StageEvents = QuietStageEvents(),
    force: bool = False,
) -> Staged:
    """Stage ``source`` (object or prefix) at ``dest`` once per node; see the module doc.

    ``force`` lets one object replace a file at DEST that lading did not write (refused otherwise).
    """
    uri = parse_uri(source)
    if uri.scheme == "file" and is_snapshot(uri.prefix):  # a snapshot stands for its whole prefix
        store = open_store(uri, config)
        root = Path(dest.rstrip("/") or "/")
        return Staged(stage_prefix(store, store.url, root, options, events), root)
    found = _find_object(uri, config)
    if found is not None:
        store, info = found
        if _into_directory(dest):
            root = Path(dest)
            target = safe_join(root, info.key)  # the one key-safety check: '.', '..', NUL...
        else:
            root = target = Path(dest)
        return Staged(stage_object(store, str(uri), info, target, options, events, force), root)
    prefix = (
        uri
        if not uri.prefix or uri.prefix.endswith("/") or uri.scheme == "file"
        else StoreURI(uri.scheme, uri.bucket, uri.prefix + "/")
    )
    root = Path(dest.rstrip("/") or "/")
    return Staged(stage_prefix(open_store(prefix, config), str(prefix), root, options, events), root)
