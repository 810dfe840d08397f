"""What det users trip over, found from the walk: ignored nested .detignore files, symlinked
directories uploaded empty, skipped files, virtualenvs, caches, checkpoints, data and secrets."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

from lading.core.sizes import format_size
from lading.context.walk import Root, WalkResult

CACHE_DIRS = frozenset(
    {".cache", ".pytest_cache", ".ruff_cache", ".tox", ".nox", "node_modules", ".ipynb_checkpoints", ".hypothesis"}
)
CHECKPOINT_DIRS = frozenset(
    {"checkpoint", "checkpoints", "ckpt", "ckpts", "lightning_logs", "wandb", "mlruns", "saved_models"}
)
DATA_DIRS = frozenset({"data", "dataset", "datasets", "_data", ".data"})
SECRET_NAMES = (
    ".env",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    "credentials",
    "credentials.json",
    ".netrc",
    ".pgpass",
    ".pypirc",
    ".htpasswd",
    "application_default_credentials.json",
)
#: regex fragments for one path segment ("*" is [^/\n]*)
SECRET_GLOBS = (
    r"[^/\n]*\.pem",
    r"[^/\n]*\.key",
    r"[^/\n]*\.p12",
    r"[^/\n]*\.pfx",
    r"\.env\.[^/\n]*",
    r"service-account[^/\n]*\.json",
    r"[^/\n]*[-_]credentials\.json",
)
VENV_NAMES = frozenset({".venv", "venv", "env", ".conda"})
BULKY_DIR_BYTES = 1 << 20  # data and checkpoint directories below this are not worth a warning
NOT_SECRET_SUFFIXES = (".example", ".sample", ".template", ".dist")
_SECRET_NAME = re.compile(r"(?:^|/)(?:" + "|".join([*map(re.escape, SECRET_NAMES), *SECRET_GLOBS]) + r")\Z")
_SECRET_NEEDLES = (
    ".env",
    "id_",
    "credentials",
    ".netrc",
    ".pgpass",
    ".pypirc",
    ".htpasswd",
    ".pem",
    ".key",
    ".p12",
    ".pfx",
    "service-account",
)
_VENV_MARKER = re.compile(r"(?:^|/)(?:pyvenv\.cfg|bin/activate)\Z")
_VENV_NEEDLES = ("pyvenv.cfg", "bin/activate")

_MESSAGES = {
    "nested_detignore": "det reads only the .detignore at the top of the context (or include); "
    "this one is ignored, so its rules do nothing",
    "symlinked_dir": "symlink to a directory: det uploads it as an empty directory",
    "broken_symlink": "broken symlink: det skips it",
    "unreadable_file": "not readable: det skips it",
    "unreadable_dir": "directory cannot be listed: det uploads it empty",
    "special_file": "not a regular file (fifo, socket or device): det would try to read it",
}


@dataclass(frozen=True)
class ContextWarning:
    """One thing worth knowing about the upload."""

    kind: str
    path: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """JSON form."""
        return {"kind": self.kind, "path": self.path, "message": self.message}


def walk_warnings(walked: WalkResult, roots: Sequence[Root] = ()) -> list[ContextWarning]:
    """Turn what the walk noticed into warnings; for a nested .detignore, also the lines that
    would do its job from the top-level .detignore."""
    found = []
    for kind, path in walked.notes:
        message = _MESSAGES[kind]
        if kind == "nested_detignore" and roots:
            lines = _lifted_rules(roots, path)
            if lines:
                message += "; to keep them, add to the top-level .detignore: " + ", ".join(repr(line) for line in lines)
        found.append(ContextWarning(kind, path, message))
    return found


def nothing_uploaded_warning(walked: WalkResult, roots: Sequence[Root]) -> list[ContextWarning]:
    """A warning when det would upload no file at all although the context holds some: the ignore
    rules drop everything (a ``.detignore`` with ``*`` or ``***``). det accepts such a context and
    the trial then fails on a missing entrypoint. (Symlinks alone are not "something to upload".)"""
    if walked.files or not roots:
        return []
    root = roots[0]
    try:
        with os.scandir(root.path) as entries:
            present = any(entry.name != ".detignore" and not entry.is_symlink() for entry in entries)
    except OSError:
        present = False
    if not present:  # an empty context: nothing was dropped
        return []
    return [
        ContextWarning(
            "nothing_uploaded",
            root.given,
            "every file is ignored (by det's defaults and .detignore): det would upload "
            "nothing, not even the model code; check the .detignore patterns",
        )
    ]


def _lifted_rules(roots: Sequence[Root], upload_path: str, max_lines: int = 10) -> list[str]:
    """The rules of a nested .detignore rewritten for the root's .detignore (gitignore meaning:
    relative to the directory that holds it)."""
    root = next((r for r in roots[1:] if upload_path.startswith(r.prefix)), roots[0])
    rel = upload_path[len(root.prefix) :]
    directory = posixpath.dirname(rel)
    try:
        with open(os.path.join(root.path, rel), "r", errors="replace") as handle:
            raw = [line.strip() for line in handle.readlines()[:200]]
    except OSError:
        return []
    lifted = []
    for line in raw:
        if not line or line.startswith("#"):
            continue
        negate, body = ("!", line[1:]) if line.startswith("!") else ("", line)
        if body.startswith("/"):
            lifted.append(f"{negate}/{directory}{body}")
        elif "/" in body.rstrip("/"):
            lifted.append(f"{negate}/{directory}/{body}")
        else:
            lifted.append(f"{negate}/{directory}/**/{body}")
    return lifted[:max_lines]


def content_warnings(walked: WalkResult, dir_bytes: Mapping[str, int]) -> list[ContextWarning]:
    """Virtualenvs, caches, checkpoints, data directories and secret-looking files that would be
    uploaded. ``dir_bytes`` maps each uploaded directory to det's bytes below it."""
    environments = _environment_warnings(walked.files, dir_bytes)
    venvs = tuple("" if w.path == "." else w.path + "/" for w in environments)
    # Inside a virtualenv, its own data directories and CA bundles are the venv's problem.
    others = _directory_warnings(walked.dirs, dir_bytes) + _secret_warnings(walked.files)
    return environments + [w for w in others if not (w.path + "/").startswith(venvs)]


def _environment_warnings(files: list[str], dir_bytes: Mapping[str, int]) -> list[ContextWarning]:
    venvs = {path[: -len(match.group(0))] or "." for path, match in _scan(files, _VENV_MARKER, _VENV_NEEDLES)}
    return [
        ContextWarning(
            "virtualenv",
            venv,
            f"a Python virtualenv ({format_size(dir_bytes.get(venv, 0))}) would be "
            "uploaded; keep it outside the context or add it to .detignore",
        )
        for venv in sorted(venvs)
    ]


def _directory_warnings(dirs: Iterable[str], dir_bytes: Mapping[str, int]) -> list[ContextWarning]:
    found: list[ContextWarning] = []
    reported: list[str] = []
    for path in sorted(dirs):
        size = dir_bytes.get(path, 0)
        if size == 0 or any(path.startswith(parent + "/") for parent in reported):
            continue
        kind = _directory_kind(posixpath.basename(path))
        if kind is None or (kind != "cache" and size < BULKY_DIR_BYTES):
            continue
        reported.append(path)
        what = {"cache": "a cache directory", "checkpoints": "a checkpoint directory", "data": "a data directory"}[kind]
        found.append(
            ContextWarning(
                kind,
                path,
                f"{what} ({format_size(size)}) would be uploaded "
                f"with the code; add '/{path}/' to .detignore unless the "
                "trial needs it",
            )
        )
    return found


def _directory_kind(name: str) -> str | None:
    lowered = name.lower()
    if lowered in CACHE_DIRS:
        return "cache"
    if lowered in CHECKPOINT_DIRS or lowered.startswith("checkpoint"):
        return "checkpoints"
    if lowered in DATA_DIRS:
        return "data"
    return None


def is_data_like_dir(name: str) -> bool:
    """Directories worth ignoring first: data, checkpoints, caches, virtualenv-ish names."""
    return _directory_kind(name) is not None or name in VENV_NAMES


def _secret_warnings(files: list[str]) -> list[ContextWarning]:
    return [
        ContextWarning(
            "secret",
            path,
            "looks like a secret and would be uploaded to the master "
            "(and stored with the experiment); add it to .detignore",
        )
        for path, _ in _scan(files, _SECRET_NAME, _SECRET_NEEDLES)
        if not path.endswith(NOT_SECRET_SUFFIXES)
    ]


def _scan(
    paths: list[str], pattern: "re.Pattern[str]", needles: tuple[str, ...]
) -> Iterator[tuple[str, "re.Match[str]"]]:
    """(path, match) for each path that ``pattern`` matches, checking only paths that contain
    one of ``needles``: a C-speed substring search over all paths joined by newlines replaces a
    Python loop over every path (falls back to the loop if a file name contains a newline)."""
    blob = "\n".join(paths)
    if blob.count("\n") != max(len(paths) - 1, 0):
        candidates: Iterable[str] = (p for p in paths if any(n in p for n in needles))
    else:
        candidates = _lines_containing(blob, needles)
    for path in candidates:
        match = pattern.search(path)
        if match:
            yield path, match


def _lines_containing(blob: str, needles: tuple[str, ...]) -> list[str]:
    starts: dict[int, str] = {}
    for needle in needles:
        at = blob.find(needle)
        while at != -1:
            start = blob.rfind("\n", 0, at) + 1
            end = blob.find("\n", at)
            end = len(blob) if end == -1 else end
            starts.setdefault(start, blob[start:end])
            at = blob.find(needle, end)
    return [starts[start] for start in sorted(starts)]
