"""Experiment-config ``bind_mounts`` for ``lading bind-mounts``: det's schema (the check from
:mod:`lading.context.config`, shared with ``lading check --config``), plus what det leaves to
the agent: valid propagation values, and "does the host path exist here?".

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
from typing import Callable, Mapping

import yaml
from lading.context import config as context_config

PROPAGATIONS = ("private", "rprivate", "shared", "rshared", "slave", "rslave")


@dataclass(frozen=True)
class MountProblem:
    """One thing wrong with ``bind_mounts``; ``det_schema`` is False for checks beyond det's."""

    message: str
    det_schema: bool = True

    def to_json(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"message": self.message, "det_schema": self.det_schema}


def validate_bind_mounts(
    config: Mapping[str, object], exists: Callable[[str], bool] | None = None
) -> list[MountProblem]:
    """det's schema checks (shared with ``lading check --config``), the runtime's propagation
    values, and, when ``exists`` is given, whether each host path exists."""
    raw = config.get("bind_mounts")
    problems = [MountProblem(text) for text in context_config.bind_mount_problems(raw)]
    for index, entry in enumerate(raw if isinstance(raw, list) else []):
        if isinstance(entry, Mapping):
            problems.extend(_beyond_det(index, entry, exists))
    return problems


def _beyond_det(index: int, entry: Mapping, exists: Callable[[str], bool] | None) -> list[MountProblem]:
    found = []
    propagation, host = entry.get("propagation"), entry.get("host_path")
    if isinstance(propagation, str) and propagation not in PROPAGATIONS:
        found.append(
            MountProblem(
                f"bind_mounts[{index}]: propagation {propagation!r} is not one of "
                f"{', '.join(PROPAGATIONS)} (det accepts it, the container runtime won't)",
                det_schema=False,
            )
        )
    if exists is not None and isinstance(host, str) and host.startswith("/") and not exists(host):
        found.append(
            MountProblem(f"bind_mounts[{index}]: host_path {host} does not exist on this machine", det_schema=False)
        )
    return found


def suggest_bind_mount(path: str) -> dict[str, object]:
    """A read-only mount of ``path`` at the same path inside the container.

    ``path`` names a directory on the agent hosts, which need not exist where this runs (a
    laptop): the caller may warn about it with :func:`missing_here`.
    """
    absolute = os.path.abspath(os.path.expanduser(path))
    return {"host_path": absolute, "container_path": absolute, "read_only": True}


def missing_here(mounts: list[dict[str, object]], exists: Callable[[str], bool] = os.path.exists) -> list[str]:
    """The host paths of ``mounts`` that do not exist on this machine."""
    return [str(mount["host_path"]) for mount in mounts if not exists(str(mount["host_path"]))]


def render_snippet(mounts: list[dict[str, object]]) -> str:
    """A ready-to-paste ``bind_mounts:`` YAML snippet."""
    return yaml.safe_dump({"bind_mounts": mounts}, sort_keys=False, default_flow_style=False)
