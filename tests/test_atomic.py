"""write_atomically: all or nothing, no temporary left behind."""

import os

import pytest
from lading.core.atomic import write_atomically


def test_replaces_contents_and_sets_mode(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    write_atomically(target, "new", durable=True, mode=0o600)
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_failed_rename_keeps_old_contents_and_no_temporary(tmp_path):
    target = tmp_path / "busy"
    target.mkdir()  # renaming a file over a non-empty directory fails
    (target / "inside").write_text("x")
    with pytest.raises(OSError):
        write_atomically(target, "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]
    assert (target / "inside").read_text() == "x"


def test_named_temporary_is_used_and_removed(tmp_path):
    target = tmp_path / "record.json"
    tmp = tmp_path / "record.json.tmp"
    write_atomically(target, "{}", tmp=tmp)
    assert target.read_text() == "{}" and not tmp.exists()
    assert not any(name.startswith(".") for name in os.listdir(tmp_path))
