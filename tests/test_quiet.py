"""``-q`` means "only errors and the final result" in every command: one rule (AppState.status and
AppState.result in lading.cli.context), checked here for each command on local data."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import click
import pytest
from lading.cli.main import COMMANDS, lading as lading_group

# command line (after `lading`, "{t}" is the test's directory) -> the one stderr line -q leaves
# (a regex), or None for none; stdout (the command's data) is the same with and without -q.
RUNS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "sync": (
        ("sync", "{t}/src", "{t}/out-sync{q}"),
        r"^synced 3 file\(s\), 21 B to .*; 0 up to date, 0 deleted, 0 failed$",
    ),
    "pack": (
        ("pack", "{t}/src", "{t}/out-pack{q}", "--name", "ds"),
        r"^packed 3 files \(3 samples, 21 B\) into 1 shard",
    ),
    "snapshot": (("snapshot", "{t}/src", "-o", "{t}/a{q}.snap.jsonl"), r"^.*a-?q?\.snap\.jsonl: 3 objects, 21 B at "),
    "snapshot diff": (
        ("snapshot", "diff", "{t}/old.snap.jsonl", "{t}/a{q}.snap.jsonl"),
        r"^3 added, 0 removed, 0 changed$",
    ),
    "fetch": (("fetch", "{t}/src/f1.txt", "{t}/fetched{q}/f1.txt"), r"-> .*fetched-?q?/f1.txt: 1 fetched \("),
    "hook init": (("hook", "init", "{t}/model{q}"), r"startup-hook.sh: updated$"),
    "hook run": (("hook", "run", "--config", "{t}/exp{q}.yaml"), r": 3 fetched \("),
    "check": (("check", "{t}/src"), None),  # its verdict is on stdout; -q keeps only that line
    "cat": (("cat", "{t}/src"), None),
    "cache list": (("cache", "list", "--cache-dir", "{t}/cache"), None),
    "cache clear": (("cache", "clear", "--cache-dir", "{t}/cache"), r"^removed 0 files, 0 B$"),
    "datasets list": (("datasets", "list", "{t}/store"), None),
    "topology": (("topology",), None),
    "bind-mounts": (("bind-mounts", "{t}/exp.yaml"), None),
}
FUSE = ("mount", "unmount")  # below, where /dev/fuse is usable
NO_OUTPUT_TO_TEST = {"datasets show", "datasets rm"}  # need a built dataset; they print with click.echo as list does


def command_paths() -> set[str]:
    """Every leaf command of the CLI (``hook init``, ``snapshot diff``, ...)."""
    paths = set()
    context = click.Context(lading_group)
    for name in COMMANDS:
        command = lading_group.get_command(context, name)
        subcommands = command.commands if isinstance(command, click.Group) else getattr(command, "subcommands", {})
        if not isinstance(command, click.Group):
            paths.add(name)
        paths.update(f"{name} {sub}" for sub in subcommands)
    return paths


def test_every_command_is_checked_for_quiet():
    assert command_paths() - set(RUNS) - set(FUSE) - NO_OUTPUT_TO_TEST == set()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    for i in (1, 2, 3):
        (tmp_path / "src" / f"f{i}.txt").write_text(f"data {i}\n")
    (tmp_path / "old").mkdir()
    (tmp_path / "store").mkdir()
    for q in ("", "-q"):
        (tmp_path / f"model{q}").mkdir()
        (tmp_path / f"exp{q}.yaml").write_text(
            f"data:\n  datasets:\n    - source: {tmp_path}/src\n      dest: {tmp_path}/staged{q}\n"
            f"bind_mounts:\n  - host_path: {tmp_path}\n    container_path: /data\n"
        )
    return tmp_path


def run(lading, args: tuple[str, ...], where: Path, quiet: bool):
    q = "-q" if quiet else ""
    line = [arg.format(t=where, q=q) for arg in args]
    return lading(*line, *(["-q"] if quiet else []))


@pytest.mark.parametrize("name", sorted(RUNS))
def test_quiet_leaves_only_errors_and_the_final_result(lading, workspace, name):
    args, final = RUNS[name]
    if name == "snapshot diff":
        assert (
            lading(
                "snapshot", str(workspace / "old"), "-o", str(workspace / "old.snap.jsonl"), "--allow-empty"
            ).returncode
            == 0
        )
        for q in ("", "-q"):
            assert lading("snapshot", str(workspace / "src"), "-o", str(workspace / f"a{q}.snap.jsonl")).returncode == 0
    loud, quiet = run(lading, args, workspace, False), run(lading, args, workspace, True)
    assert loud.returncode == quiet.returncode, (loud.stderr, quiet.stderr)
    if name == "check":  # check's -q: the verdict line only, on stdout
        assert quiet.stdout.splitlines() == loud.stdout.splitlines()[:1] and quiet.stderr == ""
        return
    assert quiet.stdout == loud.stdout
    lines = quiet.stderr.splitlines()
    if final is None:
        assert lines == [], quiet.stderr
    else:
        assert len(lines) == 1 and re.search(final, lines[0]), quiet.stderr
        assert any(re.search(final, line) for line in loud.stderr.splitlines()), loud.stderr


def test_quiet_mount_and_unmount_say_only_where_and_that(lading, workspace):
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("needs /dev/fuse and fusermount3")
    mountpoint = workspace / "mnt"
    mountpoint.mkdir()
    (mountpoint / "hidden").write_text("x")  # a warning (status) the mount prints without -q
    mounted = lading("mount", str(workspace / "src"), str(mountpoint), "-q")
    try:
        assert mounted.returncode == 0, mounted.stderr
        assert re.fullmatch(r"mounted .* at .*mnt in [\d.]+s \(pid \d+\); unmount with: .*\n", mounted.stderr)
        assert (mountpoint / "f1.txt").read_text() == "data 1\n"
    finally:
        unmounted = lading("unmount", str(mountpoint), "-q")
    assert unmounted.returncode == 0 and unmounted.stderr == f"unmounted {mountpoint}\n"
