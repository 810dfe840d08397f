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

Emulators: fake-gcs-server answers obstore's XML-API paths (``/bucket/object``) only for requests
whose Host is its ``-public-host`` (``storage.googleapis.com`` unless told otherwise); for any other
Host it takes the Host for a bucket name and answers 404, or serves a different object. So with a
custom endpoint, the first read of a store decides once how reads go (:meth:`GCSStore._choose_route`):
it compares what obstore's HEAD answers with what the JSON API reports for the same object, and
reads through obstore as configured, through obstore with ``Host: storage.googleapis.com``, or
through google-cloud-storage's media download (``/download/storage/v1/b/B/o/O?alt=media``,
pinned with ``generation``, streamed). A real generation mismatch stays :class:`ObjectChanged`.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
from datetime import timezone
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Mapping, Sequence, TypeVar

from lading.core.errors import LadingError, NotFound, ObjectChanged, TransientError
from lading.core.retry import with_retries
from lading.stores.base import ObjectInfo, Outcomes, OnPiece, ProgressCallback, RangeRequest, Views
from lading.stores.config import StoreConfig
from lading.stores.gcs.errors import from_response, status_of, translate
from lading.stores.gcs.upload import ResumableUpload
from lading.stores.lazy import translated
from lading.stores.objstore import NO_RETRIES, Fetched, ObstoreReads, Sink, client_options
from lading.stores.obstore_reads import ObstoreTarget
from lading.stores.iocore import io_core
from lading.stores.process import ProcessLocal, use_obstore
from lading.stores.uri import StoreURI

T = TypeVar("T")
_LIST_FIELDS = "items(name,size,generation,updated,md5Hash,crc32c),nextPageToken"
_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
#: fake-gcs-server's default ``-public-host``: the Host its XML-API (path-style) routes answer to.
EMULATOR_PUBLIC_HOST = "storage.googleapis.com"
#: How reads go (see :meth:`GCSStore._choose_route`): obstore as configured, obstore with the
#: emulator's public Host header, or google-cloud-storage's media download.
XML, XML_PUBLIC_HOST, MEDIA = "xml", "xml-public-host", "media"
#: The SDK media download hands the body over in pieces of at least this many bytes.
_MEDIA_PIECE = 256 << 10

log = logging.getLogger(__name__)


async def _head(store: Any, path: str) -> Any:
    """obstore's HEAD, on the I/O core's loop."""
    import obstore

    return await obstore.head_async(store, path)


def generation_pin(version: str) -> dict[str, Any]:
    """GetOptions that ask for exactly generation ``version``."""
    return {"version": version}


def generation_of(meta: Mapping[str, Any]) -> str:
    """The version (generation) in obstore's ObjectMeta."""
    return str(meta.get("version") or "")


def info_of(key: str, meta: Mapping[str, Any]) -> ObjectInfo:
    """The ObjectInfo of ``key`` from obstore's ObjectMeta."""
    modified = meta.get("last_modified")
    return ObjectInfo(key, int(meta["size"]), generation_of(meta), modified.timestamp() if modified else 0.0)


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

    def __init__(
        self,
        uri: StoreURI,
        config: StoreConfig,
        *,
        page_size: int = 1000,
        resumable_threshold: int = 8 << 20,
        chunk_size: int = 16 << 20,
    ) -> None:
        super().__init__(uri, config, from_response)
        self.page_size = page_size
        self.resumable_threshold = min(resumable_threshold, 8 << 20)  # the SDK's one-shot limit
        self.chunk_size = chunk_size
        self._client: ProcessLocal[Any] = ProcessLocal(self._build_client)
        #: How reads go; with a custom endpoint (an emulator) decided by the first read.
        self.route: str | None = None if config.gcs_endpoint else XML
        self._route_lock: ProcessLocal[threading.Lock] = ProcessLocal(threading.Lock)
        self._host_header: str | None = None

    # -- obstore ---------------------------------------------------------------------------------

    def _build(self) -> Any:
        return self._obstore_for(self._host_header)

    def _obstore_for(self, host: str | None) -> Any:
        """An obstore GCSStore for this bucket; ``host`` replaces the Host header of every request."""
        from obstore.store import GCSStore as ObstoreGCS

        cfg = self.config
        http = client_options(cfg, cfg.gcs_endpoint or "https://")
        if host:
            http["default_headers"] = {"host": host}
        options: dict[str, Any] = {"retry_config": NO_RETRIES, "client_options": http}
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

    def _target(self, client: Any) -> ObstoreTarget:
        return ObstoreTarget(
            client,
            self._where(),
            self.root,
            self.config.retry,
            pin=generation_pin,
            version_of=generation_of,
            info_of=info_of,
            from_response=from_response,
            url=self.url,
        )

    def _info(self, key: str, meta: Mapping[str, Any]) -> ObjectInfo:
        return info_of(key, meta)

    def stream(
        self,
        key: str,
        sink: Sink,
        version: str | None,
        start: int = 0,
        end: int | None = None,
        on_version: Callable[[str], None] | None = None,
    ) -> Fetched:
        """As :meth:`ObstoreReads.stream`, along the route this store's reads take; a pinned
        generation that is gone while the object exists means the object was replaced."""
        self._choose_route(key, version)
        try:
            if self.route == MEDIA:
                return self._sdk_stream(key, sink, version, start, end, on_version)
            return super().stream(key, sink, version, start, end, on_version)
        except NotFound:
            if version is None:
                raise
            raise self._pinned_not_found(key, version) from None

    def read_many(self, requests: Sequence[RangeRequest]) -> Views:
        """As :meth:`ObstoreReads.read_many`; a 404 to a range pinned to a generation is explained
        by :meth:`_pinned_not_found` (a replaced object is ObjectChanged)."""
        try:
            return super().read_many(requests)
        except NotFound as err:
            for request in requests:
                if request.version and err.message == f"not found: {self._where(request.key)}":
                    raise self._pinned_not_found(request.key, request.version) from None
            raise

    def read_each(self, requests: Sequence[RangeRequest]) -> Outcomes:
        """As :meth:`ObstoreReads.read_each`; a 404 to a pinned range is explained as in :meth:`read_many`."""
        answers = super().read_each(requests)
        return [
            self._pinned_not_found(request.key, request.version)
            if isinstance(answer, NotFound) and request.version
            else answer
            for request, answer in zip(requests, answers)
        ]

    def download(
        self,
        key: str,
        dest: Path,
        version: str | None = None,
        progress: ProgressCallback | None = None,
        size: int | None = None,
        on_piece: OnPiece | None = None,
    ) -> None:
        """As :meth:`ObstoreReads.download`; a 404 while it runs is explained: pinned, by
        :meth:`_pinned_not_found`; unpinned (the download pinned the first answer's generation),
        an object that exists again is one that was replaced."""
        try:
            super().download(key, dest, version, progress, size, on_piece)
        except NotFound:
            if version is not None:
                raise self._pinned_not_found(key, version) from None
            current = self.stat(key).version  # NotFound when it is gone
            raise ObjectChanged(
                f"{self._where(key)} changed while lading read it (it is now generation {current})",
                "the object was replaced; run again",
            ) from None

    def _pinned_not_found(self, key: str, version: str) -> LadingError:
        """The error for a 404 to a GET pinned to generation ``version``: ObjectChanged when the
        object now has another generation, NotFound when it is gone, and neither (a read path
        that does not serve this object) when the JSON API still reports ``version``."""
        try:
            current = self.stat(key).version
        except NotFound:
            return NotFound(f"not found: {self._where(key)}")
        if current == version:
            return LadingError(
                f"{self._where(key)}: the server answered 404 for generation {version}, "
                "which its JSON API reports as current",
                "the server's object download path does not serve this bucket",
            )
        return ObjectChanged(
            f"{self._where(key)} changed while lading read it (generation {version} is now {current})",
            "the object was replaced; run again",
        )

    # -- which way reads go ---------------------------------------------------------------------

    def _reads(self, key: str = "") -> Any:
        """For a read core that dispatches every read (ranges, batches, downloads, not only
        :meth:`stream`) through ``ObstoreReads._reads``: choose the route first; the media route
        reads through the SDK reader."""
        if key:
            self._choose_route(key, None)
        if self.route == MEDIA:
            return self._sdk
        return super()._reads(key)

    def coroutine_reads(self, key: str) -> Any:
        """As :meth:`ObstoreReads.coroutine_reads`; None while the route is still to be chosen with
        ``key`` (a blocking probe: the caller reads that key with the blocking calls instead)."""
        if key and self.route is None and use_obstore() and _obstore_can_name(key):
            return None
        return super().coroutine_reads(key)

    def _choose_route(self, key: str, version: str | None) -> None:
        """Decide once per store (per process) how reads reach a custom endpoint, probing with
        ``key``. Leaves the route undecided when the probe cannot tell (the object is gone or
        replaced, a transient failure): the error propagates and the next read probes again."""
        if self.route is not None or not use_obstore() or not _obstore_can_name(key):
            return
        with self._route_lock.get():
            if self.route is not None:
                return
            info = self.stat(key)  # the JSON API: which object, which generation
            if version and info.version != version:
                raise ObjectChanged(
                    f"{self._where(key)} changed while lading read it (generation {version} is now {info.version})",
                    "the object was replaced; run again",
                )
            if self._serves(key, info, None):
                self.route = XML
            elif self._serves(key, info, EMULATOR_PUBLIC_HOST):
                log.info(
                    "%s: the endpoint %s answers object paths only with Host: %s (fake-gcs-server "
                    "without -public-host); reading with that Host header",
                    self.url,
                    self.config.gcs_endpoint,
                    EMULATOR_PUBLIC_HOST,
                )
                self._host_header = EMULATOR_PUBLIC_HOST
                self._reset_client()  # rebuilt with the Host header on next use
                self.route = XML_PUBLIC_HOST
            else:
                log.warning(
                    "%s: the endpoint %s does not serve object paths (/bucket/object) for the objects "
                    "its JSON API lists; reading through its JSON media downloads instead (slower)",
                    self.url,
                    self.config.gcs_endpoint,
                )
                self.route = MEDIA

    def _serves(self, key: str, info: ObjectInfo, host: str | None) -> bool:
        """Whether obstore's HEAD of ``key`` (with Host ``host``, or as configured) answers for the
        object the JSON API described as ``info``. Transient failures propagate."""

        store = self._store.get() if host is None else self._obstore_for(host)
        path = self._path(key)
        try:
            meta = self._translated(self._where(key), lambda _default: io_core().run(_head(store, path)))
        except TransientError:
            raise
        except LadingError:
            return False
        got, size = generation_of(meta), int(meta["size"])
        if (got, size) == (info.version, info.size):
            return True
        try:  # replaced between the two requests? Then the HEAD answered for it after all.
            again = self.stat(key)
        except NotFound:
            return False
        return (got, size) == (again.version, again.size) and got != info.version

    def _sdk_stat(self, key: str) -> ObjectInfo:
        return self.stat(key)  # stat is google-cloud-storage's already

    def _sdk_stream(
        self,
        key: str,
        sink: Sink,
        version: str | None,
        start: int,
        end: int | None,
        on_version: Callable[[str], None] | None,
    ) -> Fetched:
        """A media GET through google-cloud-storage (``/download/storage/v1/b/B/o/O``), pinned with
        ``generation`` and streamed to ``sink`` in pieces of at least 256 KiB; the generation of
        the answer is checked too. Unpinned, the object is stat'ed first (and pinned to that).

        The size reported is the stat's, or (pinned) ``start`` plus the bytes delivered: exact for
        reads to the end of the object, which are the ones that use it."""
        info = self.stat(key) if version is None else None
        version = version or (info.version if info else None)
        if on_version is not None and version:
            on_version(version)
        pieces = _Pieces(sink)

        def attempt(bucket: Any) -> str | None:
            blob = bucket.blob(self._path(key), generation=int(version) if version else None)
            try:
                blob.download_to_file(
                    pieces,
                    start=start or None,
                    end=None if end is None else end - 1,
                    raw_download=True,
                    checksum=None,
                    retry=None,
                    timeout=self._timeout(),
                )
            except Exception as err:
                pieces.flush()  # bytes of the pinned generation: the caller resumes after them
                if status_of(err) == 416:
                    return None
                raise
            got = None if blob.generation is None else str(blob.generation)
            if version and got and got != version:
                raise ObjectChanged(
                    f"{self._where(key)} changed while lading read it (asked for generation "
                    f"{version}, the server sent {got})",
                    "the object was replaced; run again",
                )
            pieces.flush()
            return got

        got = self._gcs_attempt(self._where(key), attempt)
        size = info.size if info else start + pieces.delivered
        return Fetched(pieces.delivered, size, got or version or "")

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
        client = storage.Client(project=project, credentials=credentials, _http=session, client_options=options)
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
                    bucket,
                    prefix=full_prefix,
                    page_size=self.page_size,
                    page_token=token,
                    fields=_LIST_FIELDS,
                    retry=None,
                    timeout=self._timeout(),
                )
                page = next(iterator.pages, None)
                return (list(page) if page is not None else []), iterator.next_page_token

            blobs, token = self._gcs_call(self._where(prefix), fetch)
            for blob in blobs:
                info = self._blob_info(blob, self._key_of(blob.name))
                if info.key and not (info.key.endswith("/") and info.size == 0):
                    yield info
            if not token:
                return

    @staticmethod
    def _blob_info(blob: Any, key: str) -> ObjectInfo:
        updated = blob.updated
        return ObjectInfo(
            key,
            int(blob.size or 0),
            str(blob.generation),
            updated.timestamp() if updated else 0.0,
            md5_hex(blob.md5_hash),
            blob.crc32c,
        )

    def stat(self, key: str) -> ObjectInfo:
        """Fetch one object's metadata."""
        self._path(key)
        blob = self._gcs_call(
            self._where(key), lambda bucket: bucket.get_blob(self.root + key, retry=None, timeout=self._timeout())
        )
        if blob is None:
            raise NotFound(f"not found: {self._where(key)}")
        return self._blob_info(blob, key)

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
            return self._blob_info(blob, key)

        return self._gcs_call(self._where(key), attempt)

    # -- conditional writes (the claims protocol) ------------------------------------------------

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_version: str | None = None) -> str:
        """One upload of ``data`` (``ifGenerationMatch`` 0 / the generation for the conditions);
        its generation. A failed condition (412) is ObjectChanged."""
        path = self._path(key)
        generation = 0 if if_absent else (int(if_version) if if_version is not None else None)

        def attempt(bucket: Any) -> str:
            blob = bucket.blob(path)
            blob.upload_from_string(
                data,
                content_type="application/octet-stream",
                if_generation_match=generation,
                retry=None,
                timeout=self._timeout(),
            )
            return str(blob.generation)

        return self._gcs_call(self._where(key), attempt)

    def _delete_object(self, key: str, version: str | None) -> None:
        path = self._path(key)
        generation = int(version) if version is not None else None
        self._gcs_call(
            self._where(key),
            lambda bucket: bucket.blob(path).delete(
                if_generation_match=generation, retry=None, timeout=self._timeout()
            ),
        )

    def delete_many(self, keys: Sequence[str]) -> None:
        """One delete per key; missing ones are no error."""
        for key in keys:
            try:
                self._delete_object(key, None)
            except NotFound:
                pass


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
            return {
                "token": self._credentials.token,
                "expires_at": expiry.replace(tzinfo=timezone.utc) if expiry else None,
            }


def _obstore_can_name(key: str) -> bool:
    """obstore's paths refuse ASCII control characters (such keys are read through the SDK)."""
    return not any(ord(ch) < 0x20 or ch == "\x7f" for ch in key)


class _Pieces:
    """A write-only file for the SDK's download: gathers the body into pieces for ``sink``."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        self._buffer = bytearray()
        self.delivered = 0

    def write(self, data: bytes) -> int:
        """Take a piece of the body; hand it on once enough has gathered."""
        self._buffer += data
        if len(self._buffer) >= _MEDIA_PIECE:
            self.flush()
        return len(data)

    def flush(self) -> None:
        """Hand what has gathered to the sink."""
        if self._buffer:
            piece, self._buffer = self._buffer, bytearray()
            self._sink(memoryview(piece))
            self.delivered += len(piece)


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
