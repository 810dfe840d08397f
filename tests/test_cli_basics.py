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
