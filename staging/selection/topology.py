"""Which rank am I? Detect the distributed topology from explicit values or a launcher's environment.

Precedence, per field: an explicit value (``--rank`` ...) wins; otherwise the first launcher
whose rank variable is set supplies the rest, in this order:

============================  ======================================================================
launcher                      variables (rank, size, local rank, local size, node rank)
============================  ======================================================================
torchrun / Determined         RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK
Horovod                       HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE,
                              HOROVOD_CROSS_RANK
OpenMPI                       OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _NODE_RANK
MPICH / Intel MPI             PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
SLURM                         SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE,
                              SLURM_NODEID
============================  ======================================================================

With none of them, the process is rank 0 of 1. A missing local size means one process per node
(local rank 0 of 1, node rank = rank); a missing node rank is ``rank // local_world_size``.
The environment is always passed in as a mapping: this module never reads ``os.environ``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from lading.core.errors import UsageError

FIELDS = ("rank", "world_size", "local_rank", "local_world_size", "node_rank")


@dataclass(frozen=True)
class Launcher:
    """A launcher's name and the variable it uses for each field (None: it has none)."""

    name: str
    rank: str
    world_size: str
    local_rank: str | None
    local_world_size: str | None
    node_rank: str | None


LAUNCHERS: tuple[Launcher, ...] = (
    Launcher("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"),
    Launcher("horovod", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
             "HOROVOD_CROSS_RANK"),
    Launcher("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK"),
    Launcher("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", None),
    Launcher("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
             "SLURM_NODEID"),
)


@dataclass(frozen=True)
class Topology:
    """This process's place in the job. ``sources`` maps each field to where its value came from:
    a flag (``--rank``), an environment variable name, ``derived`` or ``default``."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    launcher: str = "none"
    sources: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (what ``lading topology --json`` prints)."""
        values = {name: getattr(self, name) for name in FIELDS}
        return {**values, "launcher": self.launcher, "sources": dict(self.sources)}


def _parse_int(text: str, origin: str) -> int:
    # SLURM_NTASKS_PER_NODE may read "4(x2)" (4 tasks on each of 2 nodes); the count comes first.
    match = re.fullmatch(r"\s*(-?\d+)(\(x\d+\))?\s*", text)
    if match is None:
        raise UsageError(f"{origin}={text!r} is not an integer", "fix the launcher variable or pass --rank etc.")
    return int(match.group(1))


def _from_launcher(env: Mapping[str, str]) -> tuple[str, dict[str, tuple[int, str]]]:
    for launcher in LAUNCHERS:
        if env.get(launcher.rank, "").strip() == "":
            continue
        found: dict[str, tuple[int, str]] = {}
        for name in FIELDS:
            variable = getattr(launcher, name)
            if variable and env.get(variable, "").strip() != "":
                found[name] = (_parse_int(env[variable], variable), variable)
        return launcher.name, found
    return "none", {}


def detect_topology(env: Mapping[str, str], explicit: Mapping[str, int | None] | None = None) -> Topology:
    """Resolve the topology: ``explicit`` values (None = not given) > launcher variables > defaults.

    Raises :class:`UsageError` for non-integers and inconsistent values (rank >= world size ...).
    """
    launcher, found = _from_launcher(env)
    for name, value in (explicit or {}).items():
        if name not in FIELDS:
            raise ValueError(f"unknown topology field {name!r}")
        if value is not None:
            found[name] = (int(value), "--" + name.replace("_", "-"))
    values: dict[str, int] = {name: value for name, (value, _) in found.items()}
    sources: dict[str, str] = {name: origin for name, (_, origin) in found.items()}

    def fill(name: str, value: int, how: str) -> None:
        if name not in values:
            values[name] = value
            sources[name] = how

    fill("rank", 0, "default")
    fill("world_size", 1, "default")
    # No local information: assume one process per node, the conservative choice for caching.
    fill("local_rank", 0, "default")
    if "local_rank" in found:  # a local rank without a local size: it is at least local_rank + 1
        fill("local_world_size", values["local_rank"] + 1, "derived")
    fill("local_world_size", 1, "default")
    if "node_rank" not in values:
        how = "default" if sources["rank"] == "default" else "derived"
        fill("node_rank", values["rank"] // max(1, values["local_world_size"]), how)
    topology = Topology(**values, launcher=launcher, sources=sources)
    _validate(topology)
    return topology


def _validate(topology: Topology) -> None:
    def fail(message: str) -> None:
        used = ", ".join(f"{name}={topology.sources[name]}" for name in FIELDS)
        raise UsageError(message, f"values came from: {used}")

    if topology.world_size < 1:
        fail(f"world size must be at least 1, got {topology.world_size}")
    if not 0 <= topology.rank < topology.world_size:
        fail(f"rank {topology.rank} is outside 0..{topology.world_size - 1} (world size {topology.world_size})")
    if topology.local_world_size < 1:
        fail(f"local world size must be at least 1, got {topology.local_world_size}")
    if not 0 <= topology.local_rank < topology.local_world_size:
        fail(f"local rank {topology.local_rank} is outside 0..{topology.local_world_size - 1}")
    if topology.local_world_size > topology.world_size:
        fail(f"local world size {topology.local_world_size} exceeds world size {topology.world_size}")
    if topology.node_rank < 0:
        fail(f"node rank must not be negative, got {topology.node_rank}")
