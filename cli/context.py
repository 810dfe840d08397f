"""State shared by every command, and resolution of settings at the edge."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from staging.errors import UsageError
from staging.retry import RetryPolicy
from staging.stores.base import StoreConfig


@dataclass
class AppState:
    """Global flags from the ``lading`` group."""

    debug: bool = False
    quiet: bool = False


def store_config(
    endpoint_url: str | None = None,
    profile: str | None = None,
    no_sign_request: bool = False,
    region: str | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] = os.environ,
) -> StoreConfig:
    """Resolve connection settings: flag > environment > default.

    A profile comes from ``--profile`` only: botocore reads ``AWS_PROFILE`` itself, and passing
    it explicitly would change its precedence over ``AWS_ACCESS_KEY_ID``.
    """
    endpoint = endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
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
        env_credentials=None if profile or no_sign_request else _env_credentials(env),
        ca_bundle=env.get("AWS_CA_BUNDLE") or None,
    )


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
