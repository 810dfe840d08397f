"""What a mount is asked to do, resolved at the edge, and what the caller learns back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lading.mounts.listing import ViewSpec
from lading.mounts.reader import ReaderConfig
from lading.stores.config import StoreConfig


@dataclass(frozen=True)
class MountOptions:
    """Everything ``lading mount`` needs, resolved at the edge."""

    source: str
    mountpoint: Path
    store: StoreConfig = field(default_factory=StoreConfig)
    view: ViewSpec = field(default_factory=ViewSpec)
    reader: ReaderConfig = field(default_factory=ReaderConfig)
    max_memory: int = 128 << 20  # the daemon's memory budget (RSS), buffers included
    cache_dir: Path | None = None
    cache_size: int = 10 << 30
    foreground: bool = False
    log_file: Path | None = None
    allow_other: bool = False
    debug: bool = False


@dataclass(frozen=True)
class MountReady:
    """What the caller learns once the mount is up."""

    mountpoint: Path
    pid: int
    seconds: float


#: The daemon's memory budget unless --max-memory says otherwise.
DEFAULT_MAX_MEMORY = 128 << 20
#: File-data buffers get at least this much, whatever the budget leaves them.
MIN_BUFFERS = 16 << 20
#: Kept free within the budget for what buffers do not count: the allocator's free memory (up to
#: its trim threshold), FUSE's threads and requests, Python objects per open file.
OVERHEAD = 32 << 20


def buffer_budget(max_memory: int, daemon_rss: int) -> int:
    """Bytes of file data the reader may hold or have in flight: what ``max_memory`` leaves once
    the daemon (interpreter, store client, listed tree) takes ``daemon_rss``, less a reserve."""
    return max(MIN_BUFFERS, max_memory - daemon_rss - OVERHEAD)
