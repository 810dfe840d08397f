"""Manifests: an explicit list of keys that replaces a bucket listing (``--manifest FILE``).

Three forms are accepted:

- SageMaker's ManifestFile, a JSON array whose first element names the prefix and whose other
  elements are paths relative to it (joined by plain concatenation, as SageMaker does)::

      [{"prefix": "s3://bucket/data/"}, "train/0001.jpg", "train/0002.jpg"]

- SageMaker's augmented manifest, JSON Lines whose attributes ending in ``-ref`` name objects;
  every other attribute is data for the training code::

      {"source-ref": "s3://bucket/data/img/1.jpg", "class": 3}
      {"source-ref": "s3://bucket/data/img/2.jpg", "mask-ref": "s3://bucket/data/masks/2.png", "class": 5}

  Each line becomes a :class:`Record` (its refs and its other attributes). The entries are the
  refs of every line, in order (an object referenced twice is fetched once).
- a plain text list, one key per line, relative to the sync SOURCE. Blank lines and lines
  starting with ``#`` are ignored; a line that is a full URI under SOURCE is made relative.

:func:`parse_manifest` only reads the text; :func:`keys_under` resolves the entries against a
source location (and refuses entries outside it, naming the line of an augmented manifest).
Keys are not checked for safety here: callers pass them through :func:`lading.core.keys.key_parts`
like listed keys.

For augmented manifests, :func:`share_records` deals lines to ranks (a line goes with its first
referenced object, and brings its other objects along) and :func:`write_local_manifest` writes
the rank's lines into DEST as ``manifest.jsonl``, each ref rewritten to the object's path
relative to DEST, every other attribute as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

from lading.core.atomic import write_atomically
from lading.core.errors import NotFound, UsageError, local_error
from lading.selection.sharding import assign_ranks
from lading.stores.base import ObjectInfo
from lading.stores.uri import StoreURI, parse_uri

#: The name of the rewritten augmented manifest in DEST.
LOCAL_MANIFEST = "manifest.jsonl"
#: Attributes whose names end in this name objects (SageMaker's convention).
REF_SUFFIX = "-ref"

T = TypeVar("T", bound=ObjectInfo)


@dataclass(frozen=True)
class Record:
    """One line of an augmented manifest: ``refs`` maps each ``*-ref`` attribute to the location
    it names, ``attributes`` holds the line's other attributes; ``order`` is every attribute
    name in the line's order."""

    line: int
    refs: Mapping[str, str]
    attributes: Mapping[str, Any]
    order: tuple[str, ...] = ()


@dataclass(frozen=True)
class Manifest:
    """Entries of a manifest. ``prefix`` is the ManifestFile prefix (None for the other forms).

    Each entry is the full location (``prefix + path``) for the JSON form, the ref as written
    for an augmented manifest (``records`` holds its lines) and the line as written for the
    plain form.
    """

    prefix: str | None
    entries: tuple[str, ...]
    origin: str = "manifest"
    records: tuple[Record, ...] | None = None

    @property
    def augmented(self) -> bool:
        """Whether this is an augmented manifest (JSON Lines with ``*-ref`` attributes)."""
        return self.records is not None


def parse_manifest(text: str, origin: str = "manifest") -> Manifest:
    """Parse either manifest form; raise :class:`UsageError` when it is malformed.

    Text starting with ``[`` or ``{`` is JSON: when it does not parse, the error says so,
    instead of reading the broken JSON as a list of keys.
    """
    import json  # here, not at the top: `lading cat` and `sync` start faster without it

    if text.lstrip().startswith("{"):
        first = text.lstrip().split("\n", 1)[0]
        try:
            is_lines = isinstance(json.loads(first), dict)
        except json.JSONDecodeError:
            is_lines = False  # a JSON object over several lines: not JSON Lines
        if is_lines:
            return _parse_json_lines(text, origin)
    if text.lstrip().startswith(("[", "{")):
        return _parse_json(text, origin)
    entries = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            entries.append(stripped)
    return Manifest(None, tuple(entries), origin)


def _parse_json(text: str, origin: str) -> Manifest:
    import json

    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(
            f"{origin}: the manifest is invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}",
            'a ManifestFile is [{"prefix": "s3://bucket/p/"}, "key", ...]; a plain manifest is one key per line',
        ) from None
    if not isinstance(data, list):
        raise UsageError(
            f"{origin}: a ManifestFile is a JSON array, not {type(data).__name__}",
            '[{"prefix": "s3://bucket/p/"}, "key", ...]',
        )
    if not data or not isinstance(data[0], dict) or not isinstance(data[0].get("prefix"), str):
        raise UsageError(f'{origin}: a ManifestFile starts with {{"prefix": "s3://bucket/prefix/"}}')
    prefix = data[0]["prefix"]
    entries = []
    for index, item in enumerate(data[1:], start=1):
        if not isinstance(item, str) or not item:
            raise UsageError(f"{origin}: element {index} is not a non-empty string: {item!r}")
        entries.append(prefix + item)
    return Manifest(prefix, tuple(entries), origin)


def _parse_json_lines(text: str, origin: str) -> Manifest:
    """An augmented manifest: one JSON object per line, objects named by ``*-ref`` attributes."""
    import json

    records: list[Record] = []
    entries: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(
                f"{origin} line {number}: invalid JSON at column {err.colno}: {err.msg}",
                "an augmented manifest has one JSON object per line",
            ) from None
        if not isinstance(item, dict):
            raise UsageError(
                f"{origin} line {number}: a JSON {type(item).__name__}, not an object",
                "an augmented manifest has one JSON object per line",
            )
        refs: dict[str, str] = {}
        attributes: dict[str, Any] = {}
        for name, value in item.items():
            if not name.endswith(REF_SUFFIX):
                attributes[name] = value
            elif isinstance(value, str) and value:
                refs[name] = value
            else:
                raise UsageError(
                    f"{origin} line {number}: {name!r} must name an object, got {value!r}",
                    "a *-ref attribute holds a location such as s3://bucket/key",
                )
        records.append(Record(number, refs, attributes, tuple(item)))
        entries.extend(refs.values())
    if not entries:
        raise UsageError(
            f"{origin}: JSON Lines without any '{REF_SUFFIX}' attribute name no objects",
            'an augmented manifest names objects in attributes such as "source-ref"; '
            'a ManifestFile is [{"prefix": "s3://bucket/p/"}, "key", ...]',
        )
    return Manifest(None, tuple(entries), origin, tuple(records))


def load_manifest(path: str | Path) -> Manifest:
    """Read and parse a manifest file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise NotFound(f"manifest not found: {path}") from err
    except UnicodeDecodeError as err:
        raise UsageError(f"cannot read manifest {path}: not UTF-8 text ({err.reason})") from err
    except OSError as err:
        raise local_error(err, f"read the manifest {path}") from err
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
    if manifest.records is not None:
        return list(dict.fromkeys(key for keys in record_keys(manifest, uri) for key in keys.values()))
    root = _root(uri)
    keys: list[str] = []
    seen: set[str] = set()
    for entry in manifest.entries:
        key = _relative(entry, root, manifest, uri)
        if key not in seen:
            seen.add(key)
            keys.append(key)
    return keys


def record_keys(manifest: Manifest, source: str | StoreURI) -> list[dict[str, str]]:
    """For each line of an augmented manifest, its refs as keys relative to ``source``
    (attribute -> key). A ref outside ``source`` is a usage error naming the line."""
    uri = parse_uri(source) if isinstance(source, str) else source
    root = _root(uri)
    result = []
    for record in manifest.records or ():
        where = f"{manifest.origin} line {record.line}"
        result.append({name: _relative(ref, root, manifest, uri, where, name) for name, ref in record.refs.items()})
    return result


def _relative(
    entry: str, root: str, manifest: Manifest, source: StoreURI, where: str | None = None, attribute: str | None = None
) -> str:
    is_location = (
        "://" in entry or manifest.prefix is not None or (manifest.records is not None and entry.startswith("/"))
    )
    if not is_location:
        return entry
    if source.scheme == "file" and entry.startswith("file://"):
        entry = entry[len("file://") :]
    if entry.startswith(root) and len(entry) > len(root):
        return entry[len(root) :]
    if attribute is not None:
        raise UsageError(
            f"{where}: {attribute} {entry!r} is not under the source {str(source)!r}",
            "every object an augmented manifest references must lie under SOURCE",
        )
    raise UsageError(
        f"{manifest.origin}: {entry!r} is not under the source {str(source)!r}",
        "the manifest's prefix must be the sync SOURCE or lie inside it",
    )


def share_records(
    manifest: Manifest,
    source: str,
    kept: Sequence[T],
    mine: Sequence[T],
    rank: int,
    world_size: int,
    distribution: str = "replicated",
    balance: str = "count",
) -> tuple[list[T], tuple[int, ...]]:
    """This rank's objects and lines (indices into ``manifest.records``) for an augmented manifest.

    ``kept`` are the selected objects of every rank, ``mine`` this rank's share by the sharding
    rule. A line goes to the rank that owns its first kept ref, and that rank also fetches the
    line's other refs, so every line is complete on exactly one rank (an object two lines share
    may be fetched by two ranks). A line whose refs were all filtered out is left out; a line
    without any ref goes to rank ``index mod world_size``. Replicated: every line, every object.
    A key that would shadow DEST's ``manifest.jsonl`` is refused.
    """
    by_key = {info.key: info for info in kept}
    clash = [key for key in by_key if key == LOCAL_MANIFEST or key.startswith(LOCAL_MANIFEST + "/")]
    if clash:
        raise UsageError(
            f"{manifest.origin}: the object {clash[0]!r} would be replaced by the rewritten "
            f"augmented manifest DEST/{LOCAL_MANIFEST}",
            "rename the object, or leave it out with --exclude",
        )
    keys_per_line = record_keys(manifest, source)
    replicated = distribution == "replicated" or world_size == 1
    owner = {} if replicated else assign_ranks(kept, world_size, balance)
    wanted: set[str] = set()
    lines: list[int] = []
    for index, keys in enumerate(keys_per_line):
        present = [key for key in keys.values() if key in by_key]
        if keys and not present:
            continue
        if not replicated:
            line_rank = owner[present[0]] if present else index % world_size
            if line_rank != rank:
                continue
        lines.append(index)
        wanted.update(present)
    if replicated:
        return list(mine), tuple(lines)
    mine = [info for info in kept if info.key in wanted]
    return sorted(mine, key=lambda info: info.key), tuple(lines)


def local_lines(manifest: Manifest, source: str, lines: Sequence[int], present: set[str]) -> list[str]:
    """The JSON Lines of ``DEST/manifest.jsonl``: the chosen lines, each ref that was fetched
    rewritten to its path relative to DEST (its key), other refs and attributes as they were."""
    import json

    keys_per_line = record_keys(manifest, source)
    records = manifest.records or ()
    out = []
    for index in lines:
        record, keys = records[index], keys_per_line[index]
        item = {}
        for name in record.order:
            if name in record.refs:
                key = keys[name]
                item[name] = key if key in present else record.refs[name]
            else:
                item[name] = record.attributes[name]
        out.append(json.dumps(item, ensure_ascii=False))
    return out


def write_local_manifest(manifest: Manifest, source: str, dest: Path, lines: Sequence[int], present: set[str]) -> Path:
    """Write (atomically) ``dest/manifest.jsonl`` for this rank's lines; unchanged content is not
    rewritten. Call it once every object is in place, so a reader never sees a line whose file
    is missing."""
    path = Path(dest) / LOCAL_MANIFEST
    text = "".join(line + "\n" for line in local_lines(manifest, source, lines, present))
    try:
        if path.is_file() and not path.is_symlink() and path.read_bytes() == text.encode("utf-8"):
            return path
        write_atomically(path, text)
    except OSError as err:
        raise local_error(err, f"write {path}") from err
    return path
