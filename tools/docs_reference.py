"""The command reference of the documentation site, generated from the click commands themselves.

Used two ways:

- as a mkdocs hook (``hooks:`` in mkdocs.yml): a page line ``<!-- lading-reference: sync -->`` is
  replaced by the reference of ``lading sync`` and its subcommands: usage, the help text (with its
  examples and exit codes) as ``--help`` prints it, and a table of every option and argument;
  a command without a page carrying its marker fails the build;
- by tests/test_docs_reference.py, which compares the built pages with ``--help``.

It also generates the Python API pages: ``<!-- lading-api: lading.datasets -->`` becomes the
package's docstring and one mkdocstrings section per name in its ``__all__``, each at the module
that defines it (found by reading the source, not importing it: names loaded lazily through a
module ``__getattr__``, like ``lading.datasets.DataLoader``, and functions named like their
module, like ``lading.datalayer.cached``, are documented too).
"""

from __future__ import annotations

import ast
import html
from pathlib import Path
from typing import Iterator

import click

MARKER = "<!-- lading-reference: {name} -->"
API_MARKER = "<!-- lading-api: {module} -->"
WIDTH = 100
#: Where the ``lading`` package's source lives (``staging/`` is ``lading``).
SOURCE = Path(__file__).resolve().parent.parent / "staging"


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


# ------------------------------------------------------------------------------------- API pages


def module_file(module: str) -> Path:
    """The source file of ``lading.a.b``: ``staging/a/b.py`` or ``staging/a/b/__init__.py``."""
    parts = module.split(".")[1:]
    package = SOURCE.joinpath(*parts) / "__init__.py"
    return package if package.exists() else SOURCE.joinpath(*parts[:-1], parts[-1] + ".py") if parts else package


def _tree(module: str) -> ast.Module:
    return ast.parse(module_file(module).read_text())


def public_names(module: str) -> list[str]:
    """The names in ``module``'s ``__all__``, read from its source."""
    for node in _tree(module).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise KeyError(f"{module} has no __all__")


def _defines(tree: ast.Module, name: str) -> bool:
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return True
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(getattr(target, "id", None) == name for target in targets):
            return True
    return False


def _imported_from(tree: ast.Module, name: str) -> str | None:
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if any((alias.asname or alias.name) == name and alias.name == name for alias in node.names):
                return node.module
    return None


def definition(module: str, name: str) -> str:
    """Where ``module.name`` is defined: followed through ``from X import name``; a name the module
    does not import at its top (loaded on first use) is looked for in the modules below it."""
    tree = _tree(module)
    if _defines(tree, name):
        return f"{module}.{name}"
    origin = _imported_from(tree, name)
    if origin is not None and origin.startswith("lading."):
        return definition(origin, name)
    if module_file(module).name == "__init__.py":
        folder = module_file(module).parent
        for path in sorted(folder.rglob("*.py")):
            below = ".".join([module, *path.relative_to(folder).with_suffix("").parts])
            below = below.removesuffix(".__init__")
            if below != module and _defines(ast.parse(path.read_text()), name):
                return f"{below}.{name}"
    raise KeyError(f"cannot find where {module}.{name} is defined")


def render_api(module: str) -> str:
    """The API page body of ``module``: its docstring, then every name of ``__all__``."""
    out = [f"::: {module}", "    options:", "      members: false", ""]
    for name in public_names(module):
        out += [f"::: {definition(module, name)}", "    options:", "      show_root_heading: true", ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------- mkdocs hook


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 (mkdocs' objects)
    """Replace each ``<!-- lading-reference: NAME -->`` line with the generated reference, and
    each ``<!-- lading-api: MODULE -->`` line with the module's API sections."""
    lines = []
    for line in markdown.splitlines():
        stripped = line.strip()
        if stripped.startswith("<!-- lading-reference:") and stripped.endswith("-->"):
            name = stripped[len("<!-- lading-reference:") : -len("-->")].strip()
            lines.append(render(name))
        elif stripped.startswith("<!-- lading-api:") and stripped.endswith("-->"):
            lines.append(render_api(stripped[len("<!-- lading-api:") : -len("-->")].strip()))
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
            name, _, option = stripped[len("<!-- lading-include:") : -len("-->")].strip().partition(" ")
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
