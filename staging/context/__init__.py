"""``lading check``'s library: what ``det experiment create`` would upload, and whether it fits.

Typical use::

    report = check_context("model", includes=["../shared"], limit=parse_size("95MiB"))
    report.fits, report.total_bytes, report.remedy
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from lading.context.config import config_warnings, load_config
from lading.context.detignore import IgnoreSpec
from lading.context.explain import Explanation, explain, upload_name
from lading.context.report import CheckReport, DirStat, Remedy, directory_stats
from lading.context.sizes import DET_LIMIT_BYTES, det_size
from lading.core.sizes import format_size, parse_size
from lading.context.walk import WalkResult, resolve_roots, walk_roots
from lading.context.warnings import ContextWarning, content_warnings, nothing_uploaded_warning, walk_warnings

__all__ = [
    "CheckReport",
    "ContextWarning",
    "DET_LIMIT_BYTES",
    "DirStat",
    "Explanation",
    "Remedy",
    "check_context",
    "det_size",
    "format_size",
    "parse_size",
]


def check_context(
    context_dir: str,
    includes: Sequence[str] = (),
    *,
    limit: int = DET_LIMIT_BYTES,
    config_path: str | None = None,
    explain_path: str | None = None,
    remedies: bool = True,
    progress: Callable[[int], None] | None = None,
    fork: bool = False,
) -> CheckReport:
    """Walk the context (and includes) as det would, and build the report.

    Raises NotFound for a missing context, include or config; UsageError for a context that is
    a file, colliding include names, a bad .detignore pattern or a bad config; AccessDenied when
    the context cannot be listed. ``progress(files_so_far)`` is called after each directory.
    ``fork`` lets big trees be stat'ed with a forked helper process (the CLI's choice; a library
    caller's process is never forked unless it asks).
    """
    roots = resolve_roots(context_dir, includes)
    config = load_config(config_path) if config_path is not None else None
    specs = [IgnoreSpec([]) if root.is_file else IgnoreSpec.for_root(root.path) for root in roots]
    walked = walk_roots(roots, specs, progress, fork)
    dirs = directory_stats(walked)
    det_bytes = {path: stat.det_bytes for path, stat in dirs.items()}
    report = CheckReport(roots=roots, limit_bytes=limit, walked=walked, dirs=dirs)
    report.warnings = (
        walk_warnings(walked, roots) + content_warnings(walked, det_bytes) + nothing_uploaded_warning(walked, roots)
    )
    if config is not None and config_path is not None:
        report.warnings += config_warnings(config_path, config, roots, _uploaded_set(walked, config_path))
    if remedies and not report.fits:
        from lading.context.remedy import plan_remedy

        report.remedy = plan_remedy(report)
    if explain_path is not None:
        report.explanation = explain(roots, specs, upload_name(roots, explain_path))
    return report


def _uploaded_set(walked: WalkResult, config_path: str) -> set[str]:
    """Uploaded paths that end in the config's file name (all the config check needs)."""
    name = os.path.basename(config_path)
    return {path for path in walked.files if path.rpartition("/")[2] == name}
