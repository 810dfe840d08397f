"""State shared by every command, and resolution of settings at the edge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lading.stores.config import StoreConfig


@dataclass
class AppState:
    """Global flags from the ``lading`` group."""

    debug: bool = False
    quiet: bool = False


def store_config(**flags: Any) -> StoreConfig:
    """Store settings for a command: its flags on top of the environment."""
    return StoreConfig.from_env(**flags)
