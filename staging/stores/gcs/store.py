"""Google Cloud Storage as a Store: reads through obstore, listings and uploads through
google-cloud-storage.

The prefix rule is the same as for S3 (see :mod:`lading.stores.s3.store`): ``gs://b/data`` and
``gs://b/data/`` list the objects under ``data/``, relative to it; zero-byte folder markers
(``.../``) are skipped.

Where each part goes:

- obstore (:mod:`lading.stores.objstore`): GETs, pinned to the generation (the ``generation``
  parameter) and checked against the ``x-goog-generation`` of the answer.
- google-cloud-storage: listings and ``stat`` (obstore's GCS listing reports neither the
  generation nor the MD5/CRC32C, which pin reads and verify downloads), and uploads (one request,
  or a resumable session that continues from the bytes GCS committed).

Credentials come from the standard google-auth chain (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud
application-default credentials, the metadata server), handed to obstore as a refreshing token
provider. With ``StoreConfig.gcs_anonymous`` (``STORAGE_EMULATOR_HOST`` is set) both clients are
anonymous and talk to ``StoreConfig.gcs_endpoint``. Retries: the SDKs' own are off; every call
goes through :func:`lading.core.retry.with_retries`.
"""

from __future__ import annotations

import base64
import os
import threading
from datetime import timezone
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, TypeVar

from lading.core.errors import LadingError, NotFound, ObjectChanged
from lading.core.retry import with_retries
from lading.stores.base import ObjectInfo, ProgressCallback
from lading.stores.config import StoreConfig
from lading.stores.gcs.errors import from_response, status_of, translate
from lading.stores.gcs.upload import ResumableUpload
from lading.stores.lazy import LazyClient, translated
from lading.stores.objstore import NO_RETRIES, Fetched, ObstoreReads, Sink, client_options
from lading.stores.uri import StoreURI

T = TypeVar("T")
_LIST_FIELDS = "items(name,size,generation,updated,md5Hash,crc32c),nextPageToken"
_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"


def md5_hex(md5_base64: str | None) -> str | None:
    """GCS reports MD5 as base64; ObjectInfo carries hex. Composite objects have none."""
    if not md5_base64:
        return None
    return base64.b64decode(md5_base64).hex()


class GCSStore(ObstoreReads):
    """A bucket prefix on Google Cloud Storage (or an emulator).

    Tunables (attributes): ``page_size`` objects per listing request; files larger than
    ``resumable_threshold`` upload through a resumable session in ``chunk_size`` chunks (a
    multiple of 256 KiB), which resumes after a failure from the bytes GCS committed.
    """

    scheme = "gs"

    def __init__(self, uri: StoreURI, config: StoreConfig, *, page_size: int = 1000,
                 resumable_threshold: int = 8 << 20, chunk_size: int = 16 << 20) -> None:
        super().__init__(uri, config, from_response)
        self.page_size = page_size
        self.resumable_threshold = min(resumable_threshold, 8 << 20)  # the SDK's one-shot limit
        self.chunk_size = chunk_size
        self._client = LazyClient(self._build_client)

    # -- obstore ---------------------------------------------------------------------------------

    def _build(self) -> Any:
        from obstore.store import GCSStore as ObstoreGCS

        cfg = self.config
        options: dict[str, Any] = {"retry_config": NO_RETRIES,
                                   "client_options": client_options(cfg, cfg.gcs_endpoint or "https://")}
        if cfg.gcs_endpoint:
            options["base_url"] = cfg.gcs_endpoint
        if cfg.gcs_anonymous:  # an emulator: any bearer token will do
            options["credential_provider"] = lambda: {"token": "anonymous", "expires_at": None}
        elif cfg.no_sign_request:
            options["skip_signature"] = True
            # A provider (never called: nothing is signed) keeps obstore from opening
            # GOOGLE_APPLICATION_CREDENTIALS, which a public read does not need.
            options["credential_provider"] = lambda: {"token": "anonymous", "expires_at": None}
        else:
            options["credential_provider"] = GoogleTokens()
        return ObstoreGCS(self.bucket, **options)

    def _pin(self, version: str) -> dict[str, Any]:
        return {"version": version}

    def _version_of(self, meta: dict[str, Any]) -> str:
        return str(meta.get("version") or "")

    def stream(self, key: str, sink: Sink, version: str | None, start: int = 0,
               end: int | None = None, on_version: Callable[[str], None] | None = None) -> Fetched:
        """As :meth:`ObstoreReads.stream`; a pinned generation that is gone while the object
        exists means the object was replaced."""
        try:
            return super().stream(key, sink, version, start, end, on_version)
        except NotFound:
            if version is None:
                raise
            try:
                current = self.stat(key).version
            except NotFound:
                raise NotFound(f"not found: {self._where(key)}") from None
            raise ObjectChanged(f"{self._where(key)} changed while lading read it (generation {version} "
                                f"is now {current})", "the object was replaced; run again") from None

    def _sdk_stat(self, key: str) -> ObjectInfo:
        return self.stat(key)  # stat is google-cloud-storage's already

    def _sdk_stream(self, key: str, sink: Sink, version: str | None, start: int, end: int | None,
                    on_version: Callable[[str], None] | None) -> Fetched:
        """A media GET through google-cloud-storage, pinned with ``generation`` and checked."""
        info = self.stat(key) if version is None else None
        version = version or (info.version if info else None)
        if on_version is not None and version:
            on_version(version)

        def attempt(bucket: Any) -> tuple[bytes, int]:
            blob = bucket.blob(self._path(key), generation=int(version) if version else None)
            try:
                data = blob.download_as_bytes(start=start or None, end=None if end is None else end - 1,
                                              raw_download=True, checksum=None, retry=None,
                                              timeout=self._timeout())
            except Exception as err:
                if status_of(err) == 416:
                    return b"", start
                raise
            return data, int(blob.size) if blob.size is not None else start + len(data)

        data, size = self._gcs_attempt(self._where(key), attempt)
        if data:
            sink(memoryview(data))
        return Fetched(len(data), size, version or "")

    # -- google-cloud-storage: listings, stat, uploads -----------------------------------------

    def _build_client(self) -> Any:
        import google.auth
        import requests.adapters
        from google.auth.transport.requests import AuthorizedSession
        from google.cloud import storage

        cfg = self.config
        project: str | None = None
        if cfg.gcs_anonymous or cfg.no_sign_request:  # emulator, or a public bucket
            from google.auth.credentials import AnonymousCredentials

            credentials: Any = AnonymousCredentials()
        else:
            credentials, project = google.auth.default(scopes=list(storage.Client.SCOPE))
        session = AuthorizedSession(credentials)
        # One pool shared by all threads, as large as our concurrency; no urllib3-level retries.
        adapter = requests.adapters.HTTPAdapter(pool_maxsize=cfg.max_pool_connections, max_retries=0)
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        options = {"api_endpoint": cfg.gcs_endpoint} if cfg.gcs_endpoint else None
        client = storage.Client(project=project, credentials=credentials, _http=session,
                                client_options=options)
        # Recent releases fetch bucket metadata in a background thread (for trace attributes
        # only) on first use: an extra request per process that we neither need nor want.
        if getattr(client, "_bucket_metadata_cache", None) is not None:
            client._bucket_metadata_cache = None
        return client

    def _timeout(self) -> tuple[float, float]:
        return (min(self.config.timeout, 10.0), self.config.timeout)

    def _gcs_attempt(self, what: str, operation: Callable[[Any], T]) -> T:
        """Run ``operation(bucket)`` once, translating any SDK error (no retry)."""
        return translated(lambda: operation(self._client.get().bucket(self.bucket)), translate, what)

    def _gcs_call(self, what: str, operation: Callable[[Any], T]) -> T:
        """Run ``operation(bucket)`` with translation and retries of transient failures."""
        return with_retries(lambda: self._gcs_attempt(what, operation), self.config.retry)

    # -- listing and metadata -------------------------------------------------------------------

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield objects under ``root + prefix`` in key order, one page at a time."""
        full_prefix = self.root + prefix
        token: str | None = None
        while True:
            def fetch(bucket: Any, token: str | None = token) -> tuple[list[Any], str | None]:
                iterator = bucket.client.list_blobs(
                    bucket, prefix=full_prefix, page_size=self.page_size, page_token=token,
                    fields=_LIST_FIELDS, retry=None, timeout=self._timeout())
                page = next(iterator.pages, None)
                return (list(page) if page is not None else []), iterator.next_page_token

            blobs, token = self._gcs_call(self._where(prefix), fetch)
            for blob in blobs:
                info = self._info(blob, self._key_of(blob.name))
                if info.key and not (info.key.endswith("/") and info.size == 0):
                    yield info
            if not token:
                return

    @staticmethod
    def _info(blob: Any, key: str) -> ObjectInfo:
        updated = blob.updated
        return ObjectInfo(key, int(blob.size or 0), str(blob.generation),
                          updated.timestamp() if updated else 0.0, md5_hex(blob.md5_hash), blob.crc32c)

    def stat(self, key: str) -> ObjectInfo:
        """Fetch one object's metadata."""
        self._path(key)
        blob = self._gcs_call(self._where(key), lambda bucket: bucket.get_blob(
            self.root + key, retry=None, timeout=self._timeout()))
        if blob is None:
            raise NotFound(f"not found: {self._where(key)}")
        return self._info(blob, key)

    # -- uploads --------------------------------------------------------------------------------

    def upload(self, src: Path, key: str, progress: ProgressCallback | None = None) -> ObjectInfo:
        """Upload ``src``: one request up to ``resumable_threshold``, else a resumable session.

        A small upload that fails transiently is sent again whole (its reported progress taken
        back with a negative callback); a resumable one continues from the bytes GCS committed.
        """
        self._path(key)
        size = os.path.getsize(src)
        if size > self.resumable_threshold:
            ResumableUpload(self, src, key, size, progress).run()
            return self.stat(key)

        def attempt(bucket: Any) -> ObjectInfo:
            blob = bucket.blob(self.root + key)
            with open(src, "rb") as handle:
                reader = _ProgressReader(handle, progress)
                try:
                    blob.upload_from_file(reader, size=size, retry=None, timeout=self._timeout())
                except BaseException:
                    reader.take_back()
                    raise
            return self._info(blob, key)

        return self._gcs_call(self._where(key), attempt)




class GoogleTokens:
    """google-auth's default credentials as obstore's credential provider (refreshed as needed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._credentials: Any = None

    def __call__(self) -> dict[str, Any]:
        import google.auth
        from google.auth.transport.requests import Request

        with self._lock:
            try:
                if self._credentials is None:
                    self._credentials, _ = google.auth.default(scopes=[_SCOPE])
                if not self._credentials.valid:
                    self._credentials.refresh(Request())
            except Exception as err:
                mapped = translate(err, "Google credentials")
                raise (mapped if isinstance(mapped, LadingError) else err) from err
            expiry = self._credentials.expiry
            return {"token": self._credentials.token,
                    "expires_at": expiry.replace(tzinfo=timezone.utc) if expiry else None}


class _ProgressReader:
    """Wraps an open file: reports bytes as the SDK reads them."""

    def __init__(self, handle: BinaryIO, progress: ProgressCallback | None) -> None:
        self._handle, self._progress = handle, progress
        self.reported = 0

    def read(self, size: int = -1) -> bytes:
        """Read and report."""
        data = self._handle.read(size)
        if self._progress is not None and data:
            self._progress(len(data))
            self.reported += len(data)
        return data

    def take_back(self) -> None:
        """Report the bytes of a failed attempt as negative progress."""
        if self._progress is not None and self.reported:
            self._progress(-self.reported)
        self.reported = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)
