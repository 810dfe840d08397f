"""The documentation site against the code: it builds with ``mkdocs build --strict``, each command
page lists every option that command's ``--help`` shows, every public package has an API page,
and that page has a section (an anchor) for every name of the package's ``__all__``."""

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
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def page_text(site: Path, page: str) -> str:
    """A built page's text, tags removed and entities decoded."""
    raw = (site / page / "index.html").read_text()
    return html.unescape(re.sub(r"<[^>]+>", "", raw))


def command_paths() -> list[list[str]]:
    """Every command and subcommand, as a path below ``lading``."""
    return [
        docs_reference.command_path(ctx)
        for name in docs_reference.top_level_names()
        for ctx in docs_reference.walk([name])
    ]


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


def test_the_site_loads_nothing_from_the_network(site: Path) -> None:
    """An offline build is the whole site: no script or stylesheet from a CDN (highlight.js was)."""
    remote = re.compile(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"')
    found = {url for page in site.rglob("*.html") for url in remote.findall(page.read_text())}
    assert not found, sorted(found)


def api_pages() -> dict[str, str]:
    """Each module with an API page (``<!-- lading-api: MODULE -->``) -> the page's name."""
    pages = {}
    for page in sorted((REPO / "docs" / "api").glob("*.md")):
        for module in re.findall(r"<!-- lading-api: ([\w.]+) -->", page.read_text()):
            pages[module] = page.stem
    return pages


def test_every_public_package_has_an_api_page() -> None:
    """Public: the packages whose names the README and the guides import (and which say, in
    ``__all__``, what they export), and the top-level packages with an ``__all__`` except those
    only the command line uses."""
    prose = [REPO / "README.md", *(p for p in (REPO / "docs").rglob("*.md") if p.parent.name != "api")]
    imported = {m for path in prose for m in re.findall(r"(?:from|import) (lading(?:\.\w+)*)", path.read_text())}
    top = {f"lading.{p.parent.name}" for p in docs_reference.SOURCE.glob("*/__init__.py")}
    public = set()
    for module in (imported | top) - INTERNAL:
        try:
            docs_reference.public_names(module)
        except (KeyError, FileNotFoundError):
            continue  # no __all__: an internal module a page reaches into (named in its prose)
        public.add(module)
    assert public - set(api_pages()) == set(), "public packages without an API page"


#: Top-level packages with an ``__all__`` that only the command line uses (their names are not API).
INTERNAL = {"lading.sync", "lading.transfer"}


@pytest.mark.parametrize("module", sorted(api_pages()))
def test_api_page_has_a_section_for_every_public_name(site: Path, module: str) -> None:
    raw = (site / "api" / api_pages()[module] / "index.html").read_text()
    names = docs_reference.public_names(module)
    package = importlib.import_module(module) if module != "lading.pack.ray" else None
    if package is not None:
        assert sorted(package.__all__) == sorted(names)
    missing = sorted(name for name in names if f'id="{docs_reference.definition(module, name)}"' not in raw)
    assert not missing, f"api/{api_pages()[module]} has no section for {missing}"
