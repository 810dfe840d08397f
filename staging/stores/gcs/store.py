"""Google Cloud Storage as a Store, through google-cloud-storage.

The prefix rule is the same as for S3 (see :mod:`lading.stores.s3.store`): ``gs://b/data`` and
``gs://b/data/`` list the objects under ``data/``, relative to it; zero-byte folder markers
(``.../``) are skipped.

Credentials come from the standard google-auth chain (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud
application-default credentials, the metadata server). With ``StoreConfig.gcs_anonymous`` (set by
the CLI when ``STORAGE_EMULATOR_HOST`` is present) the client is anonymous and talks to
``StoreConfig.gcs_endpoint``.

Retries: the library's own retries are disabled (``retry=None`` on every call); every call goes
through :func:`staging.retry.with_retries`, like S3. Downloads resume from the bytes already
written, guarded by ``ifGenerationMatch``. Objects are read raw (no decompressive transcoding),
so the bytes match the stored size, MD5 and CRC32C.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, TypeVar

from lading.core.errors import NotFound, TransientError
from lading.core.retry import with_retries
from lading.stores.base import ObjectInfo, ProgressCallback
from lading.stores.config import StoreConfig
from lading.stores.gcs.errors import status_of, translate
from lading.stores.gcs.upload import ResumableUpload
from lading.stores.lazy import LazyClient, translated
from lading.stores.uri import StoreURI, root_prefix

T = TypeVar("T")
_LIST_FIELDS = "items(name,size,generation,updated,md5Hash,crc32c),nextPageToken"


def md5_hex(md5_base64: str | None) -> str | None:
    """GCS reports MD5 as base64; ObjectInfo carries hex. Composite objects have none."""
    if not md5_base64:
        return None
    return base64.b64decode(md5_base64).hex()


class GCSStore:
    """A bucket prefix on Google Cloud Storage (or the emulator).

    Tunables (attributes): ``page_size`` objects per listing request; files larger than
    ``resumable_threshold`` upload through a resumable session in ``chunk_size`` chunks (a
    multiple of 256 KiB), which resumes after a failure from the bytes GCS committed.
    """

    def __init__(self, uri: StoreURI, config: StoreConfig, *, page_size: int = 1000,
                 resumable_threshold: int = 8 << 20, chunk_size: int = 16 << 20) -> None:
        self.uri = uri
        self.config = config
        self.url = str(uri)
        self.bucket = uri.bucket
        self.root = root_prefix(uri.prefix)
        self.page_size = page_size
        self.resumable_threshold = min(resumable_threshold, 8 << 20)  # the SDK's one-shot limit
        self.chunk_size = chunk_size
        self._client = LazyClient(self._build_client)

    # -- client and the one retry/translation wrapper ------------------------------------------

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

    def _where(self, key: str = "") -> str:
        return f"gs://{self.bucket}/{self.root}{key}"

    def _timeout(self) -> tuple[float, float]:
        return (min(self.config.timeout, 10.0), self.config.timeout)

    def _attempt(self, what: str, operation: Callable[[Any], T]) -> T:
        """Run ``operation(bucket)`` once, translating any SDK error (no retry)."""
        return translated(lambda: operation(self._client.get().bucket(self.bucket)), translate, what)

    def _call(self, what: str, operation: Callable[[Any], T]) -> T:
        """Run ``operation(bucket)`` with translation and retries of transient failures."""
        return with_retries(lambda: self._attempt(what, operation), self.config.retry)

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

            blobs, token = self._call(self._where(prefix), fetch)
            for blob in blobs:
                info = self._info(blob, blob.name[len(self.root):])
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
        blob = self._call(self._where(key), lambda bucket: bucket.get_blob(
            self.root + key, retry=None, timeout=self._timeout()))
        if blob is None:
            raise NotFound(f"not found: {self._where(key)}")
        return self._info(blob, key)

    # -- reads ----------------------------------------------------------------------------------

    def read_range(self, key: str, start: int, end: int, version: str | None = None) -> bytes:
        """Bytes ``[start, end)`` (fewer at the end), guarded by ``ifGenerationMatch``."""
        if end <= start:
            return b""

        def attempt(bucket: Any) -> bytes:
            try:
                return bucket.blob(self.root + key).download_as_bytes(
                    start=start, end=end - 1, raw_download=True, checksum=None,
                    if_generation_match=int(version) if version else None,
                    retry=None, timeout=self._timeout())
            except Exception as err:
                if status_of(err) == 416:
                    return b""  # the range starts at or past the end of the object
                raise

        return self._call(self._where(key), attempt)

    def download(
        self,
        key: str,
        dest: Path,
        version: str | None = None,
        progress: ProgressCallback | None = None,
    ) -> None:
        """Stream the object into ``dest``; a broken transfer resumes where it stopped.

        Every request is pinned with ``ifGenerationMatch`` (``version``, or the generation
        stat'ed first), so a replaced object raises :class:`ObjectChanged` instead of mixing.
        """
        if version is None:
            version = self.stat(key).version
        with open(dest, "wb") as out:
            sink = _Sink(out, progress)
            size = self._call(self._where(key), lambda bucket: self._download_rest(bucket, key, sink, version))
        if size is not None and sink.written != size:
            raise TransientError(f"{self._where(key)}: got {sink.written} of {size} bytes")

    def _download_rest(self, bucket: Any, key: str, sink: "_Sink", version: str) -> int | None:
        sink.rewind_to_written()
        blob = bucket.blob(self.root + key)
        try:
            blob.download_to_file(sink, start=sink.written or None, raw_download=True, checksum=None,
                                  if_generation_match=int(version), retry=None, timeout=self._timeout())
        except Exception as err:
            if status_of(err) == 416 and sink.written:
                return None  # everything was already written before the failure
            raise
        return blob.size  # set from the response headers when the server reports it

    # -- uploads --------------------------------------------------------------------------------

    def upload(self, src: Path, key: str, progress: ProgressCallback | None = None) -> ObjectInfo:
        """Upload ``src``: one request up to ``resumable_threshold``, else a resumable session.

        A small upload that fails transiently is sent again whole (its reported progress taken
        back with a negative callback); a resumable one continues from the bytes GCS committed.
        """
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

        return self._call(self._where(key), attempt)


class _Sink:
    """A write-only file object that counts bytes and reports progress."""

    def __init__(self, out: BinaryIO, progress: ProgressCallback | None) -> None:
        self.out, self.progress = out, progress
        self.written = 0

    def rewind_to_written(self) -> None:
        """Drop anything past what we counted (a write cut short), before a resumed request."""
        self.out.seek(self.written)
        self.out.truncate()

    def write(self, data: bytes) -> int:
        """Append ``data`` and report it."""
        self.out.write(data)
        self.written += len(data)
        if self.progress is not None and data:
            self.progress(len(data))
        return len(data)

    def flush(self) -> None:
        """Flush the underlying file."""
        self.out.flush()


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
