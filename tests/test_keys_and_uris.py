"""Untrusted keys and malformed URIs are refused with project errors."""

import itertools
from pathlib import Path

import pytest
from lading.core.errors import UnsafeKey, UsageError
from lading.core.keys import find_collisions, is_safe_key, key_parts, safe_join
from lading.stores.uri import parse_uri


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", "", "a\x00b", "a\\..\\b", "a/"])
def test_escaping_keys_refused(key, tmp_path):
    with pytest.raises(UnsafeKey):
        safe_join(tmp_path, key)


def test_the_fast_check_agrees_with_key_parts():
    # every key of up to 5 pieces from these (the newline: where a "$" would wrongly end; the
    # dotted names: dots that are not a "." or ".." segment)
    pieces = ["a", ".", "..", "/", "\\", "\x00", "\n", ".a", "a."]
    for length in range(6):
        for key in map("".join, itertools.product(pieces, repeat=length)):
            try:
                accepted = bool(key_parts(key))
            except UnsafeKey:
                accepted = False
            assert is_safe_key(key) == accepted, repr(key)


def test_safe_join_stays_inside(tmp_path):
    path = safe_join(tmp_path, "a/b/c.txt")
    assert path == tmp_path / "a" / "b" / "c.txt"
    assert Path(path).resolve().is_relative_to(tmp_path.resolve())


def test_collisions_found_despite_sort_interleaving():
    keys = sorted(["a", "a-b", "a/b", "c/d", "c/d/e", "f"])
    assert sorted(find_collisions(keys)) == [("a", "a/b"), ("c/d", "c/d/e")]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("s3://bucket/pre/fix", ("s3", "bucket", "pre/fix")),
        ("s3://bucket", ("s3", "bucket", "")),
        ("gs://my.bucket/x/", ("gs", "my.bucket", "x/")),
        ("file:///tmp/x", ("file", "", "/tmp/x")),
    ],
)
def test_uris_parse(text, expected):
    uri = parse_uri(text)
    assert (uri.scheme, uri.bucket, uri.prefix) == expected


@pytest.mark.parametrize(
    "text", ["s3://", "s3:/bucket", "ftp://host/x", "s3://UPPER/x", "s3://a/x", "file://rel/x", ""]
)
def test_malformed_uris_refused(text):
    with pytest.raises(UsageError):
        parse_uri(text)


@pytest.mark.parametrize(
    "text, hint",
    [
        ("file:data", "use file:///absolute/path"),  # was "write it as file://bucket/prefix": no bucket here
        ("file:/tmp/x", "use file:///absolute/path"),
        ("file://rel/x", "use file:///absolute/path"),
        ("s3:/bucket", "write it as s3://bucket/prefix"),
    ],
)
def test_a_malformed_location_hints_its_own_scheme_s_form(text, hint):
    with pytest.raises(UsageError) as raised:
        parse_uri(text)
    assert raised.value.hint is not None and raised.value.hint.startswith(hint), raised.value.hint
