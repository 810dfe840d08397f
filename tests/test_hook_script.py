"""`lading hook init`: the startup-hook.sh block, its idempotence, and how it behaves when sourced."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from lading.core.errors import UsageError
from lading.hooks.script import BEGIN, END, HookEntry, updated_text


def test_same_entry_twice_gives_the_same_bytes():
    entry = HookEntry("s3://b/train/", "/tmp/train", slots=True)
    once = updated_text(None, entry)
    assert updated_text(once, entry) == once
    assert once.count(BEGIN) == 1 and once.count(END) == 1


def test_user_lines_outside_the_markers_are_kept():
    first = updated_text("#!/bin/bash\nexport FOO=1\n", HookEntry("s3://b/a/", "/tmp/a"))
    edited = first + "pip install -r extra.txt\n"
    second = updated_text(edited, HookEntry("s3://b/b/", "/tmp/b"))
    assert second.startswith("#!/bin/bash\nexport FOO=1\n")
    assert second.endswith(END + "\npip install -r extra.txt\n")
    assert "s3://b/a/" in second and "s3://b/b/" in second


def test_new_source_for_the_same_dest_replaces_it():
    text = updated_text(None, HookEntry("s3://b/old/", "/tmp/d"))
    text = updated_text(text, HookEntry("s3://b/new/", "/tmp/d"))
    assert "s3://b/old/" not in text and text.count("lading fetch") == 1


def test_damaged_markers_are_refused():
    text = updated_text(None, HookEntry("s3://b/a/", "/tmp/a")).replace(END, "# gone")
    with pytest.raises(UsageError, match="damaged"):
        updated_text(text, HookEntry("s3://b/a/", "/tmp/a"))


def test_cli_init_is_idempotent_and_keeps_user_lines(lading, tmp_path):
    hook = tmp_path / "startup-hook.sh"
    hook.write_text("#!/bin/bash\necho mine\n")
    first = lading("hook", "init", str(tmp_path), "s3://bucket/train/", "/tmp/train", "--slots")
    assert first.returncode == 0, first.stderr
    before = hook.read_bytes()
    mtime = hook.stat().st_mtime_ns
    again = lading("hook", "init", str(tmp_path), "s3://bucket/train/", "/tmp/train", "--slots")
    assert again.returncode == 0 and "already up to date" in again.stderr
    assert hook.read_bytes() == before and hook.stat().st_mtime_ns == mtime
    assert before.startswith(b"#!/bin/bash\necho mine\n")
    assert b"lading fetch --slots s3://bucket/train/ /tmp/train" in before


def test_cli_init_dry_run_changes_nothing(lading, tmp_path):
    result = lading("hook", "init", str(tmp_path), "s3://bucket/x/", "/tmp/x", "--dry-run")
    assert result.returncode == 0 and "lading fetch s3://bucket/x/ /tmp/x" in result.stdout
    assert not (tmp_path / "startup-hook.sh").exists()


@pytest.mark.parametrize(
    "args, message, code",
    [
        (("s3://bucket/x/", "relative/dest"), "absolute", 2),
        (("s3:/bucket", "/tmp/x"), "malformed", 2),
        (("/no/such/context", "s3://bucket/x/", "/tmp/x"), "does not exist", 3),  # as in `lading check`
    ],
)
def test_cli_init_bad_input_is_a_usage_error(lading, tmp_path, args, message, code):
    result = lading("hook", "init", *args, cwd=tmp_path)
    assert result.returncode == code and message in result.stderr
    assert "Traceback" not in result.stderr


def _source(
    context: Path, path_env: str, script: str = "set -e; set -x; source startup-hook.sh; echo AFTER-SOURCE"
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", script],
        cwd=context,
        capture_output=True,
        text=True,
        env={"PATH": path_env, "DET_SLOT_IDS": "[0,1]"},
        timeout=60,
    )


def test_missing_lading_fails_the_task_with_a_message(tmp_path):
    (tmp_path / "startup-hook.sh").write_text(updated_text(None, HookEntry("s3://b/a/", "/tmp/a")))
    result = _source(tmp_path, "/usr/bin:/bin")
    assert result.returncode != 0
    assert "AFTER-SOURCE" not in result.stdout
    assert "lading is not on PATH" in result.stderr


def test_failure_returns_instead_of_exiting_the_sourcing_shell(tmp_path):
    (tmp_path / "startup-hook.sh").write_text(updated_text(None, HookEntry("s3://b/a/", "/tmp/a")))
    result = _source(tmp_path, "/usr/bin:/bin", "source startup-hook.sh || echo STATUS=$?; echo AFTER-SOURCE")
    assert "STATUS=127" in result.stdout and "AFTER-SOURCE" in result.stdout


def test_a_lone_uri_is_not_taken_for_a_context_dir(lading, tmp_path):
    result = lading("hook", "init", "s3://bucket/train/", cwd=tmp_path)
    assert result.returncode == 2 and "needs a DEST" in result.stderr


def test_progress_for_logs_is_periodic_lines():
    from lading.cli.cmd_hook import LogProgress

    lines: list[str] = []
    progress = LogProgress("s3://b/p -> /tmp/d", lines.append, interval=0.0)
    progress.on_phase("download", None)
    progress.on_bytes(1024)
    progress.on_bytes(1024)
    assert lines[0].endswith("fetching 1 object(s)")
    assert len(lines) == 3 and "2.0 KiB" in lines[-1] and "\r" not in "".join(lines)
    quiet: list[str] = []
    slow = LogProgress("x", quiet.append, interval=3600)
    slow.on_phase("download", None)
    slow.on_bytes(10)
    assert len(quiet) == 1  # nothing more until the interval has passed
