"""The generated startup hook, sourced as Determined does, against moto through a counting proxy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from lading.hooks.script import HookEntry, updated_text
from lading.hooks.stage import VIEW_RECORD
from lading.sync.state import RESERVED_NAMES
from proxies import FaultProxy

BUCKET = "lading-hook"
SECRET = "lading-secret-VALUE-4242"
TOKEN = "lading-session-token-VALUE-4343"
DATA = {
    "data/train-0.bin": os.urandom(150_000),
    "data/train-1.bin": os.urandom(2_000),
    "data/sub/labels.csv": b"id,label\n1,cat\n2,dog\n",
    "other/skip.bin": b"not staged",
}


@pytest.fixture
def proxy(s3_env):
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    for key, body in DATA.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as running:
        yield running


def det_env(proxy: FaultProxy, config: dict, **extra: str) -> dict[str, str]:
    """A simulated Determined container: no RANK/LOCAL_RANK, lading's venv on PATH."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "DET_SLOT_IDS": "[0,1]",
        "DET_TRIAL_ID": "17",
        "DET_TASK_TYPE": "TRIAL",
        "DET_EXPERIMENT_CONFIG": json.dumps(config),
        "AWS_ENDPOINT_URL": proxy.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": TOKEN,
        "AWS_DEFAULT_REGION": "us-east-1",
        "LADING_RETRIES": "2",
    }
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.update(extra)
    return env


def start_hook(context: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", "-c", "set -e; set -x; source startup-hook.sh; echo HOOK-DONE"],
        cwd=context,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out + err


def object_gets(proxy: FaultProxy) -> int:
    return proxy.count("GET", path_prefix=f"/{BUCKET}/", where=lambda seen: "list-type" not in seen.query)


def snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every file under the roots (sync's state record in DEST included)."""
    found = {}
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                st = path.stat()
                found[str(path)] = (st.st_ino, st.st_mtime_ns)
    return found


def hook_context(tmp_path: Path, entry: HookEntry) -> Path:
    context = tmp_path / "model"
    context.mkdir()
    (context / "startup-hook.sh").write_text("#!/bin/bash\necho user-line\n")
    (context / "startup-hook.sh").write_text(updated_text((context / "startup-hook.sh").read_text(), entry))
    return context


def test_two_containers_download_once_then_a_restart_makes_no_get(proxy, tmp_path):
    dest = tmp_path / "node" / "train"
    config = {"data": {"datasets": [{"source": f"s3://{BUCKET}/data/", "dest": str(dest), "slots": True}]}}
    context = hook_context(tmp_path, HookEntry())
    env = det_env(proxy, config)
    first, second = start_hook(context, env), start_hook(context, env)
    results = [finish(first), finish(second)]
    for code, output in results:
        assert code == 0, output
        assert "HOOK-DONE" in output and "user-line" in output
        assert SECRET not in output and TOKEN not in output
    staged = {key: body for key, body in DATA.items() if key.startswith("data/")}
    for key in staged:
        assert proxy.counts[("GET", f"/{BUCKET}/{key}")] == 1, key  # one download for both containers
    for root in (dest, tmp_path / "node" / "train-rank0", tmp_path / "node" / "train-rank1"):
        got = {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in root.rglob("*")
            if p.is_file() and p.name not in RESERVED_NAMES | {VIEW_RECORD}
        }  # lading's own records
        assert got == {key.removeprefix("data/"): body for key, body in staged.items()}
    view_file = tmp_path / "node" / "train-rank1" / "train-0.bin"
    assert view_file.stat().st_ino == (dest / "train-0.bin").stat().st_ino  # a hard link, not a copy

    before = snapshot(dest, tmp_path / "node" / "train-rank0", tmp_path / "node" / "train-rank1")
    proxy.reset_counts()
    code, output = finish(start_hook(context, env))
    assert code == 0, output
    assert "up to date" in output
    assert object_gets(proxy) == 0 and proxy.count("HEAD") == 0 and proxy.count("PUT") == 0
    assert snapshot(dest, tmp_path / "node" / "train-rank0", tmp_path / "node" / "train-rank1") == before


def test_failing_download_fails_the_hook_with_a_clear_message(proxy, tmp_path):
    dest = tmp_path / "broken"
    context = hook_context(tmp_path, HookEntry(f"s3://{BUCKET}/data/", str(dest)))
    proxy.add_fault("slowdown", rate=1.0, method="GET", path_prefix=f"/{BUCKET}/data/")
    code, output = finish(start_hook(context, det_env(proxy, {})))
    assert code != 0
    assert "HOOK-DONE" not in output
    assert "lading could not stage" in output and "lading: error:" in output
    assert SECRET not in output and TOKEN not in output
    # nothing half-written under a final name (only sync's state record and lock)
    assert not [p for p in dest.rglob("*") if p.is_file() and p.name not in RESERVED_NAMES]


def test_bad_data_section_fails_the_hook(proxy, tmp_path):
    context = hook_context(tmp_path, HookEntry())
    config = {"data": {"datasets": [{"source": f"s3://{BUCKET}/data/", "dest": "relative/path"}]}}
    code, output = finish(start_hook(context, det_env(proxy, config)))
    assert code != 0 and "'dest' is required and must be an absolute path" in output


def test_sharded_views_split_the_keys_between_slots(proxy, tmp_path, lading):
    dest = tmp_path / "shards"
    config = {
        "resources": {"slots_per_trial": 2},
        "data": {"datasets": [{"source": f"s3://{BUCKET}/data/", "dest": str(dest), "distribution": "sharded"}]},
    }
    result = lading("hook", "run", "--json", env=det_env(proxy, config))
    assert result.returncode == 0, result.stderr
    keys = sorted(key.removeprefix("data/") for key in DATA if key.startswith("data/"))
    assert _shards(tmp_path) == [set(keys[0::2]), set(keys[1::2])]
    assert json.loads(result.stdout)["datasets"][0]["files"] == len(keys)  # lading sync's field names
    # a new key shifts the assignment: each view follows it, no key left in two shards
    boto3.client("s3", endpoint_url=proxy.url, region_name="us-east-1").put_object(
        Bucket=BUCKET, Key="data/a-first.bin", Body=b"new"
    )
    assert lading("hook", "run", env=det_env(proxy, config)).returncode == 0
    keys = sorted(keys + ["a-first.bin"])
    assert _shards(tmp_path) == [set(keys[0::2]), set(keys[1::2])]


def _shards(tmp_path: Path) -> list[set[str]]:
    return [
        {
            p.relative_to(tmp_path / f"shards-rank{i}").as_posix()
            for p in (tmp_path / f"shards-rank{i}").rglob("*")
            if p.is_file() and p.name != VIEW_RECORD
        }
        for i in (0, 1)
    ]


def test_sharded_across_containers_is_refused(proxy, tmp_path, lading):
    config = {
        "resources": {"slots_per_trial": 8},
        "data": {
            "datasets": [{"source": f"s3://{BUCKET}/data/", "dest": str(tmp_path / "s"), "distribution": "sharded"}]
        },
    }
    result = lading("hook", "run", env=det_env(proxy, config))
    assert result.returncode == 2 and "lading sync --distribution sharded" in result.stderr


def test_hook_run_from_a_yaml_file(proxy, tmp_path, lading):
    config = tmp_path / "const.yaml"
    config.write_text(f"data:\n  datasets:\n    - source: s3://{BUCKET}/data/sub/\n      dest: {tmp_path}/labels\n")
    env = det_env(proxy, {})
    del env["DET_EXPERIMENT_CONFIG"]
    result = lading("hook", "run", "--config", str(config), env=env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "labels" / "labels.csv").read_bytes() == DATA["data/sub/labels.csv"]
