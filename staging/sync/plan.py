"""Plan a sync as a stream: which objects this rank gets, which to fetch, which are up to date, which to delete.

Two steps, both pure with respect to DEST (nothing is written there), both over sorted key runs
(:mod:`lading.selection.runs`: rows on disk in key order, a bounded chunk in memory), so the
memory a plan takes does not grow with the number of keys:

1. :func:`select_objects` lists the source (streaming pages) or stats the manifest's keys, keeps
   keys matching the ``--include``/``--exclude`` globs, skips directory markers (zero-byte keys
   ending in ``/``), refuses unsafe keys and file/directory clashes for the whole selection
   before anything is written (so every rank agrees) and an empty one (a mistyped prefix;
   unless ``allow_empty``), then applies the sharding rule of :mod:`lading.selection.sharding`
   over the sorted stream (``count``: a counter; ``bytes``: the sizes in key order).
2. :func:`plan_sync` walks this rank's objects beside the destination's index
   (:mod:`lading.sync.state`, also in key order), its lines verified against the files on disk
   as they are read (:mod:`lading.sync.verify`; for a large index in a helper process, beside
   the listing), and stats the other files a page at a time: at most one ``stat`` per file.
   With ``--delete``, an index entry that the selection skips over is a file to delete.

The :class:`SyncPlan` holds its three lists as runs on disk with their counts; ``--dry-run
--json`` writes them out as they are read (:meth:`SyncPlan.write_json`). Close selections and
plans (or use them as context managers) to remove their runs at once.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import io
import os
import stat as stat_mode
import subprocess
import sys
from array import array
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from json.encoder import encode_basestring_ascii
from operator import attrgetter, itemgetter, lt
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Iterable, Iterator

from lading.core.errors import LadingError, NotFound, UnsafeKey, UsageError
from lading.core.keys import is_safe_key, key_parts
from lading.selection.runs import SortedRuns
from lading.selection.sharding import BALANCES, DISTRIBUTIONS, owners_by_bytes, select_for_rank
from lading.stores import refuse_an_object
from lading.stores.base import PAGE_ROWS, ObjectInfo, Page, Store
from lading.sync import verify
from lading.sync.state import RESERVED_NAMES, Entry, SyncState, parse_line

if TYPE_CHECKING:  # the manifest module (and hashlib under it) loads only for a sync with --manifest
    from lading.selection.manifest import Manifest

log = logging.getLogger(__name__)

_SHOWN_UNSAFE = 5
#: What every reserved name starts with (a key that does not is none of them).
_RESERVED_START = os.path.commonprefix(sorted(RESERVED_NAMES))
#: An index of at least this many bytes (about 12,000 files) is verified against DEST's files by
#: a helper process (:func:`_verified_lines`); starting one costs about 50 ms.
_VERIFY_APART = 1 << 20


@dataclass(frozen=True)
class SyncRequest:
    """What to sync where, for which rank. ``dest`` is the already-rendered destination."""

    source: str
    dest: Path
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    manifest: Manifest | None = None
    distribution: str = "replicated"
    balance: str = "count"
    rank: int = 0
    world_size: int = 1
    delete: bool = False
    allow_empty: bool = False  # an empty listing (or none matching the filters) is not an error

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise UsageError(f"unknown distribution {self.distribution!r}", "use replicated or sharded")
        if self.balance not in BALANCES:
            raise UsageError(f"unknown balance {self.balance!r}", "use count or bytes")
        if not 0 <= self.rank < self.world_size:
            raise UsageError(f"rank {self.rank} is outside 0..{self.world_size - 1}")


class Selection:
    """The objects this rank gets, in key order (rows on disk), and counts from the listing.

    This module's classes other than :class:`SyncRequest` are plain classes: a dataclass costs
    about 1 ms of start-up to create (``lading sync`` creates every class it imports), and none
    of them is compared, hashed or copied."""

    __slots__ = ("runs", "listed", "matched", "markers", "selected_bytes", "records")

    def __init__(self, runs: SortedRuns, listed: int = 0, matched: int = 0, markers: int = 0) -> None:
        self.runs, self.listed, self.matched, self.markers = runs, listed, matched, markers
        self.selected_bytes = 0
        self.records: tuple[int, ...] | None = None  # augmented manifest: this rank's lines (share_records)

    @property
    def selected_files(self) -> int:
        """How many objects this rank gets."""
        return self.runs.count

    def objects(self) -> Iterator[ObjectInfo]:
        """This rank's objects, in ascending key order, read from disk."""
        return (ObjectInfo(*row) for row in self.runs)

    def close(self) -> None:
        """Remove the runs on disk."""
        self.runs.close()

    def __enter__(self) -> "Selection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PlannedFetch:
    """An object to fetch and why: new, changed, missing, modified or untracked."""

    __slots__ = ("info", "reason")

    def __init__(self, info: ObjectInfo, reason: str) -> None:
        self.info, self.reason = info, reason


class SyncPlan:
    """The sync, as data on disk. :meth:`to_fetch` and :meth:`up_to_date` are this rank's
    objects; :meth:`to_delete` the files lading tracks in DEST that left the selection (only
    with ``--delete``); each in key order."""

    __slots__ = (
        "source",
        "dest",
        "rank",
        "world_size",
        "distribution",
        "balance",
        "listed",
        "matched",
        "fetch_bytes",
        "up_to_date_bytes",
        "fetching",
        "current",
        "deleting",
        "counted_current",
    )

    def __init__(self, source: str, dest: str, rank: int, world_size: int, distribution: str, balance: str) -> None:
        self.source, self.dest, self.rank, self.world_size = source, dest, rank, world_size
        self.distribution, self.balance = distribution, balance
        self.listed = self.matched = self.fetch_bytes = self.up_to_date_bytes = 0
        self.fetching = SortedRuns()  # ObjectInfo fields + reason
        self.current = SortedRuns()  # (key,)
        self.deleting = SortedRuns()  # (key,)
        self.counted_current: int | None = None  # up to date, when not listed in ``current`` (a sync's plan)

    @property
    def fetch_files(self) -> int:
        """Files the plan will fetch."""
        return self.fetching.count

    @property
    def up_to_date_files(self) -> int:
        """Files already current in DEST."""
        return self.current.count if self.counted_current is None else self.counted_current

    @property
    def delete_files(self) -> int:
        """Files the plan will delete."""
        return self.deleting.count

    def to_fetch(self, skip: frozenset[str] = frozenset()) -> Iterator[PlannedFetch]:
        """The objects to fetch, in key order, except the keys in ``skip``."""
        for row in self.fetching:
            if row[0] not in skip:
                yield PlannedFetch(ObjectInfo(*row[:-1]), row[-1])

    def up_to_date(self) -> Iterator[str]:
        """Keys already current in DEST, in key order (a plan made with ``list_current=False``
        has none)."""
        return (row[0] for row in self.current)

    def to_delete(self) -> Iterator[str]:
        """Keys to delete from DEST, in key order."""
        return (row[0] for row in self.deleting)

    def totals(self) -> dict[str, int]:
        """Counts and bytes per category."""
        return {
            "listed": self.listed,
            "matched": self.matched,
            "selected_files": self.fetch_files + self.up_to_date_files,
            "selected_bytes": self.fetch_bytes + self.up_to_date_bytes,
            "fetch_files": self.fetch_files,
            "fetch_bytes": self.fetch_bytes,
            "up_to_date_files": self.up_to_date_files,
            "delete_files": self.delete_files,
        }

    def write_json(self, out: IO[str]) -> None:
        """Write the JSON of ``lading sync --dry-run --json`` to ``out``, one list item a line,
        as the runs are read (never the whole plan in memory)."""
        dumps = json.dumps
        out.write("{\n")
        for name in ("source", "dest", "rank", "world_size", "distribution", "balance"):
            out.write(f"  {dumps(name)}: {dumps(getattr(self, name))},\n")
        out.write(f'  "totals": {dumps(self.totals())},\n')
        string = encode_basestring_ascii  # what json.dumps does for a str, without its overhead
        _write_list(
            out,
            "to_fetch",
            (
                f'{{"key": {string(row[0])}, "size": {row[1]:d}, "version": {string(row[2])}, "reason": "{row[-1]}"}}'
                for row in self.fetching
            ),
            last=False,
        )
        _write_list(out, "up_to_date", (string(row[0]) for row in self.current), last=False)
        _write_list(out, "to_delete", (string(row[0]) for row in self.deleting), last=True)
        out.write("}\n")

    def close(self) -> None:
        """Remove the runs on disk."""
        for runs in (self.fetching, self.current, self.deleting):
            runs.close()

    def __enter__(self) -> "SyncPlan":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_list(out: IO[str], name: str, items: Iterable[str], last: bool) -> None:
    out.write(f"  {json.dumps(name)}: [")
    separator = "\n    "
    for item in items:
        out.write(separator)
        out.write(item)
        separator = ",\n    "
    out.write("\n  ]" if separator != "\n    " else "]")
    out.write("\n" if last else ",\n")


def matches_filters(key: str, include: Iterable[str], exclude: Iterable[str]) -> bool:
    """True when ``key`` matches an include glob (or there are none) and no exclude glob.

    Globs use :mod:`fnmatch` on the whole key relative to the source, so ``*`` also crosses
    ``/``: ``*.jpg`` matches ``a/b/c.jpg`` and ``train/*`` everything under ``train/``.
    """
    include = tuple(include)
    if include and not any(fnmatch.fnmatchcase(key, pattern) for pattern in include):
        return False
    return not any(fnmatch.fnmatchcase(key, pattern) for pattern in exclude)


def source_pages(store: Store, manifest: Manifest | None, source: str, workers: int = 32) -> Iterator[Page]:
    """The store's listing as pages of rows of ObjectInfo's fields (:meth:`Store.list_pages`),
    or (with a manifest) one ``stat`` per key, done in parallel, a page at a time."""
    if manifest is None:
        yield from store.list_pages()
        return
    from lading.selection.manifest import keys_under

    keys = keys_under(manifest, source)
    refusals = _Refusals()
    for reason in map(unsafe_reason, keys):
        if reason is not None:
            refusals.add(refusals.unsafe, reason)
    if refusals.total:  # never hand an escaping key to a store; name every problem at once
        clashes = _Clashes(refusals)
        for key in sorted(key for key in keys if unsafe_reason(key) is None):
            clashes.see(key)
        _refuse(refusals, source)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(keys) or 1))) as pool:
        rows = ((i.key, i.size, i.version, i.mtime, i.md5, i.crc32c) for i in pool.map(store.stat, keys))
        while page := list(islice(rows, PAGE_ROWS)):
            yield page


def unsafe_reason(key: str, raise_it: bool = False) -> str | None:
    """Why ``key`` can't be written under DEST (None if it can)."""
    if is_safe_key(key) and not key.startswith(_RESERVED_START):
        return None
    try:
        parts = key_parts(key)
    except UnsafeKey as err:
        if raise_it:
            raise
        return err.message
    if parts[0] in RESERVED_NAMES:
        message = f"refusing key {key!r}: the name is reserved for lading's state record"
        if raise_it:
            raise UnsafeKey(message)
        return message
    return None


def select_objects(store: Store, request: SyncRequest, workers: int = 32) -> Selection:
    """List (or stat the manifest), filter, check safety and shard: this rank's objects, as
    sorted runs on disk. Raises before anything is written anywhere."""
    kept = SortedRuns()
    try:
        found = _Filtered(_Refusals(), sizes=array("q") if _wants_sizes(request) else None)  # 8 bytes an object
        for page in _filtered(store, request, workers, found):
            kept.extend(page)
        kept.finish()
        sizes = found.sizes
        if not found.ascending:  # the clashes and sizes need the keys in order: read the runs
            sizes = _clashes_and_sizes(kept, found.unsafe, request)
        _check(found, request, store)
        selection = Selection(kept, listed=found.listed, matched=kept.count, markers=found.markers)
        if request.manifest is not None and request.manifest.augmented:  # a line's objects stay together
            return _share_augmented(selection, request)
        if request.distribution == "replicated" or request.world_size == 1:
            selection.selected_bytes = found.total_bytes
            return selection
        mine = _shard(kept, request, sizes)
        selection.runs, selection.selected_bytes = mine, sum(row[1] for row in mine)
    except BaseException:
        kept.close()
        raise
    kept.close()
    return selection


def plan_listing(
    store: Store, request: SyncRequest, state: SyncState, workers: int = 32, list_current: bool = True
) -> SyncPlan:
    """:func:`select_objects` then :func:`plan_sync`, in one pass where that gives the same plan:
    a listing (no manifest) shared by count or not at all comes in key order, so its rows go
    straight to the comparison with DEST and no selection is written to disk and read back.
    The selection's refusals (empty, unsafe keys, clashes) are raised once the listing is read,
    before anything is written anywhere, as :func:`select_objects` raises them. A listing out of
    key order (no store lists so) is planned in two passes instead."""
    if request.manifest is not None or _wants_sizes(request):
        with select_objects(store, request, workers) as selection:
            return plan_sync(selection, request, state, workers, list_current)
    found = _Filtered(_Refusals())
    pages = _filtered(store, request, workers, found, ordered=True)
    if request.distribution == "sharded" and request.world_size > 1:
        pages = _every(pages, request.rank, request.world_size)
    try:
        plan = _plan_rows(pages, request, state, list_current)
    except _Unordered:
        log.debug("%s: listed out of key order; planning in two passes", request.source)
        with select_objects(store, request, workers) as selection:
            return plan_sync(selection, request, state, workers, list_current)
    try:
        _check(found, request, store)
    except BaseException:
        plan.close()
        raise
    plan.listed, plan.matched = found.listed, found.kept
    return plan


class _Refusals:
    """Unsafe keys and file/directory clashes: the first few reasons of each kind, and how many."""

    __slots__ = ("unsafe", "clashes", "total")

    def __init__(self) -> None:
        self.unsafe: list[str] = []
        self.clashes: list[str] = []
        self.total = 0

    def add(self, reasons: list[str], reason: str) -> None:
        self.total += 1
        if len(reasons) < _SHOWN_UNSAFE:
            reasons.append(reason)


class _Filtered:
    """What the pass over the listing found besides the kept rows. When the listing came in
    ascending key order (every store lists so), the clash check and the sizes for the ``bytes``
    balance were done on the way (``ascending``); otherwise they need a pass over the runs."""

    __slots__ = ("unsafe", "listed", "markers", "kept", "total_bytes", "ascending", "sizes")

    def __init__(self, unsafe: _Refusals, sizes: array | None = None) -> None:
        self.unsafe, self.sizes = unsafe, sizes
        self.listed = self.markers = self.kept = self.total_bytes = 0
        self.ascending = True


class _Unordered(Exception):
    """A listing came out of key order, where one pass needed it in order."""


def _wants_sizes(request: SyncRequest) -> bool:
    return request.distribution == "sharded" and request.world_size > 1 and request.balance == "bytes"


def _filtered(
    store: Store, request: SyncRequest, workers: int, found: _Filtered, ordered: bool = False
) -> Iterator[Page]:
    """Listing -> filters -> the kept rows (ObjectInfo fields), a page at a time, counted in
    ``found``, with the clash check and the sizes while the keys come in ascending order.
    ``ordered``: a key out of order raises :class:`_Unordered` (for a caller that needs the rows
    in order as they come)."""
    pages = _PageFilter(request, found, ordered)
    for page in source_pages(store, request.manifest, request.source, workers):
        kept = pages.take(page)
        if kept:
            yield kept
    pages.finish()


#: Substrings of the keys of a page joined by ``/`` (and wrapped in ``/``) that show a key
#: :func:`_plain_keys` can't vouch for: ``//`` an empty key or segment, a leading or trailing
#: ``/`` (so a directory marker); ``/./`` and ``/../`` a dot segment; what :func:`is_safe_key`
#: refuses besides; a segment starting as a reserved name does.
_NOT_PLAIN = ("//", "/./", "/../", "\\", "\x00", "/" + _RESERVED_START)


def _plain_keys(keys: list[str]) -> bool:
    """True when every key is safe (:func:`unsafe_reason` is None) and no directory marker,
    tested on the keys joined by ``/``, without a Python step per key. False is not a verdict:
    the keys are then checked one by one."""
    joined = "/" + "/".join(keys) + "/"
    return not any(bad in joined for bad in _NOT_PLAIN)


class _PageFilter:
    """The pass of :func:`_filtered` over the listing, a page at a time. A page of plain keys
    (:func:`_plain_keys`) in ascending order is checked with a few operations over the whole page
    (in C: joins, substring searches, :func:`map`); any other page key by key, with the same
    outcome."""

    def __init__(self, request: SyncRequest, found: _Filtered, ordered: bool) -> None:
        self.include, self.exclude = request.include, request.exclude
        self.found = found
        self.ordered = ordered
        self.clash_refusals = _Refusals()
        self.clashes = _Clashes(self.clash_refusals)
        self.last = ""
        self.ascending = True

    def take(self, page: Page) -> Page:
        """The rows of ``page`` to keep, counted in ``found``."""
        found = self.found
        found.listed += len(page)
        if not _plain_keys(list(map(_first, page))):
            return self._take_each(page)
        if self.include or self.exclude:
            page = [row for row in page if matches_filters(row[0], self.include, self.exclude)]
            if not page:
                return page
        keys = list(map(_first, page))
        if not (self.ascending and keys[0] > self.last and all(map(lt, keys, islice(keys, 1, None)))):
            return self._take_each(page)  # (filtering again keeps the same rows)
        self.clashes.see_sorted(keys)
        if found.sizes is not None:
            found.sizes.extend(map(_size, page))
        self.last = keys[-1]
        found.kept += len(page)
        found.total_bytes += sum(map(_size, page))
        return page

    def _take_each(self, page: Page) -> Page:
        """:meth:`take`, key by key."""
        found, include, exclude = self.found, self.include, self.exclude
        kept: Page = []
        for row in page:
            key, size = row[0], row[1]
            if key.endswith("/") and size == 0:
                found.markers += 1  # a "folder" created by a console: nothing to write
                continue
            if (include or exclude) and not matches_filters(key, include, exclude):
                continue
            reason = unsafe_reason(key)
            if reason is not None:
                found.unsafe.add(found.unsafe.unsafe, reason)
                continue
            if self.ascending:
                if key > self.last:
                    self.clashes.see(key)
                    if found.sizes is not None:
                        found.sizes.append(size)
                    self.last = key
                elif self.ordered:
                    raise _Unordered(key)
                else:
                    self.ascending = False
            found.kept += 1
            found.total_bytes += size
            kept.append(row)
        return kept

    def finish(self) -> None:
        """The listing is read: hand over the clashes, if the keys came in order (else the pass
        over the runs finds them)."""
        if self.ascending:
            self.found.unsafe.clashes.extend(self.clash_refusals.clashes)
            self.found.unsafe.total += self.clash_refusals.total
        self.found.ascending = self.ascending


def _every(pages: Iterable[Page], rank: int, world: int) -> Iterator[Page]:
    """The rows whose index in the stream is ``rank`` modulo ``world``, a page at a time."""
    offset = 0
    for page in pages:
        mine = page[(rank - offset) % world :: world]
        offset += len(page)
        if mine:
            yield mine


_first = itemgetter(0)
_size = itemgetter(1)
_mode = attrgetter("st_mode")


def _check(found: _Filtered, request: SyncRequest, store: Store) -> None:
    """Refuse an empty selection (unless allowed), then unsafe keys and clashes, all in one report."""
    if found.markers:
        log.debug("%s: skipped %d directory marker(s) (zero-byte keys ending in /)", request.source, found.markers)
    if not found.kept and not found.unsafe.total and not request.allow_empty:
        _refuse_empty(request, found.listed - found.markers, store)
    if found.unsafe.total:  # unsafe keys and clashes in one report, not one kind per run
        _refuse(found.unsafe, request.source)


def _clashes_and_sizes(kept: SortedRuns, refusals: _Refusals, request: SyncRequest) -> array | None:
    """One pass over the sorted keys: file/directory clashes (a key that is also the directory
    of another), and the sizes in key order when the ``bytes`` balance needs them."""
    sizes = array("q") if _wants_sizes(request) else None  # 8 bytes an object
    clashes = _Clashes(refusals)
    for row in kept:
        clashes.see(row[0])
        if sizes is not None:
            sizes.append(row[1])
    return sizes


class _Clashes:
    """Finds keys that are also the directory of another key, over keys in ascending order,
    holding only the keys that may still be such a directory (a nested chain, a few at most)."""

    def __init__(self, refusals: _Refusals) -> None:
        self.refusals = refusals
        self.open_files: list[str] = []

    def see(self, key: str) -> None:
        """The next key in order."""
        open_files = self.open_files
        # the keys under "f/" sort in [f + "/", f + "0"): past f + "0", f can clash no more
        while open_files and key >= open_files[-1] + "0":
            open_files.pop()
        for file_key in open_files:
            if key.startswith(file_key + "/"):
                self.refusals.add(
                    self.refusals.clashes, f"key {file_key!r} is a file and also the directory of {key!r}"
                )
        open_files.append(key)

    def see_sorted(self, keys: list[str]) -> None:
        """The next keys, in ascending order: :meth:`see` of each, without a Python step per key
        when no key starts with the one before it. Then no key of them is the directory of a
        later one, nor can be, but the last: the keys under a key ``f`` sort in ``[f + "/", f +
        "0")``, so the key that follows ``f`` starts with ``f`` if any key is under it. The keys
        held before that the last of them has sorted past (no later key can be under them) are
        let go first."""
        open_files = self.open_files
        if len(open_files) > 1:
            newest = open_files[-1]
            open_files[:] = [held for held in open_files if newest < held + "0"]
        following = keys if open_files else keys[1:]
        if len(open_files) <= 1 and not any(map(str.startswith, following, open_files + keys[:-1])):
            open_files[:] = keys[-1:]
            return
        for key in keys:
            self.see(key)


def _shard(kept: SortedRuns, request: SyncRequest, sizes: array | None) -> SortedRuns:
    """This rank's rows by the sharding rule, over the sorted stream."""
    rank, world = request.rank, request.world_size
    owners = owners_by_bytes(sizes, world) if sizes is not None else None
    del sizes
    mine = SortedRuns()
    for index, row in enumerate(kept):
        if (owners[index] if owners is not None else index % world) == rank:
            mine.add(row)
    return mine.finish()


def _share_augmented(selection: Selection, request: SyncRequest) -> Selection:
    """Augmented manifests: a line's objects stay together (:func:`share_records`). The
    manifest is in memory already, so its objects are too."""
    from lading.selection.manifest import share_records

    assert request.manifest is not None
    kept = list(selection.objects())
    mine = select_for_rank(kept, request.rank, request.world_size, request.distribution, request.balance)
    mine, records = share_records(
        request.manifest,
        request.source,
        kept,
        mine,
        request.rank,
        request.world_size,
        request.distribution,
        request.balance,
    )
    runs = SortedRuns()
    runs.extend((info.key, info.size, info.version, info.mtime, info.md5, info.crc32c) for info in mine)
    selection.runs.close()
    selection.runs, selection.records = runs.finish(), records
    selection.selected_bytes = sum(info.size for info in mine)
    return selection


def _refuse_empty(request: SyncRequest, objects: int, store: Store) -> None:
    """An empty selection is almost always a mistyped prefix or filter, or an empty manifest:
    say which (exit 3). A SOURCE that names one object is a usage error (exit 2), found by one
    HEAD here, on the failure path, as a local SOURCE that is a file is refused."""
    if request.manifest is not None and not request.manifest.entries:
        raise NotFound(
            f"the manifest {request.manifest.origin} is empty: it lists no keys",
            "check the file; --allow-empty accepts an empty source",
        )
    if objects == 0:
        refuse_an_object(
            store, "lading fetch {url} DEST copies one object; or sync its prefix {parent} --include '{name}'"
        )
        raise NotFound(
            f"nothing at {request.source}: no objects under this prefix",
            "check the bucket and prefix, keys are case-sensitive; --allow-empty accepts an empty source",
        )
    raise NotFound(
        f"nothing at {request.source} matches the filters: {objects} object(s) listed, "
        "none kept by --include/--exclude",
        "the globs match keys relative to SOURCE; --allow-empty accepts an empty selection",
    )


def _refuse(refusals: _Refusals, source: str) -> None:
    """One error naming the unsafe keys and the file/directory clashes (a few of each kind)."""
    shown = refusals.unsafe + refusals.clashes
    more = f" (and {refusals.total - len(shown)} more)" if refusals.total > len(shown) else ""
    raise UnsafeKey(
        f"{refusals.total} unsafe key(s) in {source}, nothing was written: {'; '.join(shown)}{more}",
        "rename them in the bucket, or leave them out with --exclude",
    )


def _classify(row: tuple, entry: Entry | None, st: os.stat_result | None, verified: bool = False) -> str | None:
    """Why the object of ``row`` (ObjectInfo fields) must be fetched, given its index entry and
    local file, or None when the local copy is current. ``verified``: the entry's line was
    verified against its file (:mod:`lading.sync.verify`), so ``st`` is not needed."""
    if entry is None:
        return "new" if st is None else "untracked"
    if entry.version != row[2] or entry.size != row[1]:
        return "changed"
    if verified:
        return None
    if st is None:
        return "missing"
    if not stat_mode.S_ISREG(st.st_mode) or not entry.matches_local(st):
        return "modified"
    return None


def _stat_folder(root: str, folder: str, names: list[str]) -> list[os.stat_result | None]:
    """The ``lstat`` of each name in ``root/folder`` (None: no file), relative to the folder's
    descriptor: one path walk per folder, not one per file."""
    try:
        fd = os.open(f"{root}/{folder}" if folder else root, _FOLDER_FLAGS)
    except OSError:  # no such folder (or a file in its place): no file under it
        return [None] * len(names)
    stat = os.stat
    found: list[os.stat_result | None] = []
    try:
        for name in names:
            try:
                found.append(stat(name, dir_fd=fd, follow_symlinks=False))
            except OSError:
                found.append(None)
    finally:
        os.close(fd)
    return found


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _stat_page(root: str, page: Page) -> list[os.stat_result | None]:
    """The ``lstat`` of each row's file under ``root`` (None: no file), a folder at a time (keys
    passed key_parts: plain relative paths, in key order)."""
    found: list[os.stat_result | None] = []
    current: str | None = None
    names: list[str] = []
    for row in page:
        parent, _, name = row[0].rpartition("/")
        if parent != current:
            if names:
                found.extend(_stat_folder(root, current or "", names))
            current, names = parent, []
        names.append(name)
    if names:
        found.extend(_stat_folder(root, current or "", names))
    return found


def plan_sync(
    selection: Selection, request: SyncRequest, state: SyncState, workers: int = 8, list_current: bool = True
) -> SyncPlan:
    """Compare this rank's objects with DEST's index and files, both in key order. Writes
    nothing in DEST. ``list_current=False`` only counts the files already up to date (a sync
    needs their number, ``--dry-run --json`` their keys). (``workers`` is kept for callers; the
    stats are :func:`_verified_lines`' and :func:`_stat_page`'s.)"""
    plan = _plan_rows(_pages_of(selection.runs), request, state, list_current)
    plan.listed, plan.matched = selection.listed, selection.matched
    return plan


def _pages_of(rows: Iterable[tuple]) -> Iterator[Page]:
    """Rows in pages of at most :data:`PAGE_ROWS`."""
    rows = iter(rows)
    while page := list(islice(rows, PAGE_ROWS)):
        yield page


@contextmanager
def _verified_lines(state: SyncState, root: str) -> Iterator[Iterator[str]]:
    """DEST's index lines verified against its files (:func:`lading.sync.verify.verified`): by
    a helper process reading the index when it is the whole record and at least
    :data:`_VERIFY_APART` bytes (its ``stat`` calls then run beside the listing, on another
    core), else in this thread as the lines are read."""
    path = state.index_alone()
    try:
        large = path is not None and path.stat().st_size >= _VERIFY_APART
    except OSError:
        large = False
    helper = _start_verifier(path, root) if large and path is not None else None
    if helper is None:
        yield verify.verified(root, state.lines())
        return
    try:
        yield _helper_lines(helper, root, lambda: verify.verified(root, state.lines()))
    finally:
        if helper.poll() is None:
            helper.kill()
        helper.wait()
        for stream in (helper.stdout, helper.stderr):
            if stream is not None:
                stream.close()


def _start_verifier(path: Path, root: str) -> subprocess.Popen[bytes] | None:
    """``python -S verify.py ROOT`` reading the index on stdin (None: it can't be started;
    the lines are then verified here)."""
    argv = _verifier_argv(root)
    if not argv[0] or getattr(sys, "frozen", False):  # no interpreter to run a script with
        return None
    try:
        with open(path, "rb") as index:
            return subprocess.Popen(
                argv,
                stdin=index,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
    except OSError as err:
        log.debug("%s: verifying the index here, no helper process: %s", root, err)
        return None


def _verifier_argv(root: str) -> list[str]:
    """The helper's command: :mod:`lading.sync.verify` as a script (no site: it needs the
    standard library only)."""
    return [sys.executable or "", "-S", verify.__file__, root]


def _helper_lines(helper: subprocess.Popen[bytes], root: str, here: Callable[[], Iterator[str]]) -> Iterator[str]:
    """The helper's lines; at their end, its exit status checked: a helper that failed before
    its first line (an interpreter that can't run it) leaves the lines to ``here``; one that
    died later must not pass for an index that ended."""
    assert helper.stdout is not None and helper.stderr is not None
    lines = io.TextIOWrapper(helper.stdout, encoding="utf-8")
    first = lines.readline()
    if first:
        yield first
        yield from lines
    if helper.wait() == 0:
        return
    detail = helper.stderr.read().decode("utf-8", "replace").strip().splitlines()[-1:]
    failure = f"exit {helper.returncode}{': ' + detail[0] if detail else ''}"
    if not first:
        log.warning("%s: verifying the state record here, its helper process failed (%s)", root, failure)
        yield from here()
        return
    raise LadingError(
        f"checking the files in {root} against its state record failed ({failure})",
        "nothing was written; run the sync again",
    )


class _Lines:
    """DEST's index lines as :mod:`lading.sync.verify` passes them on (``"?"`` before a line
    not verified), with lines taken ahead put back."""

    def __init__(self, lines: Iterator[str]) -> None:
        self._lines = lines
        self._back: deque[str] = deque()

    def next(self) -> str | None:
        return self._back.popleft() if self._back else next(self._lines, None)

    def take(self, count: int) -> list[str]:
        taken = [self._back.popleft() for _ in range(min(count, len(self._back)))]
        taken.extend(islice(self._lines, count - len(taken)))
        return taken

    def put_back(self, lines: list[str]) -> None:
        self._back.extendleft(reversed(lines))

    def entry_after(self, last: str | None, root: str, warn: bool = True) -> tuple[Entry, bool] | None:
        """The next entry whose key sorts after ``last``, and whether its line was verified
        (None: no more lines). Lines malformed or out of key order are dropped, those out of
        order with a warning if ``warn``."""
        while (line := self.next()) is not None:
            verified = not line.startswith("?")
            entry = _parse_start(line) if verified else parse_line(line[1:])
            if entry is None:
                continue
            if last is None or entry.key > last:
                return entry, verified
            if warn:
                log.warning("%s: dropping row %r out of key order", root, entry.key)
        return None


def _parse_start(line: str) -> Entry | None:
    """The entry of a verified line's start (``[key,size,version,`` and a newline), its local
    side unknown (-1: only its source side is compared), or None when it is malformed."""
    try:
        row = json.loads(line[:-2] + "]")
    except ValueError:
        return None
    if type(row) is list and len(row) == 3 and type(row[0]) is str and type(row[1]) is int and type(row[2]) is str:
        return Entry(row[0], row[1], row[2], -1, -1)
    return None


#: A verified index line, as :mod:`lading.sync.verify` passes it on: its start, the source's
#: side of the row (``[key,size,version,``, JSON as :func:`lading.sync.state._dumps` writes it).
_LINE_START = "[{},{},{},\n".format
_second, _third = itemgetter(1), itemgetter(2)


def _line_starts(rows: Page) -> list[str]:
    """The verified line of each row (ObjectInfo fields) when it is up to date, in C (maps, no
    Python step per row)."""
    string = encode_basestring_ascii
    return list(map(_LINE_START, map(string, map(_first, rows)), map(_second, rows), map(string, map(_third, rows))))


def _compare(
    pages: Iterable[Page], lines: Iterator[str], plan: SyncPlan, delete: bool, root: str, list_current: bool
) -> None:
    """Walk this rank's rows (in pages) beside DEST's index lines, verified against DEST's files
    (:func:`lading.sync.verify.verified`), both in key order, filling ``plan``. A page whose
    next lines are verified and are the lines a fetch of its rows would record now (same keys,
    sizes and versions: :func:`_line_starts`) is up to date as a whole, without parsing a line or a
    ``stat`` here; otherwise each row is compared on its own: lines are parsed (those malformed
    or out of key order dropped), and the page's files stat'ed unless their lines were verified."""
    index = _Lines(lines)
    taken: tuple[Entry, bool] | None = None  # a line parsed and not yet matched to a row
    last: str | None = None  # the last index key taken: a line at or below it is out of order
    current = up_to_date_bytes = 0
    for batch in pages:
        if taken is None:
            got = index.take(len(batch))
            if got == _line_starts(batch):
                current += len(batch)
                up_to_date_bytes += sum(map(_second, batch))
                if list_current:
                    plan.current.extend((row[0],) for row in batch)
                last = batch[-1][0]
                continue
            index.put_back(got)
        stats: list[os.stat_result | None] | None = None
        for at, row in enumerate(batch):
            key = row[0]
            mine: tuple[Entry, bool] | None = None
            while True:
                if taken is None:
                    taken = index.entry_after(last, root)
                    if taken is None:
                        break
                entry = taken[0]
                if entry.key > key:
                    break
                if entry.key == key:
                    mine = taken
                elif delete and is_safe_key(entry.key):  # tracked, no longer selected
                    plan.deleting.add((entry.key,))
                last, taken = entry.key, None
            if mine is not None and mine[1]:
                reason = _classify(row, mine[0], None, verified=True)
            else:
                if stats is None:
                    stats = _stat_page(root, batch)
                reason = _classify(row, None if mine is None else mine[0], stats[at])
            if reason is None:
                if list_current:
                    plan.current.add((key,))
                current += 1
                up_to_date_bytes += row[1]
            else:
                plan.fetching.add(row + (reason,))
                plan.fetch_bytes += row[1]
    while delete:  # the entries past the last row: tracked, no longer selected
        if taken is None:
            taken = index.entry_after(last, root, warn=False)
            if taken is None:
                break
        if is_safe_key(taken[0].key):
            plan.deleting.add((taken[0].key,))
        last, taken = taken[0].key, None
    plan.counted_current, plan.up_to_date_bytes = current, up_to_date_bytes


def _plan_rows(pages: Iterable[Page], request: SyncRequest, state: SyncState, list_current: bool) -> SyncPlan:
    """The plan of ``pages`` (this rank's objects as ObjectInfo fields, in key order).

    The index's rows are read unchecked: a row is used only when its key equals a selected key
    (checked by the selection) or, for ``--delete``, after its own key check."""
    root = str(Path(request.dest))
    plan = SyncPlan(
        request.source,
        root,
        request.rank,
        request.world_size,
        request.distribution,
        request.balance,
    )
    try:
        with _verified_lines(state, root) as lines:
            _compare(pages, lines, plan, request.delete, root, list_current)
        for runs in (plan.fetching, plan.current, plan.deleting):
            runs.finish()
    except BaseException:
        plan.close()
        raise
    return plan
