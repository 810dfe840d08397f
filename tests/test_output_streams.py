"""One rule for the streams (docs/commands/index.md, "Which stream carries what"): data and --json
on stdout, status lines on stderr; and ANSI escapes only on a terminal."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
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


def _piped_into_head(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``lading ARGS | head -c 1`` under pipefail: lading's own exit code and stderr."""
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "lading", *args])
    script = f"set -o pipefail; {command} 2> {tmp_path / 'err'} | head -c 1 > /dev/null"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [["sync", "{tree}", "{dest}", "--dry-run", "--json"], ["check", "{tree}", "--json"]])
def test_a_reader_that_closes_stdout_early_ends_the_command_quietly(tree: Path, tmp_path: Path, args) -> None:
    # `lading sync ... --dry-run --json | head`: exit 0 and nothing on stderr, as `lading cat`'s
    # (lading.cli.errors maps BrokenPipeError to 0). click intercepted EPIPE first: exit 1, no word.
    for i in range(3000):  # output well beyond a pipe's 64 KiB buffer
        (tree / f"many-{i:05d}.txt").write_text("x")
    args = [a.format(tree=tree, dest=tmp_path / "d") for a in args]
    result = _piped_into_head(args, tmp_path)
    assert result.returncode == 0 and (tmp_path / "err").read_text() == "", (tmp_path / "err").read_text()


def test_a_closed_stdout_is_no_traceback(tree: Path, tmp_path: Path) -> None:
    # `lading sync SRC DEST >&-` (a job started with stdout closed): sync writes nothing to stdout,
    # so it works; before, "internal error: AttributeError: 'NoneType' object has no attribute
    # 'isatty'" and a traceback from the final flush.
    script = f'"$0" -m lading sync {tree} {tmp_path / "d"} >&-'
    result = subprocess.run(["bash", "-c", script, sys.executable], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "synced 6 file(s)" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and (tmp_path / "d" / "s0.txt").read_text() == "sample 0"


FULL_DISK = (
    "lading: error: cannot write stdout: No space left on device "
    "(hint: free space on that file system, or choose another destination)\n"
)


@pytest.mark.parametrize(
    "args",
    [
        ["topology"],
        ["topology", "--json"],
        ["check", "{tree}"],
        ["check", "{tree}", "--json"],
        ["sync", "{tree}", "{dest}", "--json"],
        ["sync", "{tree}", "{dest}", "--dry-run", "--json"],
        ["cache", "list"],
        ["cache", "list", "--json"],
        ["cache", "clear", "--json"],
    ],
)
def test_a_full_disk_under_stdout_is_exit_6_in_one_line(tree: Path, tmp_path: Path, args) -> None:
    # `lading topology > file` on a full file system (/dev/full: every write is ENOSPC) was
    # "internal error: OSError: [Errno 28] No space left on device", exit 1, for every command
    # but cat; now the local error it is, as cat's (tests/test_cat.py).
    args = [a.format(tree=tree, dest=tmp_path / "d") for a in args]
    command = [sys.executable, "-m", "lading", *args]
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            command, stdout=full, stderr=subprocess.PIPE, text=True, env=os.environ | env_for(tmp_path), timeout=120
        )
    assert (result.returncode, result.stderr) == (6, FULL_DISK), result.stderr


def test_every_json_document_has_one_shape(tree: Path, tmp_path: Path) -> None:
    # `--json` is json.dumps(doc, indent=2) and a newline for every command (lading.cli.output.
    # print_json); `cache list` and `datasets` printed indent 1, `cache clear` and `check` one line.
    (tree / 'caf\u00e9 "q".txt').write_text("odd name")
    (tmp_path / "empty").mkdir()
    snap = tmp_path / "s.snap.jsonl"
    commands = [
        ["topology", "--json"],
        ["cache", "list", "--json"],
        ["cache", "clear", "--json"],
        ["check", str(tree), "--json"],  # its file list is written apart, at C speed: the same text
        ["check", str(tmp_path / "empty"), "--json"],
        ["sync", str(tree), str(tmp_path / "d"), "--json"],
        ["fetch", f"{tree}/", str(tmp_path / "f"), "--json"],
        ["snapshot", str(tree), "-o", str(snap), "--json"],
        ["snapshot", "diff", str(snap), str(snap), "--json"],
        ["datasets", "list", f"file://{tmp_path}", "--json"],
    ]
    for args in commands:
        result = run_lading(*args, env=env_for(tmp_path))
        assert result.returncode == 0, (args, result.stderr)
        assert result.stdout == json.dumps(json.loads(result.stdout), indent=2) + "\n", (args, result.stdout)
