"""What a mount is asked to do, resolved at the edge, and what the caller learns back."""

from __future__ import annotations

import os
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


def default_max_memory() -> int:
    """A modest share of RAM for buffers: 1/16 of it, between 128 MiB and 2 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 << 30
    return max(128 << 20, min(2 << 30, total // 16))
