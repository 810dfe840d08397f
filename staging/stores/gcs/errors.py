"""The one place google-cloud-storage / google-auth / requests errors become project errors.

The SDK modules are imported lazily (inside :func:`translate`), so importing this is cheap.
"""

from __future__ import annotations

from lading.core.errors import AccessDenied, LadingError, NotFound, ObjectChanged, Throttled, TransientError, UsageError

CREDENTIALS_HINT = (
    "check Google credentials (GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`)"
)


def status_of(err: BaseException) -> int:
    """The HTTP status an SDK error carries, or 0."""
    code = getattr(err, "code", None)
    if isinstance(code, int):
        return code
    response = getattr(err, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else 0


def translate(err: BaseException, what: str) -> BaseException:
    """Map an exception raised while working on ``what`` (``gs://bucket/key``) to a project error.

    Returns the error unchanged when it is already a :class:`LadingError` or not an SDK or
    network error.
    """
    if isinstance(err, LadingError):
        return err
    from google.api_core import exceptions as gax
    from google.auth import exceptions as gauth
    from google.cloud.storage import exceptions as gcs_errors

    if isinstance(err, gauth.DefaultCredentialsError):
        return AccessDenied(f"no Google credentials for {what}: {_short(err)}", CREDENTIALS_HINT)
    if isinstance(err, gauth.RefreshError):
        return AccessDenied(f"Google credentials were refused for {what}: {_short(err)}", CREDENTIALS_HINT)
    if isinstance(err, gauth.TransportError):
        return TransientError(f"network error getting credentials for {what}: {_short(err)}")
    if isinstance(err, gcs_errors.DataCorruption):
        return TransientError(f"checksum mismatch downloading {what}")
    if isinstance(err, (gax.GoogleAPICallError, gcs_errors.InvalidResponse)):
        return from_response("", status_of(err), _short(err), what)
    if isinstance(err, gax.RetryError):
        return TransientError(f"gave up retrying {what}: {_short(err)}")
    if isinstance(err, ValueError) and "bucket name" in str(err).lower():
        return UsageError(f"invalid bucket in {what}: {err}")
    if _is_network_error(err):
        return TransientError(f"network error on {what}: {_short(err)}")
    return err


def from_response(code: str, status: int, message: str, what: str) -> LadingError:
    """An error answer from GCS (HTTP ``status``; ``code`` is the JSON reason, unused) as a
    project error; shared by the google-cloud-storage and obstore paths."""
    if status == 412:
        return ObjectChanged(
            f"{what} changed (precondition failed: the generation no longer matches)",
            "the object was replaced while lading read it; run again",
        )
    if status == 404:
        if "bucket does not exist" in message.lower():  # GCS's words for a missing bucket
            bucket = what.removeprefix("gs://").split("/", 1)[0]
            return NotFound(f"bucket {bucket} not found", "check its name, and the project you can see it in")
        return NotFound(f"not found: {what}")
    if status in (401, 403):
        return AccessDenied(f"access denied to {what}" + (f": {message}" if message else ""), CREDENTIALS_HINT)
    if status in (429, 503):
        return Throttled(f"throttled by GCS on {what}: {message}")
    if status == 408 or status >= 500:
        return TransientError(f"GCS server error on {what}: {message}")
    if status == 400 and "bucket" in message.lower():
        return UsageError(f"GCS refused {what}: {message}")
    return LadingError(f"GCS refused the request on {what}: {message}")


def _is_network_error(err: BaseException) -> bool:
    import http.client  # here, not at the top: it imports the email package (a command's start-up)

    if isinstance(err, (ConnectionError, TimeoutError, http.client.HTTPException)):
        return True
    import requests.exceptions as rex
    from urllib3 import exceptions as u3

    return isinstance(
        err,
        (
            rex.ConnectionError,
            rex.Timeout,
            rex.ChunkedEncodingError,
            rex.ContentDecodingError,
            u3.ProtocolError,
            u3.ReadTimeoutError,
            u3.IncompleteRead,
            u3.NewConnectionError,
        ),
    )


def _short(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."
