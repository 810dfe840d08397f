"""State shared by every command, and resolution of settings at the edge."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

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
    """Resolve connection settings: flag > environment > default."""
    endpoint = endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    emulator = env.get("STORAGE_EMULATOR_HOST") or None
    if emulator and not emulator.startswith("http"):
        emulator = f"http://{emulator}"
    return StoreConfig(
        endpoint_url=endpoint,
        profile=profile or env.get("AWS_PROFILE") or None,
        region=region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
        no_sign_request=no_sign_request,
        gcs_anonymous=bool(emulator),
        gcs_endpoint=emulator,
        timeout=timeout if timeout is not None else float(env.get("LADING_TIMEOUT", "60")),
        retry=RetryPolicy(attempts=int(env.get("LADING_RETRIES", "6"))),
    )
