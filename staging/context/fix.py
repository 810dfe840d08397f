"""``lading check --fix --bucket URI``: move what makes a context too big into a bucket.

Plan, then apply:

1. the plan is ``lading check``'s remedy (largest data-like paths first, proven by walking
   again): each chosen path is uploaded under ``URI/<path>``, except caches and virtualenvs,
   which are only ignored (they are rebuilt, not restored; a virtualenv does not survive an
   object store: links and modes are lost);
2. apply uploads every file det would have sent, then verifies each object (size, and MD5
   where the store reports one) and that each uploaded prefix holds exactly those files,
   BEFORE anything in the context changes;
3. only then it appends the lines to ``.detignore`` and adds one ``lading fetch`` per path to
   ``startup-hook.sh`` (destinations relative to the working directory, which is where
   Determined unpacks the context and sources the hook), so the files come back in place.

User files are never deleted or modified: the data stays where it is, only ignored. Running it
again re-uses what is already in the bucket (matching size and MD5 are not uploaded again).
"""

from __future__ import annotations

import hashlib
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lading.context import CheckReport
from lading.context.detignore import DETIGNORE
from lading.context.remedy import detignore_line, is_environment
from lading.context.warnings import CACHE_DIRS
from lading.core.errors import LadingError, NotFound, ProblemFound, UsageError
from lading.hooks.script import HOOK_NAME, HookEntry, updated_text, write_hook
from lading.stores import ObjectInfo, Store, StoreURI, parse_uri

_MD5_CHUNK = 1 << 20


@dataclass(frozen=True)
class FixItem:
    """One path taken out of the upload: its files go to ``uri`` unless ``restore`` is False."""

    path: str
    is_dir: bool
    det_bytes: int
    files: tuple[tuple[str, int], ...]  # (upload path, raw size) of every file det would send
    uri: str
    restore: bool

    def to_json(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "path": self.path + ("/" if self.is_dir else ""),
            "det_bytes": self.det_bytes,
            "files": len(self.files),
            "bytes": sum(size for _, size in self.files),
            "uri": self.uri if self.restore else None,
            "restore": self.restore,
        }


@dataclass
class FixPlan:
    """What ``--fix`` would do, as data (what the dry run prints and ``--yes`` applies)."""

    context: Path
    bucket: str
    items: list[FixItem]
    detignore_lines: list[str]
    total_before: int
    total_after: int
    limit_bytes: int

    @property
    def fits_after(self) -> bool:
        """Whether det would accept the context once the plan is applied."""
        return self.total_after <= self.limit_bytes

    @property
    def upload_bytes(self) -> int:
        """Bytes to upload (before skipping what the bucket already has)."""
        return sum(size for item in self.items if item.restore for _, size in item.files)

    def hook_entries(self) -> list[HookEntry]:
        """One ``lading fetch`` per restored path, into the same relative place."""
        return [HookEntry(item.uri, item.path + ("/" if item.is_dir else "")) for item in self.items if item.restore]

    def to_json(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "context": str(self.context),
            "bucket": self.bucket,
            "items": [item.to_json() for item in self.items],
            "detignore": str(self.context / DETIGNORE),
            "detignore_lines": self.detignore_lines,
            "hook": str(self.context / HOOK_NAME),
            "hook_entries": [{"source": e.source, "dest": e.dest} for e in self.hook_entries()],
            "total_bytes_before": self.total_before,
            "total_bytes_after": self.total_after,
            "limit_bytes": self.limit_bytes,
            "fits_after": self.fits_after,
            "upload_bytes": self.upload_bytes,
        }


@dataclass
class FixResult:
    """What ``--yes`` did."""

    uploaded: int = 0
    uploaded_bytes: int = 0
    already_there: int = 0
    detignore_added: list[str] = field(default_factory=list)
    hook_changed: bool = False

    def to_json(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "uploaded": self.uploaded,
            "uploaded_bytes": self.uploaded_bytes,
            "already_there": self.already_there,
            "detignore_added": self.detignore_added,
            "hook_changed": self.hook_changed,
        }


def plan_fix(report: CheckReport, bucket: str) -> FixPlan:
    """Turn the check report's remedy into a fix plan. The context must be over the limit."""
    if len(report.roots) > 1:
        raise UsageError("--fix works on the context directory alone", "run it without -i/--include")
    base = parse_uri(bucket)
    if report.remedy is None:
        raise (
            ProblemFound("nothing to fix: the context fits")
            if report.fits
            else ProblemFound("no remedy was computed for this context")
        )
    items = [_item(report, path, det_bytes, base) for path, det_bytes in report.remedy.paths]
    lines = [detignore_line(item.path, item.is_dir) for item in items]
    return FixPlan(
        Path(report.roots[0].path),
        str(base),
        items,
        lines,
        report.total_bytes,
        report.remedy.total_after,
        report.limit_bytes,
    )


def _item(report: CheckReport, path: str, det_bytes: int, base: StoreURI) -> FixItem:
    is_dir = path in report.dirs
    walked = report.walked
    if is_dir:
        prefix = path + "/"
        files = tuple((f, s) for f, s in zip(walked.files, walked.sizes) if f.startswith(prefix))
    else:
        files = tuple((f, s) for f, s in zip(walked.files, walked.sizes) if f == path)
    restore = not (is_dir and (posixpath.basename(path).lower() in CACHE_DIRS or is_environment(report, path)))
    uri = str(StoreURI(base.scheme, base.bucket, base.join(path) + ("/" if is_dir else "")))
    return FixItem(path, is_dir, det_bytes, files, uri, restore)


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while chunk := handle.read(_MD5_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _matches(info: ObjectInfo, local: Path, size: int) -> bool:
    """True when the object has this size and (when the store knows it) this MD5."""
    return info.size == size and (info.md5 is None or info.md5 == _md5(local))


def _upload_one(store: Store, context: Path, rel: str, size: int, on_bytes: Callable[[int], None]) -> bool:
    """Upload one file unless already there; verify what the store reports. True when uploaded."""
    local = context.joinpath(*rel.split("/"))
    try:
        if _matches(store.stat(rel), local, size):
            return False
    except NotFound:
        pass
    if not _matches(store.upload(local, rel, on_bytes), local, size):  # upload returns the object's stat
        raise ProblemFound(
            f"{store.url}: {rel} does not match the local file after upload",
            "nothing in the context was changed; rerun to retry",
        )
    return True


def _check_prefixes(store: Store, plan: FixPlan) -> None:
    """Each uploaded directory prefix must hold exactly the files we put there."""
    for item in plan.items:
        if not (item.restore and item.is_dir):
            continue
        expected = {rel for rel, _ in item.files}
        extra = [info.key for info in store.list(item.path + "/") if info.key not in expected]
        if extra:
            raise ProblemFound(
                f"{item.uri} also holds {len(extra)} object(s) that are not in the context "
                f"(e.g. {extra[0]}); the hook would download them too",
                "use a fresh --bucket prefix; nothing in the context was changed",
            )


def apply_fix(
    plan: FixPlan, store: Store, on_bytes: Callable[[int], None] = lambda n: None, workers: int = 8
) -> FixResult:
    """Upload and verify everything, then edit ``.detignore`` and ``startup-hook.sh``."""
    if not plan.fits_after:
        raise ProblemFound(
            "even with these paths moved the context would still be over the limit",
            "nothing was changed; see `lading check` for what else is large",
        )
    result = FixResult()
    jobs = [(rel, size) for item in plan.items if item.restore for rel, size in item.files]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        outcomes = list(pool.map(lambda job: _upload_one(store, plan.context, job[0], job[1], on_bytes), jobs))
    for (rel, size), uploaded in zip(jobs, outcomes):
        if uploaded:
            result.uploaded += 1
            result.uploaded_bytes += size
        else:
            result.already_there += 1
    _check_prefixes(store, plan)
    result.detignore_added = _append_detignore(plan.context / DETIGNORE, plan.detignore_lines)
    result.hook_changed = _write_hook(plan)
    return result


def _append_detignore(path: Path, lines: list[str]) -> list[str]:
    """Append the lines not already present; atomically, keeping what the user wrote."""
    try:
        current = path.read_text()
    except FileNotFoundError:
        current = ""
    except OSError as err:
        raise LadingError(f"cannot read {path}: {err.strerror}") from None
    present = {line.strip() for line in current.splitlines()}
    new = [line for line in lines if line not in present]
    if not new:
        return []
    sep = "" if not current or current.endswith("\n") else "\n"
    header = "# moved to a bucket by `lading check --fix`; startup-hook.sh brings them back\n"
    write_hook(path, current + sep + header + "".join(line + "\n" for line in new), new_mode=0o644)
    return new


def _write_hook(plan: FixPlan) -> bool:
    path = plan.context / HOOK_NAME
    text = path.read_text() if path.exists() else None
    for entry in plan.hook_entries():
        text = updated_text(text, entry, str(path))
    return write_hook(path, text) if text is not None else False
