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

import contextlib
import os
import threading
from typing import Any, Callable, Iterator, MutableMapping, TypeVar

import click
from lading.cli.context import store_config
from lading.stores.config import StoreConfig

F = TypeVar("F", bound=Callable[..., Any])

#: The keyword arguments :func:`store_options` adds to a command.
STORE_OPTION_NAMES = ("endpoint_url", "profile", "no_sign_request", "region")
#: SSL_CERT_DIR while a client that never uses TLS is built: a folder that cannot exist.
NO_ROOTS = os.path.join(os.devnull, "lading-no-roots")
#: Where systems keep their bundle of root certificates (one file), the first found is used.
BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine, Arch
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL
    "/etc/ssl/ca-bundle.pem",  # openSUSE
    "/etc/ssl/cert.pem",  # macOS, BSDs
)


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


@contextlib.contextmanager
def unused_roots_skipped(config: StoreConfig, scheme: str) -> Iterator[None]:
    """Around the build of a store's client (:meth:`~lading.stores.base.Store.connect`), while
    this process runs no other thread: when every request goes to a plain ``http://`` endpoint
    (no proxy), the client's TLS library reads one bundle of root certificates, not the folder.

    obstore's HTTP client (rustls) loads the system's roots when it is built, used or not: on
    Debian-like systems the bundle and every file of /etc/ssl/certs (about 290 files and 430
    certificates; 30-40 ms of start-up, about 0.1 s with a cold page cache; bench/RESULTS.md,
    session 11). It reads ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` instead when either is set, and
    needs at least one root, so for the build the first names a bundle (the user's, else the
    system's) and the second a folder that cannot exist: a client that never makes a TLS
    connection has no use for the roots. The environment is as before once the client is built.
    A process-wide setting, for a moment: here in the CLI, never in the library."""
    endpoint = {"s3": config.endpoint_url, "gs": config.gcs_endpoint}.get(scheme) or ""
    plain = endpoint.startswith("http://") and config.proxy_for(endpoint) is None
    bundle = os.environ.get("SSL_CERT_FILE") or next((path for path in BUNDLES if os.path.isfile(path)), None)
    if not plain or bundle is None or threading.active_count() > 1:  # another thread could read the environment
        yield
        return
    saved = {name: os.environ.get(name) for name in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    os.environ.update(SSL_CERT_FILE=bundle, SSL_CERT_DIR=NO_ROOTS)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
