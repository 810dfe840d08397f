"""Symlinks, includes, collisions, det's byte accounting and the exact limit boundary."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lading.context import DET_LIMIT_BYTES, check_context, det_size
from lading.core.errors import NotFound, UsageError


def write(path: Path, content: bytes | str = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that takes no disk space (stat is all check looks at)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


def files_of(report) -> dict[str, int]:
    return dict(zip(report.walked.files, report.walked.sizes))


def test_det_size_rounds_each_file_up_to_a_multiple_of_three():
    assert [det_size(n) for n in range(8)] == [0, 3, 3, 3, 6, 6, 6, 9]
    assert DET_LIMIT_BYTES == 99_614_720 == 95 * 1024 * 1024


def test_total_is_the_sum_of_rounded_sizes_and_directories_count_zero(tmp_path):
    for name, size in {"a": 1, "b": 2, "c": 3, "d/e": 4, "d/f/g": 0}.items():
        write(tmp_path / name, b"z" * size)
    report = check_context(str(tmp_path))
    assert report.raw_bytes == 10
    assert report.total_bytes == 3 + 3 + 3 + 6 + 0
    assert sorted(report.walked.dirs) == ["d", "d/f"]
    assert report.dirs["d"].det_bytes == 6 and report.dirs["d"].files == 2


def test_at_the_limit_fits_and_one_byte_over_after_rounding_is_over(tmp_path):
    # det totals are multiples of 3, and 99,614,720 is not: 99,614,718 is the largest total that fits.
    largest_fitting = DET_LIMIT_BYTES - DET_LIMIT_BYTES % 3
    big = sparse(tmp_path / "ctx" / "big.bin", largest_fitting)
    report = check_context(str(tmp_path / "ctx"))
    assert report.total_bytes == largest_fitting and report.fits and report.headroom_bytes == 2
    os.truncate(big, largest_fitting + 1)  # raw size still under the limit, det's rounding is not
    report = check_context(str(tmp_path / "ctx"))
    assert report.raw_bytes == largest_fitting + 1 <= DET_LIMIT_BYTES
    assert report.total_bytes == largest_fitting + 3 > DET_LIMIT_BYTES
    assert not report.fits and report.headroom_bytes == -1


def test_a_total_equal_to_the_limit_fits_strictly_greater_is_over(tmp_path):
    write(tmp_path / "f", b"x" * 300)
    assert check_context(str(tmp_path), limit=300).fits
    write(tmp_path / "g", b"x")
    assert not check_context(str(tmp_path), limit=302).fits  # 300 + 3
    assert check_context(str(tmp_path), limit=303).fits


def test_link_to_a_file_counts_the_target_bytes(tmp_path):
    write(tmp_path / "outside" / "weights.bin", b"w" * 1000)
    (tmp_path / "ctx").mkdir()
    os.symlink(tmp_path / "outside" / "weights.bin", tmp_path / "ctx" / "w.bin")
    report = check_context(str(tmp_path / "ctx"))
    assert files_of(report) == {"w.bin": 1000}
    assert report.total_bytes == 1002


def test_link_to_a_directory_is_uploaded_empty_with_a_warning(tmp_path):
    write(tmp_path / "outside" / "data" / "big.bin", b"b" * 5000)
    write(tmp_path / "ctx" / "train.py")
    os.symlink(tmp_path / "outside" / "data", tmp_path / "ctx" / "data")
    report = check_context(str(tmp_path / "ctx"))
    assert files_of(report) == {"train.py": 1}
    assert report.walked.dirs == ["data"]
    assert ("symlinked_dir", "data") in [(w.kind, w.path) for w in report.warnings]


def test_broken_link_is_skipped_with_a_warning(tmp_path):
    write(tmp_path / "ctx" / "a")
    os.symlink(tmp_path / "nowhere", tmp_path / "ctx" / "dangling")
    os.symlink("loop", tmp_path / "ctx" / "loop")
    report = check_context(str(tmp_path / "ctx"))
    assert files_of(report) == {"a": 1}
    kinds = sorted((w.kind, w.path) for w in report.warnings)
    assert kinds == [("broken_symlink", "dangling"), ("broken_symlink", "loop")]


def test_ignored_symlink_to_a_directory_is_not_listed(tmp_path):
    write(tmp_path / "outside" / "x")
    write(tmp_path / "ctx" / ".detignore", "data/\n")
    os.symlink(tmp_path / "outside", tmp_path / "ctx" / "data")
    report = check_context(str(tmp_path / "ctx"))
    assert report.walked.dirs == [] and report.warnings == []


def test_the_root_is_resolved_first(tmp_path):
    write(tmp_path / "real" / "sub" / "f", b"abcd")
    write(tmp_path / "real" / ".detignore", "/sub/\n")
    os.symlink(tmp_path / "real", tmp_path / "alias")
    report = check_context(str(tmp_path / "alias"))
    assert report.roots[0].path == str((tmp_path / "real").resolve())
    assert files_of(report) == {}


def test_directory_include_lands_under_its_name_with_its_own_detignore(tmp_path):
    write(tmp_path / "ctx" / "model.py")
    write(tmp_path / "ctx" / ".detignore", "*.txt\n")  # does not apply to the include
    write(tmp_path / "shared" / "utils" / "u.py", b"uu")
    write(tmp_path / "shared" / "utils" / "notes.txt", b"n")
    write(tmp_path / "shared" / "utils" / "skip.bin", b"s")
    write(tmp_path / "shared" / "utils" / ".detignore", "*.bin\n")
    report = check_context(str(tmp_path / "ctx"), [str(tmp_path / "shared" / "utils")])
    assert files_of(report) == {"model.py": 1, "utils/u.py": 2, "utils/notes.txt": 1}
    assert "utils" in report.walked.dirs


def test_file_include_lands_at_the_top_by_its_resolved_name(tmp_path):
    write(tmp_path / "ctx" / "model.py")
    write(tmp_path / "cfg" / "real.yaml", b"abc")
    os.symlink(tmp_path / "cfg" / "real.yaml", tmp_path / "alias.yaml")
    report = check_context(str(tmp_path / "ctx"), [str(tmp_path / "alias.yaml")])
    assert files_of(report) == {"model.py": 1, "real.yaml": 3}


def test_include_colliding_with_a_top_level_entry_is_a_usage_error(tmp_path):
    write(tmp_path / "ctx" / "utils" / "a.py")
    write(tmp_path / "other" / "utils" / "b.py")
    with pytest.raises(UsageError, match="duplicate top-level path.*'utils'"):
        check_context(str(tmp_path / "ctx"), [str(tmp_path / "other" / "utils")])


def test_two_includes_with_the_same_name_collide(tmp_path):
    write(tmp_path / "ctx" / "m.py")
    write(tmp_path / "a" / "lib" / "x")
    write(tmp_path / "b" / "lib" / "y")
    with pytest.raises(UsageError, match="'lib'"):
        check_context(str(tmp_path / "ctx"), [str(tmp_path / "a" / "lib"), str(tmp_path / "b" / "lib")])


def test_an_ignored_top_level_entry_does_not_collide(tmp_path):
    write(tmp_path / "ctx" / "utils" / "a.py")
    write(tmp_path / "ctx" / ".detignore", "/utils/\n")
    write(tmp_path / "other" / "utils" / "b.py")
    report = check_context(str(tmp_path / "ctx"), [str(tmp_path / "other" / "utils")])
    assert files_of(report) == {"utils/b.py": 1}


def test_missing_context_include_and_file_context(tmp_path):
    with pytest.raises(NotFound):
        check_context(str(tmp_path / "nope"))
    (tmp_path / "ctx").mkdir()
    with pytest.raises(NotFound, match="include"):
        check_context(str(tmp_path / "ctx"), [str(tmp_path / "missing")])
    write(tmp_path / "file.py")
    with pytest.raises(UsageError, match="must be a directory"):
        check_context(str(tmp_path / "file.py"))


def test_remedy_lines_bring_it_under_and_are_verified(tmp_path):
    ctx = tmp_path / "ctx"
    write(ctx / "model.py", b"code")
    sparse(ctx / "data" / "train.bin", 60 << 20)
    sparse(ctx / "data" / "val.bin", 10 << 20)
    sparse(ctx / "weights" / "init.pt", 30 << 20)
    sparse(ctx / "src" / "big_table.py", 20 << 20)
    report = check_context(str(ctx))
    assert not report.fits and report.remedy is not None
    remedy = report.remedy
    assert remedy.lines == {str(ctx.resolve() / ".detignore"): ["/data/"]}
    assert remedy.fits_after and remedy.total_after == report.total_bytes - report.dirs["data"].det_bytes
    assert remedy.hook_paths == ["data"]
    # Appending the lines for real gives the promised total.
    write(ctx / ".detignore", "\n".join(remedy.lines[str(ctx.resolve() / ".detignore")]) + "\n")
    assert check_context(str(ctx)).total_bytes == remedy.total_after


def test_remedy_escapes_glob_characters(tmp_path):
    ctx = tmp_path / "ctx"
    sparse(ctx / "run[1]*" / "ckpt.bin", 100 << 20)
    write(ctx / "run1x" / "keep.py")
    report = check_context(str(ctx))
    assert report.remedy is not None and report.remedy.fits_after
    assert list(report.remedy.lines.values()) == [["/run\\[1]\\*/"]]
    assert report.remedy.total_after == 3


def test_remedy_prefers_one_line_for_a_directory_of_shards_over_code(tmp_path):
    ctx = tmp_path / "ctx"
    for i in range(6):
        sparse(ctx / "out" / "shards" / f"train-{i:04d}.tar", 20 << 20)
    write(ctx / "out" / "shards" / "index.txt", b"i")
    sparse(ctx / "out" / "report.bin", 1 << 20)
    write(ctx / "out" / "make_shards.py", b"code")  # out/ holds code: only out/shards/ is data
    sparse(ctx / ".venv" / "lib" / "big.so", 100 << 20)
    write(ctx / ".venv" / "pyvenv.cfg")
    report = check_context(str(ctx))
    assert report.remedy is not None and report.remedy.fits_after
    lines = report.remedy.lines[str(ctx.resolve() / ".detignore")]
    assert lines == ["/out/shards/", "/.venv/"]
    assert report.remedy.hook_paths == ["out/shards"]  # a virtualenv is not data for a bucket


def test_warnings_for_environments_caches_checkpoints_data_and_secrets(tmp_path):
    ctx = tmp_path / "ctx"
    for rel in [
        ".venv/pyvenv.cfg",
        "env2/bin/activate",
        ".cache/pip/x",
        ".env",
        ".env.example",
        "keys/id_rsa",
        "keys/id_rsa.pub",
        "tls/server.pem",
        "aws/credentials",
        "model.py",
        "empty_data/data/",
        "src/data/tiny.json",
    ]:
        if rel.endswith("/"):
            (ctx / rel).mkdir(parents=True)
        else:
            write(ctx / rel)
    sparse(ctx / "checkpoints" / "e1.pt", 2 << 20)
    sparse(ctx / "data" / "train.csv", 2 << 20)
    kinds = {(w.kind, w.path) for w in check_context(str(ctx)).warnings}
    assert kinds == {
        ("virtualenv", ".venv"),
        ("virtualenv", "env2"),
        ("cache", ".cache"),
        ("checkpoints", "checkpoints"),
        ("data", "data"),
        ("secret", ".env"),
        ("secret", "keys/id_rsa"),
        ("secret", "tls/server.pem"),
        ("secret", "aws/credentials"),
    }


def test_nested_detignore_warning_suggests_lifted_rules(tmp_path):
    write(tmp_path / "data" / ".detignore", "# only comments count as nothing\n*.bin\n!keep.bin\n/top.txt\nsub/x\n")
    write(tmp_path / "data" / "a.bin")
    (warning,) = [w for w in check_context(str(tmp_path)).warnings if w.kind == "nested_detignore"]
    assert warning.path == "data/.detignore"
    assert warning.message.endswith("'/data/**/*.bin', '!/data/**/keep.bin', '/data/top.txt', '/data/sub/x'")
    # The suggestion does what the nested file meant: lifted into the top-level .detignore,
    # data/a.bin is dropped.
    write(tmp_path / ".detignore", "/data/**/*.bin\n!/data/**/keep.bin\n/data/top.txt\n/data/sub/x\n")
    assert "data/a.bin" not in check_context(str(tmp_path)).walked.files


def test_never_reads_file_contents(tmp_path):
    ctx = tmp_path / "ctx"
    write(ctx / "a.bin", b"abc")
    os.chmod(ctx / "a.bin", 0o000)
    os.mkfifo(ctx / "pipe")  # opening a fifo for reading would block forever
    report = check_context(str(ctx))
    readable_by_us = os.geteuid() == 0
    assert ("a.bin" in report.walked.files) == readable_by_us
    assert ("special_file", "pipe") in [(w.kind, w.path) for w in report.warnings]


def test_read_permission_check_follows_owner_group_other_bits(monkeypatch):
    from lading.context.walk import _read_permission_check

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getegid", lambda: 100)
    monkeypatch.setattr(os, "getgroups", lambda: [100, 200])
    readable = _read_permission_check()
    assert readable is not None

    def info(mode: int, uid: int, gid: int) -> os.stat_result:
        return os.stat_result((mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))

    assert readable(info(0o100400, 1000, 0))  # owner may read
    assert not readable(info(0o100044, 1000, 100))  # owner bits decide for the owner
    assert readable(info(0o100040, 1, 200))  # a supplementary group may read
    assert not readable(info(0o100004, 1, 200))  # group bits decide for a member
    assert readable(info(0o100004, 1, 1))  # others may read
    assert not readable(info(0o100440, 1, 1))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert _read_permission_check() is None  # root reads everything


def test_remedy_for_an_include_goes_to_the_includes_detignore(tmp_path):
    write(tmp_path / "ctx" / "model.py")
    sparse(tmp_path / "assets" / "datasets" / "big.parquet", 100 << 20)
    write(tmp_path / "assets" / "vocab.txt", b"v")
    report = check_context(str(tmp_path / "ctx"), [str(tmp_path / "assets")])
    assert report.remedy is not None and report.remedy.fits_after
    assert report.remedy.lines == {str((tmp_path / "assets").resolve() / ".detignore"): ["/datasets/"]}
    assert report.remedy.paths[0][0] == "assets/datasets"


def test_explain_through_includes_and_symlinked_directories(tmp_path):
    from lading.context.detignore import IgnoreSpec
    from lading.context.explain import explain, upload_name
    from lading.context.walk import resolve_roots

    write(tmp_path / "ctx" / "model.py")
    write(tmp_path / "elsewhere" / "inner.py")
    os.symlink(tmp_path / "elsewhere", tmp_path / "ctx" / "linked")
    write(tmp_path / "lib" / "util.py")
    write(tmp_path / "lib" / ".detignore", "*.tmp\n")
    write(tmp_path / "lib" / "scratch.tmp")
    roots = resolve_roots(str(tmp_path / "ctx"), [str(tmp_path / "lib")])
    specs = [IgnoreSpec.for_root(root.path) for root in roots]

    def decide(given: str):
        return explain(roots, specs, upload_name(roots, given))

    assert decide("lib").uploaded and "-i/--include" in decide("lib").reason
    tmp = decide("lib/scratch.tmp")
    assert not tmp.uploaded and tmp.rule is not None and tmp.rule.source.endswith("lib/.detignore")
    assert decide(str(tmp_path / "lib" / "util.py")).path == "lib/util.py"
    inner = decide("linked/inner.py")
    assert not inner.uploaded and "symlink to a directory" in inner.reason
    linked = decide("linked")
    assert linked.uploaded and linked.kind == "directory" and "empty directory" in linked.reason
