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

from staging.context.detignore import DETIGNORE, IgnoreSpec
from staging.errors import AccessDenied, NotFound, UsageError


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
        raise UsageError(f"context path '{context_dir}' must be a directory",
                         hint="use -i/--include to add a single file")
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
            raise UsageError(f"unable to determine the name of include '{include}'",
                             hint="include a directory below /, not / itself")
        roots.append(Root(given=include, path=resolved, name=name, is_file=os.path.isfile(resolved)))
    return roots


def walk_roots(roots: Sequence[Root], specs: Sequence[IgnoreSpec],
               progress: Callable[[int], None] | None = None) -> WalkResult:
    """Walk every root with its spec; raise UsageError when top-level names collide (det does).

    ``progress`` is called with the number of files found so far after each directory.
    """
    result = WalkResult()
    readable = _read_permission_check()
    for root, spec in zip(roots, specs):
        if root.is_file:
            _add_file_root(root, result, readable)
        else:
            if root.name:
                result.dirs.append(root.name)
            _walk_tree(root, spec, result, readable, progress)
    _check_collisions(result)
    return result


def _add_file_root(root: Root, result: WalkResult, readable: Callable | None) -> None:
    try:
        info = os.stat(root.path)
    except OSError as err:
        raise NotFound(f"include '{root.given}' cannot be read: {err.strerror}") from err
    if readable is not None and not readable(info):
        raise AccessDenied(f"include '{root.given}' is not readable", hint="det would fail on it too")
    _count(result, "", root.name, info.st_size)


def _count(result: WalkResult, directory: str, path: str, size: int) -> None:
    totals = result.own.setdefault(directory, DirTotals())
    totals.files += 1
    totals.raw_bytes += size
    totals.det_bytes += (size + 2) // 3 * 3
    result.files.append(path)
    result.sizes.append(size)


def _walk_tree(root: Root, spec: IgnoreSpec, result: WalkResult, readable: Callable | None,
               progress: Callable[[int], None] | None) -> None:
    """Depth-first walk of one directory root.

    Plain regular files (known from the directory entry's type, no syscall) go through
    list comprehensions in bulk, which is most of the speed; everything else (directories,
    links, special files) takes the careful path one entry at a time.
    """
    ignores = spec.matcher()
    stack = [("", root.path)]
    while stack:
        rel, path = stack.pop()
        entries = _list_directory(root, rel, path, result)
        first = len(result.sizes)
        plain = []
        for entry in entries:
            try:
                is_plain_file = entry.is_file(follow_symlinks=False)
            except OSError:
                is_plain_file = False
            if is_plain_file:
                plain.append(entry)
            else:
                _add_other_entry(root, rel, entry, ignores, result, stack, readable)
        if plain:
            _add_plain_files(root, rel, plain, ignores, result, readable)
        if len(result.sizes) > first:
            result.own[root.prefix + rel[:-1] if rel else root.name] = _totals(result.sizes[first:])
        if progress is not None:
            progress(len(result.sizes))


def _list_directory(root: Root, rel: str, path: str, result: WalkResult) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as scan:
            return list(scan)
    except OSError as err:
        if not rel:
            raise AccessDenied(f"cannot list '{root.given}': {err.strerror}") from err
        result.notes.append(("unreadable_dir", root.prefix + rel[:-1]))  # os.walk skips it silently
        return []


def _add_plain_files(root: Root, rel: str, entries: list[os.DirEntry], ignores: Callable[[str], object],
                     result: WalkResult, readable: Callable | None) -> None:
    rels = [rel + entry.name for entry in entries]
    if rel + DETIGNORE in rels:
        at = rels.index(rel + DETIGNORE)
        del rels[at], entries[at]
        if rel:
            result.notes.append(("nested_detignore", root.prefix + rel + DETIGNORE))
    ignored = list(map(ignores, rels))
    kept = [entry for entry, hit in zip(entries, ignored) if not hit]
    kept_rels = [path for path, hit in zip(rels, ignored) if not hit]
    try:
        infos = [entry.stat() for entry in kept]
    except OSError:  # one vanished or lost permission since the listing: take them one by one
        for entry, path in zip(kept, kept_rels):
            _add_file(root, path, entry, result, readable)
        return
    if readable is not None and not all(map(readable, infos)):
        for entry, path in zip(kept, kept_rels):
            _add_file(root, path, entry, result, readable)
        return
    prefix = root.prefix
    result.files.extend([prefix + path for path in kept_rels] if prefix else kept_rels)
    result.sizes.extend([info.st_size for info in infos])


def _add_other_entry(root: Root, rel: str, entry: os.DirEntry, ignores: Callable[[str], object],
                     result: WalkResult, stack: list[tuple[str, str]], readable: Callable | None) -> None:
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
        _add_file(root, rel_path, entry, result, readable)


def _add_file(root: Root, rel_path: str, entry: os.DirEntry, result: WalkResult,
              readable: Callable | None) -> None:
    """One file that no pattern ignores: uploaded if det could open it."""
    path = root.prefix + rel_path
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


def _totals(sizes: list[int]) -> DirTotals:
    """Totals of one directory's files, at C speed: ceil(s/3)*3 adds 2 bytes when s % 3 == 1
    and 1 byte when s % 3 == 2."""
    remainders = list(map(operator.mod, sizes, itertools.repeat(3)))
    raw = sum(sizes)
    return DirTotals(len(sizes), raw, raw + 2 * remainders.count(1) + remainders.count(2))


def _read_permission_check() -> Callable[[os.stat_result], bool] | None:
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
        raise UsageError(f"duplicate top-level path{'s' if len(duplicates) > 1 else ''} in the "
                         f"upload: {names}", hint="an include has the same name as another include "
                         "or as an entry at the top of the context; rename or drop one")
