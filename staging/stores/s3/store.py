"""S3 (and S3-compatible endpoints) as a Store, through boto3.

Prefix rule: a URI always names a *prefix*, like a directory. ``s3://b/data`` and
``s3://b/data/`` both mean "the keys under ``data/``", and keys are returned relative to it
(``data/x/y.bin`` -> ``x/y.bin``). ``s3://b`` is the whole bucket. Zero-byte "folder marker"
objects whose key ends in ``/`` are skipped. To address one object, split the URI at its last
``/`` (:meth:`staging.stores.uri.StoreURI.split_name`): the parent prefix is the store, the
last segment is the key.

Retries: botocore's own retries are switched off (``total_max_attempts=1``); every call goes
through :func:`staging.retry.with_retries` with ``StoreConfig.retry``, so throttling, server
errors and network failures -- including a body that breaks off half-way, which botocore never
retries -- are retried in one place, with exponential backoff and full jitter. Downloads resume
from the bytes already written, guarded by ``If-Match`` so a replaced object is never mixed.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import os
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, TypeVar

from lading.core.errors import ObjectChanged, TransientError
from lading.core.retry import with_retries
from lading.stores.base import ObjectInfo, ProgressCallback
from lading.stores.config import StoreConfig
from lading.stores.lazy import LazyClient, translated
from lading.stores.s3.errors import client_error_code, translate
from lading.stores.s3.listing import md5_of_etag
from lading.stores.s3.upload import MultipartUpload
from lading.stores.uri import StoreURI, root_prefix

T = TypeVar("T")
_READ_CHUNK = 1 << 20


def _etag(raw: str | None) -> str:
    return (raw or "").strip('"')


def parse_timestamp(value: str) -> datetime:
    """S3 timestamps, fast: ISO 8601 in XML bodies, RFC 1123 in headers (dateutil as fallback)."""
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        pass
    try:
        return email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        from botocore.utils import parse_timestamp as slow_parse

        return slow_parse(value)


class S3Store:
    """A bucket prefix on S3 or an S3-compatible server.

    Tunables (attributes, for callers and tests): ``page_size`` keys per listing request,
    ``multipart_threshold`` / ``part_size`` / ``upload_workers`` for uploads.
    """

    def __init__(self, uri: StoreURI, config: StoreConfig, *, page_size: int = 1000,
                 multipart_threshold: int = 64 << 20, part_size: int = 16 << 20,
                 upload_workers: int = 8) -> None:
        self.uri = uri
        self.config = config
        self.url = str(uri)
        self.bucket = uri.bucket
        self.root = root_prefix(uri.prefix)
        self.page_size = page_size
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self.upload_workers = upload_workers
        self._client = LazyClient(self._build_client)

    # -- client and the one retry/translation wrapper ------------------------------------------

    def _build_client(self) -> Any:
        import boto3
        import botocore.session
        from botocore import UNSIGNED
        from botocore.config import Config

        cfg = self.config
        options: dict[str, Any] = {
            "retries": {"mode": "standard", "total_max_attempts": 1},  # ours, see module docstring
            "max_pool_connections": cfg.max_pool_connections,
            "connect_timeout": min(cfg.timeout, 10.0),
            "read_timeout": cfg.timeout,
            "tcp_keepalive": True,
            # Checksums only where S3 requires them: S3-compatible servers often reject the
            # aws-chunked trailers newer botocore sends by default. We send Content-MD5 ourselves.
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
        }
        if cfg.no_sign_request:
            options["signature_version"] = UNSIGNED
        if cfg.endpoint_url:
            options["s3"] = {"addressing_style": "path"}
        core = botocore.session.Session()
        # botocore parses every LastModified with dateutil: about 60% of a listing's CPU.
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
        session = boto3.session.Session(botocore_session=core, profile_name=cfg.profile, region_name=cfg.region)
        return session.client("s3", endpoint_url=cfg.endpoint_url, config=Config(**options))

    def _where(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{self.root}{key}"

    def _attempt(self, what: str, operation: Callable[[Any], T]) -> T:
        """Run ``operation(client)`` once, translating any SDK error (no retry)."""
        return translated(lambda: operation(self._client.get()), translate, what)

    def _call(self, what: str, operation: Callable[[Any], T]) -> T:
        """Run ``operation(client)`` with translation and retries of transient failures."""
        return with_retries(lambda: self._attempt(what, operation), self.config.retry)

    # -- listing and metadata -------------------------------------------------------------------

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield objects under ``root + prefix`` in key order, one ListObjectsV2 page at a time."""
        full_prefix = self.root + prefix
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix, "MaxKeys": self.page_size}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call(self._where(prefix), lambda client: client.list_objects_v2(**kwargs))
            for item in page.get("Contents", ()):
                info = self._info_from_listing(item)
                if info is not None:
                    yield info
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def _info_from_listing(self, item: dict[str, Any]) -> ObjectInfo | None:
        key = item["Key"][len(self.root):]
        if not key or (key.endswith("/") and item.get("Size", 0) == 0):
            return None  # the prefix itself, or a folder marker
        etag = _etag(item.get("ETag"))
        modified = item.get("LastModified")
        return ObjectInfo(key, int(item.get("Size", 0)), etag,
                          modified.timestamp() if modified else 0.0, md5_of_etag(etag))

    def stat(self, key: str) -> ObjectInfo:
        """HEAD one object."""
        head = self._call(self._where(key), lambda client: client.head_object(
            Bucket=self.bucket, Key=self.root + key))
        etag = _etag(head.get("ETag"))
        modified = head.get("LastModified")
        # With SSE-KMS or SSE-C the ETag is not the MD5 of the content.
        encrypted = head.get("ServerSideEncryption") == "aws:kms" or "SSECustomerAlgorithm" in head
        return ObjectInfo(key, int(head.get("ContentLength", 0)), etag,
                          modified.timestamp() if modified else 0.0, None if encrypted else md5_of_etag(etag))

    # -- reads ----------------------------------------------------------------------------------

    def _get(self, client: Any, key: str, byte_range: str | None, version: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.root + key}
        if byte_range:
            kwargs["Range"] = byte_range
        if version:
            kwargs["IfMatch"] = f'"{version}"'
        return client.get_object(**kwargs)

    def read_range(self, key: str, start: int, end: int, version: str | None = None) -> bytes:
        """Bytes ``[start, end)`` (fewer at the end of the object), guarded by ``If-Match``."""
        if end <= start:
            return b""

        def attempt(client: Any) -> bytes:
            try:
                response = self._get(client, key, f"bytes={start}-{end - 1}", version)
            except Exception as err:
                if client_error_code(err)[1] == 416:
                    return b""  # the range starts at or past the end of the object
                raise
            body = response["Body"]
            try:
                _check_version(response, version, self._where(key))
                if _range_start(response) is None:  # a server that ignores Range: skip ahead
                    return _read_slice(body, start, end - start)
                return body.read()
            finally:
                body.close()

        return self._call(self._where(key), attempt)

    def download(
        self,
        key: str,
        dest: Path,
        version: str | None = None,
        progress: ProgressCallback | None = None,
    ) -> None:
        """Stream the object into ``dest``; a broken transfer resumes where it stopped.

        The first response's ETag (or ``version``) guards every resumed request with
        ``If-Match``, so the file never mixes two versions: a replaced object raises
        :class:`ObjectChanged`.
        """
        with open(dest, "wb") as out:
            _Download(self, key, out, version, progress).run()

    # -- uploads --------------------------------------------------------------------------------

    def upload(self, src: Path, key: str, progress: ProgressCallback | None = None) -> ObjectInfo:
        """Upload ``src``; multipart (parallel parts, each retried) above ``multipart_threshold``."""
        size = os.path.getsize(src)
        if size < self.multipart_threshold:
            self._put_single(src, key, size)
            if progress is not None:
                progress(size)
        else:
            MultipartUpload(self, src, key, size, progress).run()
        return self.stat(key)

    def _put_single(self, src: Path, key: str, size: int) -> None:
        digest = md5_base64_of_file(src)

        def attempt(client: Any) -> None:
            with open(src, "rb") as body:
                client.put_object(Bucket=self.bucket, Key=self.root + key, Body=body,
                                  ContentLength=size, ContentMD5=digest)

        self._call(self._where(key), attempt)


class _Download:
    """One resumable download: state kept across attempts by :func:`with_retries`."""

    def __init__(self, store: S3Store, key: str, out: BinaryIO, version: str | None,
                 progress: ProgressCallback | None) -> None:
        self.store, self.key, self.out, self.progress = store, key, out, progress
        self.etag = version
        self.written = 0
        self.total: int | None = None

    def run(self) -> None:
        self.store._call(self.store._where(self.key), self._attempt)
        if self.total is not None and self.written != self.total:
            raise TransientError(f"{self.store._where(self.key)}: got {self.written} of {self.total} bytes")

    def _attempt(self, client: Any) -> None:
        if self.total is not None and self.written >= self.total:
            return
        self.out.seek(self.written)
        self.out.truncate()
        byte_range = f"bytes={self.written}-" if self.written else None
        response = self.store._get(client, self.key, byte_range, self.etag)
        body = response["Body"]
        try:
            if self.etag is None:
                self.etag = _etag(response.get("ETag"))
            where = self.store._where(self.key)
            _check_version(response, self.etag, where)
            if self.total is None:
                self.total = _total_size(response)
            if byte_range and _range_start(response) != self.written:
                self._restart(response, where)
            for chunk in body.iter_chunks(_READ_CHUNK):
                self.out.write(chunk)
                self.written += len(chunk)
                if self.progress is not None:
                    self.progress(len(chunk))
        finally:
            body.close()

    def _restart(self, response: dict[str, Any], where: str) -> None:
        """The server ignored our Range and sent the whole object: start the file over."""
        if _range_start(response) is not None:
            raise TransientError(f"{where}: the server answered a different range than asked")
        self.out.seek(0)
        self.out.truncate()
        if self.progress is not None and self.written:
            self.progress(-self.written)
        self.written = 0


def _check_version(response: dict[str, Any], version: str | None, where: str) -> None:
    """Catch a server that ignores If-Match and sends another version."""
    etag = _etag(response.get("ETag"))
    if version and etag and etag != version:
        raise ObjectChanged(f"{where} changed while lading read it",
                            "the object was replaced during the transfer; run again")


def _range_start(response: dict[str, Any]) -> int | None:
    """First byte of a 206 response (``Content-Range: bytes A-B/TOTAL``), None for a 200."""
    content_range = response.get("ContentRange") or ""
    first = content_range.removeprefix("bytes ").split("-", 1)[0]
    return int(first) if first.isdigit() else None


def _read_slice(body: Any, skip: int, length: int) -> bytes:
    """Read ``length`` bytes after discarding ``skip``, without holding more than a chunk extra."""
    while skip > 0:
        dropped = body.read(min(skip, _READ_CHUNK))
        if not dropped:
            return b""
        skip -= len(dropped)
    return body.read(length)


def _total_size(response: dict[str, Any]) -> int:
    content_range = response.get("ContentRange")
    if content_range and "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        if total.isdigit():
            return int(total)
    return int(response.get("ContentLength", 0))


def md5_base64_of_file(path: Path) -> str:
    """Base64 MD5 of a file, as ``Content-MD5`` wants it."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while chunk := handle.read(_READ_CHUNK):
            digest.update(chunk)
    return base64.b64encode(digest.digest()).decode()
