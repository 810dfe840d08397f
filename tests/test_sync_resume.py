"""kill -9 in the middle of a sync, then a re-run: complete, byte-identical, no stray temporaries."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from conftest import REPO
from sync_fixtures import BUCKET, put_objects, read_tree, s3_client, sample_objects, stray_temporaries

SOURCE = f"s3://{BUCKET}/data"


def journal_lines(dest) -> int:
    try:
        return (dest / ".lading-sync.journal").read_text().count("\n")
    except OSError:
        return 0


def test_kill_9_then_rerun_completes(s3_env, tmp_path, lading):
    objects = sample_objects(240, seed=11)
    put_objects(s3_client(s3_env), objects)
    dest = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lading", "sync", SOURCE, str(dest), "--workers", "1"],
        cwd=REPO,
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while journal_lines(dest) < 20 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, "the sync finished before it could be killed; make it bigger"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = journal_lines(dest)
    assert 20 <= done_before < len(objects)
    assert not (dest / ".lading-sync.json").exists()  # the snapshot is written at the end only

    result = lading("sync", SOURCE, str(dest), "--json")
    assert result.returncode == 0, result.stderr
    assert read_tree(dest) == objects
    assert stray_temporaries(dest) == []
    summary = json.loads(result.stdout)
    assert summary["skipped"] >= done_before - 1  # journaled files were not fetched again
    assert summary["files"] + summary["skipped"] == len(objects)
