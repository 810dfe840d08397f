"""Which rank am I? Detect the distributed topology from explicit values or a launcher's environment.

Precedence, per field: an explicit value (``--rank`` ...) wins; otherwise the first launcher
whose rank variable is set supplies the rest, in this order:

============================  ======================================================================
launcher                      variables (rank, size, local rank, local size, node rank)
============================  ======================================================================
torchrun / Determined /       RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (else
Ray Train / PyTorchJob        NODE_RANK, which Ray Train sets)
Horovod                       HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE,
                              HOROVOD_CROSS_RANK
OpenMPI                       OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _NODE_RANK
MPICH / Intel MPI             PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
SLURM                         SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE,
                              SLURM_NODEID
============================  ======================================================================

Then two launchers that describe nodes, not processes (one process per node runs the entry
point or hook; the ranks it will start are ``node_rank * local_world_size + local_rank``):

- SageMaker (:mod:`lading.selection.sagemaker`): node rank = index of ``SM_CURRENT_HOST`` among
  the sorted ``SM_HOSTS`` (or ``resourceconfig.json``'s ``current_host`` and ``hosts``), local
  world size = ``SM_NUM_GPUS`` (at least 1), world size = hosts x local world size, rank =
  node rank x local world size + local rank (0 unless ``--local-rank``).
- Kubernetes Indexed Jobs (JobSet): node rank = ``JOB_COMPLETION_INDEX``. The world size is
  not in the environment: with ``--world-size`` the rank is derived as above, otherwise the
  process is rank 0 of 1 on node ``JOB_COMPLETION_INDEX``.

With none of them, the process is rank 0 of 1. A missing local size means one process per node
(local rank 0 of 1, node rank = rank); a missing node rank is ``rank // local_world_size``.
The environment is always passed in as a mapping: this module never reads ``os.environ``
(SageMaker's ``resourceconfig.json`` is read from a path that callers may pass).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from lading.core.errors import UsageError
from lading.selection.sagemaker import read_hosts

FIELDS = ("rank", "world_size", "local_rank", "local_world_size", "node_rank")


class Launcher:
    """A launcher's name and the variable it uses for each field (None: it has none; a tuple:
    the first of these that is set). A plain class: a dataclass costs about 1 ms of start-up to
    create, and no caller compares, hashes or copies these."""

    __slots__ = ("name", "rank", "world_size", "local_rank", "local_world_size", "node_rank")

    def __init__(
        self,
        name: str,
        rank: str,
        world_size: str,
        local_rank: str | None,
        local_world_size: str | None,
        node_rank: str | tuple[str, ...] | None,
    ) -> None:
        self.name, self.rank, self.world_size = name, rank, world_size
        self.local_rank, self.local_world_size, self.node_rank = local_rank, local_world_size, node_rank


LAUNCHERS: tuple[Launcher, ...] = (
    Launcher("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", ("GROUP_RANK", "NODE_RANK")),
    Launcher(
        "horovod", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK"
    ),
    Launcher(
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "OMPI_COMM_WORLD_NODE_RANK",
    ),
    Launcher("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", None),
    Launcher("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID"),
)


class Topology:
    """This process's place in the job. ``sources`` maps each field to where its value came from:
    a flag (``--rank``), an environment variable name, ``derived`` or ``default``. A plain class
    (see :class:`Launcher`); :meth:`to_json` is its comparable form."""

    __slots__ = ("rank", "world_size", "local_rank", "local_world_size", "node_rank", "launcher", "sources")

    def __init__(
        self,
        rank: int = 0,
        world_size: int = 1,
        local_rank: int = 0,
        local_world_size: int = 1,
        node_rank: int = 0,
        launcher: str = "none",
        sources: Mapping[str, str] | None = None,
    ) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.local_world_size, self.node_rank, self.launcher = local_world_size, node_rank, launcher
        self.sources: Mapping[str, str] = {} if sources is None else sources

    def __repr__(self) -> str:
        return f"Topology({self.to_json()!r})"

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


#: Launchers that place nodes, not processes: the rank is derived from the node rank.
NODE_LAUNCHERS = ("sagemaker", "indexed-job")


class _Found:
    """What a launcher's environment says: (value, origin) per field, and the number of nodes
    when the launcher knows it (SageMaker's hosts)."""

    __slots__ = ("launcher", "fields", "nodes")

    def __init__(
        self, launcher: str = "none", fields: dict[str, tuple[int, str]] | None = None, nodes: int | None = None
    ) -> None:
        self.launcher, self.fields, self.nodes = launcher, {} if fields is None else fields, nodes


def _from_launcher(env: Mapping[str, str], resource_config: str | Path | None) -> _Found:
    for launcher in LAUNCHERS:
        if env.get(launcher.rank, "").strip() == "":
            continue
        found: dict[str, tuple[int, str]] = {}
        for name in FIELDS:
            variables = getattr(launcher, name)
            for variable in (variables,) if isinstance(variables, str) else variables or ():
                if env.get(variable, "").strip() != "":
                    found[name] = (_parse_int(env[variable], variable), variable)
                    break
        return _Found(launcher.name, found)
    hosts = read_hosts(env, resource_config)
    if hosts is not None:
        found = {"node_rank": (hosts.node_rank, hosts.origin)}
        if hosts.gpus:  # SM_NUM_GPUS=0 on CPU instances: one process per host
            found["local_world_size"] = (hosts.gpus, "SM_NUM_GPUS")
        return _Found("sagemaker", found, nodes=len(hosts.hosts))
    if env.get("JOB_COMPLETION_INDEX", "").strip() != "":
        index = _parse_int(env["JOB_COMPLETION_INDEX"], "JOB_COMPLETION_INDEX")
        return _Found("indexed-job", {"node_rank": (index, "JOB_COMPLETION_INDEX")})
    return _Found()


def detect_topology(
    env: Mapping[str, str], explicit: Mapping[str, int | None] | None = None, resource_config: str | Path | None = None
) -> Topology:
    """Resolve the topology: ``explicit`` values (None = not given) > launcher variables > defaults.

    ``resource_config`` is SageMaker's ``resourceconfig.json`` (default: in ``SM_INPUT_CONFIG_DIR``,
    else ``/opt/ml/input/config``); it is read only when no other launcher's variables are set.
    Raises :class:`UsageError` for non-integers and inconsistent values (rank >= world size ...).
    """
    detected = _from_launcher(env, resource_config)
    launcher, found = detected.launcher, detected.fields
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

    if launcher in NODE_LAUNCHERS:
        _derive_from_node(values, sources, detected.nodes)
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


def _derive_from_node(values: dict[str, int], sources: dict[str, str], nodes: int | None) -> None:
    """A launcher that placed this node, not this process: world size = nodes x local world
    size, rank = node rank x local world size + local rank (when the world size is known)."""
    local_size = values.get("local_world_size", 1)
    if "world_size" not in values and nodes is not None:
        values["world_size"], sources["world_size"] = nodes * local_size, "derived"
    if "rank" not in values and "world_size" in values and "node_rank" in values:
        values["rank"] = values["node_rank"] * local_size + values.get("local_rank", 0)
        sources["rank"] = "derived"


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
    # This node holds local_world_size ranks and every other node at least one: so at most
    # world_size - local_world_size + 1 nodes. Unknown world size (an indexed job without
    # --world-size is rank 0 of 1 on its node): nothing to check against.
    nodes = topology.world_size - topology.local_world_size + 1
    if topology.sources.get("world_size") != "default" and topology.node_rank >= nodes:
        fail(
            f"node rank {topology.node_rank} is outside 0..{nodes - 1} (world size {topology.world_size}, "
            f"{topology.local_world_size} rank(s) on this node)"
        )
