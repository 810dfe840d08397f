"""lading pack --engine ray and ShardSink on a local Ray (2 CPUs, bound to 127.0.0.1), against moto.

One Ray for the module (started in this process, shut down at the end). Workers are killed for
real (SIGKILL of the task's process); Ray itself is never patched.
"""

from __future__ import annotations

import ast
import base64
import re
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import boto3
import google_crc32c
import pytest
from lading.core.errors import AccessDenied, UsageError
from lading.core.retry import RetryPolicy
from lading.datasets import PackedDataset, ShardDataset
from lading.pack import PackOptions, plan_pack, run_pack
from lading.stores import StoreConfig
from proxies import FaultProxy

ray = pytest.importorskip("ray")
from ray_fixtures import WORKER_KEYS, ray_cluster  # noqa: E402,F401 - the module's Ray
from lading.pack.ray import ShardSink, run_pack_ray  # noqa: E402 - only with Ray installed

BUCKET = "lading-pack-ray"
TOP = Path(__file__).resolve().parent.parent
FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.005, max_delay=0.01)


@pytest.fixture
def s3(s3_env):
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return client


def config(endpoint: str) -> StoreConfig:
    """Settings for the driver and, sent with each task, the Ray workers (which resolve their own
    credentials: ray_fixtures.WORKER_KEYS)."""
    return replace(StoreConfig.from_env(endpoint_url=endpoint), retry=FAST_RETRY, timeout=10)


def make_source(root: Path, count: int = 60) -> dict[str, bytes]:
    files = {}
    for i in range(count):
        files[f"d{i % 3}/s{i:03d}.bin"] = os.urandom(700 + 37 * i)
        files[f"d{i % 3}/s{i:03d}.json"] = json.dumps({"i": i}).encode()
    for key, data in files.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
    return files


def listing(s3, prefix: str) -> dict[str, bytes]:
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]
    return {key[len(prefix) :]: s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() for key in keys}


def crc32c_of(data: bytes) -> str:
    """The CRC32C as an index records it (base64, big-endian), computed here independently."""
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def assert_crc32cs(index: dict, objects: dict[str, bytes]) -> None:
    """Every shard and the offsets file carry the CRC32C of their bytes."""
    entries = [*index["shardlist"], index["lading"]["offsets"]]
    assert [entry["crc32c"] for entry in entries] == [crc32c_of(objects[entry["url"]]) for entry in entries]


def without_timing(index: bytes) -> dict:
    return json.loads(index)


def test_ray_and_local_engines_write_identical_shards_and_indexes(ray_cluster, s3, s3_env, tmp_path):
    make_source(tmp_path / "src")
    settings = config(s3_env["AWS_ENDPOINT_URL"])
    for engine, dest in (("local", f"s3://{BUCKET}/local"), ("ray", f"s3://{BUCKET}/ray")):
        plan = plan_pack(
            str(tmp_path / "src"), dest, PackOptions("ds", shard_size=15_000, shuffle=True, seed=3), settings
        )
        (run_pack if engine == "local" else run_pack_ray)(plan, str(tmp_path / "src"), dest, settings)
    local, on_ray = listing(s3, "local/"), listing(s3, "ray/")
    assert sorted(local) == sorted(on_ray), "the same objects, and no receipts left behind"
    assert len([key for key in local if key.endswith(".tar")]) >= 4
    assert all(local[key] == on_ray[key] for key in local if key != "ds.manifest.json")
    assert json.loads(local["ds.index.json"]) == json.loads(on_ray["ds.index.json"])
    assert_crc32cs(json.loads(on_ray["ds.index.json"]), on_ray)


def test_bucket_source_on_ray_reads_back_exactly(ray_cluster, s3, s3_env, tmp_path):
    files = make_source(tmp_path / "src", count=30)
    for key, data in files.items():
        s3.put_object(Bucket=BUCKET, Key=f"raw/{key}", Body=data)
    settings = config(s3_env["AWS_ENDPOINT_URL"])
    plan = plan_pack(f"s3://{BUCKET}/raw", str(tmp_path / "out"), PackOptions("raw", shard_size=8_000), settings)
    result = run_pack_ray(plan, f"s3://{BUCKET}/raw", str(tmp_path / "out"), settings)
    samples = {s["__key__"]: s for s in ShardDataset(str(tmp_path / "out" / "raw.index.json"))}
    assert len(result.shards) == len(plan.shards) >= 3
    assert sorted(samples) == sorted({key.rsplit(".", 1)[0] for key in files})
    assert all(samples[key.rsplit(".", 1)[0]][key.rsplit(".", 1)[1]] == data for key, data in files.items())
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        [s.name for s in plan.shards] + ["raw.index.json", "raw.manifest.json", "raw.offsets.safetensors"]
    )


def test_cli_engine_ray_joins_the_cluster(ray_cluster, lading, tmp_path):
    make_source(tmp_path / "src", count=20)
    local = lading("pack", str(tmp_path / "src"), str(tmp_path / "local"), "--name", "ds", "--shard-size", "10KB")
    assert local.returncode == 0, local.stderr
    # relative paths: the workers' working directory is not the CLI's
    run = lading(
        "pack",
        "src",
        "ray",
        "--name",
        "ds",
        "--shard-size",
        "10KB",
        "--engine",
        "ray",
        "--ray-address",
        ray_cluster,
        "--json",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    names = sorted(p.name for p in (tmp_path / "local").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "ray").iterdir())
    tars = [name for name in names if name.endswith(".tar")]
    assert len(tars) == len(summary["shards"]) >= 3
    assert all((tmp_path / "local" / n).read_bytes() == (tmp_path / "ray" / n).read_bytes() for n in tars)
    wrong = lading("pack", str(tmp_path / "src"), str(tmp_path / "x"), "--ray-address", ray_cluster)
    assert wrong.returncode == 2 and "--engine ray" in wrong.stderr


def _kill_a_shard_task(killed: list[int]) -> None:
    """SIGKILL the worker process running a shard task (Ray titles it ``ray::lading_pack_shard``)
    of this test session's Ray: its TMPDIR is ours (another pytest-xdist worker may be packing
    with a Ray of its own at the same time)."""
    ours = f"TMPDIR={os.environ['TMPDIR']}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if title.startswith(b"ray::lading_pack_shard") and ours in environ:
            os.kill(int(pid), signal.SIGKILL)
            killed.append(int(pid))
            return


def test_task_killed_mid_shard_is_retried_and_the_pack_is_exact(ray_cluster, s3, s3_env, tmp_path):
    files = make_source(tmp_path / "src", count=40)
    for key, data in files.items():
        s3.put_object(Bucket=BUCKET, Key=f"raw/{key}", Body=data)
    dest = f"s3://{BUCKET}/packed"
    killed: list[int] = []
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        settings = config(proxy.url)
        plan = plan_pack(f"s3://{BUCKET}/raw", dest, PackOptions("ds", shard_size=12_000), settings)
        # the 10th object GET: its worker is killed while reading the members of its shard
        proxy.add_fault(
            "slowdown",
            first=1,
            method="GET",
            path_prefix=f"/{BUCKET}/raw/",
            after=9,
            then=lambda: _kill_a_shard_task(killed),
        )
        run_pack_ray(plan, f"s3://{BUCKET}/raw", dest, settings)
    assert killed, "no shard task was running when the fault fired"
    run_pack(plan, f"s3://{BUCKET}/raw", f"s3://{BUCKET}/local", config(s3_env["AWS_ENDPOINT_URL"]))
    packed, local = listing(s3, "packed/"), listing(s3, "local/")
    assert sorted(packed) == sorted(local), "an orphan or a missing object"
    assert all(packed[key] == local[key] for key in local if key.endswith(".tar"))
    assert json.loads(packed["ds.index.json"]) == json.loads(local["ds.index.json"])


def test_failed_pack_leaves_no_index_and_a_rerun_reuses_the_shards_written(ray_cluster, s3, s3_env, tmp_path):
    make_source(tmp_path / "src", count=40)
    dest = f"s3://{BUCKET}/again"
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        settings = config(proxy.url)
        plan = plan_pack(str(tmp_path / "src"), dest, PackOptions("ds", shard_size=10_000), settings)
        assert len(plan.shards) >= 4
        proxy.add_fault("403", rate=1.0, method="PUT", path_prefix=f"/{BUCKET}/again/ds-000002.tar")
        with pytest.raises(AccessDenied):
            run_pack_ray(plan, str(tmp_path / "src"), dest, settings)
        assert "ds.index.json" not in listing(s3, "again/")
        # shards with a receipt are complete (one whose task was cancelled between its upload and
        # its receipt is not trusted, and written again)
        receipts = [key for key in listing(s3, "again/") if key.startswith("ds.lading-pack/")]
        written = {key.rsplit("/", 1)[1].removesuffix(".json") for key in receipts}
        assert written and "ds-000002.tar" not in written
        proxy.clear_faults()
        proxy.reset_counts()
        run_pack_ray(plan, str(tmp_path / "src"), dest, settings)
        puts = Counter(
            seen.path.rsplit("/", 1)[1]
            for seen in proxy.requests
            if seen.method == "PUT" and seen.path.endswith(".tar")
        )
    assert "ds-000002.tar" in puts and not set(puts) & written, "a shard already written was written again"
    run_pack(plan, str(tmp_path / "src"), f"s3://{BUCKET}/local", config(s3_env["AWS_ENDPOINT_URL"]))
    again, local = listing(s3, "again/"), listing(s3, "local/")
    assert sorted(again) == sorted(local)
    assert all(again[key] == local[key] for key in local if key.endswith(".tar"))
    assert json.loads(again["ds.index.json"]) == json.loads(local["ds.index.json"]), "reused shards keep their CRC32C"
    assert_crc32cs(json.loads(again["ds.index.json"]), again)


def rows(count: int) -> list[dict]:
    return [
        {"__key__": f"n{i % 4}/x{i:04d}", "bin": os.urandom(300 + i), "cls": i, "txt": f"row {i}"} for i in range(count)
    ]


def test_shard_sink_output_read_once_by_shard_dataset_packed_dataset_and_wids(ray_cluster, s3, s3_env, tmp_path):
    written = {row["__key__"]: row for row in rows(400)}
    dataset = ray.data.from_items(list(written.values()), override_num_blocks=4)
    sink = ShardSink(f"s3://{BUCKET}/sink", name="imgs", shard_size=30_000)
    dataset.write_datasink(sink)
    index = json.loads(s3.get_object(Bucket=BUCKET, Key="sink/imgs.index.json")["Body"].read())
    objects = listing(s3, "sink/")
    assert sorted(objects) == sorted(
        [s["url"] for s in index["shardlist"]] + ["imgs.index.json", "imgs.manifest.json", "imgs.offsets.safetensors"]
    )
    assert len(index["shardlist"]) >= 4 and sum(s["nsamples"] for s in index["shardlist"]) == 400
    assert_crc32cs(index, objects)

    seen = Counter()
    for sample in ShardDataset(f"s3://{BUCKET}/sink/imgs.index.json"):
        seen[sample["__key__"]] += 1
        row = written[sample["__key__"]]
        assert sample["bin"] == row["bin"] and int(sample["cls"]) == row["cls"] and sample["txt"] == row["txt"].encode()
    assert seen == Counter(list(written)), "every row exactly once"
    packed = PackedDataset(f"s3://{BUCKET}/sink/imgs.index.json")
    assert len(packed) == 400 and packed[123]["bin"] == written[packed[123]["__key__"]]["bin"]

    wids = pytest.importorskip("wids")
    local = tmp_path / "sink"
    ray.data.from_items(list(written.values()), override_num_blocks=3).write_datasink(
        ShardSink(str(local), name="imgs", shard_size=30_000)
    )
    read = wids.ShardListDataset(str(local / "imgs.index.json"))
    keys = Counter(read[i]["__key__"] for i in range(len(read)))
    assert len(read) == 400 and set(keys) == set(written) and set(keys.values()) == {1}
    assert read[7][".bin"].read() == written[read[7]["__key__"]]["bin"]  # wids hands out file objects


def test_shard_sink_write_task_killed_mid_shard_leaves_no_orphan(ray_cluster, s3, s3_env, tmp_path):
    marker = tmp_path / "crashed"
    written = {row["__key__"]: row for row in rows(300)}

    def crash_once(batch):
        # the first attempt dies in the middle of its task's rows (shards of it already uploaded)
        if "n2/x0150" in list(batch["__key__"]) and not marker.exists():
            marker.write_text("x")
            os._exit(1)
        return batch

    dataset = ray.data.from_items(list(written.values()), override_num_blocks=2).map_batches(
        crash_once, batch_size=10, batch_format="pandas"
    )
    dataset.write_datasink(ShardSink(f"s3://{BUCKET}/retried", name="imgs", shard_size=8_000))
    assert marker.exists(), "the write task never crashed"
    index = json.loads(s3.get_object(Bucket=BUCKET, Key="retried/imgs.index.json")["Body"].read())
    listed = {s["url"] for s in index["shardlist"]}
    assert set(listing(s3, "retried/")) == listed | {
        "imgs.index.json",
        "imgs.manifest.json",
        "imgs.offsets.safetensors",
    }
    seen = Counter(sample["__key__"] for sample in ShardDataset(f"s3://{BUCKET}/retried/imgs.index.json"))
    assert seen == Counter(list(written))


def test_shard_sink_refuses_an_existing_dataset_and_cleans_up_a_failed_write(ray_cluster, tmp_path):
    dest = tmp_path / "out"
    ray.data.from_items(rows(20)).write_datasink(ShardSink(str(dest), name="a", shard_size=2_000))
    with pytest.raises(Exception, match="already exists"):
        ray.data.from_items(rows(20)).write_datasink(ShardSink(str(dest), name="a"))
    bad = rows(50) + [{"__key__": "bad.key", "bin": b"x"}]
    with pytest.raises(Exception, match="dots"):
        ray.data.from_items(bad, override_num_blocks=1).write_datasink(ShardSink(str(dest), name="b", shard_size=2_000))
    assert not [p.name for p in dest.iterdir() if p.name.startswith("b")], "the failed write left files behind"


def test_only_the_ray_modules_import_ray():
    allowed = {TOP / "staging" / "pack" / "ray", TOP / "staging" / "datalayer" / "ray.py"}
    offenders = []
    for root in ("staging", "cli", "mounts"):
        for path in (TOP / root).rglob("*.py"):
            if path in allowed or path.parent in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                offenders += [f"{path.relative_to(TOP)}: {name}" for name in names if name.split(".")[0] == "ray"]
    assert offenders == []
    code = (
        "import sys, lading, lading.pack, lading.datalayer, lading.datasets, lading.cli.main, lading.cli.cmd_pack; "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=TOP)


def test_ctrl_c_stops_submitting_exits_130_and_leaves_no_index(ray_cluster, tmp_path):
    make_source(tmp_path / "src", count=400)
    dest = tmp_path / "out"
    env = dict(os.environ, LADING_PROGRESS_SECONDS="0")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lading",
            "pack",
            str(tmp_path / "src"),
            str(dest),
            "--name",
            "ds",
            "--shard-size",
            "1",
            "--engine",
            "ray",
            "--ray-address",
            ray_cluster,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=TOP,
    )
    for line in proc.stderr:  # a progress line: shards are being written
        if line.startswith("lading pack:") and " 0 shard(s) done" not in line:
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130, rest
    assert "Traceback" not in rest
    names = {path.name for path in dest.iterdir()}
    assert "ds.index.json" not in names and "ds.manifest.json" not in names
    shards = [name for name in names if name.endswith(".tar")]
    assert 0 < len(shards) < 400, "the pack ran to its end instead of stopping"


def test_engine_ray_without_ray_installed_is_a_usage_error(lading, tmp_path):
    make_source(tmp_path / "src", count=3)
    code = (
        "import sys; sys.modules['ray'] = None  # as if Ray were not installed\n"
        "from lading.cli.main import main; sys.argv[0] = 'lading'; main()"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, "pack", str(tmp_path / "src"), str(tmp_path / "out"), "--engine", "ray"],
        capture_output=True,
        text=True,
        cwd=TOP,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "pip install './lading[ray]'" in run.stderr
    assert not (tmp_path / "out").exists()


def test_shard_sink_takes_the_size_strings_of_pack_shard_size_and_refuses_others(tmp_path):
    assert ShardSink(str(tmp_path), name="a", shard_size="256KB").shard_size == 256_000
    assert ShardSink(str(tmp_path), name="a", shard_size="1.5MiB").shard_size == 3 << 19
    assert ShardSink(str(tmp_path), name="a", shard_size=4096).shard_size == 4096
    for bad in ("12 parsecs", "0", "64M", -1, 2.5, True, None):
        with pytest.raises(UsageError, match="shard_size"):
            ShardSink(str(tmp_path), name="a", shard_size=bad)


def signed_by(seen) -> str:
    """The access key id an S3 request was signed with."""
    found = re.search(r"Credential=([^/]+)/", seen.headers.get("Authorization") or "")
    return found.group(1) if found else ""


def test_ray_tasks_resolve_their_own_credentials_and_never_receive_the_drivers(
    ray_cluster, s3, s3_env, tmp_path, monkeypatch
):
    secret = f"driver-secret-{os.urandom(8).hex()}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "driver-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    make_source(tmp_path / "src", count=20)
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        settings = replace(StoreConfig.from_env(endpoint_url=proxy.url), retry=FAST_RETRY, timeout=10)
        assert settings.env_credentials[1] == secret
        sink = ShardSink(f"s3://{BUCKET}/sink", name="imgs", shard_size=3_000, config=settings)
        assert secret.encode() not in ray.cloudpickle.dumps(sink), "the sink carries the driver's secret to its tasks"
        ray.data.from_items(rows(30), override_num_blocks=2).write_datasink(sink)
        plan = plan_pack(str(tmp_path / "src"), f"s3://{BUCKET}/packed", PackOptions("p", shard_size=5_000), settings)
        run_pack_ray(plan, str(tmp_path / "src"), f"s3://{BUCKET}/packed", settings)
        explicit = replace(
            settings, env_credentials=("explicit-key", "explicit-secret", None), credentials_from_environment=False
        )
        plan = plan_pack(str(tmp_path / "src"), f"s3://{BUCKET}/given", PackOptions("p", shard_size=5_000), explicit)
        run_pack_ray(plan, str(tmp_path / "src"), f"s3://{BUCKET}/given", explicit)
    signers = {}
    for seen in proxy.requests:
        if seen.method == "PUT":
            kind = "shard" if seen.path.endswith(".tar") else "index" if seen.path.endswith(".index.json") else ""
            signers.setdefault((seen.path.split("/")[2], kind), set()).add(signed_by(seen))
    assert signers[("sink", "shard")] == signers[("packed", "shard")] == {WORKER_KEYS[0]}, (
        "tasks used the driver's keys"
    )
    assert signers[("sink", "index")] == signers[("packed", "index")] == {"driver-key"}
    assert signers[("given", "shard")] == {"explicit-key"}, "keys given in the config travel with it"
