"""Where the node cache lives: the one rule for ``lading sync`` and the datasets (stdlib only, so the
command line can say it in its help without importing the cache)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

#: default_cache_root's rule in words, as the command line's help and the pages say it.
CACHE_ROOT_RULE = "$LADING_CACHE_DIR, else $XDG_CACHE_HOME/lading when set, else /tmp/lading-cache-<uid>"


def default_cache_root(env: Mapping[str, str] | None = None) -> Path:
    """The one location rule (CACHE_ROOT_RULE): ``$LADING_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/lading`` when that is set, else ``/tmp/lading-cache-<uid>`` (node-local,
    per user; on the same filesystem as sync's default DESTs, so files are hard-linked)."""
    env = os.environ if env is None else env
    if env.get("LADING_CACHE_DIR"):
        return Path(env["LADING_CACHE_DIR"]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "lading"
    return Path(f"/tmp/lading-cache-{os.geteuid()}")
