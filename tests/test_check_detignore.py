"""det's .detignore rules over generated trees: what is uploaded, exactly as det 0.38 decides."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import pathspec
import pytest
from lading.context import check_context
from lading.context.detignore import DEFAULT_DETIGNORE, IgnoreSpec, compile_rules
from lading.core.errors import UsageError


def make_tree(root: Path, files: dict[str, bytes | str], detignore: str | bytes | None = None) -> Path:
    """Create ``files`` (relative path -> content; a path ending in "/" is an empty directory)."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = root / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    if detignore is not None:
        data = detignore.encode() if isinstance(detignore, str) else detignore
        (root / ".detignore").write_bytes(data)
    return root


def uploaded(root: Path, includes: tuple[str, ...] = ()) -> set[str]:
    report = check_context(str(root), [str(i) for i in includes], remedies=False)
    return set(report.walked.files)


def test_default_ignores_apply_without_a_detignore(tmp_path):
    root = make_tree(
        tmp_path / "ctx",
        {
            "model.py": "x",
            "__pycache__/model.cpython-311.pyc": "x",
            "pkg/__pycache__/a.pyc": "x",
            "stale.pyc": "x",
            "stale.pyo": "x",
            "Foo$py.class": "x",
            ".git/config": "x",
            ".vscode/settings.json": "x",
            ".idea/ws.xml": "x",
            ".mypy_cache/x.json": "x",
            "terraform/main.tf": "x",
            "terraform_data/s": "x",
            "terraform.tfstate.backup": "x",
            "terraform.tfvars.json": "x",
            ".terraform.lock.hcl": "x",
            "shared_fs/big": "x",
            "deep/shared_fs/kept": "x",
            "gitlike/.gitkeep": "x",
        },
    )
    assert uploaded(root) == {"model.py", "deep/shared_fs/kept", "gitlike/.gitkeep"}


def test_hidden_files_are_uploaded_unless_a_pattern_matches(tmp_path):
    root = make_tree(tmp_path / "ctx", {".env.local": "x", ".hidden/a": "x", "b": "x"})
    assert uploaded(root) == {".env.local", ".hidden/a", "b"}
    (root / ".detignore").write_text(".*\n")
    assert uploaded(root) == {"b"}


def test_negation_reincludes_a_file(tmp_path):
    root = make_tree(
        tmp_path / "ctx",
        {"a.log": "x", "keep.log": "x", "sub/keep.log": "x", "sub/b.log": "x"},
        detignore="*.log\n!keep.log\n",
    )
    assert uploaded(root) == {"keep.log", "sub/keep.log"}


def test_negation_cannot_reach_into_a_pruned_directory(tmp_path):
    root = make_tree(
        tmp_path / "ctx", {"logs/keep.txt": "x", "logs/other.txt": "x", "a": "x"}, detignore="logs/\n!logs/keep.txt\n"
    )
    assert uploaded(root) == {"a"}


def test_the_last_matching_pattern_wins(tmp_path):
    root = make_tree(tmp_path / "ctx", {"x.py": "x", "y.py": "x"}, detignore="!x.py\n*.py\n")
    assert uploaded(root) == set()
    (root / ".detignore").write_text("*.py\n!x.py\n")
    assert uploaded(root) == {"x.py"}


def test_anchored_patterns_match_from_the_root_only(tmp_path):
    root = make_tree(
        tmp_path / "ctx",
        {"data/a": "x", "sub/data/b": "x", "a/b": "x", "z/a/b": "x", "b": "x"},
        detignore="/data\na/b\n",
    )
    # "/data" and "a/b" (a slash in the middle) are anchored; "sub/data" and "z/a/b" stay
    assert uploaded(root) == {"sub/data/b", "z/a/b", "b"}


def test_unanchored_name_matches_at_any_depth(tmp_path):
    root = make_tree(tmp_path / "ctx", {"cache/a": "x", "x/cache/b": "x", "x/cached": "x"}, detignore="cache\n")
    assert uploaded(root) == {"x/cached"}


def test_directory_only_pattern_ignores_directories_not_files(tmp_path):
    root = make_tree(
        tmp_path / "ctx",
        {"build/out.o": "x", "src/build": "file named build", "src/build2/x": "x"},
        detignore="build/\n",
    )
    assert uploaded(root) == {"src/build", "src/build2/x"}
    report = check_context(str(root), remedies=False)
    assert "build" not in report.walked.dirs and "src/build2" in report.walked.dirs


def test_double_star_patterns(tmp_path):
    root = make_tree(
        tmp_path / "ctx",
        {
            "deep/x": "x",
            "a/deep/y/z": "x",
            "a/b": "x",
            "a/1/2/b": "x",
            "a/c": "x",
            "logs/1/2/t.txt": "x",
            "logs/t.txt": "x",
            "logs/t.csv": "x",
        },
        detignore="**/deep/**\na/**/b\nlogs/**/*.txt\n",
    )
    assert uploaded(root) == {"a/c", "logs/t.csv"}


def test_comments_blank_lines_and_escapes(tmp_path):
    root = make_tree(
        tmp_path / "ctx",
        {
            "#hash": "x",
            "!bang": "x",
            "# comment": "x",
            "star*": "x",
            "starX": "x",
            "q?": "x",
            "qq": "x",
            "keep": "x",
        },
        detignore="# comment\n\n   \n\\#hash\n\\!bang\nstar\\*\nq\\?\n",
    )
    assert uploaded(root) == {"# comment", "starX", "qq", "keep"}


@pytest.mark.parametrize("newline", ["\r\n", "\r", "\n"])
def test_line_endings_crlf_and_cr_like_lf(tmp_path, newline):
    root = make_tree(
        tmp_path / "ctx",
        {"a.log": "x", "b/c": "x", "keep": "x", "d": "x"},
        detignore=newline.join(["*.log", "b/", "d"]) + newline,
    )
    assert uploaded(root) == {"keep"}


def test_nested_detignore_is_ignored_and_never_uploaded(tmp_path):
    root = make_tree(tmp_path / "ctx", {"sub/.detignore": "*.bin\n", "sub/w.bin": "x", "a.bin": "x"}, detignore="")
    report = check_context(str(root), remedies=False)
    assert set(report.walked.files) == {"sub/w.bin", "a.bin"}
    assert [(w.kind, w.path) for w in report.warnings] == [("nested_detignore", "sub/.detignore")]


def test_root_detignore_is_not_uploaded_but_can_be_explained(tmp_path):
    root = make_tree(tmp_path / "ctx", {"a": "x"}, detignore="!.detignore\n")
    assert uploaded(root) == {"a"}


def test_invalid_pattern_is_a_usage_error_naming_the_line(tmp_path):
    root = make_tree(tmp_path / "ctx", {"a": "x"}, detignore="ok\nbad\\\n")
    with pytest.raises(UsageError, match=r"\.detignore line 2"):
        check_context(str(root))


def test_detignore_that_is_a_directory_is_not_read(tmp_path):
    root = make_tree(tmp_path / "ctx", {".detignore/x": "y", "a": "x"})
    assert uploaded(root) == {".detignore/x", "a"}


def test_rules_remember_file_and_line(tmp_path):
    rules = compile_rules(["# c\n", "*.log\n", "\n", "!keep.log\n"], "/ctx/.detignore")
    assert [(r.line, r.text, r.ignores) for r in rules] == [(2, "*.log", True), (4, "!keep.log", False)]


PATTERNS = [
    "*.log",
    "!keep.log",
    "/data",
    "data/",
    "build/",
    "**/deep/**",
    "a/**/b",
    "logs/*.txt",
    "\\#x",
    "foo",
    "!Foo",
    "*.py",
    "!x.py",
    "b/",
    "/a/b",
    "**/logs",
    "[Bb]uild",
    "q\\?",
    "!*/",
    "*",
    "!*.py",
    ".*",
    "x.py[co]",
    "data/**",
    "!data/keep/",
    "*/",
    "**",
    "a?c",
    "!a/x.py",
]
SEGMENTS = [
    "a",
    "b",
    "data",
    "logs",
    "x.py",
    "x.pyc",
    "foo",
    "Foo",
    "#x",
    "keep.log",
    "Build",
    "deep",
    "q?",
    "abc",
    "t.txt",
    ".h",
    "__pycache__",
    "terraform",
]


def test_merged_matcher_agrees_with_pathspec_on_random_specs():
    """The fast path (one merged regex) must decide exactly as pathspec's PathSpec does."""
    rng = random.Random(1234)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for _ in range(150):
            lines = list(DEFAULT_DETIGNORE) + rng.sample(PATTERNS, rng.randint(0, 6))
            reference = pathspec.PathSpec.from_lines(pathspec.patterns.GitWildMatchPattern, lines)
            spec = IgnoreSpec(compile_rules(lines, "test"))
            for _ in range(40):
                path = "/".join(rng.choice(SEGMENTS) for _ in range(rng.randint(1, 4)))
                path += rng.choice(["", "/"])
                assert spec.ignores(path) == reference.match_file(path), (lines, path)
                assert bool(spec.matcher()(path)) == reference.match_file(path), (lines, path)
