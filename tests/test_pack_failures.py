"""A pack that fails or is killed leaves no index (and, locally, no shards) behind; the CLI's
usage errors and JSON summary."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from lading.core.errors import LocalIOError, ObjectChanged, TransientError
from lading.pack import PackOptions, plan_pack, run_pack, write_pack
from lading.pack.sources import LocalSource
from lading.pack.upload import LocalPublisher, StorePublisher
from lading.stores.local import LocalStore

REPO = Path(__file__).resolve().parent.parent


def make_source(root: Path, count: int = 30, size: int = 3000) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (root / f"s{i:03d}.bin").write_bytes(bytes([i % 251]) * size)
        (root / f"s{i:03d}.txt").write_text(f"sample {i}")


class FailingStore(LocalStore):
    """A LocalStore whose upload number ``fail_at`` (1-based) fails like a dropped connection."""

    def __init__(self, root: Path, fail_at: int) -> None:
        super().__init__(root)
        self.fail_at = fail_at
        self.uploaded: list[str] = []

    def upload(self, src, key, progress=None):
        if len(self.uploaded) + 1 == self.fail_at:
            raise TransientError("connection reset by peer (injected)")
        info = super().upload(src, key, progress)
        self.uploaded.append(key)
        return info


def test_store_failure_mid_pack_leaves_no_index(tmp_path):
    source, dest = tmp_path / "src", tmp_path / "bucket"
    make_source(source)
    dest.mkdir()
    plan = plan_pack(str(source), str(dest), PackOptions("ds", shard_size=20_000))
    assert len(plan.shards) >= 4
    store = FailingStore(dest, fail_at=3)
    publisher = StorePublisher(store, plan)
    staging = publisher.shard_path(plan.shards[0]).parent
    with pytest.raises(TransientError, match="injected"):
        write_pack(plan, LocalSource(source), publisher, str(dest))
    assert store.uploaded == ["ds-000000.tar", "ds-000001.tar"]
    assert not (dest / "ds.index.json").exists() and not (dest / "ds.manifest.json").exists()
    assert not staging.exists(), "temporary shards left behind"


def test_store_upload_order_puts_index_last(tmp_path):
    source, dest = tmp_path / "src", tmp_path / "bucket"
    make_source(source)
    dest.mkdir()
    plan = plan_pack(str(source), str(dest), PackOptions("ds", shard_size=20_000, version="v1"))
    store = FailingStore(dest, fail_at=0)
    write_pack(plan, LocalSource(source), StorePublisher(store, plan), str(dest))
    shards = [f"ds/v1/{shard.name}" for shard in plan.shards]
    assert store.uploaded == shards + ["ds/v1/ds.manifest.json", "ds/v1/ds.offsets.safetensors", "ds/v1/ds.index.json"]


def test_write_failure_cleans_up_local_dest(tmp_path):
    source, dest = tmp_path / "src", tmp_path / "out"
    make_source(source)
    plan = plan_pack(str(source), str(dest), PackOptions("ds", shard_size=20_000))

    class DiskFullsMidPack(LocalSource):
        def write_members(self, members, writer):
            members = list(members)
            if any(member.info.key == "s020.bin" for member in members):
                raise OSError(errno.ENOSPC, "No space left on device")
            super().write_members(members, writer)

    with pytest.raises(LocalIOError, match="No space left"):  # exit 6, as sync and fetch
        write_pack(plan, DiskFullsMidPack(source), LocalPublisher(dest, plan), str(dest))
    assert not dest.exists(), "shards, index, staging directory or the DEST pack made left behind"


def test_file_changed_after_listing_is_refused(tmp_path):
    source, dest = tmp_path / "src", tmp_path / "out"
    make_source(source)
    plan = plan_pack(str(source), str(dest), PackOptions("ds", shard_size=20_000))
    (source / "s020.bin").write_bytes(b"grown" * 2000)
    with pytest.raises(ObjectChanged, match="s020.bin changed"):
        run_pack(plan, str(source), str(dest))
    assert not dest.exists()


KILLABLE = """
import sys, threading
from pathlib import Path
from lading.pack import PackEvents, PackOptions, plan_pack, run_pack

source, dest, marker = sys.argv[1:4]

class StopAfterFirstShard(PackEvents):
    def on_shard(self, name, nbytes):
        Path(marker).write_text(name)
        threading.Event().wait()  # block here until the test kills us

plan = plan_pack(source, dest, PackOptions("ds", shard_size=20_000))
run_pack(plan, source, dest, events=StopAfterFirstShard())
"""


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def wait_gone(pids: list[int], timeout: float = 30) -> list[int]:
    """Poll until none of ``pids`` is alive (zombies count as gone); return those still running."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as handle:
                    if handle.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except OSError:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


def test_kill_9_mid_pack_leaves_no_index_and_next_pack_cleans_up(tmp_path):
    source, dest, marker = tmp_path / "src", tmp_path / "out", tmp_path / "marker"
    make_source(source)
    proc = subprocess.Popen([sys.executable, "-c", KILLABLE, str(source), str(dest), str(marker)], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "the pack exited before its first shard"
            assert time.monotonic() < deadline, "no shard written within 60 s"
            time.sleep(0.02)
        workers = children_of(proc.pid)
        assert workers, "expected forked writer processes"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert wait_gone(workers) == [], "worker processes outlived the killed pack"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    visible = [name for name in os.listdir(dest) if not name.startswith(".")]
    assert visible == [], "a killed pack published something"
    leftovers = [name for name in os.listdir(dest) if name.startswith(".ds.lading-pack-")]
    assert len(leftovers) == 1
    assert (dest / leftovers[0] / "ds-000000.tar").exists()

    plan = plan_pack(str(source), str(dest), PackOptions("ds", shard_size=20_000))
    run_pack(plan, str(source), str(dest))
    assert (dest / "ds.index.json").exists()
    assert not [name for name in os.listdir(dest) if name.startswith(".")], "stale staging not removed"


# --- the CLI --------------------------------------------------------------------------------


def test_cli_json_summary(lading, tmp_path):
    source, dest = tmp_path / "images", tmp_path / "out"
    make_source(source)
    result = lading("pack", str(source), str(dest), "--shard-size", "20KB", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["name"] == "images"  # from SOURCE's last folder
    assert summary["samples"] == 30 and summary["files"] == 60
    assert summary["index"] == f"{dest}/images.index.json"
    assert [s["name"] for s in summary["shards"]] == sorted(p.name for p in dest.glob("*.tar"))
    with tarfile.open(dest / "images-000000.tar") as archive:
        assert archive.getnames()[:2] == ["s000.bin", "s000.txt"]


def test_cli_dry_run_writes_nothing(lading, tmp_path):
    source, dest = tmp_path / "src", tmp_path / "out"
    make_source(source)
    result = lading(
        "pack", str(source), str(dest), "--shard-size", "20KB", "--dry-run", "--json", "--name", "ds", "--version", "v3"
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["dry_run"] is True and plan["index"] == "ds/v3/ds.index.json"
    assert plan["shards"][0]["name"] == "ds/v3/ds-000000.tar"
    assert not dest.exists()


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["--shard-size", "12 parsecs"], 2, "'--shard-size': invalid size"),  # the option named, as cat's
        (["--shard-size", "0"], 2, "'--shard-size': invalid size"),
        (["--seed", "3"], 2, "--seed only makes sense with --shuffle"),
        (["--name", "../evil"], 2, "not usable in shard names"),
        (["--version", "v 1"], 2, "not usable in shard names"),
    ],
)
def test_cli_usage_errors(lading, tmp_path, args, code, words):
    source = tmp_path / "src"
    make_source(source, count=2)
    result = lading("pack", str(source), str(tmp_path / "out"), *args)
    assert result.returncode == code
    assert words in result.stderr and "Traceback" not in result.stderr


def test_cli_refusals(lading, tmp_path):
    source = tmp_path / "src"
    make_source(source, count=2)
    missing = lading("pack", str(tmp_path / "nope"), str(tmp_path / "out"))
    assert missing.returncode == 3 and "no such directory" in missing.stderr
    a_file = lading("pack", str(source / "s000.bin"), str(tmp_path / "out"))
    assert a_file.returncode == 2 and "is a file" in a_file.stderr
    (tmp_path / "taken").write_text("a file where DEST should be")
    dest_file = lading("pack", str(source), str(tmp_path / "taken"))
    assert dest_file.returncode == 2 and "is not a directory" in dest_file.stderr
    inside = lading("pack", str(source), str(source / "shards"))
    assert inside.returncode == 2 and "inside SOURCE" in inside.stderr
    (source / "README").write_text("no extension")
    misnamed = lading("pack", str(source), str(tmp_path / "out"))
    assert misnamed.returncode == 2 and "'README'" in misnamed.stderr and "no extension" in misnamed.stderr
    (source / "README").unlink()
    first = lading("pack", str(source), str(tmp_path / "out"), "--name", "ds")
    assert first.returncode == 0, first.stderr
    again = lading("pack", str(source), str(tmp_path / "out"), "--name", "ds")
    assert again.returncode == 2 and "already exists" in again.stderr
    outputs = missing.stderr + a_file.stderr + dest_file.stderr + inside.stderr + misnamed.stderr + again.stderr
    assert "Traceback" not in outputs and "internal error" not in outputs


def test_ctrl_c_mid_pack_removes_everything(tmp_path):
    source, dest, marker = tmp_path / "src", tmp_path / "out", tmp_path / "marker"
    make_source(source)
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLABLE, str(source), str(dest), str(marker)],
        cwd=REPO,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "the pack exited before its first shard"
            assert time.monotonic() < deadline, "no shard written within 60 s"
            time.sleep(0.02)
        workers = children_of(proc.pid)
        assert workers, "expected forked writer processes"
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        assert wait_gone(workers) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert b"KeyboardInterrupt" in stderr
    assert not dest.exists(), "an interrupted pack left files (or the DEST it made) behind"


def test_bucket_pack_keeps_few_temporary_shards(tmp_path):
    source, dest = tmp_path / "src", tmp_path / "bucket"
    make_source(source, count=60)
    dest.mkdir()
    plan = plan_pack(str(source), str(dest), PackOptions("ds", shard_size=12_000))
    assert len(plan.shards) >= 12

    class CountingStore(LocalStore):
        most = 0

        def upload(self, src, key, progress=None):
            CountingStore.most = max(CountingStore.most, len(list(Path(src).parent.glob("*.tar"))))
            return super().upload(src, key, progress)

    write_pack(plan, LocalSource(source), StorePublisher(CountingStore(dest), plan), str(dest))
    assert 1 <= CountingStore.most <= 5, f"{CountingStore.most} temporary shards on disk at once"
    assert (dest / "ds.index.json").exists()


def test_log_progress_lines(capsys):
    from lading.cli.cmd_pack import _LogLines

    lines = _LogLines(total=4 << 20, interval=0.0)
    lines.on_shard("ds-000000.tar", 1)
    lines.on_bytes(1 << 20)
    err = capsys.readouterr().err
    assert "lading pack: 1.0 MiB of 4.0 MiB (25%), 1 shard(s) done" in err


def test_a_directory_lading_sync_filled_packs_without_its_state_files(tmp_path):
    from conftest import run_lading

    source = tmp_path / "bucket-copy"
    source.mkdir()
    for i in range(3):
        (source / f"s{i}.txt").write_text(f"sample {i}")
    synced = tmp_path / "synced"
    done = run_lading("sync", str(source), str(synced), "-q")
    assert done.returncode == 0, done.stderr
    assert (synced / ".lading-sync.json").exists()
    done = run_lading("pack", str(synced), str(tmp_path / "out"), "--name", "ds", "-q")
    assert done.returncode == 0, done.stderr
    index = json.loads((tmp_path / "out" / "ds.index.json").read_text())
    assert sum(shard["nsamples"] for shard in index["shardlist"]) == 3
