"""A local Ray for a test module (2 CPUs, a small object store, bound to 127.0.0.1: on Linux Ray
otherwise takes the machine's interface address). Import ``ray_cluster`` into a test module."""

from __future__ import annotations

from typing import Iterator

import pytest


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """Ray started for the module and stopped after it; yields its GCS address, which lets
    subprocesses (the CLI, other drivers) join it."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, object_store_memory=100 << 20, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, logging_level="ERROR")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
