"""The suite keeps to its own folders (tests/hermetic.py): what its subprocesses see."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = (
    "import json, os, tempfile, pathlib; print(json.dumps({'tmp': tempfile.gettempdir(), "
    "'home': str(pathlib.Path.home()), 'wids': os.environ.get('WIDS_CACHE'), "
    "'cache': os.environ.get('XDG_CACHE_HOME'), 'lading_cache': os.environ.get('LADING_CACHE_DIR')}))"
)


def test_subprocesses_get_the_sessions_own_tmpdir_home_and_caches(tmp_path):
    seen = json.loads(subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout)
    root = Path(seen["tmp"])
    assert root.name.startswith("lading-t") and root != Path("/tmp"), seen
    assert Path(tempfile.gettempdir()) == root, seen
    # pytest's folders: in this session directory, or (an xdist worker's) in its controller's
    assert any(parent.name.startswith("lading-t") for parent in tmp_path.parents), tmp_path
    for name in ("home", "wids", "cache"):
        assert Path(seen[name]).parent == root, seen
    assert seen["lading_cache"] is None and not list(Path(seen["home"]).glob(".aws"))
    assert len(str(root / "ray" / "session_2026-11-26_11-31-30_123456_12345" / "sockets" / "plasma_store")) < 107


def test_wids_import_folder_is_removed_when_empty_and_reported_when_used(tmp_path):
    import hermetic

    real = {"tmp": tmp_path / "tmp", "home": tmp_path / "home"}
    for folder in real.values():
        folder.mkdir()
    session = hermetic.Session(tmp_path / "session", {}, None, real)
    (real["tmp"] / hermetic.WIDS_IMPORT_FOLDER).mkdir()  # what `import wids` does
    assert hermetic.leftovers(session) == []
    assert not (real["tmp"] / hermetic.WIDS_IMPORT_FOLDER).exists()

    (real["tmp"] / hermetic.WIDS_IMPORT_FOLDER).mkdir()
    (real["tmp"] / hermetic.WIDS_IMPORT_FOLDER / "shard.tar").write_bytes(b"x")  # a download
    assert hermetic.leftovers(session) == [real["tmp"] / hermetic.WIDS_IMPORT_FOLDER]
