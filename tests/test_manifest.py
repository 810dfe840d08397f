"""Manifest parsing: SageMaker ManifestFile JSON and plain key lists."""

from __future__ import annotations

import pytest
from lading.core.errors import NotFound, UsageError
from lading.selection.manifest import keys_under, load_manifest, parse_manifest


def test_manifest_file_json_relative_to_source():
    manifest = parse_manifest('[{"prefix": "s3://bkt/data/train/"}, "a.jpg", "sub/b.jpg"]')
    assert manifest.prefix == "s3://bkt/data/train/"
    assert keys_under(manifest, "s3://bkt/data") == ["train/a.jpg", "train/sub/b.jpg"]
    assert keys_under(manifest, "s3://bkt/data/train/") == ["a.jpg", "sub/b.jpg"]


def test_manifest_prefix_outside_source_is_refused():
    manifest = parse_manifest('[{"prefix": "s3://other/x/"}, "a"]')
    with pytest.raises(UsageError, match="not under the source"):
        keys_under(manifest, "s3://bkt/data")


def test_plain_list_with_comments_blank_lines_and_full_uris():
    manifest = parse_manifest("# keys\na/1\n\n  a/2  \ns3://bkt/data/a/3\na/1\n")
    assert manifest.prefix is None
    assert keys_under(manifest, "s3://bkt/data") == ["a/1", "a/2", "a/3"]


def test_local_source(tmp_path):
    manifest = parse_manifest(f'[{{"prefix": "{tmp_path}/"}}, "x/y"]')
    assert keys_under(manifest, str(tmp_path)) == ["x/y"]


@pytest.mark.parametrize(
    "text,needle",
    [
        ("[1, 2", "invalid JSON"),
        ('["a", "b"]', "starts with"),
        ('[{"prefix": "s3://bkt/"}, 3]', "element 1"),
    ],
)
def test_malformed(text, needle):
    with pytest.raises(UsageError, match=needle):
        parse_manifest(text)


def test_load_missing_file(tmp_path):
    with pytest.raises(NotFound):
        load_manifest(tmp_path / "nope.json")
    (tmp_path / "m.txt").write_text("k\n")
    assert load_manifest(tmp_path / "m.txt").entries == ("k",)
