"""The obstore-backed store shared by the S3 and GCS backends: error translation, client options,
and which reader serves a read. The jobs live in their own modules: reads on the I/O core
(:mod:`lading.stores.obstore_reads`), reads through the SDK (:mod:`lading.stores.sdk_reads`),
exact listings (:mod:`lading.stores.listing`).

What this layer guarantees, whatever the server does:

- **Version-checked reads.** Every GET is pinned to the version asked for (S3: ``If-Match``
  with the ETag; GCS: the ``generation`` parameter) *and* the version in the response is
  compared with it: a server that ignores the condition (rclone's ``serve s3`` does, and so does
  fake-gcs-server) yields :class:`ObjectChanged`, never bytes of two versions.
- **Errors classified once** (:func:`translate`): 404 -> NotFound, 401/403 -> AccessDenied,
  412/304 -> ObjectChanged, 429/503 -> Throttled, 5xx and network failures -> TransientError.
  Only obstore's exceptions are translated: a local ``OSError`` raised by a caller's sink (a
  full disk, say) passes through untouched, so it is never mistaken for a network failure.
- **Resumable bodies.** :meth:`ObstoreReads.stream` is one attempt that reports every byte it
  delivered; callers resume a cut body with a Range request from there, pinned to the version.
- **One I/O core.** Data reads run as coroutines on this process's event loop
  (:mod:`lading.stores.obstore_reads`); the SDK serves a process forked after obstore started in
  its parent, and a dataset's construction (:func:`lading.stores.process.control_plane`).
- **Fork safety.** The obstore store is built lazily per process (:class:`ProcessLocal`), and
  obstore's runtime is never used in a child forked after it started (:mod:`lading.stores.process`).

obstore's own retries are off (``max_retries=0``): one retry policy, ours
(:func:`lading.core.retry.with_retries`), counts every attempt.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, cast

from lading.core.errors import LadingError, NotFound, ObjectChanged, UsageError
from lading.core.keys import key_parts
from lading.core.retry import with_retries
from lading.stores.base import (
    Fetched,
    ObjectInfo,
    Outcomes,
    OnPiece,
    ProgressCallback,
    RangeRequest,
    Sink,
    Store,
    Views,
)
from lading.stores.config import StoreConfig
from lading.stores.listing import ListingMixin
from lading.stores.obstore_errors import FromResponse, status_and_code, translate
from lading.stores.process import ProcessLocal, note_obstore_start, obstore_allowed, use_obstore, warn_fallback
from lading.stores.uri import StoreURI, root_prefix

if TYPE_CHECKING:  # the readers (and asyncio under them) load at the first read, after a listing started
    from lading.stores.obstore_reads import ObstoreReader, ObstoreTarget
    from lading.stores.sdk_reads import SdkReader

log = logging.getLogger(__name__)
#: ASCII control characters: S3 and GCS keys may hold them, obstore's paths may not.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def client_options(config: StoreConfig, endpoint: str | None) -> dict[str, Any]:
    """obstore's HTTP client settings from ours: timeouts, TLS roots, proxies."""
    options: dict[str, Any] = {
        "connect_timeout": timedelta(seconds=min(config.timeout, 10.0)),
        "read_timeout": timedelta(seconds=config.timeout),  # between two reads of a body
        "timeout": timedelta(hours=1),  # a whole request; read_timeout catches a stalled one
        "pool_idle_timeout": timedelta(seconds=60),
    }
    if endpoint and endpoint.startswith("http://"):
        options["allow_http"] = True
    if config.ca_bundle and not (endpoint or "").startswith("http://"):
        options["root_certificate"] = _read_pem(config.ca_bundle)
    proxy = config.proxy_for(endpoint or "https://")
    if proxy:
        options["proxy_url"] = proxy
        if config.no_proxy:
            options["proxy_excludes"] = config.no_proxy
    return options


NO_RETRIES = {"max_retries": 0}


def _read_pem(path: str) -> bytes:
    """The CA bundle's certificates (obstore takes their PEM text, not a path)."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as err:
        raise UsageError(f"cannot read the CA bundle {path} (AWS_CA_BUNDLE): {err.strerror or err}") from None


class ObstoreReads(ListingMixin, Store):
    """list / stat / read_range / download / stream over an obstore store.

    A backend provides :meth:`_build` (the obstore store for this process), :meth:`_target`
    (what its obstore reader needs, handed over once per client: how a version pins a GET, how
    to read the version and the ObjectInfo out of obstore's metadata, how an error response maps
    to a project error) and :meth:`_info` (an ObjectInfo from obstore's metadata, for listings).
    """

    def __init__(self, uri: StoreURI, config: StoreConfig, from_response: FromResponse) -> None:
        self.uri = uri
        self.config = replace(
            config, retry=replace(config.retry, endpoint=config.retry.endpoint or self._endpoint(config))
        )
        self.url = str(uri)
        self.bucket = uri.bucket
        self.root = root_prefix(uri.prefix)
        self._from_response = from_response
        self._store: ProcessLocal[Any] = ProcessLocal(self._build)
        self._fast: ProcessLocal[ObstoreReader] = ProcessLocal(self._new_reader)
        self._sdk_reader: SdkReader | None = None

    # -- what a backend provides ------------------------------------------------------------------

    def _build(self) -> Any:
        raise NotImplementedError

    def _target(self, client: Any) -> ObstoreTarget:
        """What this backend's obstore reader needs, over ``client`` (this process's obstore store)."""
        raise NotImplementedError

    def _info(self, key: str, meta: Mapping[str, Any]) -> ObjectInfo:
        """The ObjectInfo of ``key`` from obstore's ObjectMeta."""
        raise NotImplementedError

    # -- shared machinery -------------------------------------------------------------------------

    def _endpoint(self, config: StoreConfig) -> str:
        """Where this store's requests go (for retry messages and the never-answered rule)."""
        if self.scheme == "gs":
            return config.gcs_endpoint or "https://storage.googleapis.com"
        return config.endpoint_url or "https://s3.amazonaws.com"

    def _where(self, key: str = "") -> str:
        return f"{self.scheme}://{self.bucket}/{self.root}{key}"

    def _key_of(self, name: str) -> str:
        """A listed object's key: its full ``name`` relative to the root. A name outside the root
        (a listing that normalised the prefix asked for) is an error, never a key cut short."""
        if not name.startswith(self.root):
            raise LadingError(
                f"the listing of {self._where()} returned {name!r}, outside the prefix asked for ({self.root!r})",
                "write the location without empty, '.' or '..' segments",
            )
        return name[len(self.root) :]

    def _path(self, key: str) -> str:
        """The object path of ``key``; UnsafeKey for a key that could escape or alias the root."""
        key_parts(key)
        return self.root + key

    def _obstore_store(self) -> Any:
        """This process's obstore store (built, and obstore's runtime noted, on first use)."""
        note_obstore_start()
        return self._store.get()

    def connect(self) -> None:
        """The obstore client of this process, built now (see :meth:`Store.connect`)."""
        if use_obstore():
            self._translated(self._where(), lambda store: store)

    def _new_reader(self) -> ObstoreReader:
        from lading.stores.obstore_reads import ObstoreReader

        return ObstoreReader(self._target(self._obstore_store()))

    @property
    def _sdk(self) -> SdkReader:
        """The reader through the backend's SDK (made on first use)."""
        if self._sdk_reader is None:
            from lading.stores.sdk_reads import SdkReader, SdkTarget

            self._sdk_reader = SdkReader(SdkTarget(self._where(), self.config.retry, self._sdk_stat, self._sdk_stream))
        return self._sdk_reader

    def _reset_client(self) -> None:
        """Forget this process's obstore store and its reader (rebuilt on next use)."""
        self._store.reset()
        self._fast.reset()

    def _translate(self, err: BaseException, what: str) -> BaseException:
        """An obstore exception as a project error (anything else unchanged)."""
        return translate(err, what, self._from_response)

    def _translated(self, what: str, operation: Callable[[Any], Any]) -> Any:
        """One attempt at ``operation(store)``; obstore errors come out as project errors."""
        try:
            return operation(self._obstore_store())
        except Exception as err:
            mapped = self._translate(err, what)
            if mapped is err:
                raise
            raise mapped from err

    def _call(self, what: str, operation: Callable[[Any], Any]) -> Any:
        """``operation(store)`` with translation and our retries of transient failures."""
        return with_retries(lambda: self._translated(what, operation), self.config.retry)

    def _reads(self, key: str = "") -> ObstoreReader | SdkReader:
        """Which reader serves this read: obstore on the I/O core, or the SDK where obstore cannot
        run (a forked child of a process that started it), should not start yet (a dataset's
        construction) or cannot name the key (control characters)."""
        if use_obstore() and not _CONTROL.search(key):
            # Built here, in the caller's thread: the client, credentials and (S3) the bucket's
            # region are blocking work that must never run on the I/O core's loop.
            return self._fast.get()
        if not obstore_allowed():
            warn_fallback(self.url)
        else:  # a dataset's construction: the DataLoader workers forked next will use obstore
            self._prepare_for_workers()
        return self._sdk

    def _prepare_for_workers(self) -> None:
        """Settle, in a process about to fork readers, what each of them would otherwise work out
        again (the state a fork copies: plain attributes, not :class:`ProcessLocal` values)."""

    def coroutine_reads(self, key: str) -> ObstoreReader | SdkReader | None:
        """The reader that serves ``key`` in this process (obstore, or the SDK in a pool thread)."""
        return self._reads(key)

    # -- the Store protocol -----------------------------------------------------------------------

    def stat(self, key: str) -> ObjectInfo:
        """HEAD one object."""
        return self._reads(key).stat(key)

    def read_range(self, key: str, start: int, end: int, version: str | None = None) -> bytes:
        """Bytes ``[start, end)`` (fewer at the end of the object) of ``version``."""
        if end <= start:
            return b""
        return bytes(self.read_many([RangeRequest(key, start, end, version)])[0])

    def read_many(self, requests: Sequence[RangeRequest]) -> Views:
        """Several ranges at once (one hop to the I/O core, the GETs concurrent), each pinned to
        and checked against its version, transient failures retried per request. The views are
        zero-copy over obstore's buffers."""
        return self._batched(requests, "read_many")

    def read_each(self, requests: Sequence[RangeRequest]) -> Outcomes:
        """As :meth:`read_many`, each request's failure returned in its place (a batch of
        independent objects: one failing does not fail the others)."""
        return self._batched(requests, "read_each")

    def _batched(self, requests: Sequence[RangeRequest], method: str) -> list[Any]:
        """A batch through its readers: keys obstore cannot name (control characters) go through
        the SDK, the rest together."""
        groups: dict[int, tuple[Any, list[int]]] = {}
        for position, request in enumerate(requests):
            reader = self._reads(request.key)
            groups.setdefault(id(reader), (reader, []))[1].append(position)
        out: list[Any] = [None] * len(requests)
        for reader, positions in groups.values():
            batch = [requests[p] for p in positions]
            values = reader.read_many(batch) if method == "read_many" else reader.read_each(batch)
            for position, value in zip(positions, values):
                out[position] = value
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
        """One GET of bytes ``[start, end)`` (to the end when ``end`` is None), pinned to and checked
        against ``version``, each piece handed to ``sink`` as it arrives.

        Raises project errors; a body cut short raises TransientError after the pieces already
        handed over (the caller counts them and resumes from there, pinned to the version that
        ``on_version`` was told of before the first piece). A range starting at or past
        the end of the object delivers nothing. Errors raised by ``sink`` pass through as they are.
        """
        return self._reads(key).stream(key, sink, version, start, end, on_version)

    def download(
        self,
        key: str,
        dest: Path,
        version: str | None = None,
        progress: ProgressCallback | None = None,
        size: int | None = None,
        on_piece: OnPiece | None = None,
    ) -> None:
        """The object into ``dest``, never mixing two versions, a cut body resumed from the bytes
        already written. Through obstore, an object of known ``size`` larger than a part comes in
        parallel ranged parts pinned to one version."""
        reads = self._reads(key)
        if reads is self._sdk_reader:
            reads.download(key, dest, version, progress, on_piece)
        else:
            cast("ObstoreReader", reads).download(key, dest, version, progress, size, on_piece)

    # -- conditional writes (the claims protocol) -------------------------------------------------

    def read_object(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and version (ETag or generation), or None when it does not exist."""
        pieces: list[bytes] = []
        try:
            fetched = self.stream(key, lambda chunk: pieces.append(bytes(chunk)), None)
        except NotFound:
            return None
        return b"".join(pieces), fetched.version

    def delete(self, key: str, version: str | None = None) -> bool:
        """Delete ``key`` (only if still at ``version``). The version is checked against a fresh
        read first, for servers that delete whatever the condition (fake-gcs-server); S3 and GCS
        answer a delete of a missing key as a success, so it is stat'ed first without one."""
        if version is not None:
            current = self.read_object(key)
            if current is None or current[1] != version:
                return False
        else:
            try:
                self.stat(key)
            except NotFound:
                return False
        try:
            self._delete_object(key, version)
        except (NotFound, ObjectChanged):
            return False
        return True

    def _delete_object(self, key: str, version: str | None) -> None:
        """One delete request (conditional on ``version`` when given), retried."""
        raise NotImplementedError

    # -- the SDK paths: in a forked child of a process that used obstore ------------------------

    def _sdk_stat(self, key: str) -> ObjectInfo:
        """HEAD through the backend's SDK."""
        raise NotImplementedError

    def _sdk_stream(
        self,
        key: str,
        sink: Sink,
        version: str | None,
        start: int,
        end: int | None,
        on_version: Callable[[str], None] | None,
    ) -> Fetched:
        """:meth:`stream` through the backend's SDK, with the same version check."""
        raise NotImplementedError


__all__ = [
    "Fetched",
    "FromResponse",
    "NO_RETRIES",
    "ObstoreReads",
    "RangeRequest",
    "Sink",
    "client_options",
    "status_and_code",
    "translate",
]
