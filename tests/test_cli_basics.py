"""The group-level contract: version, help, usage errors and the exit-code table."""

from lading import __version__


def test_version(lading):
    result = lading("--version")
    assert result.returncode == 0
    assert __version__ in result.stdout


def test_help_lists_commands_and_exit_codes(lading):
    result = lading("--help")
    assert result.returncode == 0
    assert "check" in result.stdout
    assert "130  interrupted" in result.stdout


def test_unknown_command_is_usage_error(lading):
    result = lading("no-such-command")
    assert result.returncode == 2
    assert "No such command" in result.stderr
    assert "Traceback" not in result.stderr


def test_servers_answer(moto_server, rclone_server, gcs_server):
    import urllib.error
    import urllib.request

    for server in (moto_server, rclone_server, gcs_server):
        assert server.proc.poll() is None
        try:
            with urllib.request.urlopen(server.url + "/", timeout=5) as response:
                status = response.status
        except urllib.error.HTTPError as err:  # fake-gcs-server: 404, rclone: 400 (unsigned)
            status = err.code
        assert status < 500, server.name


def test_bad_progress_interval_is_one_line_usage_error(lading, tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("a")
    dest = tmp_path / "dest"
    result = lading("sync", str(source), str(dest), env={"LADING_PROGRESS_SECONDS": "soon"})
    assert result.returncode == 2
    assert result.stderr.strip() == "lading: error: LADING_PROGRESS_SECONDS='soon' is not a number"
    assert not dest.exists()


_ARENAS = """
import ctypes, sys, threading
from lading.cli.main import keep_freed_memory
keep_freed_memory(one_arena=sys.argv[1] == "one")
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
held, ready = [], threading.Barrier(5)
def allocate():
    held.append(libc.malloc(1 << 20))  # a runtime thread collecting a body
    ready.wait()
threads = [threading.Thread(target=allocate) for _ in range(4)]
for thread in threads:
    thread.start()
ready.wait()
libc.fopen.restype = ctypes.c_void_p
out = libc.fopen(sys.argv[2].encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(out))
libc.fclose(ctypes.c_void_p(out))
"""


def test_data_commands_keep_one_malloc_arena(tmp_path):
    """`lading sync`/`cat`/`hook` allocate from one heap (a part buffer freed after one runtime
    thread collected it is reused whichever thread collects the next), `mount` keeps an arena per
    thread; glibc's own report (malloc_info) counts the heaps threads allocated from."""
    import subprocess
    import sys

    from lading.cli.main import _DATA_COMMANDS, _ONE_ARENA_COMMANDS

    def heaps(mode: str) -> int:
        report = tmp_path / f"{mode}.xml"
        subprocess.run([sys.executable, "-c", _ARENAS, mode, str(report)], check=True, timeout=60)
        return report.read_text().count("<heap nr=")

    assert heaps("one") == 1
    assert heaps("per-thread") > 1
    assert _ONE_ARENA_COMMANDS == _DATA_COMMANDS - {"mount"}


def test_data_commands_collect_garbage_less_often(lading, tmp_path):
    """A data command raises the cyclic collector's thresholds (cli.main.GC_THRESHOLDS); other
    commands keep Python's own. The command's process reports them through a sitecustomize hook."""
    import ast
    import gc

    from lading.cli.main import GC_THRESHOLDS

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import atexit, gc, os\n"
        "atexit.register(lambda: open(os.environ['GC_REPORT'], 'w').write(repr(gc.get_threshold())))\n"
    )
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("a")

    def thresholds(*argv: str) -> tuple[int, ...]:
        report = tmp_path / "report"
        result = lading(*argv, env={"PYTHONPATH": str(hook), "GC_REPORT": str(report)})
        assert result.returncode == 0, result.stderr
        return ast.literal_eval(report.read_text())

    assert thresholds("sync", str(source), str(tmp_path / "dest")) == GC_THRESHOLDS
    assert thresholds("check", str(source)) == gc.get_threshold() != GC_THRESHOLDS
