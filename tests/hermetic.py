"""The suite keeps to its own folders: one session directory holds its TMPDIR, HOME and caches.

:func:`enter` (at ``pytest_configure``, before any test module imports lading) makes
``<tmp>/lading-tXXXXXXXX`` and points at it, in this process and every subprocess and server the
suite starts (the CLI, moto, rclone, fake-gcs-server, Ray and its workers, DataLoader workers):

- ``TMPDIR`` (and :data:`tempfile.tempdir`), the directory itself: temporary files, pytest's own ``tmp_path`` folders,
  ``pymp-*`` of multiprocessing, Ray's session directory, ``lading-pack-ray-*`` of its tasks;
- ``HOME`` (``home/``): ``~/.ray/auth_token``, ``~/.config/rclone``, and no ``~/.aws`` of the user's;
- ``WIDS_CACHE`` (``wids/``): wids' download cache (``/tmp/_wids_cache`` unless set);
- ``XDG_CACHE_HOME`` (``xdg-cache/``): the node cache's default root (``xdg-cache/lading``) (``LADING_CACHE_DIR`` is unset: ``lading sync``
  reads it as ``--cache-dir``, which would turn its node cache on in every sync test).

:func:`leave` (at ``pytest_sessionfinish``) restores them, removes the session directory (kept,
and named, when the session failed), and returns what appeared meanwhile in the real temporary
directory and HOME under the names the suite used to leave behind: the check that nothing did.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

#: What the suite used to leave behind, by folder: globs checked before and after the session.
LEFTOVERS = {
    # by name, not "anything new": other sessions (lading-t*, benchmarks) share the real /tmp
    "tmp": ("_wids_cache", "lading-pack-*", "lading-shardsink-*", "lading-cache-*", "pymp-*", "ray", "ray-*"),
    "home": (".ray", ".config/rclone", ".cache/lading", "_wids_cache"),
}
VARIABLES = ("TMPDIR", "HOME", "WIDS_CACHE", "XDG_CACHE_HOME", "LADING_CACHE_DIR")
#: Importing wids makes this folder, empty, in the real /tmp whatever WIDS_CACHE says (a default
#: argument, ``localname=DefaultLocalname()``, evaluated at import); only a non-empty one means a
#: test downloaded into wids' default cache.
WIDS_IMPORT_FOLDER = "_wids_cache"
#: Set by the session's controller when pytest-xdist runs the tests in worker processes: the real
#: temporary directory and HOME, in which each worker makes a session directory of its own.
REAL_TMP, REAL_HOME = "LADING_SUITE_REAL_TMP", "LADING_SUITE_REAL_HOME"


@dataclass
class Session:
    """The session directory, and what the environment and the real folders held before it."""

    root: Path
    saved_env: dict[str, str | None]
    saved_tempdir: str | None
    real: dict[str, Path]
    before: set[Path] = field(default_factory=set)


def _present(real: dict[str, Path]) -> set[Path]:
    return {path for name, folder in real.items() for pattern in LEFTOVERS[name] for path in folder.glob(pattern)}


def enter() -> Session:
    """Make the session directory and point TMPDIR, HOME and the caches into it (see the module).

    An xdist worker inherits the controller's TMPDIR and HOME; it makes its own session directory
    in the real ones (:data:`REAL_TMP`, :data:`REAL_HOME`), so two workers never share a TMPDIR
    (Ray's sessions, ``pymp-*``) or a HOME, and Ray's socket paths stay short."""
    real = {
        "tmp": Path(os.environ.get(REAL_TMP) or tempfile.gettempdir()),
        "home": Path(os.environ.get(REAL_HOME) or Path.home()),
    }
    # short: Ray puts AF_UNIX sockets (107 bytes at most) under TMPDIR/ray/session_.../sockets
    root = Path(tempfile.mkdtemp(prefix="lading-t", dir=real["tmp"]))
    session = Session(root, {name: os.environ.get(name) for name in VARIABLES}, tempfile.tempdir, real)
    session.before = _present(real) - {root}
    for name in ("home", "wids", "xdg-cache"):
        (root / name).mkdir()
    os.environ.update(
        TMPDIR=str(root), HOME=str(root / "home"), WIDS_CACHE=str(root / "wids"), XDG_CACHE_HOME=str(root / "xdg-cache")
    )
    os.environ.pop("LADING_CACHE_DIR", None)
    tempfile.tempdir = str(root)
    return session


def leave(session: Session, passed: bool) -> list[Path]:
    """Restore the environment, remove the session directory (kept when the session failed),
    and return what appeared in the real temporary directory and HOME (nothing, when the suite
    keeps to its own folders)."""
    for name, value in session.saved_env.items():
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value
    tempfile.tempdir = session.saved_tempdir
    for name in (REAL_TMP, REAL_HOME):
        os.environ.pop(name, None)
    if passed:
        shutil.rmtree(session.root, ignore_errors=True)
    return leftovers(session)


def leftovers(session: Session) -> list[Path]:
    """What appeared in the real temporary directory and HOME since :func:`enter`; wids' import
    folder is removed first when the session made it and it is empty."""
    made_by_import = session.real["tmp"] / WIDS_IMPORT_FOLDER
    if made_by_import not in session.before:
        with contextlib.suppress(OSError):  # absent, or not empty: then reported below
            made_by_import.rmdir()
    return sorted(_present(session.real) - session.before - {session.root})
