"""SageMaker augmented manifests (JSON Lines with ``*-ref`` attributes): parsing, and `lading sync
--manifest` fetching every referenced object once and writing DEST/manifest.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lading.core.errors import UsageError
from lading.selection.manifest import keys_under, load_manifest, parse_manifest, record_keys
from proxies import FaultProxy
from sync_fixtures import object_gets, put_objects, s3_client

BUCKET = "aug-bucket"
SOURCE = f"s3://{BUCKET}/data"

LINES = [
    {"source-ref": f"{SOURCE}/img/0.jpg", "class": 0},
    {
        "source-ref": f"{SOURCE}/img/1.jpg",
        "mask-ref": f"{SOURCE}/masks/1.png",
        "class": 1,
        "mask-ref-metadata": {"internal-color-map": {"0": "bg"}},
    },
    {"source-ref": f"{SOURCE}/img/2.jpg", "class": 2, "note": "ünïcode"},
    {"source-ref": f"{SOURCE}/img/0.jpg", "class": 9},  # the same image again: fetched once
    {"source-ref": f"{SOURCE}/img/3.jpg", "mask-ref": f"{SOURCE}/masks/3.png", "class": 3},
    {"source-ref": f"{SOURCE}/img/4.jpg", "class": 4},
]
OBJECTS = {f"img/{i}.jpg": bytes([i]) * (100 + i) for i in range(5)}
OBJECTS.update({"masks/1.png": b"m1" * 30, "masks/3.png": b"m3" * 40, "unreferenced.bin": b"u"})


def jsonl(lines) -> str:
    return "".join(json.dumps(line) + "\n" for line in lines)


# -- parsing -------------------------------------------------------------------------------------


def test_parse_records_refs_and_attributes():
    manifest = parse_manifest(jsonl(LINES) + "\n", "train.manifest")
    assert manifest.augmented and manifest.prefix is None
    assert len(manifest.records) == len(LINES)
    second = manifest.records[1]
    assert second.line == 2
    assert dict(second.refs) == {"source-ref": f"{SOURCE}/img/1.jpg", "mask-ref": f"{SOURCE}/masks/1.png"}
    assert dict(second.attributes) == {"class": 1, "mask-ref-metadata": {"internal-color-map": {"0": "bg"}}}
    assert keys_under(manifest, SOURCE) == [
        "img/0.jpg",
        "img/1.jpg",
        "masks/1.png",
        "img/2.jpg",
        "img/3.jpg",
        "masks/3.png",
        "img/4.jpg",
    ]
    assert record_keys(parse_manifest(jsonl(LINES[:1])), f"{SOURCE}/img") == [{"source-ref": "0.jpg"}]
    # keys relative to SOURCE, absolute paths and file:// URIs for a local source
    local = parse_manifest('{"a-ref": "x/1.bin"}\n{"a-ref": "/d/x/2.bin"}\n{"a-ref": "file:///d/x/3.bin"}\n')
    assert keys_under(local, "/d") == ["x/1.bin", "x/2.bin", "x/3.bin"]


@pytest.mark.parametrize(
    "text,needle",
    [
        ('{"source-ref": "s3://b/a"}\n{"source-ref": \n', "m.jsonl line 2: invalid JSON at column"),
        ('{"source-ref": "s3://b/a"}\n[1, 2]\n', "m.jsonl line 2: a JSON list, not an object"),
        ('{"source-ref": 3}\n', "m.jsonl line 1: 'source-ref' must name an object"),
        ('{"source-ref": ""}\n', "m.jsonl line 1: 'source-ref' must name an object"),
        ('{"source": "inline text", "class": 1}\n', "without any '-ref' attribute"),
        ('{"prefix": "s3://b/p/"}\n', "without any '-ref' attribute"),
    ],
)
def test_malformed_augmented_manifests(text, needle):
    with pytest.raises(UsageError) as info:
        parse_manifest(text, "m.jsonl")
    assert needle in info.value.message


def test_a_ref_outside_source_names_the_line():
    manifest = parse_manifest(jsonl(LINES[:2] + [{"source-ref": "s3://other/img/9.jpg"}]), "m.jsonl")
    with pytest.raises(UsageError) as info:
        keys_under(manifest, SOURCE)
    assert "m.jsonl line 3: source-ref 's3://other/img/9.jpg' is not under the source" in info.value.message


def test_json_documents_are_still_manifest_files(tmp_path):
    path = tmp_path / "m.json"
    path.write_text('[{"prefix": "s3://b/p/"}, "a", "b"]')
    assert not load_manifest(path).augmented
    path.write_text('{\n  "prefix": "s3://b/p/"\n}\n')  # an object over several lines: not JSON Lines
    with pytest.raises(UsageError, match="JSON array"):
        load_manifest(path)


# -- sync ----------------------------------------------------------------------------------------


@pytest.fixture
def bucket(s3_env):
    put_objects(s3_client(s3_env), OBJECTS, bucket=BUCKET, prefix="data")
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        yield {"AWS_ENDPOINT_URL": proxy.url}, proxy


def local_lines(dest: Path) -> list[dict]:
    return [json.loads(line) for line in (dest / "manifest.jsonl").read_text(encoding="utf-8").splitlines()]


def test_sync_fetches_each_referenced_object_once_and_writes_manifest_jsonl(lading, bucket, tmp_path):
    env, proxy = bucket
    manifest = tmp_path / "train.manifest"
    manifest.write_text(jsonl(LINES))
    dest = tmp_path / "out"
    result = lading("sync", SOURCE, str(dest), "--manifest", str(manifest), "--json", env=env)
    assert result.returncode == 0, result.stderr
    referenced = sorted(OBJECTS.keys() - {"unreferenced.bin"})
    assert json.loads(result.stdout)["files"] == len(referenced) == 7
    assert object_gets(proxy) == 7 and not (dest / "unreferenced.bin").exists()
    for key in referenced:
        assert (dest / key).read_bytes() == OBJECTS[key]
    lines = local_lines(dest)
    assert [line["class"] for line in lines] == [0, 1, 2, 9, 3, 4]
    assert lines[1] == {
        "source-ref": "img/1.jpg",
        "mask-ref": "masks/1.png",
        "class": 1,
        "mask-ref-metadata": {"internal-color-map": {"0": "bg"}},
    }
    assert lines[2]["note"] == "ünïcode"
    for line in lines:  # every ref is a path relative to DEST (where manifest.jsonl is)
        for name, value in line.items():
            if name.endswith("-ref"):
                assert (dest / value).is_file()
    written = (dest / "manifest.jsonl").stat().st_mtime_ns

    proxy.reset_counts()
    result = lading("sync", SOURCE, str(dest), "--manifest", str(manifest), "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert object_gets(proxy) == 0 and json.loads(result.stdout)["skipped"] == 7
    assert (dest / "manifest.jsonl").stat().st_mtime_ns == written  # unchanged, not rewritten


def test_sharded_ranks_get_whole_lines(lading, bucket, tmp_path):
    env, _ = bucket
    manifest = tmp_path / "train.manifest"
    manifest.write_text(jsonl(LINES))
    seen_lines: list[int] = []
    for rank in range(2):
        dest = tmp_path / f"r{rank}"
        result = lading(
            "sync",
            SOURCE,
            str(dest),
            "--manifest",
            str(manifest),
            "--distribution",
            "sharded",
            "--rank",
            str(rank),
            "--world-size",
            "2",
            "-q",
            env=env,
        )
        assert result.returncode == 0, result.stderr
        lines = local_lines(dest)
        assert lines, "each rank gets some lines"
        for line in lines:  # a line's image and mask are on the same rank
            for name, value in line.items():
                if name.endswith("-ref"):
                    assert (dest / value).read_bytes() == OBJECTS[value]
        seen_lines += [line["class"] for line in lines]
    assert sorted(seen_lines) == sorted(line["class"] for line in LINES)  # every line exactly once


def test_filters_keep_refs_they_leave_out_as_locations(lading, bucket, tmp_path):
    env, proxy = bucket
    manifest = tmp_path / "train.manifest"
    manifest.write_text(jsonl(LINES))
    dest = tmp_path / "out"
    result = lading("sync", SOURCE, str(dest), "--manifest", str(manifest), "--exclude", "masks/*", "-q", env=env)
    assert result.returncode == 0, result.stderr
    lines = local_lines(dest)
    assert lines[1]["source-ref"] == "img/1.jpg" and lines[1]["mask-ref"] == f"{SOURCE}/masks/1.png"
    assert not (dest / "masks").exists()


def test_a_ref_outside_source_is_one_line_exit_2(lading, bucket, tmp_path):
    env, proxy = bucket
    manifest = tmp_path / "train.manifest"
    manifest.write_text(jsonl(LINES[:2] + [{"source-ref": f"s3://{BUCKET}/elsewhere/x.jpg", "class": 7}]))
    result = lading("sync", SOURCE, str(tmp_path / "out"), "--manifest", str(manifest), env=env)
    assert result.returncode == 2
    assert "train.manifest line 3: source-ref" in result.stderr and "not under the source" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    assert object_gets(proxy) == 0


def test_an_object_named_manifest_jsonl_is_refused(lading, bucket, s3_env, tmp_path):
    env, _ = bucket
    s3_client(s3_env).put_object(Bucket=BUCKET, Key="data/manifest.jsonl", Body=b"{}")
    manifest = tmp_path / "train.manifest"
    manifest.write_text(jsonl([{"source-ref": f"{SOURCE}/manifest.jsonl"}]))
    result = lading("sync", SOURCE, str(tmp_path / "out"), "--manifest", str(manifest), env=env)
    assert result.returncode == 2 and "manifest.jsonl" in result.stderr and not (tmp_path / "out").exists()


def test_dry_run_writes_nothing(lading, bucket, tmp_path):
    env, _ = bucket
    manifest = tmp_path / "train.manifest"
    manifest.write_text(jsonl(LINES))
    result = lading("sync", SOURCE, str(tmp_path / "out"), "--manifest", str(manifest), "--dry-run", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["totals"]["fetch_files"] == 7 and not (tmp_path / "out").exists()
