"""Issue 14, "found by injecting faults": hostile keys and URIs, names at NAME_MAX, a shared
node cache, a crafted view record. Each is refused with a one-line error or handled, and
nothing is ever written or deleted outside the destination."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import one_line_error

BUCKET = "injected-faults"
LONG = "n" * 255  # NAME_MAX bytes: a valid Linux file name
LONG_UTF8 = "é" * 127  # 254 bytes of two-byte characters


@pytest.fixture
def s3(s3_env):
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return client


def _tree(root: Path) -> set[str]:
    return {str(Path(d, name).relative_to(root)) for d, dirs, files in os.walk(root) for name in dirs + files}


# -- '.' and '..': in URIs (exit 2) and as keys that become paths ---------------------------------


@pytest.mark.parametrize(
    "uri",
    [
        f"s3://{BUCKET}/..",
        f"s3://{BUCKET}/a/../b",
        f"s3://{BUCKET}/prefix/.",
        f"s3://{BUCKET}/./x",
        f"gs://{BUCKET}/a/..",
    ],
)
@pytest.mark.parametrize("command", ["sync", "fetch"])
def test_dot_segments_in_uris_are_usage_errors(lading, tmp_path, uri, command):
    dest = tmp_path / "dest"
    result = lading(command, uri, f"{dest}/")
    one_line_error(result, 2, "is not allowed as a segment")
    assert os.listdir(tmp_path) == []


def test_fetch_of_prefix_dot_writes_nothing_outside_dest(s3, lading, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="prefix/.", Body=b"dot")
    s3.put_object(Bucket=BUCKET, Key="prefix/..", Body=b"dotdot")
    (tmp_path / "dest").mkdir()
    for key in (".", ".."):
        result = lading("fetch", f"s3://{BUCKET}/prefix/{key}", f"{tmp_path}/dest/")
        one_line_error(result, 2)
    assert _tree(tmp_path) == {"dest"}  # no file beside DEST, no lock or marker either


def test_single_object_key_goes_through_the_key_safety_check(tmp_path, monkeypatch):
    from lading.core.errors import UnsafeKey
    from lading.hooks import fetch as fetch_module
    from lading.stores.base import ObjectInfo

    for key in (".", "..", "a\\b"):
        monkeypatch.setattr(fetch_module, "_find_object", lambda uri, config, key=key: (None, ObjectInfo(key, 1, "v")))
        with pytest.raises(UnsafeKey):
            fetch_module.stage_source(f"s3://{BUCKET}/p/x", f"{tmp_path}/dest/")
    assert _tree(tmp_path) == set()


# -- names of NAME_MAX bytes -------------------------------------------------------------------------


def _long_objects(s3) -> dict[str, bytes]:
    objects = {
        f"long/{LONG}": b"255 bytes of name",
        f"long/sub/{LONG_UTF8}": b"accented",
        f"long/{'m' * 250}.bin": b"near the limit",
    }
    for key, body in objects.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    return objects


def _no_temporaries(root: Path) -> None:
    names = [name for _, dirs, files in os.walk(root) for name in dirs + files]
    assert all(len(os.fsencode(name)) <= 255 for name in names)
    assert not [name for name in names if ".lading-part" in name or ".lading-link-" in name or ".lading-tmp" in name]


def test_sync_and_fetch_names_of_255_bytes(s3, lading, tmp_path):
    objects = _long_objects(s3)
    synced = lading("sync", f"s3://{BUCKET}/long", str(tmp_path / "synced"))
    assert synced.returncode == 0, synced.stderr
    for key, body in objects.items():
        assert (tmp_path / "synced" / key.removeprefix("long/")).read_bytes() == body
    _no_temporaries(tmp_path / "synced")
    again = lading("sync", f"s3://{BUCKET}/long", str(tmp_path / "synced"), "--json")
    assert json.loads(again.stdout)["skipped"] == len(objects)

    one = lading("fetch", f"s3://{BUCKET}/long/{LONG}", f"{tmp_path}/one/")
    assert one.returncode == 0, one.stderr
    assert (tmp_path / "one" / LONG).read_bytes() == objects[f"long/{LONG}"]
    markers = [name for name in os.listdir(tmp_path / "one") if name != LONG]
    assert len(markers) == 1 and markers[0].endswith(".lading-staged.json")  # the hashed marker name
    skipped = lading("fetch", f"s3://{BUCKET}/long/{LONG}", f"{tmp_path}/one/", "--json")
    assert json.loads(skipped.stdout)["skipped"] == 1
    _no_temporaries(tmp_path / "one")


def test_node_cache_and_slot_views_with_255_byte_names(s3, lading, tmp_path):
    objects = _long_objects(s3)
    cached = lading("sync", f"s3://{BUCKET}/long", str(tmp_path / "dest"), "--cache-dir", str(tmp_path / "cache"))
    assert cached.returncode == 0, cached.stderr
    assert (tmp_path / "dest" / LONG).stat().st_nlink == 2  # hard-linked from the cache entry
    views = lading("fetch", "--slots", f"s3://{BUCKET}/long/", str(tmp_path / "staged"), env={"DET_SLOT_IDS": "[0,1]"})
    assert views.returncode == 0, views.stderr
    for rank in (0, 1):
        assert (tmp_path / f"staged-rank{rank}" / LONG).read_bytes() == objects[f"long/{LONG}"]
    for root in ("dest", "cache", "staged", "staged-rank0", "staged-rank1"):
        _no_temporaries(tmp_path / root)


def test_ranged_download_with_a_255_byte_name_resumes_by_its_sidecar(tmp_path):
    from lading.core.names import hidden_sibling
    from lading.stores.local import LocalStore
    from lading.transfer import TransferItem, TransferOptions, fetch_all
    from lading.transfer.files import sidecar_path, temporaries_of, temporary_path

    source = tmp_path / "src"
    source.mkdir()
    body = os.urandom(3 << 20)
    (source / LONG).write_bytes(body)
    store = LocalStore(source)
    dest = tmp_path / "dest" / LONG
    dest.parent.mkdir()
    options = TransferOptions(multipart_threshold=1 << 20, part_size=256 << 10)
    (result,) = fetch_all(store, [TransferItem(store.stat(LONG), dest)], options)
    assert result.ok, result.error
    assert dest.read_bytes() == body and os.listdir(dest.parent) == [LONG]
    for path in temporaries_of(dest):
        assert len(os.fsencode(path.name)) <= 255 and path.parent == dest.parent
    assert temporary_path(dest).name.endswith(".lading-part") and sidecar_path(dest).name.endswith(".lading-part.json")
    assert len(os.fsencode(sidecar_path(dest).name + ".tmp")) <= 255
    assert hidden_sibling(LONG, ".x") != hidden_sibling(LONG[:-1] + "m", ".x")  # distinct names stay distinct
    assert hidden_sibling("a.txt", ".lading-part") == ".a.txt.lading-part"  # short names unchanged


# -- the node cache is per user ------------------------------------------------------------------------


def test_the_default_node_cache_is_private_to_the_user():
    from lading.sync.cache import default_cache_root  # the one rule of sync's and the datasets' cache

    assert default_cache_root({}) == Path(f"/tmp/lading-cache-{os.geteuid()}")
    assert default_cache_root({"LADING_CACHE_DIR": "/x"}) == Path("/x")


def test_a_new_cache_root_is_created_0700(tmp_path):
    from lading.sync.nodecache import ensure_private_root

    root = tmp_path / "deeper" / "cache"
    ensure_private_root(root)
    assert (root.stat().st_mode & 0o777) == 0o700 and root.stat().st_uid == os.geteuid()
    ensure_private_root(root)  # and it is accepted again


@pytest.mark.parametrize("problem", ["writable", "foreign"])
def test_a_cache_root_others_control_is_refused_before_any_link(s3, lading, tmp_path, problem):
    s3.put_object(Bucket=BUCKET, Key="data/a.bin", Body=b"the real bytes")
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o777)  # e.g. the old shared /tmp/lading-cache
    if problem == "foreign":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the directory to another user")
        os.chmod(root, 0o755)
        os.chown(root, 65534, 65534)
    dest = tmp_path / "dest"
    result = lading("sync", f"s3://{BUCKET}/data", str(dest), "--cache-dir", str(root))
    one_line_error(result, 4, "refusing the node cache", str(root))
    assert not dest.exists() and os.listdir(root) == []


def test_sync_and_the_datasets_judge_a_symlinked_cache_root_alike(tmp_path):
    """One rule for both node-cache roots: a symlink another user made is refused (planted in
    /tmp before the job ran), one of this user's own is judged by its target."""
    from lading.core.errors import AccessDenied
    from lading.datasets.cache import NodeCache
    from lading.sync.nodecache import ensure_private_root

    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (tmp_path / "my-link").symlink_to(mine)  # e.g. ~/.cache/lading -> a bigger disk
    ensure_private_root(tmp_path / "my-link")
    NodeCache(tmp_path / "my-link")
    if os.geteuid() != 0:
        return  # the rest needs root to give a symlink to another user
    (tmp_path / "planted").symlink_to(mine)
    os.lchown(tmp_path / "planted", 65534, 65534)
    for check in (ensure_private_root, NodeCache):
        with pytest.raises(AccessDenied, match="it is a symlink owned by uid 65534"):
            check(tmp_path / "planted")
    os.chmod(mine, 0o777)
    for check in (ensure_private_root, NodeCache):
        with pytest.raises(AccessDenied, match="others can write to it"):
            check(tmp_path / "my-link")


def test_a_planted_entry_in_a_shared_root_is_never_linked(s3, tmp_path):
    """A root that is ours but an entry that is not (made while the root was shared) is refused."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the entry to another user")
    from lading.core.errors import AccessDenied
    from lading.stores import open_store
    from lading.sync import SyncRequest, run_sync
    from lading.sync.nodecache import cache_entry_name

    s3.put_object(Bucket=BUCKET, Key="data/a.bin", Body=b"the real bytes")
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    request = SyncRequest(f"s3://{BUCKET}/data", tmp_path / "dest")
    planted = root / cache_entry_name(request)
    planted.mkdir()
    (planted / "a.bin").write_bytes(b"planted")
    os.chown(planted, 65534, 65534)
    with pytest.raises(AccessDenied, match="owned by uid 65534"):
        run_sync(open_store(request.source), request, cache_root=root)
    assert not (tmp_path / "dest" / "a.bin").exists()


# -- keys read back from .lading-view.json are untrusted -------------------------------------------------


def test_a_crafted_view_record_cannot_delete_outside_the_view(tmp_path):
    from lading.hooks.stage import VIEW_RECORD, build_views, view_root

    staged = tmp_path / "train"
    (staged / "sub").mkdir(parents=True)
    (staged / "a.bin").write_bytes(b"a")
    (staged / "sub" / "b.bin").write_bytes(b"b")
    files = {"a.bin": staged / "a.bin", "sub/b.bin": staged / "sub" / "b.bin"}
    build_views(staged, files.__getitem__, {0: lambda: iter(sorted(files))})
    view = view_root(staged, 0)
    victims = [tmp_path / "victim.txt", staged / "a.bin", tmp_path / "elsewhere" / "x.txt"]
    for victim in victims:
        victim.parent.mkdir(exist_ok=True)
        victim.write_text("keep me")
    (view / "link").symlink_to(tmp_path / "elsewhere")  # a symlinked directory inside the view
    crafted = [
        "../victim.txt",
        "../train/a.bin",
        "/etc/hostname",
        "link/x.txt",
        "sub/../../victim.txt",
        "a.bin",
        ["not", "a", "key"],
        {"nor": "this"},
        7,
        "sub/b.bin",
    ]
    (view / VIEW_RECORD).write_text(json.dumps(crafted))
    changed = build_views(
        staged, files.__getitem__, {0: lambda: iter(["sub/b.bin"])}
    )  # a.bin left this view: only it goes
    assert changed == 1
    for victim in victims:
        assert victim.read_text() == "keep me", victim
    assert not (view / "a.bin").exists() and (view / "sub" / "b.bin").read_bytes() == b"b"
    assert json.loads((view / VIEW_RECORD).read_text()) == ["sub/b.bin"]
