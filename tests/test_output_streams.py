"""One rule for the streams (docs/commands/index.md, "Which stream carries what"): data and --json
on stdout, status lines on stderr; and ANSI escapes only on a terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_lading

ESC = "\x1b["


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    for i in range(3):
        (source / f"s{i}.txt").write_text(f"sample {i}")
        (source / f"s{i}.cls").write_text(str(i))
    return source


def env_for(tmp_path: Path) -> dict[str, str]:
    return {"LADING_CACHE_DIR": str(tmp_path / "cache")}


def test_sync_status_line_is_on_stderr_and_json_alone_on_stdout(tree: Path, tmp_path: Path) -> None:
    plain = run_lading("sync", str(tree), str(tmp_path / "d1"), env=env_for(tmp_path))
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == "" and "synced 6 file(s)" in plain.stderr
    as_json = run_lading("sync", str(tree), str(tmp_path / "d2"), "--json", env=env_for(tmp_path))
    assert json.loads(as_json.stdout)["files"] == 6 and "synced" not in as_json.stdout


def test_pack_and_snapshot_status_lines_are_on_stderr(tree: Path, tmp_path: Path) -> None:
    packed = run_lading("pack", str(tree), str(tmp_path / "shards"), env=env_for(tmp_path))
    assert packed.returncode == 0, packed.stderr
    assert packed.stdout == "" and "packed 6 files" in packed.stderr and "index:" in packed.stderr
    snap = run_lading("snapshot", str(tree), "-o", str(tmp_path / "s.snap.jsonl"), env=env_for(tmp_path))
    assert snap.returncode == 0, snap.stderr
    assert snap.stdout == "" and "6 objects" in snap.stderr


def test_fetch_summary_is_on_stderr(tree: Path, tmp_path: Path) -> None:
    fetched = run_lading("fetch", str(tree) + "/", str(tmp_path / "f"), env=env_for(tmp_path))
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout == "" and fetched.stderr.strip()


def test_no_ansi_escapes_when_not_a_terminal(tree: Path, tmp_path: Path) -> None:
    """Piped (a log, a CI job): plain text, whatever the command renders with."""
    for args in (
        ["check", str(tree)],
        ["sync", str(tree), str(tmp_path / "d")],
        ["pack", str(tree), str(tmp_path / "p")],
        ["cache", "list"],
        ["topology"],
    ):
        result = run_lading(*args, env=env_for(tmp_path))
        assert result.returncode in (0, 1), (args, result.stderr)
        assert ESC not in result.stdout and ESC not in result.stderr, args
