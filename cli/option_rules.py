"""The one rule for options that need another option or conflict with one.

An option typed on the command line that would do nothing (``--seed`` without ``--shuffle``) or
that contradicts another (``--no-cache --cache-dir D``) is a one-line usage error (exit 2), never
silently ignored. Defaults and environment variables never trigger these rules: only what the
user typed. Call from inside a command's callback::

    needs("seed", "shuffle")                          # --seed only makes sense with --shuffle
    needs("balance", "distribution", "sharded")       # ... with --distribution sharded
    conflicts("cache_dir", "no_cache")
"""

from __future__ import annotations

import click
from click.core import ParameterSource
from lading.core.errors import UsageError


def given(name: str) -> bool:
    """Whether the current command's option ``name`` was typed on the command line."""
    return click.get_current_context().get_parameter_source(name) is ParameterSource.COMMANDLINE


def flag(name: str, value: object = True) -> str:
    """How the user writes option ``name`` (its longest spelling), with ``value`` unless a flag."""
    ctx = click.get_current_context()
    spellings = next((param.opts for param in ctx.command.params if param.name == name), ["--" + name])
    spelled = max(spellings, key=len)
    return spelled if value is True else f"{spelled} {value}"


def needs(name: str, other: str, value: object = True) -> None:
    """A usage error when ``name`` was typed but option ``other`` is not ``value`` (it would do nothing)."""
    if given(name) and click.get_current_context().params.get(other) != value:
        raise UsageError(
            f"{flag(name)} only makes sense with {flag(other, value)}",
            f"add {flag(other, value)}, or drop {flag(name)}",
        )


def conflicts(name: str, other: str, why: str | None = None) -> None:
    """A usage error when both ``name`` and ``other`` were typed."""
    if given(name) and given(other):
        raise UsageError(f"{flag(name)} and {flag(other)} conflict" + (f": {why}" if why else ""), "drop one of them")
