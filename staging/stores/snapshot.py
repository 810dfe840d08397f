"""Pinned dataset snapshots: a prefix listed once, and a Store that reads exactly those versions.

Format (JSON Lines, UTF-8; gzip-compressed when the file name ends in ``.gz``):

- line 1, the header: ``{"lading_snapshot": 1, "source": "s3://b/data/", "taken": "2026-11-24T04:30:00Z"}``;
- then one object per line, **sorted by key**: ``{"key": "x/y.bin", "size": 123, "version":
  "<ETag or generation>", "md5": "<hex>", "crc32c": "<base64>", "mtime": 1795491520}``; the
  checksums and ``mtime`` are left out when the store has none, and ``md5`` when it equals the
  version (a single-part S3 ETag is the MD5 of the content): a version of 32 hex digits with no
  ``md5`` is read as both. About 100 bytes per key: 100 MB for a million keys, a fifth of that
  gzipped.

Streamable both ways: :func:`write_snapshot` holds one page of the listing at a time and
:func:`read_snapshot` one line. Sorted keys let :meth:`SnapshotStore.stat` find a key by binary
search in an uncompressed file (a gzip file is scanned).

:class:`SnapshotStore` wraps the store of the snapshot's source (or a mirror with the same
versions): ``list`` reads the file (no listing request), ``stat`` answers from it (no HEAD),
and every read is pinned to the recorded version, so an object replaced or removed since is an
error naming the key, never newer bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Generator, Iterator, Sequence, TypeVar

from lading.core.atomic import write_atomically
from lading.core.errors import NotFound, ObjectChanged, UsageError, local_error
from lading.core.keys import key_parts
from lading.core.names import hidden_sibling
from lading.core.retry import RetryPolicy
from lading.stores.base import (
    CoroutineReads,
    Fetched,
    ObjectInfo,
    OnPiece,
    Outcomes,
    ProgressCallback,
    RangeRequest,
    ReadOnlyStore,
    Sink,
    Store,
    Views,
)

T = TypeVar("T")
FORMAT_VERSION = 1
_MAGIC = b'{"lading_snapshot"'
_MD5_HEX = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class SnapshotHeader:
    """The first line of a snapshot."""

    source: str
    taken: str
    version: int = FORMAT_VERSION


@dataclass(frozen=True)
class SnapshotSummary:
    """What :func:`write_snapshot` wrote."""

    path: str
    source: str
    taken: str
    objects: int
    total_bytes: int
    file_bytes: int


def is_snapshot(path: str | Path) -> bool:
    """Whether ``path`` is a regular file that starts like a snapshot (plain or gzip), or is named
    like one (``.snap.jsonl[.gz]``): a damaged snapshot is still read as one, to say what is wrong."""
    if str(path).endswith((".snap.jsonl", ".snap.jsonl.gz")) and os.path.isfile(path):
        return True
    try:
        with _open(Path(path)) as handle:
            return handle.read(len(_MAGIC)) == _MAGIC
    except (OSError, EOFError, gzip.BadGzipFile):
        return False


def write_snapshot(
    store: Store, source: str, out: str | Path, progress: Callable[[int], None] | None = None
) -> SnapshotSummary:
    """List ``store`` once and write the snapshot to ``out`` (atomically: a temporary, then a rename)."""
    out = Path(out)
    taken = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    counts = {"objects": 0, "bytes": 0}

    def lines() -> Iterator[bytes]:
        yield _dump({"lading_snapshot": FORMAT_VERSION, "source": source, "taken": taken})
        for info in store.list():
            counts["objects"] += 1
            counts["bytes"] += info.size
            if progress is not None and counts["objects"] % 1000 == 0:
                progress(counts["objects"])
            yield _dump(_record(info))

    tmp = out.with_name(hidden_sibling(out.name, f".lading-tmp-{os.getpid()}"))
    try:
        with open(tmp, "wb") as handle:
            target = gzip.GzipFile(fileobj=handle, mode="wb", mtime=0) if out.name.endswith(".gz") else handle
            for line in lines():
                target.write(line)
            if target is not handle:
                target.close()
        os.replace(tmp, out)
    except OSError as err:
        raise local_error(err, f"write the snapshot {out}") from None
    finally:
        _remove_quietly(tmp)  # after a failure (or an interrupt): no half-written snapshot
    return SnapshotSummary(str(out), source, taken, counts["objects"], counts["bytes"], out.stat().st_size)


def _remove_quietly(path: Path) -> None:
    """Remove ``path`` if it is there. Removing a name that was never created fails on a
    read-only file system (EROFS, not ENOENT): that must not hide the error being raised."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def read_header(path: str | Path) -> SnapshotHeader:
    """The snapshot's header; UsageError when ``path`` is not a snapshot."""
    lines = _lines(Path(path))
    try:
        return _header(next(lines, b""), path)
    finally:
        lines.close()


def read_snapshot(path: str | Path, prefix: str = "") -> Iterator[ObjectInfo]:
    """The snapshot's objects under ``prefix``, in key order, one line in memory at a time."""
    lines = _lines(Path(path))
    try:
        _header(next(lines, b""), path)
        for number, line in enumerate(lines, start=2):
            info = _info(line, path, number)
            if info.key.startswith(prefix):
                yield info
            elif info.key > prefix:
                return  # sorted: nothing under the prefix follows
    finally:
        lines.close()


def _lines(path: Path) -> Generator[bytes, None, None]:
    """The snapshot's lines. A gzip file cut short or damaged is a UsageError naming it (its
    EOFError would otherwise read as an interrupt to the command line)."""
    with _open_checked(path) as handle:
        try:
            yield from handle
        except (EOFError, gzip.BadGzipFile, zlib.error) as err:
            raise UsageError(
                f"{path} is a truncated or damaged snapshot ({err})", "take it again: lading snapshot SOURCE -o FILE"
            ) from None


@dataclass(frozen=True)
class SnapshotDiff:
    """What changed between two snapshots, by key."""

    added: list[str]
    removed: list[str]
    changed: list[str]


def diff_snapshots(old: str | Path, new: str | Path) -> SnapshotDiff:
    """Added, removed and changed (size or version) keys: a merge of the two sorted files."""
    result = SnapshotDiff([], [], [])
    left, right = read_snapshot(old), read_snapshot(new)
    a, b = next(left, None), next(right, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a.key < b.key):
            result.removed.append(a.key)  # type: ignore[union-attr]
            a = next(left, None)
        elif a is None or b.key < a.key:
            result.added.append(b.key)
            b = next(right, None)
        else:
            if (a.size, a.version) != (b.size, b.version):
                result.changed.append(a.key)
            a, b = next(left, None), next(right, None)
    return result


class SnapshotStore(ReadOnlyStore):
    """The objects a snapshot recorded, read from ``inner`` at exactly the recorded versions."""

    def __init__(self, inner: Store, path: str | Path) -> None:
        self.inner = inner
        self.path = Path(path)
        self.header = read_header(self.path)
        self.url = inner.url
        self.config = inner.config
        self.scheme = inner.scheme
        self._compressed = self.path.name.endswith(".gz")

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """The recorded objects under ``prefix``, with no listing request."""
        return read_snapshot(self.path, prefix)

    def stat(self, key: str) -> ObjectInfo:
        """The recorded metadata of ``key``, with no HEAD; NotFound when the snapshot lacks it."""
        key_parts(key)
        found = self._scan(key) if self._compressed else self._search(key)
        if found is None:
            raise NotFound(f"{key} is not in the snapshot {self.path}")
        return found

    def read_many(self, requests: Sequence[RangeRequest]) -> Views:
        """The ranges at their recorded versions, in one batched read of the source."""
        pinned = [self._pin(request) for request in requests]
        try:
            return self.inner.read_many(pinned)
        except (NotFound, ObjectChanged) as err:
            raise self._explained(err, _key_named(err, pinned)) from None

    def read_each(self, requests: Sequence[RangeRequest]) -> Outcomes:
        """As :meth:`read_many`, each failure in its place (explained against the snapshot)."""
        pinned: list[RangeRequest | BaseException] = []
        for request in requests:
            try:
                pinned.append(self._pin(request))
            except NotFound as err:
                pinned.append(err)
        wanted = [request for request in pinned if isinstance(request, RangeRequest)]
        answers = iter(self.inner.read_each(wanted))
        out: list[memoryview | BaseException] = []
        for item in pinned:
            if not isinstance(item, RangeRequest):
                out.append(item)
                continue
            answer = next(answers)
            out.append(self._explained(answer, item.key) if isinstance(answer, (NotFound, ObjectChanged)) else answer)
        return out

    def stream(
        self,
        key: str,
        sink: Sink,
        version: str | None,
        start: int = 0,
        end: int | None = None,
        on_version: Callable[[str], None] | None = None,
    ) -> Fetched:
        """The source's streaming GET, pinned to the recorded version."""
        return self._pinned(key, lambda pinned: self.inner.stream(key, sink, pinned, start, end, on_version), version)

    def download(
        self,
        key: str,
        dest: Path,
        version: str | None = None,
        progress: ProgressCallback | None = None,
        size: int | None = None,
        on_piece: OnPiece | None = None,
    ) -> None:
        """The recorded version into ``dest``."""
        self._pinned(key, lambda pinned: self.inner.download(key, dest, pinned, progress, size, on_piece), version)

    def read_object(self, key: str) -> tuple[bytes, str] | None:
        """The recorded version's bytes, or None when the snapshot lacks the key."""
        try:
            info = self.stat(key)
        except NotFound:
            return None
        return bytes(self.read_many([RangeRequest(key, 0, None, info.version or None)])[0]), info.version

    def coroutine_reads(self, key: str) -> CoroutineReads | None:
        """The source's coroutine reads of ``key``, its missing or changed objects explained against
        the snapshot (the caller pins each request to the recorded version, as listed)."""
        reads = self.inner.coroutine_reads(key)
        return None if reads is None else _ExplainedReads(self, key, reads)

    def md5_of_version(self, version: str) -> str | None:
        """As the source says."""
        return self.inner.md5_of_version(version)

    def etag_is_md5(self, key: str) -> bool:
        """As the source says."""
        return self.inner.etag_is_md5(key)

    def _refuse(self) -> UsageError:
        return UsageError(f"cannot write into a snapshot ({self.path})", "write to the store itself")

    def _pin(self, request: RangeRequest) -> RangeRequest:
        recorded = request.version or self.stat(request.key).version or None
        return RangeRequest(request.key, request.start, request.end, recorded)

    def _pinned(self, key: str, read: Callable[[str | None], T], version: str | None) -> T:
        recorded = version or self.stat(key).version or None
        try:
            return read(recorded)
        except (NotFound, ObjectChanged) as err:
            raise self._explained(err, key) from None

    def _explained(self, err: BaseException, key: str | None) -> BaseException:
        """A source's NotFound or ObjectChanged as what it means for a snapshot."""
        where = f"{self.url.rstrip('/')}/{key}" if key else self.url
        if isinstance(err, NotFound):
            return ObjectChanged(
                f"{where} was removed since the snapshot {self.path} was taken ({self.header.taken})",
                "take a new snapshot",
            )
        if isinstance(err, ObjectChanged):
            return ObjectChanged(
                f"{where} changed since the snapshot {self.path} was taken "  # names it once
                f"({self.header.taken})",
                "take a new snapshot",
            )
        return err

    def _scan(self, key: str) -> ObjectInfo | None:
        for info in read_snapshot(self.path, key):
            if info.key == key:
                return info
            if info.key > key:
                return None
        return None

    def _search(self, key: str) -> ObjectInfo | None:
        """Binary search over the line starts of the sorted, uncompressed file. Invariant: ``low``
        and ``high`` are line starts (or the end); lines before ``low`` have smaller keys, the
        line at ``high`` (if any) a key not smaller than ``key``."""
        with open(self.path, "rb") as handle:
            low = len(handle.readline())
            high = os.fstat(handle.fileno()).st_size
            while low < high:
                handle.seek((low + high) // 2 - 1)
                handle.readline()  # to the first line starting at or after the middle
                start = handle.tell()
                if start >= high:  # no line starts there: step from ``low`` instead
                    handle.seek(start := low)
                line = handle.readline()
                if _info(line, self.path, 0).key < key:
                    low = start + len(line)
                else:
                    high = start
            handle.seek(low)
            line = handle.readline()
            found = _info(line, self.path, 0) if line else None
            return found if found is not None and found.key == key else None


class _ExplainedReads:
    """A source's coroutine reads, a NotFound or ObjectChanged said as a snapshot says it."""

    def __init__(self, snapshot: SnapshotStore, key: str, reads: CoroutineReads) -> None:
        self.snapshot, self.key, self.reads = snapshot, key, reads

    async def read(self, request: RangeRequest, policy: RetryPolicy | None = None) -> memoryview:
        """As the source's, explained."""
        try:
            return await self.reads.read(request, policy)
        except (NotFound, ObjectChanged) as err:
            raise self.snapshot._explained(err, self.key) from None

    async def attempt(
        self, key: str, start: int, end: int | None, version: str | None, sink: Sink, on_version: Callable[[str], None]
    ) -> Fetched:
        """As the source's, explained."""
        try:
            return await self.reads.attempt(key, start, end, version, sink, on_version)
        except (NotFound, ObjectChanged) as err:
            raise self.snapshot._explained(err, key) from None


def _key_named(err: BaseException, requests: Sequence[RangeRequest]) -> str | None:
    """Which request's key an error message names (for an error of a batch)."""
    text = str(err)
    return next((request.key for request in requests if request.key in text), None)


def _record(info: ObjectInfo) -> dict[str, Any]:
    record: dict[str, Any] = {"key": info.key, "size": info.size, "version": info.version}
    if info.md5 and info.md5 != info.version:  # an S3 single-part ETag is its MD5: not twice
        record["md5"] = info.md5
    if info.crc32c:
        record["crc32c"] = info.crc32c
    if info.mtime:
        record["mtime"] = int(info.mtime)
    return record


def _dump(record: dict[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _open(path: Path) -> IO[bytes]:
    if path.name.endswith(".gz"):
        return gzip.GzipFile(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _open_checked(path: Path) -> IO[bytes]:
    try:
        handle = _open(path)
    except FileNotFoundError:
        raise NotFound(f"no snapshot at {path}") from None
    except OSError as err:  # permission denied: 4, as for any file we may not read
        raise local_error(err, f"read the snapshot {path}") from None
    return handle if isinstance(handle, io.BufferedReader) else io.BufferedReader(handle)  # type: ignore[type-var]


def _header(line: bytes, path: str | Path) -> SnapshotHeader:
    try:
        data = json.loads(line)
        version = int(data["lading_snapshot"])
        header = SnapshotHeader(str(data["source"]), str(data.get("taken", "")), version)
    except (ValueError, KeyError, TypeError, gzip.BadGzipFile):
        raise UsageError(f"{path} is not a lading snapshot", "make one with: lading snapshot SOURCE -o FILE") from None
    if version > FORMAT_VERSION:
        raise UsageError(
            f"{path} is a snapshot of format {version}; this lading reads format {FORMAT_VERSION}",
            "upgrade lading-data",
        )
    return header


def _info(line: bytes, path: str | Path, number: int) -> ObjectInfo:
    try:
        data = json.loads(line)
        version = str(data.get("version", ""))
        md5 = data.get("md5") or (version if _MD5_HEX.fullmatch(version) else None)
        info = ObjectInfo(
            str(data["key"]), int(data["size"]), version, float(data.get("mtime", 0)), md5, data.get("crc32c")
        )
    except (ValueError, KeyError, TypeError):
        where = f" line {number}" if number else ""
        raise UsageError(f"{path}{where} is not a valid snapshot record") from None
    key_parts(info.key)  # a crafted snapshot must not name a path outside the destination
    return info


def write_sagemaker_manifest(snapshot: str | Path, out: str | Path) -> int:
    """A SageMaker ManifestFile (``[{"prefix": SOURCE/}, "key", ...]``) of a snapshot's objects,
    for File-mode channels; returns how many keys it lists."""
    header = read_header(snapshot)
    prefix = header.source if header.source.endswith("/") else header.source + "/"
    keys = [info.key for info in read_snapshot(snapshot)]
    text = json.dumps([{"prefix": prefix}, *keys], ensure_ascii=False)
    try:
        write_atomically(Path(out), text + "\n")
    except OSError as err:
        raise local_error(err, f"write the manifest {out}") from None
    return len(keys)
