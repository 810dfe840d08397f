"""What a new user runs into first (issue 14, "tried as a new user would"): every mistake is one
line with a documented exit code, never "internal error", and nothing half-written is left."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import one_line_error, run_unprivileged

REPO = Path(__file__).resolve().parent.parent

BUCKET = "first-use"


@pytest.fixture
def s3(s3_env):
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="data/a.txt", Body=b"hello")
    client.put_object(Bucket=BUCKET, Key="data/sub/b.txt", Body=b"b")
    return client


# -- an unwritable DEST is exit 4 ------------------------------------------------------------------


@pytest.fixture
def unwritable_dir():
    """A directory the test process owns (0755) that user ``nobody`` can enter but not write."""
    parent = Path(tempfile.mkdtemp(prefix="lading-unwritable-", dir="/tmp"))
    os.chmod(parent, 0o755)
    (parent / "dest").mkdir(mode=0o755)
    yield parent / "dest"
    shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.parametrize(
    "command",
    [
        ("sync", f"s3://{BUCKET}/data", "{dest}"),
        ("sync", f"s3://{BUCKET}/data", "{dest}/new-subdir"),
        ("fetch", f"s3://{BUCKET}/data/a.txt", "{dest}/"),
        ("fetch", f"s3://{BUCKET}/data/", "{dest}"),
    ],
)
def test_a_dest_the_user_cannot_write_is_exit_4(s3, unwritable_dir, command):
    if os.geteuid() != 0:
        os.chmod(unwritable_dir, 0o555)
    args = [part.format(dest=unwritable_dir) for part in command]
    result = run_unprivileged(*args)
    one_line_error(result, 4, str(unwritable_dir), "permission denied")
    assert os.listdir(unwritable_dir) == []


@pytest.mark.parametrize(
    "command",
    [
        ("sync", f"s3://{BUCKET}/data", "{dest}"),
        ("sync", f"s3://{BUCKET}/data", "{dest}/sub"),
        ("fetch", f"s3://{BUCKET}/data/a.txt", "{dest}/"),
        ("fetch", f"s3://{BUCKET}/data/", "{dest}"),
    ],
)
def test_a_read_only_file_system_is_exit_4(s3, lading, read_only_mount, command):
    result = lading(*[part.format(dest=read_only_mount) for part in command])
    one_line_error(result, 4, "read-only file system")


def test_lock_and_local_errors_translate_in_the_library(tmp_path, monkeypatch):
    import errno

    from lading.core.errors import AccessDenied, NotFound, UsageError, local_error
    from lading.core.locks import exclusive_lock

    assert isinstance(local_error(OSError(errno.EROFS, "Read-only file system"), "write x"), AccessDenied)
    assert isinstance(local_error(PermissionError(errno.EACCES, "Permission denied"), "write x"), AccessDenied)
    assert isinstance(local_error(OSError(errno.ENOENT, "No such file"), "read x"), NotFound)
    assert isinstance(local_error(OSError(errno.EISDIR, "Is a directory"), "read x"), UsageError)
    full = local_error(OSError(errno.ENOSPC, "No space left"), "write x")  # a full disk is not "denied"
    assert full.exit_code not in (0, 2, 3, 4) and full.message == "cannot write x: No space left"

    def refused(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(args[0]))

    monkeypatch.setattr(os, "open", refused)
    with pytest.raises(AccessDenied, match="read-only file system"):
        with exclusive_lock(tmp_path / ".lading-sync.lock"):
            pass


# -- usage errors instead of internal errors -------------------------------------------------------


def test_fetch_into_a_file_with_a_trailing_slash_is_a_usage_error(s3, lading, tmp_path):
    (tmp_path / "file").write_text("mine")
    for dest in (f"{tmp_path}/file/", f"{tmp_path}/file/deeper/"):
        result = lading("fetch", f"s3://{BUCKET}/data/a.txt", dest)
        one_line_error(result, 2, "not a directory" if dest.endswith("file/") else "in the way")
    assert (tmp_path / "file").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_hook_init_when_the_hook_is_a_directory(lading, tmp_path):
    (tmp_path / "startup-hook.sh").mkdir()
    result = lading("hook", "init", str(tmp_path), f"s3://{BUCKET}/x/", "/tmp/x")
    one_line_error(result, 2, "startup-hook.sh is a directory")


def test_hook_init_says_what_is_missing(lading, tmp_path):
    result = lading("hook", "init", str(tmp_path), f"s3://{BUCKET}/x/")
    one_line_error(result, 2, "needs a DEST")
    assert "must be absolute" not in result.stderr
    (tmp_path / "afile").write_text("x")
    result = lading("hook", "init", str(tmp_path / "afile"), f"s3://{BUCKET}/x/", "/tmp/x")
    one_line_error(result, 2, "is not a directory")
    assert not list(tmp_path.glob("**/startup-hook.sh"))


# -- a mistyped prefix is "nothing at", exit 3 -------------------------------------------------------


def test_a_mistyped_prefix_syncs_nothing_and_says_so(s3, lading, tmp_path):
    dest = tmp_path / "dest"
    result = lading("sync", f"s3://{BUCKET}/dta", str(dest))
    one_line_error(result, 3, f"nothing at s3://{BUCKET}/dta")
    assert not dest.exists()  # no empty directory with state files
    dry = lading("sync", f"s3://{BUCKET}/dta", str(dest), "--dry-run")
    one_line_error(dry, 3, "nothing at")
    filtered = lading("sync", f"s3://{BUCKET}/data", str(dest), "--include", "*.jpg")
    one_line_error(filtered, 3, "matches the filters")
    allowed = lading("sync", f"s3://{BUCKET}/dta", str(dest), "--allow-empty", "--json")
    assert allowed.returncode == 0, allowed.stderr
    assert '"files": 0' in allowed.stdout


def test_an_empty_local_source_is_refused_unless_allowed(lading, tmp_path):
    (tmp_path / "empty").mkdir()
    result = lading("sync", str(tmp_path / "empty"), str(tmp_path / "dest"))
    one_line_error(result, 3, "nothing at")
    assert not (tmp_path / "dest").exists()
    assert lading("sync", str(tmp_path / "empty"), str(tmp_path / "dest"), "--allow-empty").returncode == 0


def test_a_sharded_rank_with_an_empty_share_is_not_an_error(tmp_path):
    from lading.sync.plan import SyncRequest, select_objects

    class OneObject:
        def list_pages(self, prefix: str = ""):
            yield [("only.bin", 3, "v1", 0.0, None, None)]

    request = SyncRequest("s3://b/p", tmp_path, distribution="sharded", rank=1, world_size=2)
    assert list(select_objects(OneObject(), request).objects()) == []


def test_mount_of_an_empty_prefix_is_refused_unless_allowed(tmp_path):
    from test_mount_support import cli, mounted

    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("needs /dev/fuse and fusermount3")
    (tmp_path / "empty").mkdir()
    (tmp_path / "mnt").mkdir()
    result = cli("mount", str(tmp_path / "empty"), str(tmp_path / "mnt"))
    one_line_error(result, 3, "nothing at")
    assert not os.path.ismount(tmp_path / "mnt")
    with mounted(str(tmp_path / "empty"), tmp_path / "mnt", "--allow-empty") as mnt:
        assert os.listdir(mnt.path) == []


# -- every unsafe key in the first report ------------------------------------------------------------


def test_unsafe_keys_and_clashes_are_reported_together(s3, lading, tmp_path):
    for key in ("clash/a", "clash/a/b", "clash/evil/../x", "clash/ok.txt"):
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
    result = lading("sync", f"s3://{BUCKET}/clash", str(tmp_path / "dest"))
    one_line_error(result, 1, "2 unsafe key(s)", "'evil/../x'", "'a' is a file and also the directory of 'a/b'")
    assert not (tmp_path / "dest").exists()


def test_a_manifest_with_unsafe_keys_and_clashes_is_reported_at_once(tmp_path):
    from lading.core.errors import UnsafeKey
    from lading.selection.manifest import parse_manifest
    from lading.sync.plan import SyncRequest, select_objects

    class NeverStat:
        def stat(self, key: str):
            raise AssertionError(f"stat({key!r}) before the keys were checked")

    manifest = parse_manifest("a\na/b\n../up\nc//d\n")
    with pytest.raises(UnsafeKey) as caught:
        select_objects(NeverStat(), SyncRequest("s3://bucket/p", tmp_path, manifest=manifest))
    message = caught.value.message
    assert message.startswith("3 unsafe key(s)") and "'../up'" in message and "'c//d'" in message
    assert "'a' is a file and also the directory of 'a/b'" in message


# -- global flags anywhere on the line ----------------------------------------------------------------


def test_global_flags_work_after_the_subcommand(lading, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    quiet = lading("sync", str(tmp_path / "src"), str(tmp_path / "dest"), "-q")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr.startswith("synced 1 file(s)"), quiet
    assert len(quiet.stderr.splitlines()) == 1, quiet.stderr  # -q: only the final result
    loud = lading("sync", str(tmp_path / "src"), str(tmp_path / "dest2"))
    assert "synced 1 file(s)" in loud.stderr and loud.stdout == ""
    debug = lading("sync", str(tmp_path / "missing"), str(tmp_path / "dest3"), "--debug")
    assert debug.returncode == 3 and "Traceback" in debug.stderr, debug.stderr
    hook = lading("hook", "init", str(tmp_path), f"s3://{BUCKET}/x/", "/tmp/x", "--quiet", "--debug")
    assert hook.returncode == 0, hook.stderr
    check = lading("check", str(tmp_path), "-q")  # check's own -q: the verdict line only
    assert check.returncode == 0 and len(check.stdout.splitlines()) == 1


# -- one object: one hidden file, never the user's file, sync's JSON fields ----------------------------


def test_single_object_fetch_leaves_one_marker_and_refuses_foreign_files(s3, lading, tmp_path):
    dest = tmp_path / "d"
    first = lading("fetch", f"s3://{BUCKET}/data/a.txt", f"{dest}/", "--json")
    assert first.returncode == 0, first.stderr
    assert sorted(os.listdir(dest)) == [".a.txt.lading-staged.json", "a.txt"]  # no lock file left
    assert not [name for name in os.listdir(tmp_path) if name != "d"]
    (dest / "mine.txt").write_text("my own notes")
    refused = lading("fetch", f"s3://{BUCKET}/data/a.txt", str(dest / "mine.txt"))
    one_line_error(refused, 2, "mine.txt exists and was not written by lading", "--force")
    assert (dest / "mine.txt").read_text() == "my own notes"
    assert sorted(os.listdir(dest)) == [".a.txt.lading-staged.json", "a.txt", "mine.txt"]
    forced = lading("fetch", f"s3://{BUCKET}/data/a.txt", str(dest / "mine.txt"), "--force")
    assert forced.returncode == 0 and (dest / "mine.txt").read_bytes() == b"hello"
    edited = dest / "a.txt"  # a file lading wrote and the user edited is fetched again, as documented
    edited.write_text("edited")
    assert lading("fetch", f"s3://{BUCKET}/data/a.txt", f"{dest}/").returncode == 0
    assert edited.read_bytes() == b"hello"


def test_fetch_json_uses_sync_field_names(s3, lading, tmp_path):
    import json

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x.txt").write_text("x")
    synced = json.loads(lading("sync", str(tmp_path / "src"), str(tmp_path / "s"), "--json").stdout)
    for args in ((f"s3://{BUCKET}/data/a.txt", f"{tmp_path}/o/"), (f"s3://{BUCKET}/data/", str(tmp_path / "p"))):
        result = lading("fetch", *args, "--json")
        assert result.returncode == 0, result.stderr
        fetched = json.loads(result.stdout)
        assert set(synced) <= set(fetched), set(synced) - set(fetched)
        assert fetched["files"] >= 1 and fetched["bytes"] >= 1 and fetched["skipped"] == 0
    again = json.loads(lading("fetch", f"s3://{BUCKET}/data/a.txt", f"{tmp_path}/o/", "--json").stdout)
    assert (again["files"], again["skipped"]) == (0, 1)


def test_a_directory_at_the_object_path_is_a_usage_error(s3, lading, tmp_path):
    (tmp_path / "a.txt").mkdir()
    (tmp_path / "a.txt" / "keep").write_text("k")
    # DEST names an existing directory: the object goes into it, as with cp
    assert lading("fetch", f"s3://{BUCKET}/data/a.txt", str(tmp_path / "a.txt")).returncode == 0
    assert (tmp_path / "a.txt" / "a.txt").read_bytes() == b"hello"
    (tmp_path / "a.txt" / "a.txt").unlink()
    (tmp_path / "a.txt" / "a.txt").mkdir()
    result = lading("fetch", f"s3://{BUCKET}/data/a.txt", f"{tmp_path}/a.txt/")
    one_line_error(result, 2, "is a directory")


# -- Ctrl-C stops pack within a second ------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory):
    """4,000 samples of 48 KiB (~190 MB): a pack of it runs for seconds, in 16 MB tasks."""
    root = tmp_path_factory.mktemp("pack-src")
    block = os.urandom(48 * 1024)
    for directory in range(40):
        (root / f"d{directory:02d}").mkdir()
        for number in range(100):
            (root / f"d{directory:02d}" / f"s{number:04d}.bin").write_bytes(block)
    return root


@pytest.mark.parametrize("when", ["forking", "writing"])
def test_ctrl_c_stops_pack_within_a_second_and_leaves_nothing(big_tree, tmp_path, when):
    import signal
    import time

    dest = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lading", "pack", str(big_tree), str(dest)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def ready() -> bool:
        staging = list(dest.glob(".*.lading-pack-*")) if dest.exists() else []
        if when == "forking":  # the staging directory exists: workers are about to be forked
            return bool(staging)
        return any(shard.stat().st_blocks for shard in staging[0].glob("*.tar")) if staging else False

    try:
        deadline = time.monotonic() + 60
        while not ready():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the pack did not start writing within 60 s"
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        sent = time.monotonic()
        _, stderr = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr
    assert stderr.strip() == "lading: interrupted"
    assert took < 1.0, f"pack took {took:.2f}s to stop"
    assert not dest.exists(), "an interrupted pack left an index, a shard, its staging directory or its DEST"


# -- help: every command has examples and exit codes; one name for parallelism; no dependency noise -----

HELP_COMMANDS = [
    ("check",),
    ("sync",),
    ("topology",),
    ("mount",),
    ("unmount",),
    ("pack",),
    ("hook",),
    ("hook", "init"),
    ("hook", "run"),
    ("fetch",),
    ("bind-mounts",),
]


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=" ".join)
def test_every_command_help_has_the_shape_of_check(lading, command):
    result = lading(*command, "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.index("Examples:") < text.index("Exit codes:") < text.index("Options:"), text
    examples = text[text.index("Examples:") : text.index("Exit codes:")]
    assert f"lading {' '.join(command)}" in examples or (command == ("hook",) and "lading hook init" in examples)


def test_parallelism_is_workers_everywhere(lading, tmp_path):
    assert "--workers" in lading("sync", "--help").stdout
    mount_help = lading("mount", "--help").stdout
    assert "--workers" in mount_help and "--concurrency" in mount_help  # the old name still works
    for flag in ("--workers", "--concurrency"):
        result = lading("mount", str(tmp_path), str(tmp_path / "missing"), flag, "8")
        one_line_error(result, 3, "does not exist")  # parsed; failed later, on the mount point


def test_the_cli_hides_google_api_core_version_warnings():
    script = """
import datetime, warnings
from google.api_core import _python_version_support as support
{prelude}
support.check_python_version("google.api_core", today=datetime.date(2031, 1, 1))
warnings.warn("other warnings still show", UserWarning)
"""
    prelude = "from lading.cli.main import main\ntry:\n    main(['topology', '--json'])\nexcept SystemExit:\n    pass\n"
    plain = subprocess.run([sys.executable, "-c", script.format(prelude="")], capture_output=True, text=True)
    assert "FutureWarning" in plain.stderr  # the check does warn on that date
    cli = subprocess.run([sys.executable, "-c", script.format(prelude=prelude)], capture_output=True, text=True)
    assert "FutureWarning" not in cli.stderr and "other warnings still show" in cli.stderr, cli.stderr
    library = subprocess.run(
        [sys.executable, "-c", script.format(prelude="import lading.sync, lading.stores\n")],
        capture_output=True,
        text=True,
    )
    assert "FutureWarning" in library.stderr  # the library leaves the application's filters alone


# -- a broken manifest, a .detignore that ignores everything ----------------------------------------------


@pytest.mark.parametrize("text", ["{not json", '[{"prefix": "s3://first-use/data/"}, "a.txt",', '{"a": 1}'])
def test_a_manifest_that_is_not_valid_json_is_a_usage_error(lading, tmp_path, text):
    manifest = tmp_path / "bad.json"
    manifest.write_text(text)
    result = lading("sync", f"s3://{BUCKET}/data", str(tmp_path / "dest"), "--manifest", str(manifest))
    one_line_error(result, 2, "bad.json")
    assert "JSON" in result.stderr and "object not found" not in result.stderr
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("detignore", ["***\n", "*\n", "/*\n"])
def test_a_detignore_that_ignores_everything_is_warned_about(lading, tmp_path, detignore):
    import json

    (tmp_path / "model_def.py").write_text("class Trial: ...\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.bin").write_bytes(b"x" * 100)
    (tmp_path / ".detignore").write_text(detignore)
    result = lading("check", str(tmp_path))
    assert result.returncode == 0 and "uploads 0 B" in result.stdout
    assert "det would upload nothing" in result.stdout, result.stdout
    report = json.loads(lading("check", str(tmp_path), "--json").stdout)
    assert [w["kind"] for w in report["warnings"]] == ["nothing_uploaded"]
    (tmp_path / ".detignore").write_text("data/\n")
    assert "nothing" not in lading("check", str(tmp_path)).stdout


# -- the mount's log: user-level wording, consistent stats, no libfuse noise ---------------------------


def _needs_fuse() -> None:
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("needs /dev/fuse and fusermount3")


def test_a_failed_read_is_logged_in_user_terms_and_counted(tmp_path):
    import errno
    import re

    from test_mount_support import mounted

    _needs_fuse()
    source = tmp_path / "src"
    source.mkdir()
    (source / "big.bin").write_bytes(os.urandom(3 << 20))
    with mounted(str(source), tmp_path / "mnt") as mnt:
        fd = os.open(mnt.path / "big.bin", os.O_RDONLY)
        try:
            (source / "big.bin").write_bytes(os.urandom(3 << 20))  # replaced after mounting
            with pytest.raises(OSError) as caught:
                os.pread(fd, 65536, 2 << 20)
            assert caught.value.errno == errno.EIO
        finally:
            os.close(fd)
        stats = mnt.stats()
        assert stats["read_errors"] >= 1 and stats["request_errors"] >= 1, stats
    log = mnt.log.read_text()
    failures = [line for line in log.splitlines() if "WARNING" in line and "failed" in line]
    assert any("read /big.bin at " in line and "(EIO)" in line for line in failures), log
    assert "read_into" not in log and not re.search(r"\d{12,}", log), log  # no internal names, no pointers


def test_foreground_mount_prints_no_libfuse_noise(tmp_path):
    import signal
    import time

    from test_mount_support import force_unmount

    _needs_fuse()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lading", "mount", str(tmp_path / "src"), str(mountpoint), "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mountpoint):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert (mountpoint / "a.txt").read_text() == "a"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        force_unmount(mountpoint)
    assert "mounted " in stderr and "unmounted " in stderr
    assert "Ignoring invalid max threads" not in stderr, stderr


def test_libfuse_messages_other_than_the_noise_still_show():
    script = (
        "import ctypes\n"
        "from lading.mounts.fuse_lib import load_mfusepy\n"
        "log = load_mfusepy()._libfuse.fuse_log\n"
        "log(3, b'Ignoring invalid max threads value %u > max (%u).\\n', ctypes.c_uint(4294967295), "
        "ctypes.c_uint(100000))\n"
        "log(3, b'fuse: %s %d\\n', b'kept', ctypes.c_int(7))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if result.returncode != 0 and "cannot load libfuse" in result.stderr:
        pytest.skip("no libfuse")
    assert result.returncode == 0, result.stderr
    assert result.stderr == "fuse: kept 7\n"


# -- .ci/setup: no noise that looks like a failure, real errors and the exit status kept --------------


def _quiet(function: str, command: str, tmp_path: Path, env: dict[str, str] | None = None):
    script = f"set -euo pipefail; . {REPO}/.ci/quiet.sh; {function} {command}"
    return subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_setup_drops_debconf_notes_but_keeps_apt_errors_and_status(tmp_path):
    fake_apt = tmp_path / "apt-get"
    fake_apt.write_text(
        "#!/bin/sh\n"
        "echo 'Selecting previously unselected package fuse3.'\n"
        "echo 'debconf: delaying package configuration, since apt-utils is not installed' >&2\n"
        "echo 'debconf: unable to initialize frontend: Dialog' >&2\n"
        "echo 'E: Unable to locate package fuse9' >&2\n"
        "exit 100\n"
    )
    fake_apt.chmod(0o755)
    result = _quiet("quiet_apt", f"{fake_apt} install -y fuse3", tmp_path)
    assert result.returncode == 100
    assert result.stdout == "" and result.stderr == "E: Unable to locate package fuse9\n"


def test_setup_silences_the_editable_install_box_but_keeps_pip_errors_and_status(tmp_path):
    fake_python = tmp_path / "python"  # stands in for `.venv/bin/python -m pip ...`
    fake_python.write_text(f"""#!/bin/sh
{sys.executable} - <<'PY'
import sys, warnings
warnings.warn_explicit("Editable installation.\\n!!\\n*** Please be careful with folders ... ***\\n!!",
                       UserWarning, "editable_wheel.py", 354, module="setuptools.command.editable_wheel")
print("ERROR: Could not find a version that satisfies the requirement nope", file=sys.stderr)
print("WARNING: Location 'https://example.invalid/simple' is ignored", file=sys.stderr)
PY
exit 1
""")
    fake_python.chmod(0o755)
    result = _quiet("quiet_pip", "install -e .", tmp_path, env={"PIP_PYTHON": str(fake_python)})
    assert result.returncode == 1
    assert "Editable installation" not in result.stdout + result.stderr
    assert "WARNING: Location" not in result.stdout + result.stderr
    assert "ERROR: Could not find a version" in result.stdout + result.stderr


def test_setup_uses_the_quiet_wrappers():
    setup = (REPO / ".ci" / "setup").read_text()
    assert ". .ci/quiet.sh" in setup
    assert "quiet_apt $SUDO apt-get update" in setup and "quiet_apt $SUDO env DEBIAN_FRONTEND" in setup
    assert "quiet_pip install -e '.[test,docs]'" in setup


@pytest.mark.parametrize(
    "command", [("sync",), ("fetch",), ("pack",), ("cat",), ("hook",), ("hook", "run"), ("snapshot",)], ids=" ".join
)
def test_commands_that_write_local_files_list_exit_6(lading, command):
    # A full disk or a name too long for the file system is exit 6 for each of these (e.g.
    # test_defects_paths: pack and snapshot onto a full disk); their help listed 0-5 and 130 only.
    text = lading(*command, "--help").stdout
    codes = " ".join(text[text.index("Exit codes:") : text.index("Options:")].split())
    assert "6 local disk" in codes, codes
