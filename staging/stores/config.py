"""Connection settings for every store, resolved once: flag > environment > default."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping
from urllib.parse import urlsplit

from lading.core.errors import UsageError
from lading.core.retry import DEFAULT_POLICY, RetryPolicy


@dataclass(frozen=True)
class StoreConfig:
    """Connection settings, resolved once at the edge (flag > environment > config > default)."""

    endpoint_url: str | None = None
    profile: str | None = None
    region: str | None = None
    no_sign_request: bool = False
    gcs_anonymous: bool = False  # set when STORAGE_EMULATOR_HOST is in use
    gcs_endpoint: str | None = None  # the emulator's URL, when set
    timeout: float = 60.0
    max_pool_connections: int = 64
    retry: RetryPolicy = field(default=DEFAULT_POLICY)
    # Keys from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY[/AWS_SESSION_TOKEN] when no profile was
    # asked for: what botocore's chain would pick first anyway. They go to obstore as they are,
    # so a sync with an endpoint and a region never imports botocore (it costs ~70 ms).
    env_credentials: tuple[str, str, str | None] | None = field(default=None, repr=False)
    # True when env_credentials were read from this process's environment (resolve_store_config),
    # False when a caller gave them: only those a caller gave travel to workers (for_workers).
    credentials_from_environment: bool = field(default=False, repr=False)
    ca_bundle: str | None = None
    # Proxies from HTTPS_PROXY / HTTP_PROXY / NO_PROXY (either case), for obstore and boto3 alike.
    https_proxy: str | None = None
    http_proxy: str | None = None
    no_proxy: str | None = None

    def proxy_for(self, url: str) -> str | None:
        """The proxy for requests to ``url`` (by its scheme), or None."""
        return self.http_proxy if url.startswith("http://") else self.https_proxy

    def for_workers(self) -> "StoreConfig":
        """These settings as sent to worker processes (Ray tasks), which may run on other machines
        and outlive short-lived session keys: credentials read from this process's environment are
        left out, so each worker resolves its own through its credential chain (its environment,
        profile, instance or pod role). Credentials a caller put in the config explicitly are kept."""
        if not self.credentials_from_environment:
            return self
        return replace(self, env_credentials=None, credentials_from_environment=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **flags: Any) -> "StoreConfig":
        """Settings from the environment (``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``,
        ``LADING_TIMEOUT``, ``LADING_RETRIES``, ...), with ``flags`` on top."""
        return resolve_store_config(env=os.environ if env is None else env, **flags)


def resolve_store_config(
    endpoint_url: str | None = None,
    profile: str | None = None,
    no_sign_request: bool = False,
    region: str | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> StoreConfig:
    """Resolve connection settings once: flag (the arguments) > environment > default.

    This is what :meth:`StoreConfig.from_env` and :func:`lading.stores.open_store` (without a
    ``config``) use, so training code gets the CLI's behaviour from the same variables.

    A profile comes from ``--profile`` only: botocore reads ``AWS_PROFILE`` itself, and passing
    it explicitly would change its precedence over ``AWS_ACCESS_KEY_ID``.
    """
    env = os.environ if env is None else env
    endpoint = _endpoint(endpoint_url, env)
    credentials = None if profile or no_sign_request else _env_credentials(env)
    emulator = env.get("STORAGE_EMULATOR_HOST") or None
    if emulator and not emulator.startswith("http"):
        emulator = f"http://{emulator}"
    return StoreConfig(
        endpoint_url=endpoint,
        profile=profile or None,
        region=region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
        no_sign_request=no_sign_request,
        gcs_anonymous=bool(emulator),
        gcs_endpoint=emulator,
        timeout=timeout if timeout is not None else _number(env, "LADING_TIMEOUT", "60", float),
        retry=RetryPolicy(attempts=_number(env, "LADING_RETRIES", "6", int)),
        env_credentials=credentials,
        credentials_from_environment=credentials is not None,
        ca_bundle=env.get("AWS_CA_BUNDLE") or None,
        https_proxy=_first(env, "HTTPS_PROXY", "https_proxy"),
        http_proxy=_first(env, "HTTP_PROXY", "http_proxy"),
        no_proxy=_first(env, "NO_PROXY", "no_proxy"),
    )


def _endpoint(flag: str | None, env: Mapping[str, str]) -> str | None:
    """The S3 endpoint (``--endpoint-url`` > ``AWS_ENDPOINT_URL_S3`` > ``AWS_ENDPOINT_URL``), checked
    to be an ``http(s)://host[:port][/path]`` URL; a malformed one is a usage error naming where it
    came from (it would otherwise fail on first use, deep inside an SDK)."""
    if flag:
        return _checked_endpoint(flag, "--endpoint-url")
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if env.get(name):
            return _checked_endpoint(env[name], name)
    return None


def _checked_endpoint(url: str, origin: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(
            f"malformed endpoint {url!r} ({origin})",
            "give a URL such as http://127.0.0.1:9000 or https://s3.example.com",
        )
    return url


def _first(env: Mapping[str, str], *names: str) -> str | None:
    return next((env[name] for name in names if env.get(name)), None)


def _env_credentials(env: Mapping[str, str]) -> tuple[str, str, str | None] | None:
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret or env.get("AWS_PROFILE"):
        return None  # leave the full chain (profiles, SSO, instance roles) to botocore
    return key, secret, env.get("AWS_SESSION_TOKEN") or None


def _number(env: Mapping[str, str], name: str, default: str, kind: type) -> Any:
    text = env.get(name, default)
    try:
        value = kind(text)
    except ValueError:
        raise UsageError(f"{name}={text!r} is not a number") from None
    if value <= 0:
        raise UsageError(f"{name}={text!r} must be positive")
    return value
