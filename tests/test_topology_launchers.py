"""Launchers beyond torchrun/MPI/SLURM: SageMaker training containers, Kubernetes (PyTorchJob,
Indexed Jobs / JobSet) and Ray Train; SageMaker channels as sync's default DEST."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lading.core.errors import UsageError
from lading.selection.sagemaker import channel_dest, channels
from lading.selection.topology import detect_topology

HOSTS = '["algo-3","algo-1","algo-2"]'  # not sorted on purpose: the node rank is the sorted index


def values(topo) -> tuple[int, int, int, int, int]:
    return topo.rank, topo.world_size, topo.local_rank, topo.local_world_size, topo.node_rank


def no_file(tmp_path: Path) -> Path:
    return tmp_path / "no-such-resourceconfig.json"


# -- SageMaker -------------------------------------------------------------------------------------


def test_sagemaker_toolkit_variables(tmp_path):
    env = {"SM_CURRENT_HOST": "algo-2", "SM_HOSTS": HOSTS, "SM_NUM_GPUS": "4"}
    topo = detect_topology(env, resource_config=no_file(tmp_path))
    # node rank = index in sorted hosts; 4 GPUs per host; the per-host process is local rank 0
    assert values(topo) == (4, 12, 0, 4, 1)
    assert topo.launcher == "sagemaker"
    assert topo.sources["node_rank"] == "SM_CURRENT_HOST"
    assert topo.sources["local_world_size"] == "SM_NUM_GPUS"
    assert topo.sources["rank"] == topo.sources["world_size"] == "derived"


def test_sagemaker_local_rank_flag_gives_each_gpu_its_rank(tmp_path):
    env = {"SM_CURRENT_HOST": "algo-3", "SM_HOSTS": HOSTS, "SM_NUM_GPUS": "4"}
    ranks = [detect_topology(env, {"local_rank": i}, resource_config=no_file(tmp_path)).rank for i in range(4)]
    assert ranks == [8, 9, 10, 11]  # what torchrun --node_rank 2 --nproc_per_node 4 will number them
    per_host = detect_topology(env, {"local_world_size": 1}, resource_config=no_file(tmp_path))
    assert values(per_host) == (2, 3, 0, 1, 2)  # one rank per host: one shard per host


@pytest.mark.parametrize("gpus", [None, "0"])
def test_sagemaker_cpu_hosts_run_one_process_each(tmp_path, gpus):
    env = {"SM_CURRENT_HOST": "algo-1", "SM_HOSTS": HOSTS}
    if gpus is not None:
        env["SM_NUM_GPUS"] = gpus
    assert values(detect_topology(env, resource_config=no_file(tmp_path))) == (0, 3, 0, 1, 0)


def test_sagemaker_resourceconfig_without_the_toolkit(tmp_path):
    config = tmp_path / "resourceconfig.json"
    config.write_text(
        json.dumps({"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"})
    )
    topo = detect_topology({"HOME": "/root"}, resource_config=config)
    assert values(topo) == (1, 2, 0, 1, 1)
    assert topo.launcher == "sagemaker" and topo.sources["node_rank"] == str(config)
    # SM_INPUT_CONFIG_DIR names the directory when no path is passed
    assert values(detect_topology({"SM_INPUT_CONFIG_DIR": str(tmp_path)})) == (1, 2, 0, 1, 1)
    # SM_CURRENT_HOST without SM_HOSTS takes the host list from the file
    topo = detect_topology({"SM_CURRENT_HOST": "algo-1", "SM_NUM_GPUS": "2"}, resource_config=config)
    assert values(topo) == (0, 4, 0, 2, 0)


def test_torchrun_started_by_sagemaker_wins(tmp_path):
    """SageMaker's torch_distributed runs torchrun on every host: its per-process variables win."""
    env = {
        "SM_CURRENT_HOST": "algo-2",
        "SM_HOSTS": HOSTS,
        "SM_NUM_GPUS": "4",
        "RANK": "6",
        "WORLD_SIZE": "12",
        "LOCAL_RANK": "2",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
    }
    topo = detect_topology(env, resource_config=no_file(tmp_path))
    assert values(topo) == (6, 12, 2, 4, 1) and topo.launcher == "torchrun"


@pytest.mark.parametrize(
    "env,needle",
    [
        ({"SM_CURRENT_HOST": "algo-9", "SM_HOSTS": HOSTS}, "'algo-9' (SM_CURRENT_HOST) is not among the hosts"),
        ({"SM_CURRENT_HOST": "algo-1", "SM_HOSTS": "algo-1,algo-2"}, "SM_HOSTS='algo-1,algo-2' is not a JSON list"),
        ({"SM_CURRENT_HOST": "algo-1", "SM_HOSTS": "[]"}, "not a non-empty list"),
        ({"SM_CURRENT_HOST": "algo-1", "SM_HOSTS": HOSTS, "SM_NUM_GPUS": "many"}, "SM_NUM_GPUS='many'"),
        ({"SM_CURRENT_HOST": "algo-1"}, "SM_HOSTS is not"),
    ],
)
def test_sagemaker_bad_values_are_usage_errors(tmp_path, env, needle):
    with pytest.raises(UsageError) as info:
        detect_topology(env, resource_config=no_file(tmp_path))
    assert needle in info.value.message


def test_sagemaker_broken_resourceconfig_names_the_file(tmp_path):
    config = tmp_path / "resourceconfig.json"
    config.write_text('{"current_host": "algo-1", ')
    with pytest.raises(UsageError, match="resourceconfig.json is invalid JSON"):
        detect_topology({}, resource_config=config)


def test_topology_command_inside_sagemaker(lading, tmp_path):
    (tmp_path / "resourceconfig.json").write_text('{"current_host": "algo-2", "hosts": ["algo-1", "algo-2"]}')
    result = lading("topology", "--json", env={"SM_INPUT_CONFIG_DIR": str(tmp_path), "SM_NUM_GPUS": "8"})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["rank"], data["world_size"], data["local_world_size"], data["node_rank"]) == (8, 16, 8, 1)
    assert data["launcher"] == "sagemaker"
    result = lading("topology", env={"SM_CURRENT_HOST": "algo-2", "SM_HOSTS": '["algo-1","algo-2"]'})
    assert result.returncode == 0 and "sagemaker" in result.stdout and "SM_CURRENT_HOST" in result.stdout


# -- SageMaker channels: sync's default DEST ---------------------------------------------------------


def test_channels_from_toolkit_variables_and_inputdataconfig(tmp_path):
    env = {
        "SM_CHANNELS": '["training","test"]',
        "SM_CHANNEL_TRAINING": "/opt/ml/input/data/training",
        "SM_CHANNEL_TEST": "/opt/ml/input/data/test",
    }
    assert channels(env) == {"test": "/opt/ml/input/data/test", "training": "/opt/ml/input/data/training"}
    assert channel_dest(env, "Training") == "/opt/ml/input/data/training"
    with pytest.raises(UsageError, match="2 channels: test, training"):
        channel_dest(env)
    with pytest.raises(UsageError, match="no SageMaker channel 'eval'"):
        channel_dest(env, "eval")
    assert channel_dest({"SM_CHANNEL_TRAIN": "/d/train"}) == "/d/train"  # without SM_CHANNELS
    config = tmp_path / "inputdataconfig.json"
    config.write_text(json.dumps({"train": {"TrainingInputMode": "File"}}))
    assert channel_dest({}, input_config=config) == "/opt/ml/input/data/train"
    assert channel_dest({"SM_INPUT_DIR": "/sm/in"}, input_config=config) == "/sm/in/data/train"
    assert channel_dest({}, input_config=tmp_path / "none.json") is None  # outside SageMaker


def test_sync_into_the_channel_directory(lading, tmp_path):
    source = tmp_path / "src"
    (source / "a").mkdir(parents=True)
    (source / "a" / "x.bin").write_bytes(b"x" * 10)
    training, test = tmp_path / "data" / "training", tmp_path / "data" / "test"
    one = {"SM_CHANNEL_TRAINING": str(training), "SM_INPUT_CONFIG_DIR": str(tmp_path / "config")}
    result = lading("sync", str(source), "-q", env=one)  # DEST omitted, one channel: it is DEST
    assert result.returncode == 0, result.stderr
    assert (training / "a" / "x.bin").read_bytes() == b"x" * 10

    two = {**one, "SM_CHANNELS": '["training","test"]', "SM_CHANNEL_TEST": str(test)}
    result = lading("sync", str(source), env=two)
    assert result.returncode == 2 and "--channel" in result.stderr and "Traceback" not in result.stderr
    result = lading("sync", str(source), "--channel", "test", "--json", env=two)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["files"] == 1 and (test / "a" / "x.bin").exists()
    result = lading("sync", str(source), str(tmp_path / "d"), "--channel", "test", env=two)
    assert result.returncode == 2 and "not both" in result.stderr
    result = lading("sync", str(source), "--channel", "eval", env=two)
    assert result.returncode == 2 and "no SageMaker channel 'eval'" in result.stderr


# -- Kubernetes and Ray ------------------------------------------------------------------------------


def test_pytorchjob_pod_before_torchrun_is_one_process_per_pod(tmp_path):
    """PyTorchJob sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE (pods) and RANK (the pod's index) per pod."""
    env = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "2"}
    topo = detect_topology(env, resource_config=no_file(tmp_path))
    assert values(topo) == (2, 4, 0, 1, 2) and topo.launcher == "torchrun"
    assert topo.sources["node_rank"] == "derived"


def test_ray_train_node_rank(tmp_path):
    """Ray Train's torch backend sets NODE_RANK (not torchrun's GROUP_RANK); nodes may hold
    different numbers of workers, so rank // local_world_size would be wrong."""
    env = {"RANK": "5", "WORLD_SIZE": "6", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "3"}
    topo = detect_topology(env, resource_config=no_file(tmp_path))
    assert values(topo) == (5, 6, 0, 1, 3) and topo.sources["node_rank"] == "NODE_RANK"
    topo = detect_topology({**env, "GROUP_RANK": "4"}, resource_config=no_file(tmp_path))
    assert topo.node_rank == 4 and topo.sources["node_rank"] == "GROUP_RANK"  # torchrun's own wins


def test_indexed_job_completion_index_is_the_node_rank(tmp_path):
    env = {"JOB_COMPLETION_INDEX": "3"}
    topo = detect_topology(env, resource_config=no_file(tmp_path))
    assert values(topo) == (0, 1, 0, 1, 3) and topo.launcher == "indexed-job"
    assert topo.sources["node_rank"] == "JOB_COMPLETION_INDEX"
    topo = detect_topology(env, {"world_size": 4}, resource_config=no_file(tmp_path))
    assert values(topo) == (3, 4, 0, 1, 3) and topo.sources["rank"] == "derived"
    topo = detect_topology(
        env, {"world_size": 8, "local_world_size": 2, "local_rank": 1}, resource_config=no_file(tmp_path)
    )
    assert values(topo) == (7, 8, 1, 2, 3)
    # torchrun inside the pod sets the per-process variables: they win
    topo = detect_topology({**env, "RANK": "1", "WORLD_SIZE": "2"}, resource_config=no_file(tmp_path))
    assert topo.launcher == "torchrun" and topo.node_rank == 1
    with pytest.raises(UsageError, match="JOB_COMPLETION_INDEX='x'"):
        detect_topology({"JOB_COMPLETION_INDEX": "x"}, resource_config=no_file(tmp_path))


def test_topology_command_in_a_jobset_pod(lading):
    result = lading("topology", "--json", "--world-size", "4", env={"JOB_COMPLETION_INDEX": "2"})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["rank"], data["world_size"], data["node_rank"], data["launcher"]) == (2, 4, 2, "indexed-job")
