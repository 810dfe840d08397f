"""`lading bind-mounts`: det's bind_mounts schema, host paths that exist, and --suggest."""

from __future__ import annotations

import json

import yaml
from lading.context.bindmounts import validate_bind_mounts


def _problems(entry: dict, exists=None) -> list[str]:
    return [p.message for p in validate_bind_mounts({"bind_mounts": [entry]}, exists)]


def _one(entry: dict, needle: str) -> None:
    problems = _problems(entry)
    assert len(problems) == 1 and needle in problems[0], problems


def test_det_schema_rules():
    assert (
        _problems({"host_path": "/data", "container_path": "/data", "read_only": True, "propagation": "rslave"}) == []
    )
    two = _problems({"host_path": "data", "container_path": "."})
    assert len(two) == 2 and "absolute" in two[0] and 'must not be "."' in two[1]
    _one({"container_path": "/x"}, "host_path is required")
    _one({"host_path": "/d", "container_path": "/d", "read_only": "yes"}, "read_only")
    _one({"host_path": "/d", "container_path": "/d", "propagation": 3}, "propagation must be a string")
    _one({"host_path": "/d", "container_path": "/d", "mode": "ro"}, "unknown key 'mode'")


def test_null_read_only_and_propagation_are_allowed_as_in_det():
    assert _problems({"host_path": "/d", "container_path": "/d", "read_only": None, "propagation": None}) == []


def test_runtime_propagation_values_and_missing_host_paths_are_flagged_beyond_det():
    problems = validate_bind_mounts(
        {"bind_mounts": [{"host_path": "/nowhere", "container_path": "/d", "propagation": "sideways"}]},
        exists=lambda p: False,
    )
    assert len(problems) == 2 and not any(p.det_schema for p in problems)
    assert "sideways" in problems[0].message and "does not exist" in problems[1].message


def test_bind_mounts_must_be_a_list():
    assert "must be a list" in validate_bind_mounts({"bind_mounts": {"host_path": "/d"}})[0].message
    assert validate_bind_mounts({}) == [] and validate_bind_mounts({"bind_mounts": None}) == []


def test_cli_ok_and_problem_exit_codes(lading, tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(
        yaml.safe_dump({"bind_mounts": [{"host_path": str(tmp_path), "container_path": "/data", "read_only": True}]})
    )
    result = lading("bind-mounts", str(good))
    assert result.returncode == 0 and "1 bind mount(s), ok" in result.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "bind_mounts": [
                    {"host_path": "relative", "container_path": "."},
                    {"host_path": str(tmp_path / "missing"), "container_path": "/m"},
                ]
            }
        )
    )
    result = lading("bind-mounts", str(bad), "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["bind_mounts"] == 2
    messages = [p["message"] for p in report["problems"]]
    assert len(messages) == 3 and [p["det_schema"] for p in report["problems"]] == [True, True, False]
    assert messages[2].startswith("bind_mounts[1]: host_path") and "does not exist" in messages[2]


def test_cli_unreadable_yaml_is_2_and_missing_file_is_3(lading, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("bind_mounts: [\n  - host_path: /x\n")
    result = lading("bind-mounts", str(broken))
    assert result.returncode == 2 and "not valid YAML" in result.stderr and "Traceback" not in result.stderr
    assert lading("bind-mounts", str(tmp_path / "nope.yaml")).returncode == 3


def test_cli_reads_det_experiment_config_when_no_file_given(lading, tmp_path):
    env = {"DET_EXPERIMENT_CONFIG": json.dumps({"bind_mounts": [{"host_path": "x", "container_path": "/x"}]})}
    result = lading("bind-mounts", env=env)
    assert result.returncode == 1 and "absolute" in result.stdout


def test_suggest_prints_a_read_only_same_path_snippet(lading, tmp_path):
    data = tmp_path / "datasets"
    data.mkdir()
    result = lading("bind-mounts", "--suggest", str(data))
    assert result.returncode == 0
    snippet = yaml.safe_load(result.stdout)
    assert snippet == {"bind_mounts": [{"host_path": str(data), "container_path": str(data), "read_only": True}]}
    assert validate_bind_mounts(snippet, exists=lambda p: True) == []
    absent = lading("bind-mounts", "--suggest", str(tmp_path / "absent"), "--suggest", str(data))
    assert absent.returncode == 0  # normal on a laptop: the path lives on the agent hosts
    assert [m["host_path"] for m in yaml.safe_load(absent.stdout)["bind_mounts"]] == [
        str(tmp_path / "absent"),
        str(data),
    ]
    assert absent.stderr.startswith("lading: warning: ") and "absent does not exist on this machine" in absent.stderr
    assert len(absent.stderr.splitlines()) == 1
