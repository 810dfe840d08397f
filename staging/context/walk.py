"""The stat-only walk: what det would upload from each root, without reading a byte of content.

It mirrors ``determined.common.detignore.os_walk_to_v1Files`` over ``os.walk`` (no link
following): directories are tested as ``rel`` and ``rel/`` and pruned when ignored; a link to a
directory is listed but not entered (det uploads it empty); a ``.detignore`` file is never
uploaded; a file det could not open (broken link, no read permission) is skipped.
"""

from __future__ import annotations

import itertools
import operator
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from lading.context.detignore import DETIGNORE, IgnoreSpec
from lading.context.stat_sizes import NOT_REGULAR, Readable, stat_sizes
from lading.core.errors import AccessDenied, NotFound, UsageError


@dataclass(frozen=True)
class Root:
    """One tree det uploads: the context directory, or one ``-i/--include``."""

    given: str  # as the user wrote it
    path: str  # resolved, absolute
    name: str  # "" for the context; the resolved basename for an include
    is_file: bool = False

    @property
    def prefix(self) -> str:
        """What det puts in front of paths from this root (``""`` or ``"name/"``)."""
        return f"{self.name}/" if self.name else ""


@dataclass
class DirTotals:
    """Files directly inside one uploaded directory (not below it)."""

    files: int = 0
    raw_bytes: int = 0
    det_bytes: int = 0


@dataclass
class WalkResult:
    """Everything det would upload, as parallel lists, plus what the walk noticed."""

    files: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    own: dict[str, DirTotals] = field(default_factory=dict)  # "" is the top level
    notes: list[tuple[str, str]] = field(default_factory=list)  # (kind, upload path)


def resolve_roots(context_dir: str, includes: Sequence[str] = ()) -> list[Root]:
    """Resolve the context and includes the way det's ``read_v1_context`` does, failing with
    NotFound for a missing path and UsageError for a context that is a file or a nameless include."""
    if os.path.isfile(context_dir):
        raise UsageError(
            f"context path '{context_dir}' must be a directory", hint="use -i/--include to add a single file"
        )
    context = os.path.realpath(context_dir)
    if not os.path.isdir(context):
        raise NotFound(f"context directory '{context_dir}' does not exist")
    roots = [Root(given=context_dir, path=context, name="")]
    for include in includes:
        resolved = os.path.realpath(include)
        if not os.path.exists(resolved):
            raise NotFound(f"include '{include}' does not exist")
        name = os.path.basename(resolved)
        if not name:
            raise UsageError(
                f"unable to determine the name of include '{include}'", hint="include a directory below /, not / itself"
            )
        roots.append(Root(given=include, path=resolved, name=name, is_file=os.path.isfile(resolved)))
    return roots


def walk_roots(
    roots: Sequence[Root],
    specs: Sequence[IgnoreSpec],
    progress: Callable[[int], None] | None = None,
    fork: bool = False,
) -> WalkResult:
    """Walk every root with its spec; raise UsageError when top-level names collide (det does).

    ``progress`` is called with the number of files found so far after each directory. With
    ``fork``, big trees are stat'ed by this process and a forked child together (see stat_sizes).
    """
    result = WalkResult()
    sizer = _Sizer(result, _read_permission_check(), progress, fork)
    for root, spec in zip(roots, specs):
        if root.is_file:
            _add_file_root(root, result, sizer.readable)
        else:
            if root.name:
                result.dirs.append(root.name)
            _walk_tree(root, spec, result, sizer)
    sizer.flush()
    _check_collisions(result)
    return result


@dataclass
class _Pending:
    """The files of one directory that no pattern ignores, waiting for their sizes."""

    directory: str  # the key in WalkResult.own
    sources: list[str]  # plain regular files, as paths to stat
    paths: list[str]  # their upload paths
    others: list[tuple[str, os.DirEntry]]  # links and special files: (upload path, entry)


class _Sizer:
    """Collects directories' files during the walk and stats them in batches (see stat_sizes)."""

    BATCH = 50_000  # bounds the memory held between the walk and the stats

    def __init__(
        self, result: WalkResult, readable: Readable | None, progress: Callable[[int], None] | None, fork: bool
    ) -> None:
        self.result, self.readable, self.progress, self.fork = result, readable, progress, fork
        self.pending: list[_Pending] = []
        self.waiting = 0

    def add(self, pending: _Pending) -> None:
        """Queue one directory's files; stat a batch once enough are waiting."""
        self.pending.append(pending)
        self.waiting += len(pending.sources) + len(pending.others)
        if self.waiting >= self.BATCH:
            self.flush()
        if self.progress is not None:
            self.progress(len(self.result.files) + self.waiting)

    def flush(self) -> None:
        """Stat everything queued and record it, directory by directory."""
        result = self.result
        codes = stat_sizes([source for p in self.pending for source in p.sources], self.readable, self.fork)
        offset = 0
        for pending in self.pending:
            chunk = codes[offset : offset + len(pending.sources)]
            offset += len(pending.sources)
            first = len(result.sizes)
            if chunk and min(chunk) >= 0:
                result.files.extend(pending.paths)
                result.sizes.extend(chunk)
            else:
                for path, code in zip(pending.paths, chunk):
                    _record(result, path, code)
            for path, entry in pending.others:
                _add_file(path, entry, result, self.readable)
            if len(result.sizes) > first:
                _add_totals(result, pending.directory, result.sizes[first:])
        self.pending, self.waiting = [], 0


def _record(result: WalkResult, path: str, code: int) -> None:
    if code >= 0:
        result.files.append(path)
        result.sizes.append(code)
    else:
        result.notes.append(("special_file" if code == NOT_REGULAR else "unreadable_file", path))


def _add_file_root(root: Root, result: WalkResult, readable: Readable | None) -> None:
    try:
        info = os.stat(root.path)
    except OSError as err:
        raise NotFound(f"include '{root.given}' cannot be read: {err.strerror}") from err
    if readable is not None and not readable(info):
        raise AccessDenied(f"include '{root.given}' is not readable", hint="det would fail on it too")
    result.files.append(root.name)
    result.sizes.append(info.st_size)
    _add_totals(result, "", [info.st_size])


def _walk_tree(root: Root, spec: IgnoreSpec, result: WalkResult, sizer: _Sizer) -> None:
    """Depth-first walk of one directory root; files are handed to ``sizer`` for their sizes.

    Plain regular files (known from the directory entry's type, no syscall) go through
    list comprehensions in bulk, which is most of the speed; everything else (directories,
    links, special files) takes the careful path one entry at a time.
    """
    ignores = spec.matcher()
    stack = [("", root.path)]
    while stack:
        rel, path = stack.pop()
        plain: list[os.DirEntry] = []
        others: list[tuple[str, os.DirEntry]] = []
        for entry in _list_directory(root, rel, path, result):
            try:
                is_plain_file = entry.is_file(follow_symlinks=False)
            except OSError:
                is_plain_file = False
            if is_plain_file:
                plain.append(entry)
            else:
                _visit_other_entry(root, rel, entry, ignores, result, stack, others)
        directory = root.prefix + rel[:-1] if rel else root.name
        sources, paths = _unignored_files(root, rel, plain, ignores, result)
        sizer.add(_Pending(directory, sources, paths, others))


def _list_directory(root: Root, rel: str, path: str, result: WalkResult) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as scan:
            return list(scan)
    except OSError as err:
        if not rel:
            raise AccessDenied(f"cannot list '{root.given}': {err.strerror}") from err
        result.notes.append(("unreadable_dir", root.prefix + rel[:-1]))  # os.walk skips it silently
        return []


def _unignored_files(
    root: Root, rel: str, entries: list[os.DirEntry], ignores: Callable[[str], object], result: WalkResult
) -> tuple[list[str], list[str]]:
    """The plain files of one directory that det keeps: their paths and their upload paths."""
    rels = [rel + entry.name for entry in entries]
    if rel + DETIGNORE in rels:
        at = rels.index(rel + DETIGNORE)
        del rels[at], entries[at]
        if rel:
            result.notes.append(("nested_detignore", root.prefix + rel + DETIGNORE))
    ignored = list(map(ignores, rels))
    kept = [entry.path for entry, hit in zip(entries, ignored) if not hit]
    kept_rels = [path for path, hit in zip(rels, ignored) if not hit]
    prefix = root.prefix
    return kept, [prefix + path for path in kept_rels] if prefix else kept_rels


def _visit_other_entry(
    root: Root,
    rel: str,
    entry: os.DirEntry,
    ignores: Callable[[str], object],
    result: WalkResult,
    stack: list[tuple[str, str]],
    others: list[tuple[str, os.DirEntry]],
) -> None:
    """A directory, a link or a special file, decided the way os.walk + det decide it."""
    rel_path = rel + entry.name
    try:
        is_dir = entry.is_dir()
    except OSError:  # e.g. a symlink loop: os.walk files it as a non-directory
        is_dir = False
    if is_dir:
        if ignores(rel_path) or ignores(rel_path + "/"):
            return
        result.dirs.append(root.prefix + rel_path)
        if entry.is_symlink():
            result.notes.append(("symlinked_dir", root.prefix + rel_path))
        else:
            stack.append((rel_path + "/", entry.path))
        return
    if entry.name == DETIGNORE:
        if rel:
            result.notes.append(("nested_detignore", root.prefix + rel_path))
        return
    if not ignores(rel_path):
        others.append((root.prefix + rel_path, entry))


def _add_file(path: str, entry: os.DirEntry, result: WalkResult, readable: Readable | None) -> None:
    """One file that no pattern ignores: uploaded if det could open it."""
    try:
        info = entry.stat()
    except OSError:
        result.notes.append(("broken_symlink" if entry.is_symlink() else "unreadable_file", path))
        return
    if not stat.S_ISREG(info.st_mode):
        result.notes.append(("special_file", path))
    elif readable is not None and not readable(info):
        result.notes.append(("unreadable_file", path))
    else:
        result.files.append(path)
        result.sizes.append(info.st_size)


def _add_totals(result: WalkResult, directory: str, sizes: list[int]) -> None:
    """Add files to a directory's own totals, at C speed: ceil(s/3)*3 adds 2 bytes when
    s % 3 == 1 and 1 byte when s % 3 == 2."""
    remainders = list(map(operator.mod, sizes, itertools.repeat(3)))
    raw = sum(sizes)
    totals = result.own.setdefault(directory, DirTotals())
    totals.files += len(sizes)
    totals.raw_bytes += raw
    totals.det_bytes += raw + 2 * remainders.count(1) + remainders.count(2)


def _read_permission_check() -> Readable | None:
    """A stat-only stand-in for "can det open this file for reading" (None: always, as root).

    Uses the owner/group/other permission bits as the kernel does (ACLs aside), to avoid a
    second syscall per file.
    """
    if not hasattr(os, "geteuid") or os.geteuid() == 0:
        return None
    uid = os.geteuid()
    groups = set(os.getgroups()) | {os.getegid()}

    def readable(info: os.stat_result) -> bool:
        """Would open(path, "rb") be allowed by the permission bits?"""
        if info.st_uid == uid:
            return bool(info.st_mode & stat.S_IRUSR)
        if info.st_gid in groups:
            return bool(info.st_mode & stat.S_IRGRP)
        return bool(info.st_mode & stat.S_IROTH)

    return readable


def _check_collisions(result: WalkResult) -> None:
    top_level = Counter(path for path in (*result.files, *result.dirs) if "/" not in path)
    duplicates = sorted(name for name, count in top_level.items() if count > 1)
    if duplicates:
        names = ", ".join(repr(name) for name in duplicates)
        raise UsageError(
            f"duplicate top-level path{'s' if len(duplicates) > 1 else ''} in the upload: {names}",
            hint="an include has the same name as another include "
            "or as an entry at the top of the context; rename or drop one",
        )
