"""Joining a Ray cluster, or starting a local Ray for the duration of a call."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any, Iterator

from lading.core.errors import LadingError, TransientError, UsageError
from lading.core.install import install_command

log = logging.getLogger(__name__)


def require_ray() -> Any:
    """The ray module; a usage error (with the install hint) when Ray is not installed."""
    try:
        import ray
    except ImportError:
        raise UsageError(
            "the Ray engine needs Ray, which is not installed", f"{install_command('ray')} (or use --engine local)"
        ) from None
    return ray


@contextmanager
def ray_session(address: str | None = None) -> Iterator[Any]:
    """The ``ray`` module, initialised: an already initialised Ray is used as it is (and left
    running); ``address`` (else ``RAY_ADDRESS``) joins that cluster; otherwise a local Ray is
    started, bound to 127.0.0.1, and shut down when the block ends."""
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    options: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
    if address is None:
        options.update(include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        ray.init(address=address, **options)
    except (ConnectionError, TimeoutError) as err:
        raise TransientError(
            f"cannot join the Ray cluster at {address}: {err}",
            "check --ray-address / RAY_ADDRESS and that the cluster is up",
        ) from err
    except (ValueError, RuntimeError) as err:
        raise UsageError(f"cannot start Ray{f' at {address}' if address else ''}: {err}") from err
    log.info("Ray %s (%s)", "joined at " + address if address else "started locally", ray.__version__)
    try:
        yield ray
    finally:
        ray.shutdown()


def task_error(ray: Any, err: BaseException, what: str) -> BaseException:
    """An error a Ray task raised (or its worker's death), as a project error where it is one."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, LadingError):
        return cause
    if isinstance(err, ray.exceptions.RayTaskError):
        return TransientError(f"{what} failed: {type(cause).__name__ if cause else 'error'}: {cause or err}")
    if isinstance(err, ray.exceptions.RayError):
        return TransientError(
            f"{what} failed on Ray after its retries: {str(err).splitlines()[0] if str(err) else err}",
            "run the same command again: shards already written are reused",
        )
    return err
