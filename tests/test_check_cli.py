"""`lading check` as users run it: exit codes, --json, --limit, --explain, --config, errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from lading.context import parse_size
from lading.core.errors import UsageError


def write(path: Path, content: bytes | str = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


@pytest.fixture
def small_ctx(tmp_path: Path) -> Path:
    ctx = tmp_path / "model"
    write(ctx / "model_def.py", b"a" * 10)
    write(ctx / "lib" / "util.py", b"b" * 4)
    write(ctx / "notes.log", b"c" * 7)
    write(ctx / ".detignore", "# logs are noise\n*.log\n")
    return ctx


@pytest.fixture
def big_ctx(tmp_path: Path) -> Path:
    ctx = tmp_path / "big"
    write(ctx / "train.py", b"code")
    sparse(ctx / "data" / "shard-0.bin", 70 << 20)
    sparse(ctx / "data" / "shard-1.bin", 30 << 20)
    return ctx


def assert_one_line_error(result, code: int, text: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lading: error:") and text in lines[0], result.stderr


def test_json_shape_and_only_json_on_stdout(lading, small_ctx):
    result = lading("check", str(small_ctx), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)  # the whole stdout is one JSON document
    assert doc["fits"] is True
    assert doc["limit_bytes"] == 99_614_720
    assert doc["files"] == [{"path": "lib/util.py", "size": 4}, {"path": "model_def.py", "size": 10}]
    assert doc["total_bytes"] == 6 + 12 and doc["raw_bytes"] == 14
    assert doc["headroom_bytes"] == 99_614_720 - 18
    assert [d["path"] for d in doc["directories"]] == ["lib"]
    assert doc["directories"][0] == {"path": "lib", "files": 1, "size": 4, "det_bytes": 6}
    assert doc["warnings"] == [] and doc["remedy"] is None


def test_over_the_limit_exits_1_with_remedy_in_json(lading, big_ctx):
    result = lading("check", str(big_ctx), "--json")
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["fits"] is False and doc["total_bytes"] > doc["limit_bytes"]
    remedy = doc["remedy"]
    assert remedy["fits_after"] is True
    assert remedy["detignore_lines"] == {str(big_ctx.resolve() / ".detignore"): ["/data/"]}
    assert remedy["total_bytes_after"] == 6


def test_human_output_verdict_tables_remedy_and_hook_route(lading, big_ctx):
    result = lading("check", str(big_ctx), "--top", "1")
    assert result.returncode == 1
    out = result.stdout
    assert "over the limit by" in out
    assert "data/shard-0.bin" in out and "data/shard-1.bin" not in out  # --top 1
    assert "/data/" in out and "startup hook" in out
    assert "data directory" in out  # the data warning


def test_quiet_prints_only_the_verdict(lading, small_ctx):
    result = lading("-q", "check", str(small_ctx))
    assert result.returncode == 0
    assert result.stdout.strip().startswith("fits:") and len(result.stdout.strip().splitlines()) == 1


def test_top_limits_json_lists(lading, small_ctx):
    doc = json.loads(lading("check", str(small_ctx), "--json", "--top", "1").stdout)
    assert doc["largest_files"] == [{"path": "model_def.py", "size": 10}]
    assert len(doc["largest_directories"]) == 1


def test_include_option(lading, small_ctx, tmp_path):
    write(tmp_path / "shared" / "helpers" / "h.py", b"hh")
    doc = json.loads(lading("check", str(small_ctx), "-i", str(tmp_path / "shared" / "helpers"), "--json").stdout)
    assert {"path": "helpers/h.py", "size": 2} in doc["files"]
    assert doc["includes"] == [{"path": str((tmp_path / "shared" / "helpers").resolve()), "name": "helpers"}]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("95MiB", 99_614_720),
        ("96MB", 96_000_000),
        ("100MiB", 104_857_600),
        ("123", 123),
        ("1.5GiB", 1_610_612_736),
        ("100 MiB", 104_857_600),
        ("2kb", 2000),
        ("7B", 7),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-5", "0", "10M", "1.2.3MB", "5 parsecs", "MiB"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        parse_size(text)


def test_limit_option_changes_the_verdict(lading, small_ctx):
    assert lading("check", str(small_ctx), "--limit", "18").returncode == 0
    result = lading("check", str(small_ctx), "--limit", "17", "--json")
    assert result.returncode == 1 and json.loads(result.stdout)["limit_bytes"] == 17


@pytest.mark.parametrize("bad", ["abc", "-5", "0", "10M"])
def test_bad_limit_is_usage_error(lading, small_ctx, bad):
    result = lading("check", str(small_ctx), "--limit", bad)
    assert_one_line_error(result, 2, "'--limit': invalid size")  # the option named, as mount's --cache-size


def test_missing_directory_is_not_found(lading, tmp_path):
    assert_one_line_error(lading("check", str(tmp_path / "nope")), 3, "does not exist")


def test_context_that_is_a_file_is_usage_error(lading, tmp_path):
    write(tmp_path / "model.py")
    assert_one_line_error(lading("check", str(tmp_path / "model.py")), 2, "must be a directory")


def test_missing_include_is_not_found(lading, small_ctx, tmp_path):
    assert_one_line_error(lading("check", str(small_ctx), "-i", str(tmp_path / "gone")), 3, "include")


def test_colliding_include_is_usage_error(lading, small_ctx, tmp_path):
    write(tmp_path / "elsewhere" / "lib" / "x.py")
    result = lading("check", str(small_ctx), "-i", str(tmp_path / "elsewhere" / "lib"))
    assert_one_line_error(result, 2, "'lib'")


def test_bad_detignore_pattern_is_usage_error(lading, small_ctx):
    write(small_ctx / ".detignore", "fine\ntrailing\\\n")
    assert_one_line_error(lading("check", str(small_ctx)), 2, ".detignore line 2")


def test_bad_top_is_usage_error(lading, small_ctx):
    result = lading("check", str(small_ctx), "--top", "-1")
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_explain_ignored_by_pattern_with_file_and_line(lading, small_ctx):
    result = lading("check", str(small_ctx), "--explain", "notes.log")
    assert result.returncode == 0
    assert "not uploaded" in result.stdout
    assert "'*.log'" in result.stdout and f"{small_ctx.resolve()}/.detignore line 2" in result.stdout


def test_explain_ends_with_a_verdict_that_names_the_whole_context(lading, small_ctx):
    result = lading("check", str(small_ctx), "--explain", "notes.log", "--limit", "10B")
    lines = result.stdout.splitlines()
    assert result.returncode == 1 and lines[0].startswith("notes.log (file): not uploaded"), result.stdout
    assert lines[-1].startswith("the whole context: over the limit by "), result.stdout


def test_explain_json_for_reincluded_pruned_default_and_detignore(lading, small_ctx):
    write(small_ctx / "keep.log", b"k")
    write(small_ctx / "out" / "keep.log", b"k")
    write(small_ctx / ".detignore", "*.log\n!keep.log\nout/\n")
    write(small_ctx / "__pycache__" / "m.pyc")

    def explain(path: str) -> dict:
        return json.loads(lading("check", str(small_ctx), "--json", "--explain", path).stdout)["explain"]

    kept = explain("keep.log")
    assert kept["uploaded"] is True
    assert kept["rule"] == {
        "pattern": "!keep.log",
        "source": str(small_ctx.resolve() / ".detignore"),
        "line": 2,
        "negated": True,
    }
    pruned = explain("out/keep.log")
    assert pruned["uploaded"] is False and pruned["rule"]["pattern"] == "out/"
    assert "its directory 'out/'" in pruned["reason"]
    default = explain("__pycache__/m.pyc")
    assert default["uploaded"] is False and default["rule"]["source"] == "det's default ignores"
    assert default["rule"]["pattern"] == "__pycache__/"
    assert explain(".detignore")["uploaded"] is False
    plain = explain("model_def.py")
    assert plain["uploaded"] is True and plain["rule"] is None and plain["kind"] == "file"


def test_explain_accepts_a_path_through_the_context(lading, small_ctx):
    absolute = str(small_ctx / "lib" / "util.py")
    doc = json.loads(lading("check", str(small_ctx), "--json", "--explain", absolute).stdout)
    assert doc["explain"]["path"] == "lib/util.py" and doc["explain"]["uploaded"] is True
    outside = lading("check", str(small_ctx), "--explain", "/etc/hostname")
    assert_one_line_error(outside, 2, "outside the context")


def test_config_inside_context_and_bind_mount_schema(lading, small_ctx):
    write(
        small_ctx / "const.yaml",
        "name: x\nbind_mounts:\n"
        "  - host_path: data\n    container_path: .\n"
        "  - host_path: /mnt/ok\n    container_path: /data\n",
    )
    doc = json.loads(lading("check", str(small_ctx), "--json", "--config", str(small_ctx / "const.yaml")).stdout)
    found = {(w["kind"], w["path"]) for w in doc["warnings"]}
    assert ("config_in_context", "const.yaml") in found
    messages = [w["message"] for w in doc["warnings"] if w["kind"] == "bind_mounts"]
    assert messages == [
        "bind_mounts[0]: host_path must be an absolute path (got 'data')",
        'bind_mounts[0]: container_path must not be "."',
    ]


def test_config_outside_context_or_ignored_is_not_flagged(lading, small_ctx, tmp_path):
    write(tmp_path / "const.yaml", "name: x\nbind_mounts:\n  - host_path: /a\n    container_path: /b\n")
    doc = json.loads(lading("check", str(small_ctx), "--json", "--config", str(tmp_path / "const.yaml")).stdout)
    assert doc["warnings"] == []
    write(small_ctx / "const.yaml", "name: x\n")
    write(small_ctx / ".detignore", "const.yaml\n")
    doc = json.loads(lading("check", str(small_ctx), "--json", "--config", str(small_ctx / "const.yaml")).stdout)
    assert doc["warnings"] == []


def test_config_errors(lading, small_ctx, tmp_path):
    assert_one_line_error(lading("check", str(small_ctx), "--config", str(tmp_path / "no.yaml")), 3, "no.yaml")
    write(tmp_path / "bad.yaml", "name: [unclosed\n")
    assert_one_line_error(lading("check", str(small_ctx), "--config", str(tmp_path / "bad.yaml")), 2, "YAML")
    write(tmp_path / "list.yaml", "- a\n- b\n")
    assert_one_line_error(lading("check", str(small_ctx), "--config", str(tmp_path / "list.yaml")), 2, "mapping")


def test_help_teaches(lading):
    result = lading("check", "--help")
    assert result.returncode == 0
    for text in ("--explain", "--limit", "--include", "99,614,720", "Exit codes"):
        assert text in result.stdout
    # --fix uploads: a store that stays unreachable is exit 5, as everywhere (the help listed 0-4)
    assert "5 transient failure after retries" in " ".join(result.stdout.split())


def test_default_context_is_the_current_directory(lading, small_ctx):
    result = lading("check", "--json", cwd=small_ctx)
    assert result.returncode == 0
    assert json.loads(result.stdout)["context"] == str(small_ctx.resolve())


def test_symlinked_dir_and_broken_link_warnings_in_json(lading, small_ctx, tmp_path):
    write(tmp_path / "elsewhere" / "x.bin", b"123")
    os.symlink(tmp_path / "elsewhere", small_ctx / "linked")
    os.symlink(tmp_path / "missing", small_ctx / "dangling")
    doc = json.loads(lading("check", str(small_ctx), "--json").stdout)
    assert {(w["kind"], w["path"]) for w in doc["warnings"]} == {
        ("symlinked_dir", "linked"),
        ("broken_symlink", "dangling"),
    }
    assert "linked" in [d["path"] for d in doc["directories"]]
    assert all(not f["path"].startswith("linked/") for f in doc["files"])


def test_unreadable_config_is_a_one_line_error(lading, small_ctx):
    # /proc/self/mem opens but cannot be read from offset 0: an I/O error, not a missing file.
    result = lading("check", str(small_ctx), "--config", "/proc/self/mem")
    assert result.returncode == 1
    assert "cannot read config file" in result.stderr and "internal error" not in result.stderr
    assert "Traceback" not in result.stderr
