"""lading.datalayer.ray: a Ray Dataset published as a cached version (moto, a local Ray for the module).

Two processes publishing the same version at once join the module's Ray; one builds, the other
waits for its index; both read the same version. Ray itself is never patched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from bucket_fixtures import make_bucket
from lading.core.errors import UsageError
from lading.stores import StoreConfig

ray = pytest.importorskip("ray")
from ray_fixtures import ray_cluster  # noqa: E402,F401 - the module's Ray
import lading.datalayer  # noqa: E402
from lading.datalayer import VersionConflict  # noqa: E402
from lading.datalayer.ray import publish  # noqa: E402 - only with Ray installed

TOP = Path(__file__).resolve().parent.parent

#: The pipeline both processes publish; each call of make() leaves a file named by its pid in MARKS.
PIPELINE = """
import os, sys
import numpy as np
import ray

MARKS = os.environ["LADING_TEST_MARKS"]


def make():
    open(os.path.join(MARKS, str(os.getpid())), "w").close()
    return ray.data.range(240, override_num_blocks=3).map(
        lambda r: {"__key__": f"r{r['id']:04d}", "label": int(r["id"]), "vec": np.arange(4) * r["id"]})


if __name__ == "__main__":
    import json
    from lading.datalayer.ray import publish

    ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
    outcome = publish(make, sys.argv[2], "toy", "v1", shard_size=4_000, claim_ttl=10)
    print(json.dumps({"built": outcome.built, "samples": outcome.index["datalayer"]["samples"]}))
"""


@pytest.fixture
def cache(s3_env):
    config = StoreConfig.from_env()
    return make_bucket("s3", config, "dlray", "cache"), config


def images():
    """A module-level function: its code is the fingerprint."""
    import numpy as np

    return ray.data.range(150, override_num_blocks=3).map(
        lambda r: {
            "__key__": f"img/{r['id']:03d}.v",
            "image": np.full((3, 3), r["id"] % 200, dtype=np.uint8),
            "label": int(r["id"]),
            "Caption": f"c{r['id']}",
            "extra": None,
        }
    )


def test_published_dataset_reads_back_with_fields_and_types(ray_cluster, cache):
    uri, config = cache
    outcome = publish(images, uri, "imgs", "v1", shard_size=2_000, config=config)
    assert outcome.built and outcome.index["datalayer"]["samples"] == 150
    again = publish(images, uri, "imgs", "v1", shard_size=2_000, config=config)
    assert not again.built
    rows = {row["__key__"]: row for row in lading.datalayer.open_dataset(again, config=config)}
    assert len(rows) == 150 and len(again.index["shardlist"]) >= 3
    row = rows["img/042.v"]
    assert row["label"] == 42 and row["Caption"] == "c42" and row["extra"] is None
    assert row["image"].dtype.name == "uint8" and row["image"].shape == (3, 3) and int(row["image"][0, 0]) == 42
    packed = lading.datalayer.open_dataset(again, random_access=True, config=config)
    assert len(packed) == 150


def test_versions_are_immutable_and_a_dataset_needs_a_fingerprint(ray_cluster, cache):
    uri, config = cache
    publish(images, uri, "imgs", "v1", shard_size=2_000, config=config)
    dataset = ray.data.range(3).map(lambda r: {"x": int(r["id"])})
    with pytest.raises(VersionConflict):
        publish(dataset, uri, "imgs", "v1", fingerprint="something else", config=config)
    with pytest.raises(UsageError, match="fingerprint"):
        publish(dataset, uri, "other", "v1", config=config)


def test_two_processes_publishing_at_once_build_once(ray_cluster, cache, tmp_path, monkeypatch):
    uri, config = cache
    script = tmp_path / "pipeline.py"
    script.write_text(textwrap.dedent(PIPELINE))
    marks = tmp_path / "marks"
    marks.mkdir()
    env = dict(os.environ, LADING_TEST_MARKS=str(marks))
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), ray_cluster, uri],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=TOP,
        )
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(result["built"] for result in results) == [False, True]
    assert [result["samples"] for result in results] == [240, 240]
    assert len(list(marks.iterdir())) == 1, "the pipeline was built more than once"
    monkeypatch.setenv("LADING_TEST_MARKS", str(marks))
    sys.path.insert(0, str(tmp_path))
    try:
        import pipeline  # the same code, so the same fingerprint: reused here too

        outcome = publish(pipeline.make, uri, "toy", "v1", shard_size=4_000, config=config)
    finally:
        sys.path.remove(str(tmp_path))
    assert not outcome.built and len(list(marks.iterdir())) == 1
    keys = sorted(row["__key__"] for row in lading.datalayer.open_dataset(outcome, config=config))
    assert keys == [f"r{i:04d}" for i in range(240)]
