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
        segments). Where that could matter (an empty object that is not a ``dir/`` marker with
        keys under it, or a key obstore cannot represent) one page is listed through the backend's
        SDK, after the last key already yielded, and obstore takes over again after that page: every
        key comes out exactly as stored. A page that fails transiently is asked for again from the
        last key yielded (a listing ``offset``), within the retry policy. obstore follows
        continuation tokens but cannot tell a last page from one a server marked truncated without
        a token; so when the listing ends, one more request starting after the last key must find
        nothing, or the listing is an error (never a short listing)."""
        if (not use_obstore() or prefix and not prefix.endswith("/")) and self.has_exact_listing:
            yield from self._exact_listing(prefix, None)  # obstore lists directories, not name prefixes
            return
        after: str | None = None
        while True:
            ambiguous, after = yield from self._fast_run(prefix, after)
            if not ambiguous:
                return
            infos, after, more = self._exact_page(prefix, after)
            yield from infos
            if not more:
                return

    def _fast_run(self, prefix: str, after: str | None) -> Generator[ObjectInfo, None, tuple[bool, str | None]]:
        """obstore's listing after key ``after``: yields what it renders exactly; returns (False, _)
        at the end, or (True, the last key yielded) when the next entry needs the SDK's listing."""
        where = self._where(prefix)
        last = after
        held: dict[str, Any] | None = None  # an empty entry that may be a folder marker, until the next one
        try:
            for page in self._pages(prefix, lambda: last):
                for meta in page:
                    if last is not None and meta["path"] <= last:
                        continue  # a resumed page may repeat its first key (GCS offsets include it)
                    if held is not None:
                        if not meta["path"].startswith(held["path"] + "/"):
                            return True, last  # an empty object, or a lone marker: ask the SDK
                        held = None  # "dir/" followed by "dir/...": a folder marker, skipped
                    if self._needs_exact_keys(meta):
                        held = meta
                        continue
                    last = meta["path"]
                    info = self._listed(meta)
                    if info is not None:
                        yield info
        except UnsafeKey:
            if not self.has_exact_listing:
                raise
            return True, last  # obstore cannot represent a key here
        if held is not None:
            return True, last
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

    def _needs_exact_keys(self, meta: dict[str, Any]) -> bool:
        """Whether obstore's rendering of this entry may not be the stored key (obstore drops a
        trailing ``/``, so a folder marker ``dir/`` looks like an empty object ``dir``). Such an
        entry followed by keys under it is a marker; otherwise the SDK listing decides."""
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
