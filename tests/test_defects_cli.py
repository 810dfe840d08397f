"""Issue 17, items 7-9: the snapshot command's help and usage, flags that conflict or do nothing,
and messages that misled. Each test failed before its fix. The CLI runs in a subprocess, as
users run it; a store is the real moto server of the suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BUCKET = "defects17"


def one_line_error(result, code: int) -> str:
    """The single stderr line of a failed command, after checking its exit code."""
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("lading: error: "), lines[0]
    return lines[0]


@pytest.fixture
def bucket(s3_env: dict[str, str]) -> dict[str, str]:
    """s3://defects17/train/ holding img-000.jpg and labels.csv, on a freshly reset moto."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="train/img-000.jpg", Body=b"not really a jpeg")
    client.put_object(Bucket=BUCKET, Key="train/labels.csv", Body=b"img-000.jpg,cat\n")
    return s3_env


# --- 7: `lading snapshot` ------------------------------------------------------------------------


def test_snapshot_help_lists_its_options(lading):
    result = lading("snapshot", "--help")
    assert result.returncode == 0
    for option in ("-o, --output", "--sagemaker-manifest", "--allow-empty", "--json", "--endpoint-url"):
        assert option in result.stdout, option
    assert "lading snapshot diff OLD NEW" in result.stdout
    assert "snapshot take" not in result.stdout


def test_snapshot_diff_help_shows_its_own_options(lading):
    result = lading("snapshot", "diff", "--help")
    assert result.returncode == 0
    assert result.stdout.startswith("Usage: lading snapshot diff [OPTIONS] OLD NEW")
    assert "--json" in result.stdout and "--output" not in result.stdout


def test_snapshot_without_output_names_the_command_typed(lading):
    line = one_line_error(lading("snapshot", "s3://b/train"), 2)
    assert "'-o' / '--output'" in line and "lading snapshot --help" in line and "take" not in line


def test_snapshot_diff_usage_error_names_snapshot_diff(lading, tmp_path):
    line = one_line_error(lading("snapshot", "diff", str(tmp_path / "a")), 2)
    assert "NEW" in line and "lading snapshot diff --help" in line


def test_snapshot_diff_takes_global_flags_last(lading, bucket, tmp_path):
    snap = tmp_path / "a.snap.jsonl"
    assert lading("snapshot", f"s3://{BUCKET}/train", "-o", str(snap)).returncode == 0
    result = lading("snapshot", "diff", str(snap), str(snap), "-q")
    assert result.returncode == 0 and result.stderr == "0 added, 0 removed, 0 changed\n" and result.stdout == ""


# --- 9: one-line errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, named",
    [
        (("cat", "s3://b/x", "--part-size", "12Q"), "--part-size"),
        (("sync", "s3://b/x", "--rank", "-1"), "--rank"),
        (("sync", "s3://b/x", "--workers", "0"), "--workers"),
        (("mount", "s3://b/x", "/mnt/x", "--workers", "0"), "--workers"),
    ],
)
def test_click_validated_option_is_one_line_usage_error(lading, args, named):
    line = one_line_error(lading(*args), 2)
    assert named in line and f"lading {args[0]} --help" in line


def test_unknown_option_is_one_line_usage_error(lading):
    line = one_line_error(lading("sync", "s3://b/x", "--no-such-flag"), 2)
    assert "--no-such-flag" in line


def test_lading_alone_still_prints_the_help(lading):
    result = lading()
    assert result.returncode == 2 and "Commands:" in result.stderr + result.stdout


@pytest.mark.parametrize(
    "command",
    [("sync", "s3://nobucket17/train"), ("cat", "s3://nobucket17/train"), ("snapshot", "s3://nobucket17/train", "-o")],
)
def test_missing_bucket_is_one_clean_line(lading, bucket, tmp_path, command):
    args = [*command, str(tmp_path / "out")] if command[0] != "cat" else list(command)
    line = one_line_error(lading(*args), 3)
    assert line.startswith("lading: error: bucket nobucket17 not found")
    assert "<" not in line and "Generic" not in line and len(line) < 160


def test_gcs_missing_bucket_message():
    from lading.stores.gcs.errors import from_response

    err = from_response(
        "notFound",
        404,
        "404 GET https://storage.googleapis.com/storage/v1/b/nob/o: The specified bucket does not exist.",
        "gs://nob/train/",
    )
    assert err.exit_code == 3 and err.message == "bucket nob not found"


# --- 8: flags that conflict or do nothing -----------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (("sync", "s3://b/x", "/tmp/x", "--no-cache", "--cache-dir", "/tmp/c"), "--no-cache and --cache-dir conflict"),
        (
            ("sync", "s3://b/x", "/tmp/x", "--balance", "bytes"),
            "--balance only makes sense with --distribution sharded",
        ),
        (("cat", "s3://b/x", "--seed", "3"), "--seed only makes sense with --shuffle"),
        (("cat", "s3://b/x", "--balance", "bytes"), "--balance only makes sense with --distribution sharded"),
        (("mount", "s3://b/x", "/tmp", "--balance", "bytes"), "--balance only makes sense with --distribution sharded"),
        (("pack", "/tmp", "/tmp/out", "--seed", "3"), "--seed only makes sense with --shuffle"),
        (("check", ".", "--bucket", "s3://b/x"), "--bucket only makes sense with --fix"),
        (("check", ".", "--yes"), "--yes only makes sense with --fix"),
    ],
)
def test_option_that_would_do_nothing_is_usage_error(lading, args, words):
    assert words in one_line_error(lading(*args), 2)


def test_cache_dir_from_the_environment_does_not_conflict_with_no_cache(lading, bucket, tmp_path):
    result = lading(
        "sync",
        f"s3://{BUCKET}/train",
        str(tmp_path / "d"),
        "--no-cache",
        "-q",
        env={"LADING_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "d" / "labels.csv").exists() and not (tmp_path / "cache").exists()


def test_option_rules_accept_what_they_need(lading, bucket, tmp_path):
    result = lading("cat", f"s3://{BUCKET}/train", "--seed", "3", "--shuffle", "--dry-run")
    assert result.returncode == 0, result.stderr
    result = lading(
        "sync",
        f"s3://{BUCKET}/train",
        str(tmp_path / "d"),
        "--distribution",
        "sharded",
        "--balance",
        "bytes",
        "--world-size",
        "1",
        "--rank",
        "0",
    )
    assert result.returncode == 0, result.stderr


def test_pack_empty_name_is_refused(lading, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    line = one_line_error(lading("pack", str(tmp_path / "src"), str(tmp_path / "out"), "--name", ""), 2)
    assert "--name ''" in line and not (tmp_path / "out").exists()


def test_check_fix_validates_the_bucket_even_when_the_context_fits(lading, tmp_path):
    (tmp_path / "model.py").write_text("print('hi')\n")
    line = one_line_error(lading("check", str(tmp_path), "--fix", "--bucket", "s3://"), 2)
    assert "s3://" in line


def test_cache_clear_of_an_unknown_dataset_is_not_found(lading, s3_env, tmp_path):
    from lading.datasets import ShardDataset
    from lading.stores import StoreConfig
    from test_datasets_cache import make_bucket, pack_into

    config = StoreConfig.from_env()
    index, _ = pack_into(make_bucket("s3", config), tmp_path, config)
    cache = tmp_path / "cache"
    list(ShardDataset(index, cache_dir=cache))
    typo = lading("cache", "clear", "--cache-dir", str(cache), "--dataset", "s3://typo/x")
    assert "nothing cached matches --dataset s3://typo/x" in one_line_error(typo, 3)
    listed = json.loads(lading("cache", "list", "--cache-dir", str(cache), "--json").stdout)
    assert listed["files"] > 0  # nothing was removed
    cleared = lading("cache", "clear", "--cache-dir", str(cache), "--dataset", listed["datasets"][0]["uri"], "--json")
    assert cleared.returncode == 0 and json.loads(cleared.stdout)["files"] == listed["files"]


def test_mount_over_a_non_empty_directory_warns(lading, bucket, tmp_path):
    from test_mount_support import force_unmount

    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    (mountpoint / "mine.txt").write_text("hidden while mounted")
    result = lading("mount", f"s3://{BUCKET}/train", str(mountpoint), "--json")
    try:
        assert result.returncode == 0, result.stderr
        assert f"lading: warning: {mountpoint} is not empty: the mount hides its 1 entry" in result.stderr
        assert sorted(p.name for p in mountpoint.iterdir()) == ["img-000.jpg", "labels.csv"]
    finally:
        force_unmount(mountpoint)
    assert (mountpoint / "mine.txt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    result = lading("mount", f"s3://{BUCKET}/train", str(empty), "--json")
    try:
        assert result.returncode == 0 and "warning" not in result.stderr
    finally:
        force_unmount(empty)


# --- 9: messages that misled ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ("sync", "{file}", "{dest}"),
        ("mount", "{file}", "{dest}", "-f"),
        ("datasets", "list", "{file}"),
        ("snapshot", "{file}", "-o", "{dest}/s"),
    ],
)
def test_a_file_as_source_is_named_a_file(lading, tmp_path, command):
    source = tmp_path / "data.csv"
    source.write_text("a,b\n")
    (tmp_path / "dest").mkdir()
    args = [part.format(file=source, dest=tmp_path / "dest") for part in command]
    line = one_line_error(lading(*args), 2)
    assert f"{source} is a file, not a directory" in line and "no such directory" not in line
    assert "hint: name the directory that holds it" in line


def test_fetch_of_an_object_changed_since_the_snapshot_says_take_a_new_snapshot(lading, bucket, tmp_path):
    import boto3

    snap = tmp_path / "train.snap.jsonl"
    assert lading("snapshot", f"s3://{BUCKET}/train", "-o", str(snap)).returncode == 0
    boto3.client(
        "s3",
        endpoint_url=bucket["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).put_object(Bucket=BUCKET, Key="train/labels.csv", Body=b"new")
    fetched = lading("fetch", str(snap), str(tmp_path / "out"), "-q")
    line = one_line_error(fetched, 1)
    assert "labels.csv changed since the snapshot" in line and line.endswith("(hint: take a new snapshot)")
    synced = lading("sync", str(snap), str(tmp_path / "synced"), "-q")
    assert synced.returncode == 1 and "(hint: take a new snapshot)" in synced.stderr


@pytest.mark.parametrize("command", [("mount", "{src}", "{dir}"), ("sync", "{src}", "{dir}"), ("cat", "{src}")])
def test_an_empty_manifest_is_named_not_the_prefix(lading, bucket, tmp_path, command):
    (tmp_path / "mnt").mkdir()
    args = [part.format(src=f"s3://{BUCKET}/train", dir=tmp_path / "mnt") for part in command]
    line = one_line_error(lading(*args, "--manifest", "/dev/null"), 3)
    assert "the manifest /dev/null is empty: it lists no keys" in line and "prefix" not in line


def _not_an_image(tmp_path: Path) -> Path:
    source = tmp_path / "src" / "train"
    source.mkdir(parents=True)
    (source / "cat.jpg").write_bytes(b"this is text, not a JPEG")
    (source / "cat.cls").write_bytes(b"3")
    return source


def test_store_dataset_decode_error_names_key_field_and_source(tmp_path):
    from lading.datasets import StoreDataset
    from lading.datasets.decode import DecodeError

    source = _not_an_image(tmp_path)
    dataset = StoreDataset(str(source), decode=True)
    position = [info.key for info in dataset.objects].index("cat.jpg")
    with pytest.raises(DecodeError) as raised:
        dataset[position]
    message = raised.value.message
    assert "field 'jpg'" in message and "'cat.jpg'" in message and str(source) in message
    assert "UnidentifiedImageError" in message and raised.value.exit_code == 1


def test_packed_dataset_decode_error_names_the_shard(lading, tmp_path):
    from lading.datasets import PackedDataset
    from lading.datasets.decode import DecodeError

    source = _not_an_image(tmp_path)
    packed = lading("pack", str(source), str(tmp_path / "out"), "--name", "pets", "-q")
    assert packed.returncode == 0, packed.stderr
    dataset = PackedDataset(str(tmp_path / "out" / "pets.index.json"), decode=True)
    with pytest.raises(DecodeError) as raised:
        dataset[0]
    message = raised.value.message
    assert "field 'jpg' of sample 'cat'" in message and "pets-000000.tar" in message


def test_record_dataset_decode_error_names_the_record(tmp_path):
    from lading.datasets import RecordDataset
    from lading.datasets.decode import DecodeError

    path = tmp_path / "vectors.json"
    path.write_bytes(b'{"a": 1}' + b"not json")
    with pytest.raises(DecodeError) as raised:
        RecordDataset(str(path), record_size=8, decode=True)[1]
    assert "field 'json'" in raised.value.message and "record 1" in raised.value.message
    assert str(path) in raised.value.message


def test_ensure_that_waited_for_nobody_reports_zero(s3_env, tmp_path, monkeypatch):
    import bucket_fixtures
    import lading.datalayer as dl
    from lading.stores.config import StoreConfig

    monkeypatch.setenv("LADING_CACHE_DIR", str(tmp_path / "node-cache"))
    config = StoreConfig.from_env(s3_env)
    uri = bucket_fixtures.make_bucket("s3", config, "waited", "cache")

    @dl.cached(uri, "alone", "v1", config=config)
    def make():
        yield from ({"n": n} for n in range(3))

    built = make.ensure()
    reused = make.ensure()
    assert built.built and not reused.built
    assert built.waited == 0.0 and reused.waited == 0.0


def test_cat_help_does_not_promise_a_node_cache(lading):
    cat_help = lading("cat", "--help").stdout
    assert "--local-world-size" in cat_help and "node cache" not in cat_help
    assert "turns the node cache on" in " ".join(lading("sync", "--help").stdout.split())


@pytest.mark.parametrize("sub", ["list", "clear"])
def test_cache_subcommand_help_has_examples_and_exit_codes(lading, sub):
    text = lading("cache", sub, "--help").stdout
    assert "Examples:" in text and f"lading cache {sub}" in text and "Exit codes: 0 ok" in text


@pytest.mark.parametrize("indexed", [True, False])
def test_shard_dataset_decode_error_names_the_shard(lading, tmp_path, indexed):
    from lading.datasets import ShardDataset
    from lading.datasets.decode import DecodeError

    source = _not_an_image(tmp_path)
    packed = lading("pack", str(source), str(tmp_path / "out"), "--name", "pets", "-q")
    assert packed.returncode == 0, packed.stderr
    shard = tmp_path / "out" / "pets-000000.tar"
    dataset = ShardDataset(str(tmp_path / "out" / "pets.index.json") if indexed else [str(shard)], decode=True)
    with pytest.raises(DecodeError) as raised:
        list(dataset)
    message = raised.value.message
    assert "field 'jpg' of sample 'cat'" in message and str(shard) in message
