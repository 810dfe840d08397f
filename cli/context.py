"""State shared by every command, and resolution of settings at the edge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click
from lading.stores.config import StoreConfig


@dataclass
class AppState:
    """Global flags from the ``lading`` group, and the one rule of ``-q``: only errors and the
    final result. Commands print status lines with :meth:`status` and their final result line
    with :meth:`result` (both on stderr; data and ``--json`` go to stdout, errors through
    lading.cli.errors)."""

    debug: bool = False
    quiet: bool = False

    def status(self, line: str, nl: bool = True) -> None:
        """A status line on stderr (a phase, progress, details beside the result); ``-q`` hides it."""
        if not self.quiet:
            click.echo(line, err=True, nl=nl)

    def result(self, line: str) -> None:
        """The command's final result line on stderr, shown with ``-q`` too."""
        click.echo(line, err=True)


def store_config(**flags: Any) -> StoreConfig:
    """Store settings for a command: its flags on top of the environment."""
    return StoreConfig.from_env(**flags)
