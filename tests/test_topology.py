"""Topology detection from each launcher's variables, precedence, and bad values."""

from __future__ import annotations

import json

import pytest
from lading.core.errors import UsageError
from lading.selection.topology import detect_topology

LAUNCHER_ENVS = {
    "torchrun": (
        {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"},
        "RANK",
    ),
    "horovod": (
        {
            "HOROVOD_RANK": "5",
            "HOROVOD_SIZE": "8",
            "HOROVOD_LOCAL_RANK": "1",
            "HOROVOD_LOCAL_SIZE": "4",
            "HOROVOD_CROSS_RANK": "1",
        },
        "HOROVOD_RANK",
    ),
    "openmpi": (
        {
            "OMPI_COMM_WORLD_RANK": "5",
            "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            "OMPI_COMM_WORLD_NODE_RANK": "1",
        },
        "OMPI_COMM_WORLD_RANK",
    ),
    "mpich": ({"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}, "PMI_RANK"),
    "slurm": (
        {
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": "1",
            "SLURM_NTASKS_PER_NODE": "4(x2)",
            "SLURM_NODEID": "1",
        },
        "SLURM_PROCID",
    ),
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHER_ENVS))
def test_each_launcher(launcher):
    env, rank_var = LAUNCHER_ENVS[launcher]
    topo = detect_topology(env)
    assert (topo.rank, topo.world_size, topo.local_rank, topo.local_world_size, topo.node_rank) == (5, 8, 1, 4, 1)
    assert topo.launcher == launcher
    assert topo.sources["rank"] == rank_var
    # MPICH has no node-rank variable: derived from rank // local size
    assert topo.sources["node_rank"] != "default"
    if launcher == "mpich":
        assert topo.sources["node_rank"] == "derived"


def test_lone_process_is_rank_zero_of_one():
    topo = detect_topology({"HOME": "/root"})
    assert (topo.rank, topo.world_size, topo.local_rank, topo.local_world_size, topo.node_rank) == (0, 1, 0, 1, 0)
    assert topo.launcher == "none"
    assert topo.sources["rank"] == "default"


def test_precedence_torchrun_over_slurm_and_flags_over_all():
    env = {**LAUNCHER_ENVS["slurm"][0], "RANK": "2", "WORLD_SIZE": "4"}
    topo = detect_topology(env)
    assert (topo.rank, topo.world_size, topo.launcher) == (2, 4, "torchrun")
    topo = detect_topology(env, {"rank": 3, "world_size": None})
    assert (topo.rank, topo.world_size) == (3, 4)
    assert topo.sources["rank"] == "--rank" and topo.sources["world_size"] == "WORLD_SIZE"


def test_horovod_over_openmpi():
    env = {**LAUNCHER_ENVS["openmpi"][0], "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}
    assert detect_topology(env).launcher == "horovod"


def test_missing_local_info_means_one_process_per_node():
    topo = detect_topology({"RANK": "3", "WORLD_SIZE": "4"})
    assert (topo.local_rank, topo.local_world_size, topo.node_rank) == (0, 1, 3)


@pytest.mark.parametrize(
    "env,explicit,needle",
    [
        ({"RANK": "4", "WORLD_SIZE": "4"}, None, "rank 4 is outside"),
        ({"RANK": "x", "WORLD_SIZE": "4"}, None, "RANK='x' is not an integer"),
        ({}, {"rank": 1}, "rank 1 is outside"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, None, "local rank 2"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "4"}, None, "exceeds world size"),
        ({"PMI_RANK": "0", "PMI_SIZE": "0"}, None, "at least 1"),
        ({}, {"node_rank": 5, "world_size": 1}, "node rank 5 is outside 0..0"),
        (
            {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "3"},
            None,
            "node rank 3 is outside 0..2",
        ),
    ],
)
def test_invalid_values_are_usage_errors(env, explicit, needle):
    with pytest.raises(UsageError) as info:
        detect_topology(env, explicit)
    assert needle in info.value.message


def test_topology_command_text_and_json(lading):
    env = {
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NODEID": "0",
    }
    result = lading("topology", "--json", env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["rank"] == 1 and data["world_size"] == 2 and data["launcher"] == "slurm"
    assert data["sources"]["local_world_size"] == "SLURM_NTASKS_PER_NODE"
    result = lading("topology", "--world-size", "3", env=env)
    assert result.returncode == 0, result.stderr
    assert "slurm" in result.stdout and "--world-size" in result.stdout


def test_topology_command_bad_value_exits_2(lading):
    result = lading("topology", env={"RANK": "7", "WORLD_SIZE": "2"})
    assert result.returncode == 2
    assert "rank 7 is outside" in result.stderr and "Traceback" not in result.stderr
    result = lading("topology", "--node-rank", "5", "--world-size", "1")
    assert result.returncode == 2 and "node rank 5 is outside 0..0" in result.stderr, result.stderr


def test_an_indexed_job_without_a_world_size_keeps_its_node_rank():
    topo = detect_topology({"JOB_COMPLETION_INDEX": "3"})
    assert (topo.rank, topo.world_size, topo.node_rank) == (0, 1, 3)
