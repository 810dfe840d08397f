"""kill -9 in the middle of a ranged download, then a re-run: it fetches only the parts the killed
run had not finished (counted at a proxy), and the file is byte-identical."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from conftest import REPO
from lading.stores.download import PART_SIZE
from lading.transfer import TransferOptions
from lading.transfer.files import ResumeRecord, sidecar_path
from proxies import FaultProxy
from sync_fixtures import BUCKET, put_objects, s3_client

PART = PART_SIZE  # the engine's default part size
PARTS = TransferOptions().multipart_threshold // PART + 1  # a ranged download at the CLI's defaults


def _part_range(index: int, size: int) -> str:
    return f"bytes={index * PART}-{min(size, (index + 1) * PART) - 1}"


def test_kill_9_mid_download_then_rerun_fetches_only_the_unfinished_parts(s3_env, tmp_path, lading):
    body = os.urandom(PARTS * PART - 12345)
    put_objects(s3_client(s3_env), {"big.bin": body})
    dest = tmp_path / "out"
    sidecar = sidecar_path(dest / "big.bin")
    stalled = threading.Event()
    release = threading.Event()

    def stall() -> None:  # the fourth part's GET hangs mid-body until the process is gone
        stalled.set()
        release.wait(60)

    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        proxy.add_fault("truncate", first=1, method="GET", path_prefix=f"/{BUCKET}/data/big.bin", after=3, then=stall)
        env = dict(os.environ, AWS_ENDPOINT_URL=proxy.url)
        proc = subprocess.Popen(
            [sys.executable, "-m", "lading", "sync", f"s3://{BUCKET}/data", str(dest)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 90
            record = None
            while time.monotonic() < deadline and proc.poll() is None:
                record = ResumeRecord.load(sidecar)
                if stalled.is_set() and record is not None and len(record.done) == PARTS - 1:
                    break
                time.sleep(0.01)
            assert proc.poll() is None, "the sync ended before it could be killed"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            release.set()
        record = ResumeRecord.load(sidecar)
        assert record is not None and len(record.done) == PARTS - 1, record
        assert not (dest / "big.bin").exists()

        proxy.clear_faults()
        proxy.reset_counts()
        result = lading("sync", f"s3://{BUCKET}/data", str(dest), env={"AWS_ENDPOINT_URL": proxy.url})
        gets = [seen for seen in proxy.requests if seen.method == "GET" and seen.path.endswith("/big.bin")]

    assert result.returncode == 0, result.stderr
    assert (dest / "big.bin").read_bytes() == body
    [missing] = sorted(set(range(PARTS)) - record.done)
    assert [seen.headers.get("Range") for seen in gets] == [_part_range(missing, len(body))]
    assert not sidecar.exists()
