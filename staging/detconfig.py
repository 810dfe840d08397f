"""Experiment-config ``bind_mounts``: det's schema, plus "does the host path exist here?".

det's schema (``schemas/expconf/v0/bind-mount.json`` in determined 0.38), per entry:
``host_path`` (required string, absolute), ``container_path`` (required string, not ``.``),
``read_only`` (boolean or null, default false), ``propagation`` (string or null, default
``rprivate``); no other keys. det leaves ``propagation`` to the container runtime, which
accepts only ``private``, ``rprivate``, ``shared``, ``rshared``, ``slave`` and ``rslave``, so a
different value passes ``det experiment create`` and then fails the container: we flag it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import yaml

from staging.errors import NotFound, UsageError

PROPAGATIONS = ("private", "rprivate", "shared", "rshared", "slave", "rslave")
_KEYS = ("host_path", "container_path", "read_only", "propagation")


@dataclass(frozen=True)
class MountProblem:
    """One thing wrong with ``bind_mounts[index]``; ``schema`` is False for checks beyond det's."""

    index: int
    field: str
    message: str
    schema: bool = True

    def to_json(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"index": self.index, "field": self.field, "message": self.message, "det_schema": self.schema}


def load_config(path: Path) -> Mapping[str, object]:
    """Read an experiment config (YAML); a missing file is NotFound, bad YAML a UsageError."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise NotFound(f"config file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read {str(path)!r}: {err}") from None
    return parse_config(text, str(path))


def parse_config(text: str, origin: str) -> Mapping[str, object]:
    """Parse YAML (or JSON) text into a mapping, or raise UsageError naming the line."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{origin}{where}: not valid YAML: {getattr(err, 'problem', None) or err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{origin}: an experiment config must be a mapping, got {type(data).__name__}")
    return data


def bind_mounts(config: Mapping[str, object]) -> list[object]:
    """The raw ``bind_mounts`` entries (an absent or null section is empty)."""
    value = config.get("bind_mounts")
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def validate_bind_mounts(config: Mapping[str, object],
                         exists: Callable[[str], bool] | None = None) -> list[MountProblem]:
    """det's schema checks for every entry, plus host-path existence when ``exists`` is given."""
    raw = config.get("bind_mounts")
    if raw is not None and not isinstance(raw, list):
        return [MountProblem(-1, "bind_mounts", f"must be a list of mounts, got {type(raw).__name__}")]
    problems: list[MountProblem] = []
    for index, entry in enumerate(raw or []):
        problems.extend(_entry_problems(index, entry, exists))
    return problems


def _entry_problems(index: int, entry: object, exists: Callable[[str], bool] | None) -> list[MountProblem]:
    if not isinstance(entry, Mapping):
        return [MountProblem(index, "", f"must be a mapping with host_path and container_path, got {entry!r}")]
    out = [MountProblem(index, str(key), f"unknown key {key!r} (det allows {', '.join(_KEYS)})")
           for key in entry if key not in _KEYS]
    host, container = entry.get("host_path"), entry.get("container_path")
    for name, value in (("host_path", host), ("container_path", container)):
        if value is None:
            out.append(MountProblem(index, name, f"{name} is required"))
        elif not isinstance(value, str):
            out.append(MountProblem(index, name, f"{name} must be a string, got {value!r}"))
    if isinstance(host, str) and not host.startswith("/"):
        out.append(MountProblem(index, "host_path", f"host_path must be an absolute path, got {host!r}"))
    if container == ".":
        out.append(MountProblem(index, "container_path", 'container_path must not be "."'))
    read_only = entry.get("read_only")
    if read_only is not None and not isinstance(read_only, bool):
        out.append(MountProblem(index, "read_only", f"read_only must be true or false, got {read_only!r}"))
    propagation = entry.get("propagation")
    if propagation is not None and not isinstance(propagation, str):
        out.append(MountProblem(index, "propagation", f"propagation must be a string, got {propagation!r}"))
    elif isinstance(propagation, str) and propagation not in PROPAGATIONS:
        out.append(MountProblem(index, "propagation",
                                f"propagation {propagation!r} is not one of {', '.join(PROPAGATIONS)}", schema=False))
    if exists is not None and isinstance(host, str) and host.startswith("/") and not exists(host):
        out.append(MountProblem(index, "host_path", f"host_path {host} does not exist on this machine", schema=False))
    return out


def suggest_bind_mount(path: str) -> dict[str, object]:
    """A read-only mount of ``path`` at the same path inside the container; it must exist."""
    absolute = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(absolute):
        raise NotFound(f"{absolute} does not exist on this machine", "bind mounts name a path on the agent host")
    return {"host_path": absolute, "container_path": absolute, "read_only": True}


def render_snippet(mounts: list[dict[str, object]]) -> str:
    """A ready-to-paste ``bind_mounts:`` YAML snippet."""
    return yaml.safe_dump({"bind_mounts": mounts}, sort_keys=False, default_flow_style=False)
