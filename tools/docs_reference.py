"""The command reference of the documentation site, generated from the click commands themselves.

Used two ways:

- as a mkdocs hook (``hooks:`` in mkdocs.yml): a page line ``<!-- lading-reference: sync -->`` is
  replaced by the reference of ``lading sync`` and its subcommands: usage, the help text (with its
  examples and exit codes) as ``--help`` prints it, and a table of every option and argument;
  a command without a page carrying its marker fails the build;
- by tests/test_docs_reference.py, which compares the built pages with ``--help``.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Iterator

import click

MARKER = "<!-- lading-reference: {name} -->"
WIDTH = 100


def root_command() -> click.Group:
    """The ``lading`` group (its subcommands load on demand)."""
    from lading.cli.main import lading

    return lading


def top_level_names() -> list[str]:
    """Every subcommand of ``lading``, as ``lading --help`` lists them."""
    root = root_command()
    return root.list_commands(click.Context(root, info_name="lading"))


def context_for(path: list[str]) -> click.Context:
    """A click context for ``lading PATH...`` (parents included, so usage lines name the path)."""
    ctx = click.Context(root_command(), info_name="lading", terminal_width=WIDTH, max_content_width=WIDTH)
    for name in path:
        command = ctx.command.get_command(ctx, name)  # type: ignore[attr-defined]
        if command is None:
            raise KeyError(f"no command 'lading {' '.join(path)}'")
        ctx = click.Context(command, info_name=name, parent=ctx, terminal_width=WIDTH, max_content_width=WIDTH)
    return ctx


def walk(path: list[str]) -> Iterator[click.Context]:
    """The context of ``lading PATH`` and of each of its subcommands, depth first."""
    ctx = context_for(path)
    yield ctx
    if isinstance(ctx.command, click.Group):
        for name in ctx.command.list_commands(ctx):
            sub = ctx.command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from walk([*path, name])


def command_path(ctx: click.Context) -> list[str]:
    """``["sync"]`` for the context of ``lading sync``."""
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return names[::-1]


def visible_params(ctx: click.Context) -> list[click.Parameter]:
    """The parameters ``--help`` shows (arguments too), without hidden ones."""
    return [param for param in ctx.command.get_params(ctx) if not getattr(param, "hidden", False)]


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    text = html.escape(" ".join(text.split())).replace("|", "\\|")
    return text.replace("[", "&#91;").replace("]", "&#93;")  # never a Markdown link


def param_rows(ctx: click.Context) -> list[tuple[str, str]]:
    """(names, help with defaults) for each visible option and argument."""
    rows = []
    for param in visible_params(ctx):
        if isinstance(param, click.Argument):
            rows.append((param.make_metavar(ctx), "argument" + (" (required)" if param.required else "")))
            continue
        record = param.get_help_record(ctx)
        if record is not None:
            rows.append(record)
    return rows


def render_command(ctx: click.Context, level: int) -> str:
    """Markdown for one command: heading, ``--help`` as printed, and the option table."""
    path = command_path(ctx)
    title = " ".join(["lading", *path])
    out = [f"{'#' * level} `{title}`", "", "```text", ctx.command.get_help(ctx).rstrip(), "```", ""]
    rows = param_rows(ctx)
    if rows:
        out += ["| option | meaning |", "| --- | --- |"]
        out += [f"| <code>{cell(names)}</code> | {cell(text)} |" for names, text in rows]
        out.append("")
    return "\n".join(out)


def render(name: str, level: int = 3) -> str:
    """The reference of ``lading NAME`` and every subcommand below it."""
    parts = []
    for ctx in walk(name.split()):
        depth = len(command_path(ctx)) - len(name.split())
        parts.append(render_command(ctx, level + depth))
    return "\n".join(parts)


# ------------------------------------------------------------------------------------- mkdocs hook

def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 (mkdocs' objects)
    """Replace each ``<!-- lading-reference: NAME -->`` line with the generated reference."""
    lines = []
    for line in markdown.splitlines():
        stripped = line.strip()
        if stripped.startswith("<!-- lading-reference:") and stripped.endswith("-->"):
            name = stripped[len("<!-- lading-reference:"):-len("-->")].strip()
            lines.append(render(name))
        else:
            lines.append(line)
    return include("\n".join(lines) + "\n", Path(config["config_file_path"]).parent)


def on_pre_build(config) -> None:  # noqa: ANN001
    """Every top-level command has a page that carries its reference marker."""
    docs = Path(config["docs_dir"])
    text = "\n".join(page.read_text() for page in docs.rglob("*.md"))
    missing = [name for name in top_level_names() if MARKER.format(name=name) not in text]
    if missing:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"docs: no page carries the reference of: {', '.join(missing)}")


def include(markdown: str, root: Path) -> str:
    """Replace ``<!-- lading-include: PATH -->`` with the file at ``root/PATH``, headings one level down."""
    out = []
    for line in markdown.splitlines():
        stripped = line.strip()
        if stripped.startswith("<!-- lading-include:") and stripped.endswith("-->"):
            name, _, option = stripped[len("<!-- lading-include:"):-len("-->")].strip().partition(" ")
            text = (root / name).read_text()
            if name == "README.md":  # the README links into the site as docs/...; the site is docs/
                text = text.replace("](docs/", "](")
            fence = False
            for included in text.splitlines():
                if included.startswith("```"):
                    fence = not fence
                heading = included.startswith("#") and not fence and option != "keep-headings"
                out.append("#" + included if heading else included)
        else:
            out.append(line)
    return "\n".join(out) + "\n"
