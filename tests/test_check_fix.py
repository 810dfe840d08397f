"""`lading check --fix --bucket URI`: over -> fix -> under -> hook -> identical bytes; never deletes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from proxies import FaultProxy

BUCKET = "lading-fix"
LIMIT = "100KiB"  # small limit, small files: the same code path as 95 MiB, in milliseconds


@pytest.fixture
def s3(s3_env):
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture
def context(tmp_path) -> Path:
    root = tmp_path / "model"
    (root / "data" / "nested").mkdir(parents=True)
    (root / "model_def.py").write_text("class Trial:\n    pass\n")
    for i in range(3):
        (root / "data" / f"shard-{i}.bin").write_bytes(os.urandom(50_000 + i))
    (root / "data" / "nested" / "labels.csv").write_bytes(b"id,label\n1,cat\n")
    (root / "startup-hook.sh").write_text("#!/bin/bash\necho my-own-setup\n")
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _det_upload(lading, context: Path, workdir: Path) -> None:
    """Copy exactly what det would upload (check --json's file list) into a task's working dir."""
    report = json.loads(lading("check", str(context), "--limit", LIMIT, "--json").stdout)
    for entry in report["files"]:
        target = workdir / entry["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(context / entry["path"], target)


def _source_hook(workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "DET_SLOT_IDS": "[0]",
        "DET_TRIAL_ID": "1",
        "DET_TASK_TYPE": "TRIAL",
        **env,
    }
    return subprocess.run(
        ["bash", "-c", "set -e; set -x; source startup-hook.sh"],
        cwd=workdir,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_over_fix_under_hook_identical(s3, s3_env, lading, context, tmp_path):
    originals = _tree(context)
    assert lading("check", str(context), "--limit", LIMIT).returncode == 1

    dry = lading("check", str(context), "--limit", LIMIT, "--fix", "--bucket", f"s3://{BUCKET}/run1")
    assert dry.returncode == 1 and "dry run" in dry.stdout and "data/" in dry.stdout
    assert _tree(context) == originals  # a dry run changes nothing
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0

    applied = lading(
        "check", str(context), "--limit", LIMIT, "--fix", "--bucket", f"s3://{BUCKET}/run1", "--yes", "--json"
    )
    assert applied.returncode == 0, applied.stderr
    outcome = json.loads(applied.stdout)
    assert outcome["fits"] is True and outcome["result"]["uploaded"] == 4
    assert lading("check", str(context), "--limit", LIMIT).returncode == 0
    for rel, body in originals.items():  # nothing deleted or modified, only ignored
        if rel != "startup-hook.sh":
            assert (context / rel).read_bytes() == body
    hook = (context / "startup-hook.sh").read_text()
    assert hook.startswith("#!/bin/bash\necho my-own-setup\n") and "lading fetch" in hook
    assert "/data/" in (context / ".detignore").read_text().splitlines()

    workdir = tmp_path / "task"
    _det_upload(lading, context, workdir)
    assert not (workdir / "data").exists()
    result = _source_hook(workdir, {**s3_env, "AWS_SECRET_ACCESS_KEY": "fix-secret-VALUE"})
    assert result.returncode == 0, result.stderr
    assert "fix-secret-VALUE" not in result.stdout + result.stderr
    restored = {
        rel: body
        for rel, body in _tree(workdir).items()
        if rel.startswith("data/") and not rel.split("/")[-1].startswith(".lading")
    }
    assert restored == {rel: body for rel, body in originals.items() if rel.startswith("data/")}


def test_rerun_uploads_nothing_and_changes_nothing(s3, lading, context):
    args = ("check", str(context), "--limit", LIMIT, "--fix", "--bucket", f"s3://{BUCKET}/again", "--yes", "--json")
    assert lading(*args).returncode == 0
    detignore, hook = (context / ".detignore").read_bytes(), (context / "startup-hook.sh").read_bytes()
    again = lading("check", str(context), "--limit", LIMIT, "--fix", "--bucket", f"s3://{BUCKET}/again", "--yes")
    assert again.returncode == 0 and "nothing to fix" in again.stdout
    (context / ".detignore").write_text("")  # forget the ignore lines: over again, objects already there
    third = json.loads(lading(*args).stdout)
    assert third["result"]["uploaded"] == 0 and third["result"]["already_there"] == 4
    assert (context / ".detignore").read_bytes().endswith(b"/data/\n")
    assert (context / "startup-hook.sh").read_bytes() == hook and detignore


def test_failed_upload_changes_nothing_in_the_context(s3, s3_env, lading, context):
    originals = _tree(context)
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        proxy.add_fault("slowdown", rate=1.0, method="PUT")
        result = lading(
            "check",
            str(context),
            "--limit",
            LIMIT,
            "--fix",
            "--bucket",
            f"s3://{BUCKET}/p",
            "--yes",
            env={"AWS_ENDPOINT_URL": proxy.url, "LADING_RETRIES": "2"},
        )
    assert result.returncode == 5 and "lading: error:" in result.stderr
    assert _tree(context) == originals


def test_foreign_objects_under_the_prefix_are_refused(s3, lading, context):
    s3.put_object(Bucket=BUCKET, Key="shared/data/someone-else.bin", Body=b"x")
    originals = _tree(context)
    result = lading("check", str(context), "--limit", LIMIT, "--fix", "--bucket", f"s3://{BUCKET}/shared", "--yes")
    assert result.returncode == 1 and "not in the context" in result.stderr
    assert _tree(context) == originals


def test_usage_errors_and_a_context_that_fits(lading, context):
    assert lading("check", str(context), "--limit", LIMIT, "--fix").returncode == 2
    assert lading("check", str(context), "--limit", LIMIT, "--yes").returncode == 2
    fits = lading("check", str(context), "--fix", "--bucket", "s3://whatever-bucket/x")
    assert fits.returncode == 0 and "nothing to fix" in fits.stdout


def test_python_environments_are_ignored_not_uploaded(tmp_path):
    """A conda env or a virtualenv under any name (pyvenv.cfg) is rebuilt, never sent to the bucket."""
    from lading.context import check_context, parse_size
    from lading.context.fix import plan_fix

    root = tmp_path / "model"
    for env in (".conda", "myenv"):
        (root / env / "lib").mkdir(parents=True)
        (root / env / "lib" / "big.so").write_bytes(os.urandom(110_000))  # each alone is over the limit
    (root / "myenv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "model_def.py").write_text("class Trial:\n    pass\n")
    report = check_context(str(root), limit=parse_size(LIMIT))
    plan = plan_fix(report, str(tmp_path / "bucket"))
    assert {item.path: item.restore for item in plan.items} == {".conda": False, "myenv": False}
    assert plan.hook_entries() == []


def test_endpoint_flag_reaches_the_upload(s3, s3_env, lading, context):
    """--endpoint-url on `check --fix` is used for the upload, like on every bucket command."""
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:1"}  # unreachable: only the flag can succeed
    args = ("check", str(context), "--limit", LIMIT, "--fix", "--bucket", f"s3://{BUCKET}/ctx", "--yes")
    result = lading(*args, "--endpoint-url", s3_env["AWS_ENDPOINT_URL"], env=env)
    assert result.returncode == 0, result.stderr
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert any(key.startswith("ctx/") for key in keys)
