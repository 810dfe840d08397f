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
    """Depth-first walk of one directory root. This loop is the hot path: keep it flat."""
    ignores = spec.matcher()
    files_append, sizes_append = result.files.append, result.sizes.append
    dirs_append, note = result.dirs.append, result.notes.append
    prefix = root.prefix
    is_regular = stat.S_ISREG
    stack = [("", root.path)]
    while stack:
        rel, path = stack.pop()
        try:
            scan = os.scandir(path)
        except OSError as err:
            if not rel:
                raise AccessDenied(f"cannot list '{root.given}': {err.strerror}") from err
            note(("unreadable_dir", prefix + rel[:-1]))  # det's os.walk skips it silently
            continue
        first = len(result.sizes)
        with scan:
            for entry in scan:
                name = entry.name
                rel_path = rel + name
                try:
                    is_dir = entry.is_dir()
                except OSError:  # e.g. a symlink loop: os.walk files it as a non-directory
                    is_dir = False
                if is_dir:
                    if ignores(rel_path) or ignores(rel_path + "/"):
                        continue
                    dirs_append(prefix + rel_path)
                    if entry.is_symlink():
                        note(("symlinked_dir", prefix + rel_path))
                    else:
                        stack.append((rel_path + "/", entry.path))
                    continue
                if name == DETIGNORE:
                    if rel:
                        note(("nested_detignore", prefix + rel_path))
                    continue
                if ignores(rel_path):
                    continue
                try:
                    info = entry.stat()
                except OSError:
                    note(("broken_symlink" if entry.is_symlink() else "unreadable_file", prefix + rel_path))
                    continue
                if not is_regular(info.st_mode):
                    note(("special_file", prefix + rel_path))
                    continue
                if readable is not None and not readable(info):
                    note(("unreadable_file", prefix + rel_path))
                    continue
                files_append(prefix + rel_path)
                sizes_append(info.st_size)
        if len(result.sizes) > first:
            result.own[prefix + rel[:-1] if rel else root.name] = _totals(result.sizes[first:])
        if progress is not None:
            progress(len(result.sizes))


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
