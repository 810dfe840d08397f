"""`lading sync` end to end against moto's S3 server (through the counting / fault proxy)."""

from __future__ import annotations

import json
import subprocess

import pytest
from proxies import FaultProxy
from sync_fixtures import (
    BUCKET,
    object_gets,
    put_multipart,
    put_objects,
    read_tree,
    s3_client,
    sample_objects,
    stray_temporaries,
)

SOURCE = f"s3://{BUCKET}/data"


@pytest.fixture
def dataset(s3_env):
    """24 sample objects under s3://sync-bucket/data/."""
    client = s3_client(s3_env)
    objects = sample_objects()
    put_objects(client, objects)
    return client, objects


@pytest.fixture
def proxy(s3_env):
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as running:
        yield running


def sync_json(lading, *args: str, env: dict | None = None):
    result = lading("sync", *args, "--json", env=env)
    data = json.loads(result.stdout) if result.stdout.strip() else None
    return result, data


def test_replicated_sync_then_rerun_makes_no_get(lading, dataset, proxy, tmp_path):
    _, objects = dataset
    env = {"AWS_ENDPOINT_URL": proxy.url}
    dest = tmp_path / "out"
    result, summary = sync_json(lading, SOURCE, str(dest), env=env)
    assert result.returncode == 0, result.stderr
    assert read_tree(dest) == objects
    assert summary["files"] == len(objects) and summary["bytes"] == sum(map(len, objects.values()))
    assert object_gets(proxy) == len(objects)
    assert (dest / ".lading-sync.json").exists() and stray_temporaries(dest) == []

    proxy.reset_counts()
    result, summary = sync_json(lading, SOURCE, str(dest), env=env)
    assert result.returncode == 0, result.stderr
    assert (summary["files"], summary["skipped"]) == (0, len(objects))
    assert object_gets(proxy) == 0
    assert proxy.count("GET") >= 1  # the listing, and nothing else
    assert proxy.count("HEAD") == 0


def test_locally_modified_or_deleted_files_are_fetched_again(lading, dataset, proxy, tmp_path):
    _, objects = dataset
    env = {"AWS_ENDPOINT_URL": proxy.url}
    dest = tmp_path / "out"
    assert lading("sync", SOURCE, str(dest), env=env).returncode == 0
    (dest / "d0/sub/obj-000.bin").write_bytes(b"edited")
    (dest / "d1/sub/obj-001.bin").unlink()
    proxy.reset_counts()
    result, summary = sync_json(lading, SOURCE, str(dest), env=env)
    assert result.returncode == 0, result.stderr
    assert summary["files"] == 2 and object_gets(proxy) == 2
    assert read_tree(dest) == objects


def test_changed_object_is_fetched_again(lading, dataset, tmp_path):
    client, objects = dataset
    dest = tmp_path / "out"
    assert lading("sync", SOURCE, str(dest)).returncode == 0
    client.put_object(Bucket=BUCKET, Key="data/d2/sub/obj-002.bin", Body=b"new content")
    result, summary = sync_json(lading, SOURCE, str(dest))
    assert result.returncode == 0, result.stderr
    assert summary["files"] == 1
    assert (dest / "d2/sub/obj-002.bin").read_bytes() == b"new content"


def test_default_dest_template_and_placeholders(lading, dataset, tmp_path):
    _, objects = dataset
    template = str(tmp_path / "n{node_rank}-r{rank}-l{local_rank}-of{world_size}")
    result = lading("sync", SOURCE, template, "--rank", "1", "--world-size", "2", "--no-cache")
    assert result.returncode == 0, result.stderr
    assert read_tree(tmp_path / "n1-r1-l0-of2") == objects
    result = lading("sync", SOURCE, str(tmp_path / "x{epoch}"))
    assert result.returncode == 2 and "bad placeholder" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("balance", ["count", "bytes"])
def test_sharded_two_ranks_union_is_source(lading, dataset, tmp_path, balance):
    _, objects = dataset
    trees = []
    for rank in (0, 1):
        result = lading(
            "sync",
            SOURCE,
            str(tmp_path / "r{rank}"),
            "--distribution",
            "sharded",
            "--balance",
            balance,
            "--rank",
            str(rank),
            "--world-size",
            "2",
        )
        assert result.returncode == 0, result.stderr
        trees.append(read_tree(tmp_path / f"r{rank}"))
    assert trees[0] and trees[1]
    assert not set(trees[0]) & set(trees[1])
    assert {**trees[0], **trees[1]} == objects
    if balance == "count":
        assert sorted(trees[0]) == sorted(objects)[0::2]


def test_delete_removes_only_tracked_files(lading, dataset, tmp_path):
    client, objects = dataset
    dest = tmp_path / "out"
    assert lading("sync", SOURCE, str(dest)).returncode == 0
    (dest / "user-notes.txt").write_text("mine")
    client.delete_object(Bucket=BUCKET, Key="data/d0/sub/obj-003.bin")
    result = lading("sync", SOURCE, str(dest))
    assert result.returncode == 0 and (dest / "d0/sub/obj-003.bin").exists()  # no --delete: kept
    result, summary = sync_json(lading, SOURCE, str(dest), "--delete")
    assert result.returncode == 0, result.stderr
    assert summary["deleted"] == 1
    assert not (dest / "d0/sub/obj-003.bin").exists()
    assert (dest / "user-notes.txt").read_text() == "mine"
    expected = {k: v for k, v in objects.items() if k != "d0/sub/obj-003.bin"}
    assert read_tree(dest) == {**expected, "user-notes.txt": b"mine"}


def test_include_exclude(lading, dataset, tmp_path):
    _, objects = dataset
    dest = tmp_path / "out"
    result = lading("sync", SOURCE, str(dest), "--include", "d1/*", "--include", "d2/*", "--exclude", "*-004.bin")
    assert result.returncode == 0, result.stderr
    expected = {k for k in objects if k.startswith(("d1/", "d2/")) and not k.endswith("-004.bin")}
    assert set(read_tree(dest)) == expected and expected


def test_manifest_json_and_plain(lading, dataset, tmp_path):
    _, objects = dataset
    chosen = sorted(objects)[:5]
    manifest = tmp_path / "m.json"
    manifest.write_text(
        json.dumps([{"prefix": f"s3://{BUCKET}/data/d0/"}] + [k[3:] for k in chosen if k.startswith("d0/")])
    )
    result = lading("sync", SOURCE, str(tmp_path / "a"), "--manifest", str(manifest))
    assert result.returncode == 0, result.stderr
    assert set(read_tree(tmp_path / "a")) == {k for k in chosen if k.startswith("d0/")}
    plain = tmp_path / "keys.txt"
    plain.write_text("# chosen keys\n" + "\n".join(chosen) + "\n")
    result = lading("sync", SOURCE, str(tmp_path / "b"), "--manifest", str(plain))
    assert result.returncode == 0, result.stderr
    assert read_tree(tmp_path / "b") == {k: objects[k] for k in chosen}
    plain.write_text("d0/no-such-key\n")
    result = lading("sync", SOURCE, str(tmp_path / "c"), "--manifest", str(plain))
    assert result.returncode == 3 and "no-such-key" in result.stderr


def test_dry_run_json_is_the_plan_and_writes_nothing(lading, dataset, tmp_path):
    _, objects = dataset
    dest = tmp_path / "out"
    result = lading(
        "sync",
        SOURCE,
        str(dest),
        "--dry-run",
        "--json",
        "--distribution",
        "sharded",
        "--rank",
        "0",
        "--world-size",
        "3",
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert set(plan) >= {"source", "dest", "rank", "world_size", "totals", "to_fetch", "up_to_date", "to_delete"}
    assert [item["key"] for item in plan["to_fetch"]] == sorted(objects)[0::3]
    assert {item["reason"] for item in plan["to_fetch"]} == {"new"}
    assert plan["totals"]["listed"] == len(objects)
    assert not dest.exists()
    text = lading("sync", SOURCE, str(dest), "--dry-run")
    assert text.returncode == 0 and "fetch 24 file(s)" in text.stdout and not dest.exists()


def test_escaping_keys_are_refused_and_nothing_written(lading, s3_env, tmp_path):
    client = s3_client(s3_env)
    put_objects(client, {"ok.txt": b"fine"})
    for key in ("data/a/../../x", "data//abs", "data/a//b"):
        client.put_object(Bucket=BUCKET, Key=key, Body=b"evil")
    dest = tmp_path / "inner" / "out"
    before = sorted(p.name for p in tmp_path.iterdir())
    result = lading("sync", SOURCE, str(dest))
    assert result.returncode == 1
    assert "unsafe key" in result.stderr and "a/../../x" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not dest.exists() or read_tree(dest) == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    # leaving them out with --exclude is the documented way through
    result = lading("sync", SOURCE, str(dest), "--exclude", "*..*", "--exclude", "/*", "--exclude", "*//*")
    assert result.returncode == 0, result.stderr
    assert read_tree(dest) == {"ok.txt": b"fine"}


def test_file_and_directory_collision_is_refused(lading, s3_env, tmp_path):
    client = s3_client(s3_env)
    put_objects(client, {"a": b"file", "a/b": b"under"})
    result = lading("sync", SOURCE, str(tmp_path / "out"))
    assert result.returncode == 1 and "'a' is a file and also the directory of 'a/b'" in result.stderr


def test_symlink_in_dest_is_never_followed(lading, s3_env, tmp_path):
    client = s3_client(s3_env)
    put_objects(client, {"a/x": b"payload", "b": b"fine"})
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "a").symlink_to(outside)
    result = lading("sync", SOURCE, str(dest))
    assert result.returncode == 1
    assert "a/x" in result.stderr and "symlink" in result.stderr
    assert list(outside.iterdir()) == []
    assert (dest / "b").read_bytes() == b"fine"


def test_missing_bucket_and_malformed_uri(lading, s3_env, tmp_path):
    result = lading("sync", "s3://no-such-bucket/data", str(tmp_path / "out"))
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    for bad in ("s3:/bucket", "ftp://host/x", "s3://B!/x"):
        result = lading("sync", bad, str(tmp_path / "out"))
        assert result.returncode == 2, (bad, result.stderr)
        assert "Traceback" not in result.stderr


def test_flaky_server_resets_and_503s(lading, dataset, proxy, tmp_path):
    _, objects = dataset
    proxy.add_fault("slowdown", rate=0.2, seed=3)
    proxy.add_fault("reset", rate=0.15, seed=4)
    proxy.add_fault("truncate", rate=0.1, seed=5, method="GET")
    dest = tmp_path / "out"
    result = lading("sync", SOURCE, str(dest), env={"AWS_ENDPOINT_URL": proxy.url, "LADING_RETRIES": "10"})
    assert result.returncode == 0, result.stderr
    assert read_tree(dest) == objects
    assert proxy.injected["slowdown"] > 0 and proxy.injected["reset"] > 0
    assert stray_temporaries(dest) == []


def test_partial_failure_exits_1_and_names_keys(lading, dataset, proxy, tmp_path):
    _, objects = dataset
    proxy.add_fault("reset", rate=1.0, path_prefix=f"/{BUCKET}/data/d1/sub/obj-004")
    dest = tmp_path / "out"
    result, summary = sync_json(lading, SOURCE, str(dest), env={"AWS_ENDPOINT_URL": proxy.url, "LADING_RETRIES": "2"})
    assert result.returncode == 1
    assert "d1/sub/obj-004.bin" in result.stderr
    assert [f["key"] for f in summary["failed"]] == ["d1/sub/obj-004.bin"]
    assert summary["files"] == len(objects) - 1
    assert not (dest / "d1/sub/obj-004.bin").exists()


def test_output_lines_when_not_a_tty(lading, dataset, tmp_path):
    result = lading("sync", SOURCE, str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "synced 24 file(s)" in result.stderr and "0 failed" in result.stderr, (result.stdout, result.stderr)
    assert "\r" not in result.stderr, result.stderr  # no bar in logs
    result = lading("sync", SOURCE, str(tmp_path / "again"), "--workers", "1", env={"LADING_PROGRESS_SECONDS": "0"})
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("lading sync: download ")]
    assert len(lines) >= 10 and lines[-1].startswith("lading sync: download 24/24 files"), result.stderr


def test_dest_that_is_a_file_is_a_usage_error(lading, dataset, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = lading("sync", SOURCE, str(blocker))
    assert result.returncode == 2 and "exists and is not a directory" in result.stderr
    assert blocker.read_text() == "x"


def test_every_key_failing_for_one_reason_gives_its_exit_code(lading, dataset, proxy, tmp_path):
    proxy.add_fault("reset", rate=1.0, method="GET", path_prefix=f"/{BUCKET}/data/")
    result = lading("sync", SOURCE, str(tmp_path / "out"), env={"AWS_ENDPOINT_URL": proxy.url, "LADING_RETRIES": "1"})
    assert result.returncode == 5, result.stderr
    assert "24 key(s) failed" in result.stderr and "d0/sub/obj-000.bin" in result.stderr
    assert read_tree(tmp_path / "out") == {}


#: Modules a plain ``lading sync`` of an S3 source (MD5 ETags, credentials in the environment,
#: output not a terminal) has no use for: each is start-up time before its first request.
NOT_FOR_SYNC = (
    "boto3",
    "botocore",
    "rich",
    "tqdm",
    "google_crc32c",
    "google.cloud",
    "lading.stores.s3.upload",
    "lading.stores.snapshot",
    "lading.sync.nodecache",
)
#: Modules the listing's first request does not wait for: they load while it is under way.
AFTER_THE_LISTING_STARTED = (
    "asyncio",
    "lading.stores.obstore_reads",
    "lading.stores.iocore",
    "lading.sync",
    "lading.transfer",
    "hashlib",
    "lading.selection.manifest",
)


def _sync_in_a_process(script: str, s3_env: dict, tmp_path) -> subprocess.CompletedProcess[bytes]:
    """Run ``script`` (``python -c``, argv: SOURCE and DEST) as a sync would run; it must succeed."""
    import os
    import sys

    done = subprocess.run(
        [sys.executable, "-c", script, SOURCE, str(tmp_path / "dest")],
        env={**os.environ, **s3_env, "HOME": str(tmp_path), "SM_INPUT_CONFIG_DIR": str(tmp_path / "no-sagemaker")},
        capture_output=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done


def test_sync_of_an_s3_source_imports_only_what_it_syncs_with(dataset, s3_env, tmp_path):

    script = (
        "import sys\n"
        "import lading.stores.listing as listing\n"
        "start = listing.ListingMixin.prefetch_listing\n"
        "def noted(self):\n"
        "    sys.stderr.write('\\nAT-LISTING ' + ' '.join(sorted(sys.modules)) + '\\n')\n"
        "    start(self)\n"
        "listing.ListingMixin.prefetch_listing = noted\n"
        "from lading.cli.main import main\n"
        "try:\n"
        "    main(['sync', sys.argv[1], sys.argv[2]])\n"
        "finally:\n"
        "    sys.stderr.write('\\nMODULES ' + ' '.join(sorted(sys.modules)))\n"
    )
    done = _sync_in_a_process(script, s3_env, tmp_path)
    assert read_tree(tmp_path / "dest") == dataset[1]
    loaded = set(done.stderr.decode().rpartition("MODULES ")[2].split())
    assert {"lading.stores.s3.store", "lading.sync.apply"} <= loaded  # the check sees the modules the sync used
    found = sorted(name for name in loaded if name.split(".")[0] in NOT_FOR_SYNC or name.startswith(NOT_FOR_SYNC))
    assert not found, found
    at_listing = set(done.stderr.decode().partition("AT-LISTING ")[2].partition("\n")[0].split())
    assert "lading.stores.s3.store" in at_listing  # the listing started once the store was open ...
    early = sorted(name for name in at_listing if name.startswith(AFTER_THE_LISTING_STARTED))
    assert not early, early  # ... and before the code that plans and fetches, and asyncio, loaded


#: The dataclasses a sync may create as it imports (each costs about 1 ms of start-up): those
#: whose callers use value equality, hashing or ``dataclasses.replace``. Every other class on the
#: path is a plain one.
DATACLASSES_OF_A_SYNC = {
    "lading.cli.context.AppState",
    "lading.core.retry.RetryPolicy",
    "lading.stores.base.ObjectInfo",
    "lading.stores.base.RangeRequest",
    "lading.stores.config.StoreConfig",
    "lading.stores.uri.StoreURI",
    "lading.sync.plan.SyncRequest",
    "lading.transfer.types.TransferItem",
    "lading.transfer.types.TransferResult",
}


def test_sync_of_a_multipart_object_loads_no_hash_nor_manifest_code_and_few_dataclasses(s3_env, tmp_path):
    """A multipart object's ETag is not an MD5: nothing to hash, so hashlib (and the manifest
    module, without --manifest) never loads; the classes the sync creates are plain ones."""
    import os

    client = s3_client(s3_env)
    put_objects(client, {})
    body = os.urandom((5 << 20) + 1000)
    put_multipart(client, "data/multi.bin", body)
    script = (
        "import dataclasses, sys\n"
        "from lading.cli.main import main\n"
        "try:\n"
        "    main(['sync', sys.argv[1], sys.argv[2]])\n"
        "finally:\n"
        "    made = sorted(f'{m}.{n}' for m in list(sys.modules) if m.startswith('lading')\n"
        "                  for n, v in vars(sys.modules[m]).items()\n"
        "                  if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == m)\n"
        "    sys.stderr.write('\\nDATACLASSES ' + ' '.join(made))\n"
        "    sys.stderr.write('\\nMODULES ' + ' '.join(sorted(sys.modules)))\n"
    )
    done = _sync_in_a_process(script, s3_env, tmp_path)
    assert read_tree(tmp_path / "dest") == {"multi.bin": body}
    err = done.stderr.decode()
    loaded = set(err.rpartition("MODULES ")[2].split())
    assert "lading.sync.apply" in loaded  # the check sees the modules the sync used
    assert not {"hashlib", "lading.selection.manifest"} & loaded, sorted(
        {"hashlib", "lading.selection.manifest"} & loaded
    )
    made = set(err.rpartition("DATACLASSES ")[2].partition("\n")[0].split())
    assert "lading.stores.base.ObjectInfo" in made  # the check sees the dataclasses
    assert made <= DATACLASSES_OF_A_SYNC, sorted(made - DATACLASSES_OF_A_SYNC)
