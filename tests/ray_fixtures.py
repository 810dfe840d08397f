"""A local Ray for a test module (2 CPUs, a small object store, bound to 127.0.0.1: on Linux Ray
otherwise takes the machine's interface address). Import ``ray_cluster`` into a test module.

Its workers have credentials of their own, as a cluster's nodes have a role: ``WORKER_KEYS`` in
the environment Ray starts with (moto accepts any key). Store settings reach the tasks without
the driver's environment credentials, so a test's driver may use other keys."""

from __future__ import annotations

from typing import Iterator

import pytest

#: The Ray workers' own credentials (moto's test keys).
WORKER_KEYS = ("testing", "testing")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """Ray started for the module and stopped after it; yields its GCS address, which lets
    subprocesses (the CLI, other drivers) join it."""
    ray = pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as patch:  # what the raylet, and so every worker, inherits
        patch.setenv("AWS_ACCESS_KEY_ID", WORKER_KEYS[0])
        patch.setenv("AWS_SECRET_ACCESS_KEY", WORKER_KEYS[1])
        for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
            patch.delenv(name, raising=False)
        ray.init(
            num_cpus=2,
            object_store_memory=100 << 20,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
            logging_level="ERROR",
        )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
