"""Real test servers on 127.0.0.1: moto's S3 server and the GCS emulator, as subprocesses.

Each starts on a free port, is polled until it answers, and is stopped by PID.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Poll ``url`` until it answers any HTTP status; fail fast if ``proc`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering {url}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


@dataclass
class Server:
    """A running server subprocess."""

    name: str
    port: int
    proc: subprocess.Popen
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop the process (and its group) by PID and reap it."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _spawn(argv: list[str], log: Path) -> subprocess.Popen:
    handle = open(log, "wb")
    return subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)


def start_moto(log_dir: Path, port: int | None = None) -> Server:
    """moto in server mode (S3 over HTTP). ``POST /moto-api/reset`` clears it."""
    port = port or free_port()
    proc = _spawn([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                  log_dir / f"moto-{port}.log")
    server = Server("moto", port, proc)
    try:
        wait_http(f"{server.url}/moto-api/", proc)
    except Exception:
        server.stop()
        raise
    server.env = {
        "AWS_ENDPOINT_URL": server.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return server


def start_gcs(log_dir: Path, port: int | None = None) -> Server:
    """gcp-storage-emulator in memory, with a deeper listen backlog (see gcs_emulator.py)."""
    port = port or free_port()
    proc = _spawn([sys.executable, str(HERE / "gcs_emulator.py"), "127.0.0.1", str(port)],
                  log_dir / f"gcs-{port}.log")
    server = Server("gcs", port, proc)
    try:
        wait_http(f"{server.url}/storage/v1/b", proc)
    except Exception:
        server.stop()
        raise
    server.env = {"STORAGE_EMULATOR_HOST": server.url, "GOOGLE_CLOUD_PROJECT": "test"}
    return server


def reset_moto(server: Server) -> None:
    """Drop every bucket and object in the moto server."""
    request = urllib.request.Request(f"{server.url}/moto-api/reset", method="POST")
    urllib.request.urlopen(request, timeout=10).close()
