"""Manifests: an explicit list of keys that replaces a bucket listing (``--manifest FILE``).

Two forms are accepted:

- SageMaker's ManifestFile, a JSON array whose first element names the prefix and whose other
  elements are paths relative to it (joined by plain concatenation, as SageMaker does)::

      [{"prefix": "s3://bucket/data/"}, "train/0001.jpg", "train/0002.jpg"]

- a plain text list, one key per line, relative to the sync SOURCE. Blank lines and lines
  starting with ``#`` are ignored; a line that is a full URI under SOURCE is made relative.

:func:`parse_manifest` only reads the text; :func:`keys_under` resolves the entries against a
source location (and refuses entries outside it). Keys are not checked for safety here: callers
pass them through :func:`staging.keys.key_parts` like listed keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lading.core.errors import NotFound, UsageError
from lading.stores.uri import StoreURI, parse_uri


@dataclass(frozen=True)
class Manifest:
    """Entries of a manifest. ``prefix`` is the ManifestFile prefix (None for a plain list).

    Each entry is the full location (``prefix + path``) for the JSON form, and the line as
    written for the plain form.
    """

    prefix: str | None
    entries: tuple[str, ...]
    origin: str = "manifest"


def parse_manifest(text: str, origin: str = "manifest") -> Manifest:
    """Parse either manifest form; raise :class:`UsageError` when it is malformed.

    Text starting with ``[`` or ``{`` is JSON: when it does not parse, the error says so,
    instead of reading the broken JSON as a list of keys.
    """
    if text.lstrip().startswith(("[", "{")):
        return _parse_json(text, origin)
    entries = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            entries.append(stripped)
    return Manifest(None, tuple(entries), origin)


def _parse_json(text: str, origin: str) -> Manifest:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{origin}: the manifest is invalid JSON at line {err.lineno}, column {err.colno}: "
                         f"{err.msg}", "a ManifestFile is [{\"prefix\": \"s3://bucket/p/\"}, \"key\", ...]; "
                         "a plain manifest is one key per line") from None
    if not isinstance(data, list):
        raise UsageError(f"{origin}: a ManifestFile is a JSON array, not {type(data).__name__}",
                         "[{\"prefix\": \"s3://bucket/p/\"}, \"key\", ...]")
    if not data or not isinstance(data[0], dict) or not isinstance(data[0].get("prefix"), str):
        raise UsageError(f"{origin}: a ManifestFile starts with {{\"prefix\": \"s3://bucket/prefix/\"}}")
    prefix = data[0]["prefix"]
    entries = []
    for index, item in enumerate(data[1:], start=1):
        if not isinstance(item, str) or not item:
            raise UsageError(f"{origin}: element {index} is not a non-empty string: {item!r}")
        entries.append(prefix + item)
    return Manifest(prefix, tuple(entries), origin)


def load_manifest(path: str | Path) -> Manifest:
    """Read and parse a manifest file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise NotFound(f"manifest not found: {path}") from err
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read manifest {path}: {err}") from err
    return parse_manifest(text, str(path))


def _root(source: StoreURI) -> str:
    """The source as a string prefix that every full location under it starts with."""
    text = str(source)
    if source.scheme == "file":
        return text.rstrip("/") + "/"
    return text if text.endswith("/") else text + "/"


def keys_under(manifest: Manifest, source: str | StoreURI) -> list[str]:
    """The manifest's entries as keys relative to ``source``, deduplicated, in the given order."""
    uri = parse_uri(source) if isinstance(source, str) else source
    root = _root(uri)
    keys: list[str] = []
    seen: set[str] = set()
    for entry in manifest.entries:
        key = _relative(entry, root, manifest, uri)
        if key not in seen:
            seen.add(key)
            keys.append(key)
    return keys


def _relative(entry: str, root: str, manifest: Manifest, source: StoreURI) -> str:
    is_location = "://" in entry or manifest.prefix is not None
    if not is_location:
        return entry
    if source.scheme == "file" and entry.startswith("file://"):
        entry = entry[len("file://"):]
    if entry.startswith(root) and len(entry) > len(root):
        return entry[len(root):]
    raise UsageError(f"{manifest.origin}: {entry!r} is not under the source {str(source)!r}",
                     "the manifest's prefix must be the sync SOURCE or lie inside it")
