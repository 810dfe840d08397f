"""Click callbacks shared by several commands' options."""

from __future__ import annotations

import click
from lading.core.errors import UsageError


def size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """An option's SIZE text (``8MiB``, ``2GB``, ``4096``) as bytes; a bad one is click's usage error."""
    if value is None:
        return None
    from lading.core.sizes import parse_size

    try:
        return parse_size(value)
    except UsageError as err:
        raise click.BadParameter(err.message + (f" ({err.hint})" if err.hint else "")) from None
