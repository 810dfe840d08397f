"""An endpoint that accepts connections and never answers (a load balancer with no targets): lading
says on stderr that it is retrying, which endpoint, attempt n of m, gives up after a few attempts
since the endpoint never answered once, and ends with one line and exit 5."""

from __future__ import annotations

import socket
import threading
from typing import Iterator

import pytest


class SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never sends a byte; counts the connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.sock.settimeout(0.1)  # so the accepting thread sees close() soon
        self.connections: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            self.connections.append(conn)

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        self.sock.close()
        for conn in self.connections:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


STATIC = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "LADING_TIMEOUT": "1"}


@pytest.mark.parametrize(
    "command", [["sync", "s3://silent-bucket/data", "{dest}"], ["cat", "s3://silent-bucket/data/a.bin"]]
)
def test_a_silent_endpoint_is_retried_aloud_and_given_up_on_soon(silent, tmp_path, lading, command, monkeypatch):
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "LADING_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    args = [part.format(dest=tmp_path / "out") for part in command]
    endpoint = f"http://127.0.0.1:{silent.port}"
    result = lading(*args, "--endpoint-url", endpoint, env={**STATIC, "HOME": str(tmp_path)}, timeout=60)

    assert result.returncode == 5, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert f"no answer from {endpoint}" in result.stderr and "retrying, attempt 2 of 3" in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("lading: error")]
    assert len(errors) == 1, result.stderr
    assert len(silent.connections) <= 3  # the policy's 6 attempts are not spent on a dead endpoint
