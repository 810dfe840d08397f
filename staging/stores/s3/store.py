"""S3 (and S3-compatible servers) as a Store: reads and listings through obstore, the rest
through boto3.

Prefix rule: a URI always names a *prefix*, like a directory. ``s3://b/data`` and
``s3://b/data/`` both mean "the keys under ``data/``", and keys are returned relative to it
(``data/x/y.bin`` -> ``x/y.bin``). ``s3://b`` is the whole bucket. Zero-byte "folder marker"
objects whose key ends in ``/`` are skipped. To address one object, split the URI at its last
``/`` (:meth:`lading.stores.uri.StoreURI.split_name`).

Where each part goes:

- obstore (:mod:`lading.stores.objstore`): listings, HEAD, GETs (version-guarded, streamed).
- boto3: the credential chain (profiles, SSO, web identity, instance roles; handed to obstore as
  a refreshing credential provider, unless the keys are plainly in the environment), the
  bucket's region (HeadBucket, once, when none is configured or S3 answers with a redirect),
  uploads (single PUT with Content-MD5, or parallel multipart), and whether an ETag is really
  an MD5 (SSE-KMS / SSE-C objects), which obstore does not report.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence, TypeVar

from lading.core.errors import AccessDenied, LadingError, NoAnswer, ObjectChanged, TransientError
from lading.core.retry import Attempts, with_retries
from lading.stores.base import ObjectInfo, ProgressCallback
from lading.stores.config import StoreConfig
from lading.stores.lazy import translated
from lading.stores.listing import FolderPage, Infos
from lading.stores.process import ProcessLocal
from lading.stores.objstore import NO_RETRIES, Fetched, ObstoreReads, Sink, client_options, status_and_code
from lading.stores.s3.errors import CREDENTIALS_HINT, client_error_code, from_response, translate
from lading.stores.uri import StoreURI

if TYPE_CHECKING:
    from lading.stores.obstore_reads import ObstoreTarget

T = TypeVar("T")
log = logging.getLogger(__name__)
_READ_CHUNK = 1 << 20
_MD5_HEX = re.compile(r"[0-9a-fA-F]{32}")
#: Bucket regions found in this process, by (endpoint, bucket): each is discovered once per process.
_regions: ProcessLocal[dict[tuple[str | None, str], str]] = ProcessLocal(dict)
_regions_lock: ProcessLocal[threading.Lock] = ProcessLocal(threading.Lock)
#: Answers that mean "this bucket lives in another region".
_REDIRECTS = {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"}


def md5_of_etag(etag: str) -> str | None:
    """The hex MD5 a single-part ETag stands for, or None (multipart ``...-N``, or not hex)."""
    return etag.lower() if _MD5_HEX.fullmatch(etag) else None


def plain_etag(raw: str | None) -> str:
    """An ETag without its quotes."""
    return (raw or "").strip('"')


def if_match(version: str) -> dict[str, Any]:
    """GetOptions that ask for exactly the object with ETag ``version``."""
    return {"if_match": f'"{version}"'}


def etag_of(meta: Mapping[str, Any]) -> str:
    """The version (plain ETag) in obstore's ObjectMeta."""
    return plain_etag(meta.get("e_tag"))


def info_of(key: str, meta: Mapping[str, Any]) -> ObjectInfo:
    """The ObjectInfo of ``key`` from obstore's ObjectMeta (a single-part ETag is the MD5)."""
    etag = plain_etag(meta.get("e_tag"))
    modified = meta.get("last_modified")
    return ObjectInfo(key, int(meta["size"]), etag, modified.timestamp() if modified else 0.0, md5_of_etag(etag))


class S3Store(ObstoreReads):
    """A bucket prefix on S3 or an S3-compatible server.

    Tunables (attributes, for callers and tests): ``multipart_threshold`` / ``part_size`` /
    ``upload_workers`` for uploads. ``region`` is the region requests are signed for (resolved
    on first use when not configured).
    """

    scheme = "s3"

    def __init__(
        self,
        uri: StoreURI,
        config: StoreConfig,
        *,
        multipart_threshold: int = 64 << 20,
        part_size: int = 16 << 20,
        upload_workers: int = 8,
    ) -> None:
        super().__init__(uri, config, from_response)
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self.upload_workers = upload_workers
        self.region: str | None = config.region
        self._boto: ProcessLocal[Any] = ProcessLocal(self._build_boto)
        self._boto_session: ProcessLocal[Any] = ProcessLocal(self._new_session)
        self._redirected = False

    # -- obstore ---------------------------------------------------------------------------------

    def _build(self) -> Any:
        from obstore.store import S3Store as ObstoreS3

        cfg = self.config
        if self.region is None:
            self.region = self._known_region()
        options: dict[str, Any] = {
            "region": self.region,
            "retry_config": NO_RETRIES,
            "client_options": client_options(cfg, cfg.endpoint_url or "https://"),
        }
        if cfg.endpoint_url:
            options["endpoint"] = cfg.endpoint_url  # as given: FIPS, dual-stack, PrivateLink, IPv6
            options["virtual_hosted_style_request"] = False
        if cfg.no_sign_request:
            options["skip_signature"] = True
        elif cfg.env_credentials:
            key, secret, token = cfg.env_credentials
            options.update(access_key_id=key, secret_access_key=secret)
            if token:
                options["token"] = token
        else:
            from obstore.auth.boto3 import Boto3CredentialProvider

            session = self._session()
            if translated(session.get_credentials, translate, self._where()) is None:
                raise AccessDenied(f"no AWS credentials found for {self._where()}", CREDENTIALS_HINT)
            options["credential_provider"] = Boto3CredentialProvider(session)
        return ObstoreS3(self.bucket, **options)

    def _prepare_for_workers(self) -> None:
        """The bucket's region, found once here: each forked worker would otherwise build a boto3
        client to ask again (14% of a streaming epoch's worker time, measured)."""
        if self.region is None:
            self.region = self._known_region()

    def _target(self, client: Any) -> ObstoreTarget:
        from lading.stores.obstore_reads import ObstoreTarget

        return ObstoreTarget(
            client,
            self._where(),
            self.root,
            self.config.retry,
            pin=if_match,
            version_of=etag_of,
            info_of=info_of,
            from_response=from_response,
            url=self.url,
            moved=_is_redirect,
            relocate=self._relocate,
        )

    def _info(self, key: str, meta: Mapping[str, Any]) -> ObjectInfo:
        return info_of(key, meta)

    has_exact_listing = True

    def _may_be_marker(self, meta: dict[str, Any]) -> bool:
        return int(meta["size"]) == 0

    def _exact_listing(self, prefix: str, after: str | None) -> Iterator[ObjectInfo]:
        """ListObjectsV2 through boto3 from ``after`` on, page by page."""
        while True:
            infos, after, more = self._exact_page(prefix, after)
            yield from infos
            if not more:
                return

    def _exact_page(self, prefix: str, after: str | None) -> tuple[Infos, str | None, bool]:
        """One ListObjectsV2 page through boto3 after ``after``; a page marked truncated without a
        continuation token is an error, never a short listing."""
        where = self._where(prefix)
        request: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.root + prefix, "MaxKeys": 1000}
        if after is not None:
            request["StartAfter"] = after
        page = self._boto_call(where, lambda client: client.list_objects_v2(**request))
        contents = page.get("Contents", ())
        infos = []
        for item in contents:
            key = self._key_of(item["Key"])
            if key and not (key.endswith("/") and int(item.get("Size", 0)) == 0):
                etag = plain_etag(item.get("ETag"))
                modified = item.get("LastModified")
                infos.append(
                    ObjectInfo(
                        key,
                        int(item.get("Size", 0)),
                        etag,
                        modified.timestamp() if modified else 0.0,
                        md5_of_etag(etag),
                    )
                )
        more = bool(page.get("IsTruncated"))
        if more and not page.get("NextContinuationToken"):
            raise TransientError(
                f"the listing of {where} stopped early: the server marked a page truncated without a continuation token"
            )
        return infos, (contents[-1]["Key"] if contents else after), more and bool(contents)

    def _delimiter_page(self, folder: str, after: str | None, token: str | None) -> FolderPage:
        """One ListObjectsV2 page of ``folder`` with the delimiter ``/`` through boto3, after key
        ``after`` or from continuation ``token``."""
        request: dict[str, Any] = {"Bucket": self.bucket, "Prefix": f"{folder}/" if folder else "", "Delimiter": "/"}
        if token is not None:
            request["ContinuationToken"] = token
        elif after is not None:
            request["StartAfter"] = after
        where = f"s3://{self.bucket}/{request['Prefix']}"
        page = self._boto_call(where, lambda client: client.list_objects_v2(**request))
        contents, prefixes = page.get("Contents", ()), page.get("CommonPrefixes", ())
        last = max(contents[-1]["Key"] if contents else "", prefixes[-1]["Prefix"] if prefixes else "")
        more = page.get("NextContinuationToken") if page.get("IsTruncated") else None
        if page.get("IsTruncated") and not more:
            raise TransientError(
                f"the listing of {where} stopped early: the server marked a page truncated without a continuation token"
            )
        return FolderPage(frozenset(item["Key"] for item in contents if int(item.get("Size", 0)) == 0), last, more)

    def _translate(self, err: BaseException, what: str) -> BaseException:
        """As the base class; an answer that the bucket is in another region re-resolves the
        region once (as aws and rclone do) and comes out as a transient error, so the request is
        tried again against the new region."""
        mapped = super()._translate(err, what)
        if self._redirected or not isinstance(mapped, LadingError) or not _is_redirect(err):
            return mapped
        self._move_to_bucket_region()
        return TransientError(f"{what}: the bucket is in {self.region}; asking there")

    def _move_to_bucket_region(self) -> None:
        """Ask S3 where the bucket is (once per store and process) and rebuild the clients for it."""
        self._redirected = True
        region = self._discover_region()
        _regions.get()[(self.config.endpoint_url, self.bucket)] = region
        log.info("%s: the bucket is in %s, not %s; using %s", self.url, region, self.region, region)
        self.region = region
        self._reset_client()

    def _relocate(self) -> Any:
        """For the obstore reader, in a pool thread: the client for the bucket's own region (None
        when the store moved already)."""
        if self._redirected:
            return None
        self._move_to_bucket_region()
        return self._obstore_store()

    # -- boto3: credentials, region, uploads, SSE ------------------------------------------------

    def _session(self) -> Any:
        """boto3's session: the credential chain and the profile's region (built once)."""
        return self._boto_session.get()

    def _new_session(self) -> Any:
        import boto3

        cfg = self.config
        keys: dict[str, Any] = {}
        if cfg.env_credentials and not cfg.profile:
            key, secret, token = cfg.env_credentials
            keys = {"aws_access_key_id": key, "aws_secret_access_key": secret, "aws_session_token": token}
        return translated(
            lambda: boto3.session.Session(profile_name=cfg.profile, region_name=cfg.region, **keys),
            translate,
            self._where(),
        )

    def _build_boto(self) -> Any:
        from botocore import UNSIGNED
        from botocore.config import Config

        cfg = self.config
        options: dict[str, Any] = {
            "retries": {"mode": "standard", "total_max_attempts": 1},  # ours: with_retries
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
        if cfg.proxy_for(cfg.endpoint_url or "https://"):
            options["proxies"] = {"http": cfg.proxy_for("http://"), "https": cfg.proxy_for("https://")}
        session = self._session()
        return session.client(
            "s3",
            endpoint_url=cfg.endpoint_url,
            region_name=self.region or None,
            config=Config(**options),
            verify=cfg.ca_bundle or None,
        )

    def _known_region(self) -> str:
        """The bucket's region: discovered once per process (per endpoint and bucket)."""
        known = _regions.get()
        where = (self.config.endpoint_url, self.bucket)
        with _regions_lock.get():
            if where in known:
                return known[where]
            known[where] = self._discover_region()
            log.debug(
                "%s: the bucket is in %s (asked from thread %s)",
                self.url,
                known[where],
                threading.current_thread().name,
            )
        return known[where]

    def _discover_region(self) -> str:
        """The bucket's region, from S3 itself (HeadBucket's ``x-amz-bucket-region``, which S3
        also sends with a 301 or 403); the profile's region or us-east-1 when S3 does not say."""
        session_region = self._session().region_name
        try:
            response = self._boto_attempt(self._where(), lambda client: client.head_bucket(Bucket=self.bucket))
            headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        except NoAnswer as err:  # counted against the endpoint; the first read says more
            Attempts(self.config.retry).failed(err)
            headers = {}
        except LadingError as err:
            response = getattr(err.__cause__, "response", None) or {}
            headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        return headers.get("x-amz-bucket-region") or session_region or "us-east-1"

    def _boto_attempt(self, what: str, operation: Callable[[Any], T]) -> T:
        """Run ``operation(boto3 client)`` once, translating any SDK error (no retry)."""
        return translated(lambda: operation(self._boto.get()), translate, what)

    def _boto_call(self, what: str, operation: Callable[[Any], T]) -> T:
        """Run ``operation(boto3 client)`` with translation and retries of transient failures."""
        return with_retries(lambda: self._boto_attempt(what, operation), self.config.retry)

    def _sdk_stat(self, key: str) -> ObjectInfo:
        head = self._boto_call(
            self._where(key), lambda client: client.head_object(Bucket=self.bucket, Key=self._path(key))
        )
        etag = plain_etag(head.get("ETag"))
        modified = head.get("LastModified")
        encrypted = head.get("ServerSideEncryption") == "aws:kms" or "SSECustomerAlgorithm" in head
        return ObjectInfo(
            key,
            int(head.get("ContentLength", 0)),
            etag,
            modified.timestamp() if modified else 0.0,
            None if encrypted else md5_of_etag(etag),
        )

    def _sdk_stream(
        self,
        key: str,
        sink: Sink,
        version: str | None,
        start: int,
        end: int | None,
        on_version: Callable[[str], None] | None,
    ) -> Fetched:
        """GetObject through boto3 (If-Match, and the answer's ETag checked), body in pieces."""
        request: dict[str, Any] = {"Bucket": self.bucket, "Key": self._path(key)}
        if version:
            request["IfMatch"] = f'"{version}"'
        if start or end is not None:
            request["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        where = self._where(key)
        try:
            response = self._boto_attempt(where, lambda client: client.get_object(**request))
        except LadingError as err:
            if getattr(err.__cause__, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode") == 416:
                return Fetched(0, start, version or "")
            raise
        body = response["Body"]
        try:
            got = plain_etag(response.get("ETag"))
            if version and got and got != version:
                raise ObjectChanged(f"{where} changed while lading read it", "the object was replaced; run again")
            if on_version is not None:
                on_version(got)
            ranged = response.get("ContentRange")
            size = int(ranged.rsplit("/", 1)[1]) if ranged else int(response.get("ContentLength", 0))
            skip = start if (start or end is not None) and not ranged else 0  # a server ignoring Range
            want = (size if end is None else min(end, size)) - start
            delivered = 0
            for chunk in _translated_chunks(body, where):
                view = memoryview(chunk)
                if skip:
                    dropped = min(skip, len(view))
                    view, skip = view[dropped:], skip - dropped
                view = view[: max(want - delivered, 0)]
                if view:
                    sink(view)
                    delivered += len(view)
        finally:
            body.close()
        if delivered != want:
            raise TransientError(f"{where}: the body ended after {delivered} of {want} bytes")
        return Fetched(delivered, size, got)

    def md5_of_version(self, version: str) -> str | None:
        """A single-part ETag is the MD5 of the content (unless SSE-KMS/SSE-C: :meth:`etag_is_md5`)."""
        return md5_of_etag(version)

    def etag_is_md5(self, key: str) -> bool:
        """Whether the object's ETag is the MD5 of its bytes (not so with SSE-KMS or SSE-C)."""
        head = self._boto_call(
            self._where(key), lambda client: client.head_object(Bucket=self.bucket, Key=self.root + key)
        )
        return head.get("ServerSideEncryption") != "aws:kms" and "SSECustomerAlgorithm" not in head

    def upload(self, src: Path, key: str, progress: ProgressCallback | None = None) -> ObjectInfo:
        """Upload ``src``; multipart (parallel parts, each retried) above ``multipart_threshold``."""
        self._path(key)
        size = os.path.getsize(src)
        if size < self.multipart_threshold:
            self._put_single(src, key, size)
            if progress is not None:
                progress(size)
        else:
            from lading.stores.s3.upload import MultipartUpload

            MultipartUpload(self, src, key, size, progress).run()
        return self.stat(key)

    def _put_single(self, src: Path, key: str, size: int) -> None:
        digest = md5_base64_of_file(src)

        def attempt(client: Any) -> None:
            with open(src, "rb") as body:
                client.put_object(
                    Bucket=self.bucket, Key=self.root + key, Body=body, ContentLength=size, ContentMD5=digest
                )

        self._boto_call(self._where(key), attempt)

    # -- conditional writes (the claims protocol) ------------------------------------------------

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_version: str | None = None) -> str:
        """PutObject of ``data`` (``If-None-Match: *`` / ``If-Match`` for the conditions); a 412, or
        a 409 ConditionalRequestConflict (another conditional write in flight), is ObjectChanged."""
        path = self._path(key)
        condition = {"IfNoneMatch": "*"} if if_absent else {}
        if if_version is not None:
            condition = {"IfMatch": f'"{if_version}"'}
        response = self._conditional(
            key,
            lambda client: client.put_object(
                Bucket=self.bucket, Key=path, Body=data, ContentLength=len(data), **condition
            ),
        )
        return plain_etag(response.get("ETag"))

    def _delete_object(self, key: str, version: str | None) -> None:
        path = self._path(key)
        condition = {"IfMatch": f'"{version}"'} if version is not None else {}
        try:
            self._conditional(key, lambda client: client.delete_object(Bucket=self.bucket, Key=path, **condition))
        except LadingError as err:
            code, status = client_error_code(err.__cause__) if err.__cause__ is not None else ("", 0)
            if not condition or (status != 501 and code != "NotImplemented"):
                raise
            # A server without conditional deletes: the version was checked by a read just before.
            self._boto_call(self._where(key), lambda client: client.delete_object(Bucket=self.bucket, Key=path))

    def delete_many(self, keys: Sequence[str]) -> None:
        """DeleteObjects, 1,000 keys a request; a key that fails (other than missing) is an error."""
        for start in range(0, len(keys), 1000):
            response = self._delete_objects([self._path(key) for key in keys[start : start + 1000]])
            failed = [error for error in response.get("Errors", ()) if error.get("Code") != "NoSuchKey"]
            if failed:
                first = failed[0]
                raise from_response(
                    str(first.get("Code", "")),
                    0,
                    str(first.get("Message", "")),
                    f"s3://{self.bucket}/{first.get('Key', '')}",
                )

    def _delete_objects(self, paths: list[str]) -> Any:
        objects = [{"Key": path} for path in paths]
        return self._boto_call(
            self._where(),
            lambda client: client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}),
        )

    def _conditional(self, key: str, operation: Callable[[Any], T]) -> T:
        """A boto3 call whose 409 ConditionalRequestConflict is ObjectChanged (as a 412 is)."""
        try:
            return self._boto_call(self._where(key), operation)
        except LadingError as err:
            code, status = client_error_code(err.__cause__) if err.__cause__ is not None else ("", 0)
            if status == 409 or code == "ConditionalRequestConflict":
                raise ObjectChanged(f"{self._where(key)}: another conditional write to it was in flight") from err
            raise


def _is_redirect(err: BaseException) -> bool:
    """Whether obstore's error says the bucket lives in another region."""
    status, code = status_and_code(err)
    return status == 301 or code in _REDIRECTS


def _translated_chunks(body: Any, where: str) -> Iterator[bytes]:
    """A boto3 body's pieces; a body that breaks off (IncompleteRead, a read timeout, a reset)
    comes out as a project error (TransientError), so the caller retries and resumes."""
    chunks = body.iter_chunks(1 << 20)
    while True:
        try:
            chunk = next(chunks)
        except StopIteration:
            return
        except Exception as err:
            mapped = translate(err, where)
            if mapped is err:
                raise
            raise mapped from err
        yield chunk


def md5_base64_of_file(path: Path) -> str:
    """Base64 MD5 of a file, as ``Content-MD5`` wants it."""
    import base64  # with hashlib: for uploads only, not before a sync's first request
    import hashlib

    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while chunk := handle.read(_READ_CHUNK):
            digest.update(chunk)
    return base64.b64encode(digest.digest()).decode()
