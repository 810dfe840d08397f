"""Session fixtures: real S3 (moto, rclone serve s3) and GCS (fake-gcs-server) servers on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from contextlib import contextmanager
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hermetic  # noqa: E402
from servers import Server, reset_moto, start_fake_gcs, start_moto, start_rclone_s3  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
_HERMETIC = pytest.StashKey[hermetic.Session]()


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


def pytest_configure(config: pytest.Config) -> None:
    """The suite keeps to its own TMPDIR, HOME and caches (tests/hermetic.py), from before any
    test module imports lading to the end of the session. Ctrl-C works in the suite and in the
    commands it starts even when the suite itself was started in the background of a
    non-interactive shell (`cmd &`), which ignores SIGINT in it and in everything it execs: the
    Ctrl-C tests would otherwise fail (9 of them did, in a CI run started that way).

    Under pytest-xdist (``-n``, as .ci/run runs the suite) the controller and every worker enter
    a session directory of their own; the controller's check at the end covers the workers' time."""
    worker = hasattr(config, "workerinput")
    if not worker and config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        os.environ[hermetic.REAL_TMP], os.environ[hermetic.REAL_HOME] = tempfile.gettempdir(), str(Path.home())
    config.stash[_HERMETIC] = hermetic.enter()
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Leave the session's folders, and fail the run if the suite left anything in the real
    temporary directory or HOME."""
    state = session.config.stash.get(_HERMETIC, None)
    if state is None:
        return
    left = hermetic.leave(state, passed=exitstatus == 0)
    if exitstatus != 0:
        print(f"\nthe session's TMPDIR and HOME are kept for inspection: {state.root}")
    if left:
        print(
            "\nthe test suite left these behind (tests must keep to their own folders; on a shared "
            "machine, another process may have made them meanwhile):\n  " + "\n  ".join(map(str, left))
        )
        session.exitstatus = 1


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
def rclone_server(server_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One ``rclone serve s3`` for the session, over an empty directory. It is never reset: tests
    create a bucket of their own through its S3 API (it caches directory listings)."""
    server = start_rclone_s3(server_logs, tmp_path_factory.mktemp("rclone-s3"))
    yield server
    server.stop()


@pytest.fixture
def rclone_env(rclone_server: Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The AWS variables pointing at the rclone S3 server, set for this test."""
    for name, value in rclone_server.env.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return dict(rclone_server.env)


@pytest.fixture(scope="session")
def gcs_server(server_logs: Path) -> Iterator[Server]:
    """One fake-gcs-server (in memory) for the session; tests use buckets of their own."""
    server = start_fake_gcs(server_logs)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_server_default(server_logs: Path) -> Iterator[Server]:
    """fake-gcs-server started as its documentation shows (no ``-public-host``, no
    ``-external-url``; in memory), for tests of lading against its default configuration."""
    server = start_fake_gcs(server_logs, public_host=None)
    yield server
    server.stop()


@pytest.fixture
def gcs_env(gcs_server: Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """fake-gcs-server's variables (``STORAGE_EMULATOR_HOST``) set for this test."""
    for name, value in gcs_server.env.items():
        monkeypatch.setenv(name, value)
    return dict(gcs_server.env)


@contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs of the test's own mounted at ``where`` (created) with mount ``options``, unmounted
    afterwards; the test is skipped where mounting is not allowed."""
    where.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True).returncode
        != 0
    ):
        pytest.skip(f"cannot mount a tmpfs ({options}) here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def read_only_mount(tmp_path: Path) -> Iterator[Path]:
    """A read-only tmpfs (defeats root); skipped where mounting is not allowed."""
    with tmpfs(tmp_path / "ro", "ro,size=1m") as where:
        yield where


def run_unprivileged(*args: str) -> subprocess.CompletedProcess:
    """The CLI as a user without write access (``nobody`` when the tests run as root)."""
    drop: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv to drop privileges")
        drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    return subprocess.run(
        [*drop, sys.executable, "-m", "lading", *args],
        capture_output=True,
        text=True,
        cwd="/",
        env=dict(os.environ),
        timeout=120,
    )


def one_line_error(result: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """Assert a CLI run failed with exit ``code`` and one ``lading: error:`` line naming ``words``
    (no traceback, no internal error); return that line."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lading: error: "), result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def run_lading(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    input: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as users do."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "lading", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or REPO,
        input=input,
        timeout=timeout,
    )


@pytest.fixture
def lading():
    """``lading(*args, env=...)`` runs the CLI in a subprocess and returns CompletedProcess."""
    return run_lading
