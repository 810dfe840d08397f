"""Small files written all or nothing: state records, markers, the startup hook."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from lading.core.names import hidden_sibling


def write_atomically(
    path: Path, text: str | Iterable[str], *, durable: bool = False, mode: int | None = None, tmp: Path | None = None
) -> None:
    """Replace ``path`` with ``text`` (a string, or strings written one after another as they
    are produced): write a temporary beside it, then rename over it.

    Readers see the old contents or the new, never a mix. ``durable`` fsyncs before the rename
    (the record survives a power loss), ``mode`` sets the permissions, ``tmp`` names the
    temporary (default: a hidden per-process name, within NAME_MAX). No temporary survives a failure; the
    OSError propagates for the caller to translate.
    """
    tmp = tmp or path.with_name(hidden_sibling(path.name, f".lading-tmp-{os.getpid()}"))
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            if isinstance(text, str):
                handle.write(text)
            else:
                handle.writelines(text)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only still there when the write failed
