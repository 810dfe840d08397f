"""Listing a prefix exactly, over obstore's fast listing, the mixin of :class:`ObstoreReads`.

obstore renders keys its own way (it drops a trailing ``/`` and refuses empty, ``.`` and ``..``
segments); where that could change a key, the backend's SDK lists one page with keys exactly as
stored, then obstore takes over again. In a process where obstore may not run (see
:mod:`lading.stores.process`), the SDK lists everything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from itertools import islice
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator, NamedTuple

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
        last = seen = after  # the last key yielded; the last path listed (a skipped marker's too)
        own_marker = (self.root + prefix).rstrip("/")  # "data/" itself, rendered "data"
        window = _Window(self._pages(prefix, lambda: last), from_start=after is None)
        try:
            while (meta := window.next()) is not None:
                path = meta["path"]
                if seen is None or path > seen:
                    seen = path
                if last is not None and path <= last:
                    continue  # a resumed page's first key, or a marker "x/" rendered "x" after "x-1"
                if self._may_be_marker(meta) and (
                    path == own_marker or not folders.has_empty_object(path, window, last)
                ):
                    continue  # a folder marker
                last = path
                info = self._listed(meta)
                if info is not None:
                    yield info
        except UnsafeKey:
            if not self.has_exact_listing:
                raise
            return True, last  # obstore cannot represent a key here
        end = seen  # keys after a marker that ends the listing are no sign of a short listing
        if (
            end is not None
            and end != after
            and self._call(where, lambda store: self._has_keys_after(store, prefix, end))
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

    def _delimiter_page(self, folder: str, after: str | None, token: str | None) -> FolderPage:
        """One page of ``folder``'s listing with a delimiter through the SDK, after key ``after``
        or from continuation ``token``: for a folder too large to list whole (:class:`_Folders`)."""
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
        started = self._started_listing(prefix, first, attempts)
        if started is not None:
            pages = started
        else:
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

    def prefetch_listing(self) -> None:
        """Start the listing of the whole root now, in the background: the request for its first
        page runs while the caller still has work to do (``lading sync`` imports the code that
        plans and fetches meanwhile), and the next ``list()`` of the whole root takes it over.
        If the early start failed, that ``list()`` starts afresh, with its usual retries and
        errors; a transient failure counts as its first attempt. A store that lists through its SDK (GCS) does not start one."""
        if type(self).list is not ListingMixin.list or not use_obstore() or self.__dict__.get("_prefetch"):
            return
        try:  # built here: the build holds the GIL throughout, so on the thread it would only slow the caller
            self._translated(self._where(), lambda store: store)
        except Exception:  # the listing proper builds it again and reports the error
            return
        self._prefetch = _EarlyPages(self._translated_pages())

    def _translated_pages(self) -> Iterator[Page]:
        """The whole root's listing from its first key, page by page, errors translated."""
        where = self._where()
        pages = self._translated(where, lambda store: self._open_listing(store, "", None))
        while (page := self._translated(where, lambda _store: next(pages, None))) is not None:
            yield page

    def _started_listing(self, prefix: str, after: str | None, attempts: Attempts) -> Iterator[Page] | None:
        """The listing :meth:`prefetch_listing` started, if it fits (the whole root, from its
        first key) and succeeded; it is taken once. A transient failure of it is the listing's
        first failed attempt (a silent endpoint is not tried once more than the policy says)."""
        prefetch: _EarlyPages | None = self.__dict__.pop("_prefetch", None)
        if prefetch is None or prefix or after is not None:
            return None
        started = prefetch.result()
        if isinstance(prefetch.error, TransientError):
            time.sleep(attempts.failed(prefetch.error))
        return started

    def _listed(self, meta: dict[str, Any]) -> ObjectInfo | None:
        key = self._key_of(meta["path"])
        if not key or (key.endswith("/") and int(meta["size"]) == 0):
            return None  # the prefix itself, or a folder marker
        return self._info(key, meta)


class FolderPage(NamedTuple):
    """One SDK page of a folder's listing with a delimiter: the full paths of its empty objects,
    the last object or common prefix on it, and the token of the next page (None: the last)."""

    empty: frozenset[str]
    last: str
    token: str | None


class _Window:
    """The listing's entries one at a time, with the last :data:`_Folders.WHOLE` entries
    remembered and up to as many more read ahead on request: enough to tell whether a folder's
    entries in the listing (one contiguous run, the listing being in key order) are few."""

    def __init__(self, pages: Iterator[Page], from_start: bool) -> None:
        self._pages = pages
        self._ahead: deque[dict[str, Any]] = deque()
        self._behind: deque[str] = deque(maxlen=_Folders.WHOLE)
        self._seen = 0
        self._from_start = from_start  # the listing began at its first key (not resumed after one)
        self._ended = False

    def next(self) -> dict[str, Any] | None:
        """The next entry, or None at the end of the listing."""
        if not self._ahead and not self._read_page():
            return None
        meta = self._ahead.popleft()
        self._behind.append(meta["path"])
        self._seen += 1
        return meta

    def _read_page(self) -> bool:
        if self._ended:
            return False
        page = next(self._pages, None)
        if page is None:
            self._ended = True
            return False
        self._ahead.extend(page)
        return True

    def holds_whole(self, folder: str) -> bool:
        """Whether every entry under ``folder`` (a full path, "" for the bucket's root) lies
        within the entries remembered and those ahead, at most :data:`_Folders.WHOLE` each way."""
        under = f"{folder}/" if folder else ""
        behind = self._behind
        if not (self._from_start and self._seen <= len(behind)) and behind[0].startswith(under):
            return False  # the folder's run may begin before what is remembered
        checked, most = 0, _Folders.WHOLE
        while True:
            for meta in islice(self._ahead, checked, most):
                if not meta["path"].startswith(under):
                    return True
            checked = min(len(self._ahead), most)
            if checked >= most or not self._read_page():
                return checked < most  # the listing ended within the window


class _Folders:
    """The empty objects of the folders a listing asked about: a marker ``dir/`` is a common
    prefix in a listing with a delimiter, an empty object ``dir`` an object. A folder whose
    entries in the listing are few (at most :data:`WHOLE` each side of the entry asked about) is
    listed whole by obstore, once while it is among the last :data:`KEPT` asked about (a listing
    visits a folder's own entries between its subfolders' runs); a larger one is read a page at a
    time through the SDK (obstore's delimiter listing cannot page), from the entry asked about on,
    so memory holds at most one page of it."""

    KEPT = 8
    WHOLE = 10_000

    def __init__(self, lister: ListingMixin, prefix: str) -> None:
        self._lister = lister
        self._where = lister._where(prefix)
        self._empty: dict[str, frozenset[str] | FolderPage] = {}

    def has_empty_object(self, path: str, window: _Window, last: str | None) -> bool:
        """Whether an empty object (not a marker) is stored at exactly ``path``; ``last`` is the
        last key the listing yielded (the SDK's page starts after it)."""
        folder = path.rpartition("/")[0]
        known = self._empty.pop(folder, None)
        if isinstance(known, FolderPage) and path > known.last:
            known = self._next_page(folder, path, known, last)
        if known is None:
            if window.holds_whole(folder):
                known = self._lister._call(self._where, lambda store: _empty_objects(store, folder))
            else:
                known = self._next_page(folder, path, None, last)
            if len(self._empty) >= self.KEPT:
                del self._empty[next(iter(self._empty))]
        self._empty[folder] = known  # most recent last
        return path in (known.empty if isinstance(known, FolderPage) else known)

    def _next_page(self, folder: str, path: str, page: FolderPage | None, last: str | None) -> FolderPage:
        """The SDK page of ``folder`` that holds ``path``: the pages after ``page`` (by its token),
        or a first page starting after ``last``."""
        while True:
            if page is not None and page.token is None:
                return page  # the folder's last page: path is not in the folder
            token = page.token if page is not None else None
            page = self._lister._delimiter_page(folder, None if token else last, token)
            if path <= page.last or page.token is None:
                return page


#: Pages the early listing reads ahead before the caller takes it over (1,000 keys a page).
EARLY_PAGES = 8


class _EarlyPages:
    """A listing's first pages, read on a thread of its own (the wait for the server releases the
    GIL) until the caller takes the listing over (:meth:`result`) or :data:`EARLY_PAGES` are in.
    If the first page failed, :attr:`error` says why and the listing starts afresh; a later page's
    failure is raised in its place, after the pages read before it."""

    def __init__(self, pages: Iterator[Page]) -> None:
        self._pages = pages
        self._read: list[Page] = []
        self._ended = False  # the listing had no more pages
        self._later: Exception | None = None  # a page after the first failed
        self.error: Exception | None = None  # the first page failed
        self._taken = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lading-list", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._taken.is_set() and len(self._read) < EARLY_PAGES:
                page = next(self._pages, None)
                if page is None:
                    self._ended = True
                    return
                self._read.append(page)
        except Exception as err:  # the listing proper reports it (and retries) in its place
            if self._read:
                self._later = err
            else:
                self.error = err
                log.debug("the listing started early failed (%s); starting it again", err)

    def result(self) -> Iterator[Page] | None:
        """Stop reading ahead, wait for the page in flight; the listing's pages from its first
        (those read, then the rest), or None if its first page failed."""
        self._taken.set()
        self._thread.join()
        if self.error is not None:
            return None
        return self._handed_over()

    def _handed_over(self) -> Iterator[Page]:
        yield from self._read
        self._read = []
        if self._later is not None:
            raise self._later
        if not self._ended:
            yield from self._pages


def _empty_objects(store: Any, folder: str) -> frozenset[str]:
    import obstore

    listed = obstore.list_with_delimiter(store, folder or None)
    return frozenset(meta["path"] for meta in listed["objects"] if meta["size"] == 0 and meta["path"] != folder)
