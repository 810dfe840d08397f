"""The topology flags (--rank, --world-size, ...) shared by sync, cat and topology."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import click
from lading.selection.topology import FIELDS, Topology, detect_topology


def topology_options_with(local_world_size_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--rank, --world-size, --local-rank, --local-world-size, --node-rank; the help of
    --local-world-size says what it does in the command (sync: the node cache)."""
    helps = {
        "rank": "This process's global rank (default: from the launcher, else 0).",
        "world_size": "Number of ranks in the job (default: from the launcher, else 1).",
        "local_rank": "Rank on this node.",
        "local_world_size": local_world_size_help,
        "node_rank": "Index of this node.",
    }

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for name in reversed(FIELDS):
            lowest = 1 if name.endswith("world_size") else 0
            func = click.option(
                "--" + name.replace("_", "-"), name, type=click.IntRange(min=lowest), default=None, help=helps[name]
            )(func)
        return func

    return decorate


#: The topology flags of commands without a node cache (cat, topology).
topology_options = topology_options_with("Ranks on this node (default: from the launcher, else 1).")


def resolve_topology(values: Mapping[str, int | None], env: Mapping[str, str] = os.environ) -> Topology:
    """The topology from the flags in ``values``, then the launcher's environment."""
    return detect_topology(env, {name: values.get(name) for name in FIELDS})
