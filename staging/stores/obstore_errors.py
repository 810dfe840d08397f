"""obstore's errors as lading's: one translation for every obstore call of every backend."""

from __future__ import annotations

import re
from typing import Callable

from lading.core.errors import LadingError, NoAnswer, TransientError, UnsafeKey

#: An error response as a project error: (error code from the body, HTTP status, message, what).
FromResponse = Callable[[str, int, str, str], LadingError]

_STATUS = re.compile(r"status code: (\d{3})")
_S3_CODE = re.compile(r"<Code>([A-Za-z0-9.]+)</Code>")
_PATH_NAMED = re.compile(r'[Pp]ath "([^"]*)"')
_JSON_REASON = re.compile(r'"reason"\s*:\s*"([A-Za-z0-9 ]+)"')
_S3_MESSAGE = re.compile(r"<Message>([^<]+)</Message>")
_JSON_MESSAGE = re.compile(r'"message"\s*:\s*"([^"\\]+)"')
_BAD_CERTIFICATE = re.compile(r"InvalidCertificate\(\s*([A-Za-z]+)")
_NETWORK_WORDS = (
    "error sending request",
    "connection",
    "timed out",
    "timeout",
    "dns error",
    "broken pipe",
    "reset by peer",
    "unexpected eof",
    "error decoding response body",
    "body",
    "incomplete",
    "io error",
    "hyper",
)


def status_and_code(err: BaseException) -> tuple[int, str]:
    """HTTP status and error code that an obstore error message carries (0, "" when none)."""
    text = str(err)
    status = _STATUS.search(text)
    code = _S3_CODE.search(text) or _JSON_REASON.search(text)
    return (int(status.group(1)) if status else 0), (code.group(1) if code else "")


def server_message(err: BaseException) -> str:
    """The message of the error body an obstore error carries (S3's ``<Message>``, GCS's JSON
    ``message``), or "" when the body has none."""
    found = _S3_MESSAGE.search(str(err)) or _JSON_MESSAGE.search(str(err))
    return " ".join(found.group(1).split()) if found else ""


def translate(err: BaseException, what: str, from_response: FromResponse) -> BaseException:
    """An obstore exception as a project error (anything else is returned unchanged)."""
    import obstore.exceptions as ox

    if isinstance(err, LadingError) or not isinstance(err, (ox.BaseError, FileNotFoundError)):
        return err
    status, code = status_and_code(err)
    message = _first_line(err)
    if isinstance(err, (FileNotFoundError, ox.NotFoundError)):
        return from_response(code or "NoSuchKey", status or 404, message, what)
    if isinstance(err, (ox.PreconditionError, ox.NotModifiedError)):
        return from_response(code or "PreconditionFailed", status or 412, message, what)
    if isinstance(err, (ox.PermissionDeniedError, ox.UnauthenticatedError)) or status in (401, 403):
        # the server's own words when it sent some, never obstore's request dump
        return from_response(code or "AccessDenied", status or 403, server_message(err), what)
    if isinstance(err, ox.InvalidPathError) or "invalid path" in str(err).lower():
        named = _PATH_NAMED.search(str(err))
        key = named.group(1) if named else "?"
        return UnsafeKey(
            f"unsafe key {key!r} under {what}: a path with an empty, '.' or '..' segment",
            "rename or move the object: such keys cannot be listed here, not even to skip them",
        )
    if status:
        return from_response(code, status, message, what)
    certificate = _BAD_CERTIFICATE.search(str(err))
    if certificate:  # a configuration problem: retrying cannot help
        return LadingError(
            f"TLS certificate not trusted for {what}: {certificate.group(1)}",
            "point AWS_CA_BUNDLE at a PEM bundle with the CA that signed the server's certificate",
        )
    if "token request" in str(err).lower() or "credential" in str(err).lower():
        return from_response("InvalidToken", 401, message, what)
    # No HTTP status: the request never got an answer, or its body broke off.
    if "error sending request" in str(err):  # no response at all (refused, or none in time)
        return NoAnswer(f"network error on {what}: {message}", _network_hint(err))
    return TransientError(f"network error on {what}: {message}", _network_hint(err))


def _network_hint(err: BaseException) -> str | None:
    text = str(err).lower()
    if "connect" in text or "dns" in text:
        return "check the endpoint (--endpoint-url / AWS_ENDPOINT_URL), proxies and the network"
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).split("\n", 1)[0].strip() or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


__all__ = ["FromResponse", "server_message", "status_and_code", "translate"]
