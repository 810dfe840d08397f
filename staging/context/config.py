"""``--config const.yaml``: experiment-config problems that show up at submit time."""

from __future__ import annotations

from typing import Any, Sequence

from lading.context.explain import name_in_roots
from lading.context.walk import Root
from lading.context.warnings import ContextWarning
from lading.core.errors import AccessDenied, LadingError, NotFound, UsageError

#: det's expconf schema for one bind mount (schemas/expconf/v0/bind-mount.json).
_BIND_MOUNT_KEYS = {"host_path", "container_path", "read_only", "propagation"}


def load_config(path: str) -> dict[str, Any]:
    """Read an experiment config (YAML) into a mapping; NotFound/AccessDenied/UsageError on failure."""
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError as err:
        raise NotFound(f"config file '{path}' does not exist") from err
    except PermissionError as err:
        raise AccessDenied(f"cannot read config file '{path}': permission denied") from err
    except IsADirectoryError as err:
        raise UsageError(f"config '{path}' is a directory, not a YAML file") from err
    except OSError as err:
        raise LadingError(f"cannot read config file '{path}': {err.strerror or err}") from err
    return parse_config(text, f"config '{path}'")


def parse_config(text: str, origin: str) -> dict[str, Any]:
    """Parse an experiment config's text (YAML, or JSON as in ``DET_EXPERIMENT_CONFIG``)."""
    import yaml

    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise UsageError(f"{origin}{line} is not valid YAML: {getattr(err, 'problem', None) or err}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise UsageError(f"{origin} must be a mapping of settings, not {type(document).__name__}")
    return document


def config_warnings(
    path: str, config: dict[str, Any], roots: Sequence[Root], uploaded: set[str]
) -> list[ContextWarning]:
    """Warn when the config itself is uploaded and when ``bind_mounts`` breaks det's schema."""
    found = []
    name = name_in_roots(path, roots)
    if name is not None and name in uploaded:
        found.append(
            ContextWarning(
                "config_in_context",
                name,
                "the experiment config is inside the context, so it is uploaded "
                f"too; add '/{name}' to .detignore if that is not intended",
            )
        )
    found += [
        ContextWarning("bind_mounts", "bind_mounts", problem)
        for problem in bind_mount_problems(config.get("bind_mounts"))
    ]
    return found


def bind_mount_problems(value: Any) -> list[str]:
    """What det's schema would reject in a ``bind_mounts`` value (None is allowed)."""
    if value is None:
        return []
    if not isinstance(value, list):
        return [f"bind_mounts must be a list of mounts, not {type(value).__name__}"]
    problems = []
    for index, mount in enumerate(value):
        where = f"bind_mounts[{index}]"
        if not isinstance(mount, dict):
            problems.append(f"{where} must be a mapping with host_path and container_path")
            continue
        problems += [f"{where}: unknown key '{key}'" for key in sorted(set(mount) - _BIND_MOUNT_KEYS, key=str)]
        problems += [f"{where}: {key} is required" for key in ("host_path", "container_path") if key not in mount]
        host, container = mount.get("host_path"), mount.get("container_path")
        for key, item in (("host_path", host), ("container_path", container)):
            if key in mount and not isinstance(item, str):
                problems.append(f"{where}: {key} must be a string")
        if isinstance(host, str) and not host.startswith("/"):
            problems.append(f"{where}: host_path must be an absolute path (got {host!r})")
        if container == ".":
            problems.append(f'{where}: container_path must not be "."')
        if mount.get("read_only") is not None and not isinstance(mount.get("read_only"), bool):
            problems.append(f"{where}: read_only must be true or false")
        if mount.get("propagation") is not None and not isinstance(mount.get("propagation"), str):
            problems.append(f"{where}: propagation must be a string")
    return problems
