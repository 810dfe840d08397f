"""The documentation site against the code: it builds with ``mkdocs build --strict``, each command
page lists every option that command's ``--help`` shows, and the API pages name every public name
of lading.datasets, lading.datalayer, lading.stores and lading.context."""

from __future__ import annotations

import html
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_lading

sys.path.insert(0, str(REPO / "tools"))

import docs_reference  # noqa: E402

OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
API_MODULES = ("datasets", "datalayer", "stores", "context")


def mkdocs_or_skip() -> None:
    """CI installs the docs extra and must run these tests; elsewhere they skip without mkdocs."""
    try:
        importlib.import_module("mkdocs")
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once, strictly (a warning fails the build)."""
    mkdocs_or_skip()
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def page_text(site: Path, page: str) -> str:
    """A built page's text, tags removed and entities decoded."""
    raw = (site / page / "index.html").read_text()
    return html.unescape(re.sub(r"<[^>]+>", "", raw))


def command_paths() -> list[list[str]]:
    """Every command and subcommand, as a path below ``lading``."""
    return [docs_reference.command_path(ctx) for name in docs_reference.top_level_names()
            for ctx in docs_reference.walk([name])]


def help_options(path: list[str]) -> set[str]:
    """The options ``lading PATH --help`` lists in its Options section, from the real CLI."""
    result = run_lading(*path, "--help")
    assert result.returncode == 0, result.stderr
    options = result.stdout.split("\nOptions:", 1)[1] if "\nOptions:" in result.stdout else ""
    options = options.split("\nCommands:", 1)[0]
    found = set()
    for line in options.splitlines():
        head = line.strip().split("  ", 1)[0]  # the option column, before its help
        if head.startswith("-"):
            found |= set(OPTION.findall(head))
    return found


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p))
def test_command_page_lists_every_option(site: Path, path: list[str]) -> None:
    text = page_text(site, f"commands/{path[0]}")
    title = " ".join(["lading", *path])
    assert title in text, f"the page of {path[0]} has no section for '{title}'"
    options = help_options(path)
    assert "--help" in options
    missing = sorted(option for option in options if option not in text)
    assert not missing, f"commands/{path[0]} lacks options of '{title} --help': {missing}"


def test_every_command_has_a_page() -> None:
    for name in docs_reference.top_level_names():
        page = REPO / "docs" / "commands" / f"{name}.md"
        assert page.exists(), f"no page for lading {name}"
        assert docs_reference.MARKER.format(name=name) in page.read_text()


def test_reference_is_generated_from_click() -> None:
    """A new option appears in the rendered reference without anyone writing it down."""
    import click

    ctx = docs_reference.context_for(["sync"])
    ctx.command.params.append(click.Option(["--a-brand-new-flag"], is_flag=True, help="New."))
    try:
        assert "--a-brand-new-flag" in docs_reference.render_command(ctx, 3)
    finally:
        ctx.command.params.pop()


@pytest.mark.parametrize("module", API_MODULES)
def test_api_page_names_every_public_name(site: Path, module: str) -> None:
    package = importlib.import_module(f"lading.{module}")
    names = getattr(package, "__all__", None) or [n for n in vars(package) if not n.startswith("_")]
    text = page_text(site, f"api/{module}")
    missing = sorted(name for name in names if name not in text)
    assert not missing, f"api/{module} lacks {missing}"
