"""Session fixtures: real S3 (moto) and GCS (emulator) servers on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from servers import Server, reset_moto, start_gcs, start_moto  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def moto_server(server_logs: Path) -> Iterator[Server]:
    """One moto S3 server for the session; use ``s3_env`` for a clean state per test."""
    server = start_moto(server_logs)
    yield server
    server.stop()


@pytest.fixture
def s3_env(moto_server: Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A reset moto server, with the AWS variables pointing at it set for this test."""
    reset_moto(moto_server)
    for name, value in moto_server.env.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return dict(moto_server.env)


@pytest.fixture(scope="session")
def gcs_server(server_logs: Path) -> Iterator[Server]:
    """One GCS emulator for the session."""
    server = start_gcs(server_logs)
    yield server
    server.stop()


@pytest.fixture
def gcs_env(gcs_server: Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The emulator's variables set for this test."""
    for name, value in gcs_server.env.items():
        monkeypatch.setenv(name, value)
    return dict(gcs_server.env)


def run_lading(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
               input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as users do."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "lading", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or REPO, input=input, timeout=timeout)


@pytest.fixture
def lading():
    """``lading(*args, env=...)`` runs the CLI in a subprocess and returns CompletedProcess."""
    return run_lading
