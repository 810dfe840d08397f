"""`lading cat`: objects streamed in order (SageMaker's Pipe mode) against moto and the GCS emulator,
through the counting proxy; sharding, prefetch, version checks, closed pipes, Ctrl-C, FIFOs."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO
from lading.core.errors import ObjectChanged
from lading.selection.stream import (
    StreamOptions,
    StreamRequest,
    expand_braces,
    select_stream,
    stream_objects,
)
from lading.stores.local import LocalStore
from proxies import FaultProxy
from sync_fixtures import s3_client

BUCKET = "cat-bucket"
SOURCE = f"s3://{BUCKET}/data"


def body(i: int, size: int) -> bytes:
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (size // 32 + 1))[:size]


OBJECTS = {f"obj-{i:03d}.bin": body(i, 1000 + 300 * i) for i in range(12)}


def lading_process(*args: str, env: dict[str, str], **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lading", *args], env={**os.environ, **env}, cwd=REPO, **popen)


def object_gets(proxy: FaultProxy) -> list:
    return [
        seen
        for seen in proxy.requests
        if seen.method == "GET" and "list-type" not in seen.query and seen.path.startswith(f"/{BUCKET}/")
    ]


class MeteredProxy(FaultProxy):
    """A FaultProxy that holds every object GET for ``delay`` seconds and records how many ran at once."""

    def __init__(self, upstream_url: str, delay: float = 0.15) -> None:
        super().__init__(upstream_url)
        self.delay = delay
        self.in_flight = 0
        self.most = 0
        self.meter_lock = threading.Lock()

    def _open_upstream(self) -> http.client.HTTPConnection:
        proxy = self

        class Connection(http.client.HTTPConnection):
            counted = False

            def request(self, method, url, *args, **kwargs):  # noqa: ANN001 - http.client's signature
                if method == "GET" and "list-type" not in url and url.startswith(f"/{BUCKET}/"):
                    self.counted = True
                    with proxy.meter_lock:
                        proxy.in_flight += 1
                        proxy.most = max(proxy.most, proxy.in_flight)
                    time.sleep(proxy.delay)
                return super().request(method, url, *args, **kwargs)

            def close(self) -> None:
                if self.counted:
                    self.counted = False
                    with proxy.meter_lock:
                        proxy.in_flight -= 1
                super().close()

        return Connection(self.upstream_host, self.upstream_port, timeout=120)


@pytest.fixture
def s3(s3_env):
    client = s3_client(s3_env)
    client.create_bucket(Bucket=BUCKET)
    for key, data in OBJECTS.items():
        client.put_object(Bucket=BUCKET, Key=f"data/{key}", Body=data)
    return client


@pytest.fixture
def proxy(s3, s3_env):
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as running:
        yield running


def everything(keys) -> bytes:
    return b"".join(OBJECTS[key] for key in keys)


# -- order, sources, dry run ---------------------------------------------------------------------


def test_prefix_streams_every_object_in_key_order_once(proxy):
    out = subprocess.run(
        [sys.executable, "-m", "lading", "cat", SOURCE],
        capture_output=True,
        cwd=REPO,
        env={**os.environ, "AWS_ENDPOINT_URL": proxy.url},
    )
    assert out.returncode == 0 and out.stderr == b""
    assert out.stdout == everything(sorted(OBJECTS))
    assert len(object_gets(proxy)) == len(OBJECTS)  # one GET per object, no more


def test_dry_run_lists_the_order(lading, s3):
    result = lading("cat", SOURCE, "--dry-run")
    assert result.returncode == 0, result.stderr
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert [row[0] for row in rows] == sorted(OBJECTS)
    assert [int(row[1]) for row in rows] == [len(OBJECTS[key]) for key in sorted(OBJECTS)]
    assert all(len(row[2]) == 32 for row in rows)  # the ETag every GET is pinned to


def test_manifest_order_single_object_and_shard_list(lading, s3, tmp_path):
    keys = ["obj-007.bin", "obj-002.bin", "obj-011.bin"]
    manifest = tmp_path / "keys.txt"
    manifest.write_text("\n".join(keys) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "lading", "cat", SOURCE, "--manifest", str(manifest)], capture_output=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == everything(keys)  # the manifest's order, not key order
    augmented = tmp_path / "train.manifest"
    augmented.write_text(
        "".join(
            json.dumps({"source-ref": f"{SOURCE}/{key}", "class": i}) + "\n" for i, key in enumerate(keys + keys[:1])
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "lading", "cat", SOURCE, "--manifest", str(augmented)], capture_output=True, cwd=REPO
    )
    assert out.returncode == 0 and out.stdout == everything(keys)  # each referenced object once

    out = subprocess.run(
        [sys.executable, "-m", "lading", "cat", f"{SOURCE}/obj-004.bin"], capture_output=True, cwd=REPO
    )
    assert out.returncode == 0 and out.stdout == OBJECTS["obj-004.bin"]
    out = subprocess.run(
        [sys.executable, "-m", "lading", "cat", f"{SOURCE}/obj-{{005..003}}.bin"], capture_output=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == everything(["obj-005.bin", "obj-004.bin", "obj-003.bin"])


def test_expand_braces():
    assert expand_braces("s-{000..002}.tar") == ["s-000.tar", "s-001.tar", "s-002.tar"]
    assert expand_braces("{train,val}/{1..2}") == ["train/1", "train/2", "val/1", "val/2"]
    assert expand_braces("plain") == ["plain"]


def test_sharded_ranks_are_disjoint_cover_everything_and_keep_order(lading, s3):
    listed: list[str] = []
    for rank in range(3):
        args = ("cat", SOURCE, "--distribution", "sharded", "--rank", str(rank), "--world-size", "3")
        keys = [line.split("\t")[0] for line in lading(*args, "--dry-run").stdout.splitlines()]
        assert keys == sorted(keys) and keys == sorted(OBJECTS)[rank::3]  # sync's rule: key i -> rank i mod 3
        out = subprocess.run([sys.executable, "-m", "lading", *args], capture_output=True, cwd=REPO)
        assert out.returncode == 0, out.stderr
        assert out.stdout == everything(keys)
        listed += keys
    assert sorted(listed) == sorted(OBJECTS) and len(set(listed)) == len(OBJECTS)
    # the rank comes from the launcher too, and --balance bytes is sync's other rule
    env = {"RANK": "1", "WORLD_SIZE": "2"}
    keys = [
        line.split("\t")[0]
        for line in lading(
            "cat", SOURCE, "--distribution", "sharded", "--balance", "bytes", "--dry-run", env=env
        ).stdout.splitlines()
    ]
    other = [
        line.split("\t")[0]
        for line in lading(
            "cat", SOURCE, "--distribution", "sharded", "--balance", "bytes", "--dry-run", "--rank", "0", env=env
        ).stdout.splitlines()
    ]
    assert keys and other and sorted(keys + other) == sorted(OBJECTS) and not set(keys) & set(other)


def test_shuffle_is_a_seeded_permutation(lading, s3):
    def order(*extra: str) -> list[str]:
        result = lading("cat", SOURCE, "--dry-run", *extra)
        assert result.returncode == 0, result.stderr
        return [line.split("\t")[0] for line in result.stdout.splitlines()]

    first, again, other = order("--shuffle", "--seed", "7"), order("--shuffle", "--seed", "7"), order("--shuffle")
    assert first == again and sorted(first) == sorted(OBJECTS) and first != sorted(OBJECTS) and first != other


# -- packed shards through tar -------------------------------------------------------------------


def test_cat_of_packed_shards_through_tar_lists_members_in_order(lading, s3, tmp_path):
    source = tmp_path / "images"
    for i in range(30):
        (source / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        (source / f"c{i % 3}" / f"{i:03d}.jpg").write_bytes(body(i, 2000 + 50 * i))
        (source / f"c{i % 3}" / f"{i:03d}.json").write_text(json.dumps({"label": i % 3}))
    result = lading(
        "pack", str(source), f"s3://{BUCKET}/ds", "--name", "pets", "--version", "v1", "--shard-size", "20KB"
    )
    assert result.returncode == 0, result.stderr
    shards = sorted(
        obj["Key"]
        for obj in s3.list_objects_v2(Bucket=BUCKET, Prefix="ds/pets/v1/")["Contents"]
        if obj["Key"].endswith(".tar")
    )
    assert len(shards) >= 3
    expected = []
    for key in shards:
        path = tmp_path / Path(key).name
        path.write_bytes(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        with tarfile.open(path) as tar:
            expected += tar.getnames()
    pipeline = (
        f"set -o pipefail; {sys.executable} -m lading cat s3://{BUCKET}/ds/pets/v1 --include '*.tar' "
        f"--part-size 8KiB | tar -t -i"
    )
    out = subprocess.run(["bash", "-c", pipeline], capture_output=True, text=True, cwd=REPO, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected
    assert len(expected) == 60 and expected[:2] == ["c0/000.jpg", "c0/000.json"]


# -- prefetch and memory -------------------------------------------------------------------------


def test_prefetch_runs_gets_in_parallel_and_memory_bounds_them(s3, s3_env):
    with MeteredProxy(s3_env["AWS_ENDPOINT_URL"]) as metered:
        env = {"AWS_ENDPOINT_URL": metered.url}
        out = lading_process("cat", SOURCE, "--workers", "4", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        data, err = out.communicate(timeout=60)
        assert out.returncode == 0, err
        assert data == everything(sorted(OBJECTS))
        assert metered.most >= 3, metered.most  # 12 GETs of 0.15 s, up to 4 at once
        assert len(object_gets(metered)) == len(OBJECTS)

        metered.most = 0
        out = lading_process("cat", SOURCE, "--workers", "1", env=env, stdout=subprocess.PIPE)
        assert out.communicate(timeout=60)[0] == everything(sorted(OBJECTS)) and metered.most == 1

        # one large object in 4 ranged GETs; memory for one part only: one GET at a time
        big = body(99, 1 << 20)
        s3.put_object(Bucket=BUCKET, Key="big/one.bin", Body=big)
        metered.most = 0
        metered.reset_counts()
        out = lading_process(
            "cat",
            f"s3://{BUCKET}/big/",
            "--part-size",
            "256KiB",
            "--max-memory",
            "256KiB",
            "--workers",
            "8",
            env=env,
            stdout=subprocess.PIPE,
        )
        assert out.communicate(timeout=60)[0] == big and metered.most == 1
        ranges = [seen.headers.get("Range") for seen in object_gets(metered)]
        assert ranges == [
            f"bytes=0-{(1 << 18) - 1}",
            f"bytes={1 << 18}-{(2 << 18) - 1}",
            f"bytes={2 << 18}-{(3 << 18) - 1}",
            f"bytes={3 << 18}-{(4 << 18) - 1}",
        ]
        metered.most = 0
        out = lading_process(
            "cat", f"s3://{BUCKET}/big/", "--part-size", "256KiB", "--workers", "8", env=env, stdout=subprocess.PIPE
        )
        assert out.communicate(timeout=60)[0] == big and metered.most >= 3


# -- failures ------------------------------------------------------------------------------------


def test_an_object_replaced_mid_stream_fails_with_exit_1_naming_the_key(s3, proxy):
    def replace() -> None:
        s3.put_object(Bucket=BUCKET, Key="data/obj-006.bin", Body=b"a new version")

    proxy.add_fault("slowdown", first=1, method="GET", path_prefix=f"/{BUCKET}/data/obj-006.bin", then=replace)
    out = lading_process(
        "cat", SOURCE, env={"AWS_ENDPOINT_URL": proxy.url}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    data, err = out.communicate(timeout=60)
    assert out.returncode == 1, err
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "obj-006.bin" in lines[0] and "changed" in lines[0], lines
    before = everything(sorted(OBJECTS)[:6])
    assert data == before  # every byte before it, and nothing of either version of it


def test_library_stream_checks_each_part_against_the_version(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"a" * 1000)
    (tmp_path / "b.bin").write_bytes(b"b" * 5000)
    store = LocalStore(tmp_path)
    objects = select_stream(store, StreamRequest(str(tmp_path)))
    written: list[bytes] = []

    def sink(chunk: memoryview) -> None:
        written.append(bytes(chunk))
        if len(written) == 2:  # after b.bin's first part: replace it (another size, another version)
            (tmp_path / "b.bin").write_bytes(b"B" * 4000)

    with pytest.raises(ObjectChanged, match="b.bin"):
        stream_objects(store, objects, sink, StreamOptions(workers=1, part_size=1000, max_memory=1000))
    assert b"".join(written) == b"a" * 1000 + b"b" * 1000


def test_nothing_at_source_and_a_file_in_place_of_the_fifo(lading, s3, tmp_path):
    result = lading("cat", f"s3://{BUCKET}/nothing-here")
    assert result.returncode == 3 and "nothing at" in result.stderr and len(result.stderr.splitlines()) == 1
    assert lading("cat", f"s3://{BUCKET}/nothing-here", "--allow-empty").returncode == 0
    plain = tmp_path / "plain"
    plain.write_text("x")
    result = lading("cat", SOURCE, "--fifo", str(plain))
    assert result.returncode == 2 and "not a named pipe" in result.stderr and plain.read_text() == "x"


def test_help_has_examples_and_exit_codes(lading):
    result = lading("cat", "--help")
    assert result.returncode == 0
    for needle in ("Examples:", "Exit codes:", "--fifo", "--dry-run", "tar -t -i", "130 interrupted"):
        assert needle in result.stdout
    assert "cat" in lading("--help").stdout


# -- pipes and signals ---------------------------------------------------------------------------


def wait_until(condition, what: str, timeout: float = 20.0) -> None:
    """Poll ``condition()`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def pipe_is_full(read_end: int) -> bool:
    """The pipe behind ``read_end`` holds as many bytes as it can: its writer is blocked."""
    import fcntl
    import termios

    queued = bytearray(4)
    fcntl.ioctl(read_end, termios.FIONREAD, queued)
    return int.from_bytes(queued, sys.byteorder) >= fcntl.fcntl(read_end, 1032)  # F_GETPIPE_SZ


def blocked_opening_a_fifo(pid: int, tid: int | None = None) -> bool:
    """A thread of ``pid`` (or thread ``tid``) sleeps in open() of a FIFO, waiting for its partner."""
    tasks = [str(tid)] if tid is not None else os.listdir(f"/proc/{pid}/task")
    for task in tasks:
        try:
            wchan = Path(f"/proc/{pid}/task/{task}/wchan").read_text()
        except OSError:
            continue
        if "partner" in wchan or "fifo_open" in wchan:
            return True
    return False


@pytest.fixture
def large(s3):
    """8 MiB in 8 objects: more than any pipe buffer."""
    for i in range(8):
        s3.put_object(Bucket=BUCKET, Key=f"large/{i}.bin", Body=body(i, 1 << 20))


def test_a_reader_that_goes_away_ends_the_stream_quietly(large):
    out = lading_process("cat", f"s3://{BUCKET}/large", env={}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert out.stdout.read(1000) == body(0, 1 << 20)[:1000]
    out.stdout.close()
    assert out.wait(timeout=30) == 0
    assert out.stderr.read() == b""
    pipeline = f"set -o pipefail; {sys.executable} -m lading cat s3://{BUCKET}/large | head -c 10 | wc -c"
    shell = subprocess.run(["bash", "-c", pipeline], capture_output=True, text=True, cwd=REPO)
    assert shell.returncode == 0 and shell.stdout.strip() == "10" and shell.stderr == ""


def test_a_full_disk_under_stdout_is_exit_6_in_one_line(tmp_path):
    # `lading cat SOURCE > file` on a full file system (here /dev/full: every write is ENOSPC)
    # was "internal error: OSError: [Errno 28] No space left on device", exit 1.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"x" * 1000)
    with open("/dev/full", "wb") as full:
        out = lading_process("cat", str(tmp_path / "src"), env={}, stdout=full, stderr=subprocess.PIPE)
        assert out.wait(timeout=30) == 6
    stderr = out.stderr.read().decode()
    assert stderr == "lading: error: cannot write stdout: No space left on device " + (
        "(hint: free space on that file system, or choose another destination)\n"
    ), stderr


def test_ctrl_c_mid_stream_exits_130(large):
    out = lading_process("cat", f"s3://{BUCKET}/large", env={}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert out.stdout.read(100_000)  # streaming; then nobody reads: the writer blocks on the full pipe
    wait_until(lambda: pipe_is_full(out.stdout.fileno()), "the pipe is full and lading cat blocks writing")
    out.send_signal(signal.SIGINT)
    started = time.monotonic()
    assert out.wait(timeout=10) == 130
    assert time.monotonic() - started < 3
    assert "interrupted" in out.stderr.read().decode()
    out.stdout.close()


def test_fifo_is_created_and_waits_for_a_reader(s3, tmp_path):
    fifo = tmp_path / "train_0"
    out = lading_process("cat", SOURCE, "--fifo", str(fifo), env={}, stderr=subprocess.PIPE)
    wait_until(fifo.exists, "lading cat created the FIFO")
    with open(fifo, "rb") as reader:
        data = reader.read()
    assert out.wait(timeout=30) == 0 and data == everything(sorted(OBJECTS))
    # an existing pipe is reused; Ctrl-C while waiting for a reader: 130
    out = lading_process("cat", SOURCE, "--fifo", str(fifo), env={}, stderr=subprocess.PIPE)
    wait_until(lambda: blocked_opening_a_fifo(out.pid), "lading cat waits for a reader of the FIFO")
    out.send_signal(signal.SIGINT)
    assert out.wait(timeout=10) == 130 and "interrupted" in out.stderr.read().decode()


def test_a_failure_before_streaming_releases_a_waiting_fifo_reader(s3, tmp_path):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    wait_until(
        lambda: reader.native_id is not None and blocked_opening_a_fifo(os.getpid(), reader.native_id),
        "the reader waits in open() of the FIFO",
    )
    out = lading_process("cat", f"s3://{BUCKET}/nothing-here", "--fifo", str(fifo), env={}, stderr=subprocess.PIPE)
    assert out.wait(timeout=30) == 3
    reader.join(timeout=10)
    assert got == [b""]  # EOF instead of a reader blocked forever


# -- GCS -----------------------------------------------------------------------------------------


def test_gcs_stream(gcs_env):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(
        project="test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": gcs_env["STORAGE_EMULATOR_HOST"]},
    )
    bucket = client.bucket("cat-gcs-bucket")
    if not bucket.exists():
        client.create_bucket("cat-gcs-bucket")
    for blob in client.list_blobs("cat-gcs-bucket"):
        blob.delete()
    for key, data in list(OBJECTS.items())[:5]:
        bucket.blob(f"data/{key}").upload_from_string(data)
    out = subprocess.run(
        [sys.executable, "-m", "lading", "cat", "gs://cat-gcs-bucket/data", "--part-size", "1KiB"],
        capture_output=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == everything(sorted(OBJECTS)[:5])


def test_a_snapshot_pins_the_stream(lading, tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for i in range(3):
        (source / f"{i}.bin").write_bytes(body(i, 5000))
    snap = tmp_path / "s.snap.jsonl"
    assert lading("snapshot", str(source), "-o", str(snap)).returncode == 0
    out = subprocess.run([sys.executable, "-m", "lading", "cat", str(snap)], capture_output=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout == b"".join(body(i, 5000) for i in range(3))
    out = subprocess.run(
        [sys.executable, "-m", "lading", "cat", str(source), "--snapshot", str(snap)], capture_output=True, cwd=REPO
    )
    assert out.returncode == 0 and out.stdout == b"".join(body(i, 5000) for i in range(3))
    (source / "1.bin").write_bytes(b"edited")
    out = subprocess.run([sys.executable, "-m", "lading", "cat", str(snap)], capture_output=True, cwd=REPO)
    assert out.returncode == 1 and b"1.bin" in out.stderr and out.stdout == body(0, 5000)


#: Modules a plain ``lading cat s3://...`` of one object has no use for: loading them is start-up
#: time paid before the first request (issue 25's 0.15 s budget).
NOT_FOR_CAT = ("json", "gzip", "lading.stores.snapshot", "lading.stores.s3.upload")


def test_cat_of_one_object_imports_only_what_it_reads_with(s3_env: dict[str, str], tmp_path: Path) -> None:
    s3 = s3_client(s3_env)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="data/one.bin", Body=b"payload")
    script = (
        "import sys\n"
        "from lading.cli.main import main\n"
        "try:\n"
        "    main(['cat', sys.argv[1]])\n"
        "finally:\n"
        "    sys.stderr.write(' '.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, f"{SOURCE}/one.bin"],
        env={**os.environ, **s3_env, "HOME": str(tmp_path), "SM_INPUT_CONFIG_DIR": str(tmp_path / "no-sagemaker")},
        capture_output=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout == b"payload"
    loaded = set(done.stderr.decode().split())
    assert "lading.stores.s3.store" in loaded  # the check sees the modules the read used
    assert loaded.isdisjoint(NOT_FOR_CAT), sorted(loaded.intersection(NOT_FOR_CAT))
