"""``--explain PATH``: is this path uploaded, and which pattern in which file decided it."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any, Sequence

from lading.context.detignore import DETIGNORE, IgnoreSpec, Rule
from lading.context.walk import Root
from lading.core.errors import UsageError


@dataclass(frozen=True)
class Explanation:
    """The decision for one path, with the rule that made it (None when no pattern matched)."""

    path: str  # as det names it in the upload
    uploaded: bool
    kind: str  # "file", "directory", "missing"
    reason: str
    rule: Rule | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        rule = None
        if self.rule is not None:
            rule = {
                "pattern": self.rule.text,
                "source": self.rule.source,
                "line": self.rule.line,
                "negated": not self.rule.ignores,
            }
        return {"path": self.path, "uploaded": self.uploaded, "kind": self.kind, "reason": self.reason, "rule": rule}


def upload_name(roots: Sequence[Root], given: str) -> str:
    """Map what the user typed to det's name for it: an absolute path or a path relative to the
    current directory that lies inside a root, else a name relative to the context as det writes
    it (``data/x.bin``, ``<include>/x``)."""
    context = roots[0]
    cleaned = given.replace(os.sep, "/").strip("/") if not os.path.isabs(given) else given
    if not os.path.isabs(given) and (
        os.path.lexists(os.path.join(context.path, cleaned)) or cleaned.split("/")[0] in {r.name for r in roots[1:]}
    ):
        return os.path.normpath(cleaned).replace(os.sep, "/")
    inside = name_in_roots(given, roots)
    if inside is not None:
        return inside
    if os.path.isabs(given):
        raise UsageError(f"--explain path '{given}' is outside the context and the includes")
    return os.path.normpath(cleaned).replace(os.sep, "/")


def name_in_roots(path: str, roots: Sequence[Root]) -> str | None:
    """det's upload name for a local ``path`` inside one of ``roots`` (None when outside them).

    Links in the last component are not followed: det uploads a link by its own name."""
    absolute = os.path.abspath(path)
    absolute = os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute))
    for root in roots:
        if absolute == root.path:
            return root.name or "."
        if absolute.startswith(root.path.rstrip("/") + "/"):
            return root.prefix + os.path.relpath(absolute, root.path).replace(os.sep, "/")
    return None


def explain(roots: Sequence[Root], specs: Sequence[IgnoreSpec], name: str) -> Explanation:
    """Decide ``name`` (det's upload path) the way det's walk would reach it."""
    if name in (".", ""):
        return Explanation(".", True, "directory", "the context directory itself")
    root, spec, rel = _locate(roots, specs, name)
    if root.name and not rel:
        kind = "file" if root.is_file else "directory"
        return Explanation(name, True, kind, f"added with -i/--include {root.given}")
    parts = rel.split("/")
    for depth in range(1, len(parts)):
        ancestor = "/".join(parts[:depth])
        full = os.path.join(root.path, ancestor)
        blocked = _directory_decision(spec, ancestor)
        if blocked is not None:
            return Explanation(
                name,
                False,
                _kind(os.path.join(root.path, rel)),
                f"its directory '{root.prefix}{ancestor}/' is ignored by {blocked.describe()}",
                blocked,
            )
        if os.path.islink(full) and os.path.isdir(full):
            return Explanation(
                name,
                False,
                _kind(os.path.join(root.path, rel)),
                f"'{root.prefix}{ancestor}' is a symlink to a directory: det uploads it empty and never looks inside",
            )
    return _decide_leaf(spec, name, rel, os.path.join(root.path, rel))


def _decide_leaf(spec: IgnoreSpec, name: str, rel: str, full: str) -> Explanation:
    kind = _kind(full)
    if kind == "directory":
        blocked = _directory_decision(spec, rel)
        if blocked is not None:
            return Explanation(name, False, kind, f"ignored by {blocked.describe()}", blocked)
        rule = spec.deciding_rule(rel + "/") or spec.deciding_rule(rel)
        suffix = " (a symlink: uploaded as an empty directory)" if os.path.islink(full) else ""
        return Explanation(name, True, kind, _kept_reason(rule) + suffix, rule)
    if os.path.basename(rel) == DETIGNORE:
        return Explanation(name, False, kind, "det never uploads .detignore files")
    rule = spec.deciding_rule(rel)
    if rule is not None and rule.ignores:
        return Explanation(name, False, kind, f"ignored by {rule.describe()}", rule)
    if kind == "missing":
        what = "broken symlink: det skips it" if os.path.islink(full) else "does not exist"
        return Explanation(name, False, kind, f"{what}; {_kept_reason(rule)}", rule)
    if not os.access(full, os.R_OK):
        return Explanation(name, False, kind, "not readable: det skips it", rule)
    return Explanation(name, True, kind, _kept_reason(rule), rule)


def _directory_decision(spec: IgnoreSpec, rel: str) -> Rule | None:
    """The rule that prunes a directory (tested as ``rel``, then ``rel/``), or None."""
    for candidate in (rel, rel + "/"):
        rule = spec.deciding_rule(candidate)
        if rule is not None and rule.ignores:
            return rule
    return None


def _kept_reason(rule: Rule | None) -> str:
    if rule is None:
        return "no pattern matches it"
    return f"re-included by {rule.describe()}"


def _kind(full: str) -> str:
    try:
        mode = os.stat(full).st_mode
    except OSError:
        return "missing"
    return "directory" if stat.S_ISDIR(mode) else "file"


def _locate(roots: Sequence[Root], specs: Sequence[IgnoreSpec], name: str) -> tuple[Root, IgnoreSpec, str]:
    top, _, rest = name.partition("/")
    for root, spec in zip(roots[1:], specs[1:]):
        if root.name == top:
            return root, spec, rest
    return roots[0], specs[0], name
