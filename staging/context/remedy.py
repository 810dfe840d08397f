"""When the upload is over the limit: which ``.detignore`` lines bring it under.

Largest data-like paths (data, checkpoint and cache directories, model and dataset files) are
proposed first, then the largest other files, then other directories. The proposal is proven by
walking again with the lines appended, so the "after" total is det's, not an estimate.
"""

from __future__ import annotations

import heapq
import os
import posixpath
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from lading.context.detignore import DETIGNORE, IgnoreSpec
from lading.context.report import CheckReport, Remedy
from lading.context.sizes import det_size
from lading.context.walk import Root, walk_roots
from lading.context.warnings import VENV_NAMES, is_data_like_dir

DATA_SUFFIXES = (
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".safetensors",
    ".h5",
    ".hdf5",
    ".npy",
    ".npz",
    ".parquet",
    ".arrow",
    ".feather",
    ".csv",
    ".tsv",
    ".jsonl",
    ".tfrecord",
    ".tfrecords",
    ".tar",
    ".zip",
    ".gz",
    ".tgz",
    ".bz2",
    ".xz",
    ".zst",
    ".pkl",
    ".pickle",
    ".joblib",
    ".onnx",
    ".gguf",
    ".mdb",
    ".lmdb",
    ".db",
    ".sqlite",
    ".mp4",
    ".wav",
    ".flac",
    ".jpg",
    ".jpeg",
    ".png",
    ".idx",
    ".data",
)
CODE_SUFFIXES = (
    ".py",
    ".pyx",
    ".sh",
    ".ipynb",
    ".yaml",
    ".yml",
    ".toml",
    ".cfg",
    ".ini",
    ".c",
    ".cc",
    ".cpp",
    ".h",
    ".cu",
)
_FILE_CANDIDATES = 2000  # only the largest files can matter for the remedy
_GLOB_SPECIAL = re.compile(r"([\\*?\[])")


@dataclass(frozen=True)
class _Candidate:
    tier: int  # 0 data-like, 1 other file, 2 other directory
    det_bytes: int
    path: str
    is_dir: bool


def plan_remedy(report: CheckReport) -> Remedy:
    """Pick paths to ignore until the total fits, then prove it by walking again."""
    excess = report.total_bytes - report.limit_bytes
    chosen = _choose(_candidates(report), excess)
    lines: dict[str, list[str]] = {}
    for candidate in chosen:
        root, rel = _root_of(report.roots, candidate.path)
        lines.setdefault(root.path, []).append(detignore_line(rel, candidate.is_dir))
    specs = [
        IgnoreSpec.for_root(root.path, lines.get(root.path, ())) if not root.is_file else IgnoreSpec([])
        for root in report.roots
    ]
    after = walk_roots(report.roots, specs)
    total_after = sum(t.det_bytes for t in after.own.values())
    return Remedy(
        lines={os.path.join(path, DETIGNORE): root_lines for path, root_lines in lines.items()},
        paths=[(c.path, c.det_bytes) for c in chosen],
        total_after=total_after,
        fits_after=total_after <= report.limit_bytes,
        hook_paths=[c.path for c in chosen if c.tier == 0 and not is_environment(report, c.path)],
    )


def is_environment(report: CheckReport, path: str) -> bool:
    """Whether ``path`` is a Python environment (by name, or a virtualenv the walk recognised)."""
    return path in {w.path for w in report.warnings if w.kind == "virtualenv"} or posixpath.basename(path) in VENV_NAMES


def detignore_line(rel: str, is_dir: bool) -> str:
    """An anchored pattern that matches exactly ``rel`` (and, for a directory, all below it)."""
    escaped = _GLOB_SPECIAL.sub(r"\\\1", rel)
    if escaped.endswith(" "):
        escaped = escaped[:-1] + "\\ "
    return "/" + escaped + ("/" if is_dir else "")


def _candidates(report: CheckReport) -> list[_Candidate]:
    include_names = {root.name for root in report.roots if root.name}
    first = _mostly_data_dirs(report) | {w.path for w in report.warnings if w.kind == "virtualenv"}
    found = []
    for path, stat in report.dirs.items():
        if path and path not in include_names and stat.det_bytes > 0:
            tier = 0 if is_data_like_dir(posixpath.basename(path)) or path in first else 2
            found.append(_Candidate(tier, stat.det_bytes, path, True))
    for path, size in report.largest_files(_FILE_CANDIDATES):
        if path in include_names or size == 0:
            continue  # a file include is dropped with -i, not with .detignore
        tier = 0 if path.lower().endswith(DATA_SUFFIXES) else 1
        found.append(_Candidate(tier, det_size(size), path, False))
    return sorted(found, key=lambda c: (c.tier, -c.det_bytes, c.path))


def _mostly_data_dirs(report: CheckReport) -> set[str]:
    """Directories with no code below them whose bytes are at least 90% data-like files: one
    ``/dir/`` line beats a line per shard."""
    data_by_parent: dict[str, int] = defaultdict(int)
    code_parents: set[str] = set()
    for path, size in zip(report.walked.files, report.walked.sizes):
        parent = path.rpartition("/")[0]
        if path.lower().endswith(DATA_SUFFIXES):
            data_by_parent[parent] += det_size(size)
        elif path.endswith(CODE_SUFFIXES):
            code_parents.add(parent)
    data_below: dict[str, int] = defaultdict(int)
    for parent, size in data_by_parent.items():
        for ancestor in _self_and_ancestors(parent):
            data_below[ancestor] += size
    has_code = {ancestor for parent in code_parents for ancestor in _self_and_ancestors(parent)}
    return {
        path
        for path, size in data_below.items()
        if path not in has_code and path in report.dirs and size >= 0.9 * report.dirs[path].det_bytes
    }


def _self_and_ancestors(path: str) -> list[str]:
    parts = path.split("/") if path else []
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _choose(candidates: Sequence[_Candidate], excess: int) -> list[_Candidate]:
    chosen: list[_Candidate] = []
    chosen_dirs: set[str] = set()
    saved = 0
    for candidate in candidates:
        if saved >= excess:
            break
        if _overlaps(candidate, chosen, chosen_dirs):
            continue
        chosen.append(candidate)
        saved += candidate.det_bytes
        if candidate.is_dir:
            chosen_dirs.add(candidate.path)
    # Drop picks that turned out unnecessary, smallest first.
    for candidate in heapq.nsmallest(len(chosen), chosen, key=lambda c: c.det_bytes):
        if saved - candidate.det_bytes >= excess:
            chosen.remove(candidate)
            saved -= candidate.det_bytes
    return chosen


def _overlaps(candidate: _Candidate, chosen: Sequence[_Candidate], chosen_dirs: set[str]) -> bool:
    parts = candidate.path.split("/")
    if any("/".join(parts[:i]) in chosen_dirs for i in range(1, len(parts))):
        return True
    prefix = candidate.path + "/"
    return candidate.is_dir and any(c.path.startswith(prefix) for c in chosen)


def _root_of(roots: Sequence[Root], path: str) -> tuple[Root, str]:
    top, _, rest = path.partition("/")
    for root in roots[1:]:
        if root.name == top and rest:
            return root, rest
    return roots[0], path
