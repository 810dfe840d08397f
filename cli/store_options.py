"""Reusable click options for every command that talks to a bucket (sync, mount, pack, hook, fetch).

Usage::

    @click.command()
    @store_options
    def sync(source: str, **options: Any) -> int:
        config = pop_store_config(options)   # removes the four store options from ``options``
        store = open_store(source, config)

Resolution is done by :func:`cli.context.store_config` (flag > environment > default).
"""

from __future__ import annotations

from typing import Any, Callable, MutableMapping, TypeVar

import click
from lading.cli.context import store_config
from lading.stores.config import StoreConfig

F = TypeVar("F", bound=Callable[..., Any])

#: The keyword arguments :func:`store_options` adds to a command.
STORE_OPTION_NAMES = ("endpoint_url", "profile", "no_sign_request", "region")


def store_options(func: F) -> F:
    """Add ``--endpoint-url``, ``--profile``, ``--no-sign-request`` and ``--region`` to a command."""
    options = [
        click.option(
            "--endpoint-url",
            metavar="URL",
            default=None,
            help="S3-compatible endpoint (MinIO, Ceph, moto...). "
            "Default: $AWS_ENDPOINT_URL_S3, then $AWS_ENDPOINT_URL.",
        ),
        click.option(
            "--profile", metavar="NAME", default=None, help="AWS profile from ~/.aws/config. Default: $AWS_PROFILE."
        ),
        click.option(
            "--no-sign-request",
            is_flag=True,
            default=False,
            help="Send S3 requests unsigned, for public buckets (no credentials needed).",
        ),
        click.option(
            "--region",
            metavar="REGION",
            default=None,
            help="S3 region. Default: $AWS_REGION, $AWS_DEFAULT_REGION, the profile's.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def pop_store_config(options: MutableMapping[str, Any]) -> StoreConfig:
    """The StoreConfig for the values :func:`store_options` parsed, removing them from ``options``."""
    values = {name: options.pop(name, None) for name in STORE_OPTION_NAMES}
    return store_config(
        endpoint_url=values["endpoint_url"],
        profile=values["profile"],
        no_sign_request=bool(values["no_sign_request"]),
        region=values["region"],
    )
