"""det's ignore rules: its default patterns plus ``<root>/.detignore``, matched as det matches them.

det builds ``pathspec.PathSpec.from_lines(GitWildMatchPattern, DEFAULT_DETIGNORE + lines)`` and
asks ``match_file``: the last pattern that matches decides, ``!pattern`` re-includes. We compile
the very same pathspec patterns (so the translation to regexes is pathspec's, whatever its
version) and keep where each came from, to explain decisions. Matching is the hot path of a
walk, so the regexes are also merged into one alternation: a path that no ignoring pattern
matches (nearly every path) costs one regex call instead of one per pattern.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from lading.core.errors import AccessDenied, UsageError

#: determined.common.constants.DEFAULT_DETIGNORE (det 0.38), in order.
DEFAULT_DETIGNORE: tuple[str, ...] = (
    "__pycache__/",
    "*.py[co]",
    "*$py.class",
    "terraform",
    "terraform_data",
    "terraform.tfstate*",
    "terraform.tfvars*",
    ".terraform*",
    ".git/",
    ".vscode/",
    ".idea/",
    ".mypy_cache/",
    "/shared_fs",
)
DEFAULT_SOURCE = "det's default ignores"
DETIGNORE = ".detignore"

_ANY_DIR_PREFIX = "^(?:.+/)?"
_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


@dataclass(frozen=True)
class Rule:
    """One compiled pattern line and where it came from."""

    source: str
    line: int
    text: str
    ignores: bool  # False for a "!pattern" that re-includes
    regex: "re.Pattern[str]"

    def describe(self) -> str:
        """``'data/' (/ctx/.detignore line 3)``."""
        return f"{self.text!r} ({self.source} line {self.line})"


def _pattern_class() -> type:
    # det uses GitWildMatchPattern; pathspec >= 1.0 deprecates the name but keeps its semantics.
    import pathspec

    return pathspec.patterns.GitWildMatchPattern


def compile_rules(lines: Iterable[str], source: str, first_line: int = 1) -> list[Rule]:
    """Compile pattern lines exactly as det's ``PathSpec.from_lines`` does; blank lines and
    comments yield no rule. Raises UsageError naming the line for a pattern pathspec rejects."""
    pattern_class = _pattern_class()
    rules: list[Rule] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for number, line in enumerate(lines, start=first_line):
            if not line:
                continue
            try:
                pattern = pattern_class(line)
            except ValueError as err:
                text = line.rstrip("\r\n")
                raise UsageError(
                    f"{source} line {number}: invalid pattern {text!r}: {err}",
                    hint="det would refuse this .detignore too",
                ) from err
            if pattern.include is not None:
                rules.append(Rule(source, number, line.rstrip("\r\n"), pattern.include, pattern.regex))
    return rules


def read_detignore_lines(path: str) -> list[str]:
    """The lines of a .detignore as det reads them: text mode, universal newlines (so CRLF and
    lone CR end lines too), the locale's encoding, line endings kept."""
    try:
        with open(path, "r") as handle:
            return list(handle)
    except PermissionError as err:
        raise AccessDenied(f"cannot read {path}: permission denied") from err
    except UnicodeDecodeError as err:
        raise UsageError(f"cannot decode {path}: {err.reason}", hint="save it as UTF-8 text") from err


class IgnoreSpec:
    """The ordered rules for one root (det's defaults, then that root's .detignore)."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)
        self._has_negation = any(not rule.ignores for rule in self.rules)
        self._any_ignoring = _merge([rule.regex.pattern for rule in self.rules if rule.ignores])
        self._no_ignoring_rule = not any(rule.ignores for rule in self.rules)

    @classmethod
    def for_root(cls, root: str, extra_lines: Sequence[str] = ()) -> "IgnoreSpec":
        """det's spec for a resolved root directory: defaults + ``root/.detignore`` if it is a
        file (+ ``extra_lines``, used to try out remedies)."""
        rules = compile_rules(DEFAULT_DETIGNORE, DEFAULT_SOURCE)
        detignore = os.path.join(root, DETIGNORE)
        if os.path.isfile(detignore):
            rules += compile_rules(read_detignore_lines(detignore), detignore)
        if extra_lines:
            rules += compile_rules(extra_lines, "suggested lines")
        return cls(rules)

    def ignores(self, path: str) -> bool:
        """det's ``match_file(path)``: True when the path is ignored."""
        if self._no_ignoring_rule:
            return False
        if self._any_ignoring is not None:
            if self._any_ignoring.search(path) is None:
                return False
            if not self._has_negation:
                return True
        rule = self.deciding_rule(path)
        return rule is not None and rule.ignores

    def matcher(self) -> Callable[[str], object]:
        """``ignores`` as the cheapest callable with the same truthiness: the merged regex's
        ``search`` itself when no ``!pattern`` can re-include (the walk calls it per entry)."""
        if self._any_ignoring is not None and not self._has_negation:
            return self._any_ignoring.search
        return self.ignores

    def ignores_dir(self, rel: str) -> bool:
        """det tests a directory both as ``rel`` and as ``rel/``."""
        return self.ignores(rel) or self.ignores(rel + "/")

    def deciding_rule(self, path: str) -> Rule | None:
        """The last rule that matches ``path`` (it decides), or None when none matches."""
        for rule in reversed(self.rules):
            if rule.regex.search(path) is not None:
                return rule
        return None


def _merge(sources: list[str]) -> "re.Pattern[str] | None":
    """One regex that matches where any of ``sources`` matches (searched, as pathspec does),
    or None when there is nothing to merge or merging fails.

    Named groups are made anonymous (their names repeat across patterns) and the common
    ``^(?:.+/)?`` prefix of unanchored patterns is factored out so the engine scans the
    directory prefixes once, not once per pattern.
    """
    if not sources:
        return None
    sources = [_NAMED_GROUP.sub("(?:", source) for source in sources]
    tails = [s[len(_ANY_DIR_PREFIX) :] for s in sources if s.startswith(_ANY_DIR_PREFIX)]
    others = [s for s in sources if not s.startswith(_ANY_DIR_PREFIX)]
    parts = [f"(?:{s})" for s in others]
    if tails:
        parts.insert(0, _ANY_DIR_PREFIX + "(?:" + "|".join(f"(?:{t})" for t in tails) + ")")
    try:
        return re.compile("|".join(parts))
    except re.error:  # an exotic pattern that does not merge: match rule by rule instead
        return None
