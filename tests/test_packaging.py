"""The package layout: pyproject names every package folder, and no two modules import each other
(directly or through others), lazily or not."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
#: Repository folder -> import name (pyproject's package-dir).
ROOTS = {"staging": "lading", "cli": "lading.cli", "mounts": "lading.mounts"}


def package_folders() -> dict[str, Path]:
    """Import name -> folder, for every folder with an __init__.py under the three roots."""
    found = {}
    for folder, name in ROOTS.items():
        for init in (TOP / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(TOP / folder).parts
            found[".".join((name, *relative))] = init.parent
    return found


def module_files() -> dict[str, Path]:
    modules = {}
    for package, folder in package_folders().items():
        for path in folder.glob("*.py"):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def imports_of(path: Path, module: str, known: set[str]) -> set[str]:
    """Every lading module ``path`` imports anywhere (inside functions too)."""
    package = module if path.stem == "__init__" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def test_pyproject_lists_every_package():
    config = tomllib.loads((TOP / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert sorted(config["packages"]) == sorted(package_folders())
    assert config["package-dir"] == {name: folder for folder, name in ROOTS.items()}


def test_no_import_cycles():
    modules = module_files()
    graph = {name: imports_of(path, name, set(modules)) for name, path in modules.items()}
    # A package's __init__ re-exporting its own modules is not a cycle of the layout: drop edges
    # from a module to the packages that contain it.
    for name, targets in graph.items():
        targets -= {target for target in targets if name.startswith(target + ".")}
    cycles = _strongly_connected(graph)
    assert not cycles, f"import cycles: {cycles}"


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components
