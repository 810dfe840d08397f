"""The verdict as data: totals, directory sizes, largest entries, and the JSON form."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from lading.context.walk import DirTotals, Root, WalkResult
from lading.context.warnings import ContextWarning


@dataclass(frozen=True)
class DirStat:
    """An uploaded directory with everything below it."""

    path: str
    files: int
    raw_bytes: int
    det_bytes: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"path": self.path, "files": self.files, "size": self.raw_bytes, "det_bytes": self.det_bytes}


@dataclass
class Remedy:
    """``.detignore`` lines that bring the upload under the limit, checked by walking again."""

    lines: dict[str, list[str]]  # .detignore file -> lines to append
    paths: list[tuple[str, int]]  # (upload path, det bytes saved), largest data-like first
    total_after: int
    fits_after: bool
    hook_paths: list[str] = field(default_factory=list)  # what to move to a bucket instead

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "detignore_lines": self.lines,
            "paths": [{"path": path, "det_bytes": size} for path, size in self.paths],
            "total_bytes_after": self.total_after,
            "fits_after": self.fits_after,
            "startup_hook_paths": self.hook_paths,
        }


@dataclass
class CheckReport:
    """What ``det experiment create`` would upload from these roots, and whether it fits."""

    roots: list[Root]
    limit_bytes: int
    walked: WalkResult
    dirs: dict[str, DirStat]  # every uploaded directory, plus "" for the whole upload
    warnings: list[ContextWarning] = field(default_factory=list)
    remedy: Remedy | None = None
    explanation: Any = None  # lading.context.explain.Explanation when asked for

    @property
    def total_bytes(self) -> int:
        """det's accounting: sum of ceil(size/3)*3 over uploaded files."""
        return self.dirs[""].det_bytes

    @property
    def raw_bytes(self) -> int:
        """Plain sum of file sizes."""
        return self.dirs[""].raw_bytes

    @property
    def fits(self) -> bool:
        """det refuses only when the total is strictly greater than the limit."""
        return self.total_bytes <= self.limit_bytes

    @property
    def headroom_bytes(self) -> int:
        """Limit minus total: negative when over."""
        return self.limit_bytes - self.total_bytes

    def largest_files(self, n: int) -> list[tuple[str, int]]:
        """The n largest uploaded files as (path, raw bytes), largest first."""
        sizes, files = self.walked.sizes, self.walked.files
        if n <= 0 or not sizes:
            return []
        threshold = min(heapq.nlargest(n, sizes))
        ties_included = [(files[i], size) for i, size in enumerate(sizes) if size >= threshold]
        return sorted(ties_included, key=lambda item: (-item[1], item[0]))[:n]

    def largest_dirs(self, n: int) -> list[DirStat]:
        """The n largest uploaded directories (by det bytes below them), largest first."""
        picked = heapq.nlargest(n, (d for path, d in self.dirs.items() if path), key=lambda d: d.det_bytes)
        return sorted(picked, key=lambda d: (-d.det_bytes, d.path))

    def to_json(self, top: int, indent: int | None = None) -> str:
        """``json.dumps(self.to_dict(top), indent=indent)`` with the (possibly huge) file list
        written at C speed instead of as one dict per file. Keys are the same; "files" comes last.
        With ``indent``, the very text ``json.dumps`` would give."""
        import json
        from json.encoder import encode_basestring_ascii

        doc = self.to_dict(top, with_files=False)
        files, sizes = self.walked.files, self.walked.sizes
        order = self.sorted_file_indices()
        if indent is None:
            entries = ",".join(
                ['{"path": %s, "size": %d}' % (encode_basestring_ascii(files[i]), sizes[i]) for i in order]
            )
            return json.dumps(doc)[:-1] + ', "files": [' + entries + "]}"
        one, two, three = (" " * (indent * level) for level in (1, 2, 3))
        entry = "{\n" + three + '"path": %s,\n' + three + '"size": %d\n' + two + "}"
        entries = (",\n" + two).join([entry % (encode_basestring_ascii(files[i]), sizes[i]) for i in order])
        listed = "[\n" + two + entries + "\n" + one + "]" if order else "[]"
        return json.dumps(doc, indent=indent)[:-2] + ",\n" + one + '"files": ' + listed + "\n}"

    def sorted_file_indices(self) -> list[int]:
        """Indices into the walk's files, ordered by path."""
        return sorted(range(len(self.walked.files)), key=self.walked.files.__getitem__)

    def to_dict(self, top: int, with_files: bool = True) -> dict[str, Any]:
        """The JSON document ``lading check --json`` prints."""
        files, sizes = self.walked.files, self.walked.sizes
        doc: dict[str, Any] = {
            "fits": self.fits,
            "total_bytes": self.total_bytes,
            "limit_bytes": self.limit_bytes,
            "headroom_bytes": self.headroom_bytes,
            "raw_bytes": self.raw_bytes,
            "file_count": len(files),
            "directory_count": len(self.walked.dirs),
            "context": self.roots[0].path,
            "includes": [{"path": r.path, "name": r.name} for r in self.roots[1:]],
            "directories": [self.dirs[path].to_dict() for path in sorted(self.walked.dirs)],
            "largest_files": [{"path": p, "size": s} for p, s in self.largest_files(top)],
            "largest_directories": [d.to_dict() for d in self.largest_dirs(top)],
            "warnings": [w.to_dict() for w in self.warnings],
            "remedy": self.remedy.to_dict() if self.remedy else None,
        }
        if self.explanation is not None:
            doc["explain"] = self.explanation.to_dict()
        if with_files:
            doc["files"] = [{"path": files[i], "size": sizes[i]} for i in self.sorted_file_indices()]
        return doc


def directory_stats(walked: WalkResult) -> dict[str, DirStat]:
    """Totals below every uploaded directory (and "" for everything), from per-directory totals."""
    below: dict[str, DirTotals] = {path: DirTotals() for path in walked.dirs}
    below[""] = DirTotals()
    for path, own in walked.own.items():
        node: str | None = path
        while node is not None:
            totals = below.setdefault(node, DirTotals())
            totals.files += own.files
            totals.raw_bytes += own.raw_bytes
            totals.det_bytes += own.det_bytes
            node = None if not node else node.rpartition("/")[0]
    return {path: DirStat(path, t.files, t.raw_bytes, t.det_bytes) for path, t in below.items()}
