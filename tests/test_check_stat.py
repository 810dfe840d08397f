"""The stat phase: the forked two-process split gives exactly the serial answer, and survives a
child that dies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lading.context import check_context
from lading.context import stat_sizes as sizes_module


def make_tree(root: Path, n_dirs: int = 30, per_dir: int = 20) -> Path:
    for d in range(n_dirs):
        folder = root / f"d{d:02d}"
        folder.mkdir(parents=True)
        for f in range(per_dir):
            (folder / f"f{f:02d}.bin").write_bytes(b"z" * ((d * 31 + f * 7) % 97))
    os.symlink(root / "d00" / "f01.bin", root / "link.bin")
    os.symlink(root / "gone", root / "dangling")
    return root


def snapshot(root: Path, fork: bool = True) -> tuple:
    report = check_context(str(root), fork=fork)
    own = {key: (t.files, t.raw_bytes, t.det_bytes) for key, t in report.walked.own.items()}
    return sorted(zip(report.walked.files, report.walked.sizes)), own, sorted(report.walked.notes)


@pytest.fixture
def counted_forks(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # an idle machine
    calls = []
    real_fork = os.fork

    def fork() -> int:
        calls.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    return calls


def test_two_process_stat_matches_serial(tmp_path, monkeypatch, counted_forks):
    root = make_tree(tmp_path / "ctx")
    serial = snapshot(root)
    assert not counted_forks  # 600 files: below the threshold, no fork
    monkeypatch.setattr(sizes_module, "PARALLEL_MIN_ENTRIES", 10)
    assert snapshot(root) == serial
    assert len(counted_forks) == (1 if sizes_module._can_fork() else 0)
    assert len(serial[0]) == 601 and ("broken_symlink", "dangling") in serial[2]


def test_a_child_that_dies_is_made_up_for(tmp_path, monkeypatch, counted_forks):
    root = make_tree(tmp_path / "ctx")
    serial = snapshot(root)
    monkeypatch.setattr(sizes_module, "PARALLEL_MIN_ENTRIES", 10)
    monkeypatch.setattr(sizes_module, "_write_all", lambda fd, data: os._exit(3))
    assert snapshot(root) == serial


def test_the_library_forks_only_when_asked(tmp_path, monkeypatch, counted_forks):
    root = make_tree(tmp_path / "ctx")
    monkeypatch.setattr(sizes_module, "PARALLEL_MIN_ENTRIES", 10)
    monkeypatch.setattr(sizes_module, "_can_fork", lambda: True)
    serial = snapshot(root, fork=False)
    assert not counted_forks, "check_context forked the caller's process without being asked"
    assert snapshot(root, fork=True) == serial
    assert len(counted_forks) == 1
