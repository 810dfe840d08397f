"""Listing a prefix exactly, over obstore's fast listing, the mixin of :class:`ObstoreReads`.

obstore renders keys its own way (it drops a trailing ``/`` and refuses empty, ``.`` and ``..``
segments); where that could change a key, the backend's SDK lists one page with keys exactly as
stored, then obstore takes over again. In a process where obstore may not run (see
:mod:`lading.stores.process`), the SDK lists everything.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator

from lading.core.errors import TransientError, UnsafeKey
from lading.core.retry import Attempts
from lading.stores.base import ObjectInfo
from lading.stores.process import use_obstore

if TYPE_CHECKING:
    from lading.stores.config import StoreConfig

log = logging.getLogger(__name__)
#: One page of obstore's listing (named out here: inside a store, ``list`` is the listing method).
Page = list[dict[str, Any]]
#: One page of the SDK's exact listing.
Infos = list[ObjectInfo]


class ListingMixin:
    """``list()`` for an obstore-backed store; the store supplies ``_where``, ``_call``,
    ``_translated``, ``_obstore_store``, ``_info``, ``_key_of``, ``root`` and ``config``, and,
    when it can list exactly through its SDK, :meth:`_exact_page`."""

    if TYPE_CHECKING:  # what the store that mixes this in provides
        root: str
        config: StoreConfig

        def _where(self, key: str = "") -> str: ...
        def _call(self, what: str, operation: Callable[[Any], Any]) -> Any: ...
        def _translated(self, what: str, operation: Callable[[Any], Any]) -> Any: ...
        def _key_of(self, name: str) -> str: ...
        def _info(self, key: str, meta: dict[str, Any]) -> ObjectInfo: ...

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield objects under ``root + prefix`` in key order, a page at a time.

        obstore normalises keys (it drops a trailing ``/`` and refuses empty, ``.`` and ``..``
        segments). An entry that may be a folder marker ``dir/`` rendered as ``dir`` (on S3: any
        empty entry) is looked up in its folder's listing with a delimiter, also through obstore
        (once per folder, kept for the next few folders): there a marker is a common prefix and an
        empty object an object. Where obstore cannot represent a key, one page is listed through
        the backend's SDK, after the last key already yielded, and obstore takes over again after
        that page: every key comes out exactly as stored. A page that fails transiently is asked for
        again from the last key yielded (a listing ``offset``), within the retry policy. obstore
        follows continuation tokens but cannot tell a last page from one a server marked truncated
        without a token; so when the listing ends, one more request starting after the last key
        must find nothing, or the listing is an error (never a short listing)."""
        if (not use_obstore() or prefix and not prefix.endswith("/")) and self.has_exact_listing:
            yield from self._exact_listing(prefix, None)  # obstore lists directories, not name prefixes
            return
        after: str | None = None
        folders = _Folders(self, prefix)
        while True:
            unrepresentable, after = yield from self._fast_run(prefix, after, folders)
            if not unrepresentable:
                return
            infos, after, more = self._exact_page(prefix, after)
            yield from infos
            if not more:
                return

    def _fast_run(
        self, prefix: str, after: str | None, folders: _Folders
    ) -> Generator[ObjectInfo, None, tuple[bool, str | None]]:
        """obstore's listing after key ``after``: yields what it renders exactly; returns (False, _)
        at the end, or (True, the last key yielded) when obstore cannot represent the next key."""
        where = self._where(prefix)
        last = after
        own_marker = (self.root + prefix).rstrip("/")  # "data/" itself, rendered "data"
        try:
            for page in self._pages(prefix, lambda: last):
                for meta in page:
                    path = meta["path"]
                    if last is not None and path <= last:
                        continue  # a resumed page's first key, or a marker "x/" rendered "x" after "x-1"
                    if self._may_be_marker(meta) and (path == own_marker or not folders.has_empty_object(path)):
                        continue  # a folder marker
                    last = path
                    info = self._listed(meta)
                    if info is not None:
                        yield info
        except UnsafeKey:
            if not self.has_exact_listing:
                raise
            return True, last  # obstore cannot represent a key here
        if (
            last is not None
            and last != after
            and self._call(where, lambda store: self._has_keys_after(store, prefix, last))
        ):
            raise TransientError(
                f"the listing of {where} stopped early: the server marked a page truncated "
                "without a continuation token",
                "run again; if it persists, the server's listing is broken",
            )
        return False, last

    #: Whether :meth:`_exact_listing` exists (a listing through the SDK, with keys exactly as stored).
    has_exact_listing = False

    def _may_be_marker(self, meta: dict[str, Any]) -> bool:
        """Whether this entry may be a folder marker ``dir/`` (obstore drops the trailing ``/``,
        so it looks like an object ``dir``); its folder's delimiter listing decides."""
        return False

    def _exact_listing(self, prefix: str, after: str | None) -> Iterator[ObjectInfo]:
        """The rest of the listing after key ``after``, with keys exactly as stored."""
        raise NotImplementedError

    def _exact_page(self, prefix: str, after: str | None) -> tuple[Infos, str | None, bool]:
        """One page after key ``after``, keys exactly as stored: (objects, the page's last stored
        key, whether more may follow)."""
        raise NotImplementedError

    def _open_listing(self, store: Any, prefix: str, after: str | None) -> Iterator[Page]:
        import obstore

        full_prefix = self.root + prefix or None
        if after is None:
            return iter(obstore.list(store, full_prefix, chunk_size=1000))
        return iter(obstore.list(store, full_prefix, offset=after, chunk_size=1000))

    def _has_keys_after(self, store: Any, prefix: str, last: str) -> bool:
        page: Page = next(self._open_listing(store, prefix, last), [])
        return any(meta["path"] > last for meta in page)

    def _pages(self, prefix: str, resume_after: Callable[[], str | None]) -> Iterator[Page]:
        """obstore's listing stream, page by page; a transient failure reopens it after
        ``resume_after()`` (the last key the caller took), up to the retry policy's attempts."""
        where = self._where(prefix)
        attempts = Attempts(self.config.retry)
        first = resume_after()
        pages = self._translated(where, lambda store: self._open_listing(store, prefix, first))
        while True:
            try:
                page = self._translated(where, lambda _store: next(pages, None))
            except TransientError as err:
                delay = attempts.failed(err)
                log.info("listing %s failed (%s); resuming after the last key", where, err)
                time.sleep(delay)
                after = resume_after()
                pages = self._translated(where, lambda store: self._open_listing(store, prefix, after))
                continue
            attempts.succeeded()
            if page is None:
                return
            yield page

    def _listed(self, meta: dict[str, Any]) -> ObjectInfo | None:
        key = self._key_of(meta["path"])
        if not key or (key.endswith("/") and int(meta["size"]) == 0):
            return None  # the prefix itself, or a folder marker
        return self._info(key, meta)


class _Folders:
    """The empty objects of the folders a listing asked about, by obstore's listing with a
    delimiter (a marker ``dir/`` is a common prefix there, an empty object ``dir`` an object).
    Each folder is listed once while it is among the last :data:`KEPT` asked about (a listing
    visits a folder's own entries between its subfolders' runs)."""

    KEPT = 8

    def __init__(self, lister: ListingMixin, prefix: str) -> None:
        self._lister = lister
        self._where = lister._where(prefix)
        self._empty: dict[str, frozenset[str]] = {}

    def has_empty_object(self, path: str) -> bool:
        """Whether an empty object (not a marker) is stored at exactly ``path``."""
        folder = path.rpartition("/")[0]
        empty = self._empty.pop(folder, None)
        if empty is None:
            empty = self._lister._call(self._where, lambda store: _empty_objects(store, folder))
            if len(self._empty) >= self.KEPT:
                del self._empty[next(iter(self._empty))]
        self._empty[folder] = empty  # most recent last
        return path in empty


def _empty_objects(store: Any, folder: str) -> frozenset[str]:
    import obstore

    listed = obstore.list_with_delimiter(store, folder or None)
    return frozenset(meta["path"] for meta in listed["objects"] if meta["size"] == 0 and meta["path"] != folder)
