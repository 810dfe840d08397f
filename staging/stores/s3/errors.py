"""The one place botocore / urllib3 errors become :mod:`lading.core.errors` exceptions.

botocore is imported lazily (inside :func:`translate`), so importing this module is cheap.
"""

from __future__ import annotations

from lading.core.errors import (
    AccessDenied,
    LadingError,
    NoAnswer,
    NotFound,
    ObjectChanged,
    Throttled,
    TransientError,
    UsageError,
)

_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchUpload", "404"}
_DENIED = {
    "AccessDenied",
    "403",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
    "AccountProblem",
    "InvalidSecurity",
    "AuthorizationHeaderMalformed",
    "UnauthorizedAccess",
    "401",
}
_THROTTLED = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "TooManyRequestsException",
    "RequestThrottled",
    "ProvisionedThroughputExceededException",
    "503",
    "429",
}
_TRANSIENT = {
    "InternalError",
    "ServiceUnavailable",
    "RequestTimeout",
    "RequestTimeoutException",
    "PriorRequestNotComplete",
    "BadDigest",
    "IncompleteBody",
    "500",
    "502",
    "504",
}
_CHANGED = {"PreconditionFailed", "412"}

CREDENTIALS_HINT = (
    "check AWS credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, --profile or "
    "AWS_PROFILE), or pass --no-sign-request for a public bucket"
)


def client_error_code(err: BaseException) -> tuple[str, int]:
    """``(error code, HTTP status)`` of a botocore ClientError (``("", 0)`` for anything else)."""
    response = getattr(err, "response", None)
    if not isinstance(response, dict):
        return "", 0
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def translate(err: BaseException, what: str) -> BaseException:
    """Map an exception raised while working on ``what`` (``s3://bucket/key``) to a project error.

    Returns the error unchanged when it is already a :class:`LadingError` or is not an SDK or
    network error (a bug should surface as itself, not as a retryable failure).
    """
    if isinstance(err, LadingError):
        return err
    from botocore import exceptions as bce

    if isinstance(err, bce.ClientError):
        return _from_client_error(err, what)
    if isinstance(
        err,
        (
            bce.NoCredentialsError,
            bce.PartialCredentialsError,
            bce.CredentialRetrievalError,
            bce.TokenRetrievalError,
            bce.UnauthorizedSSOTokenError,
        ),
    ):
        return AccessDenied(f"no usable AWS credentials for {what}: {err}", CREDENTIALS_HINT)
    if isinstance(err, bce.ProfileNotFound):
        return AccessDenied(f"AWS profile not found: {err}", "check --profile / AWS_PROFILE and ~/.aws/config")
    if isinstance(err, (bce.ParamValidationError, bce.NoRegionError)):
        return UsageError(f"invalid request for {what}: {err}")
    if isinstance(err, (bce.ConnectTimeoutError, bce.ReadTimeoutError)):
        return NoAnswer(
            f"no answer from the S3 endpoint for {what}: {err}",
            "check --endpoint-url / AWS_ENDPOINT_URL and the network",
        )
    if isinstance(err, bce.EndpointConnectionError):
        return NoAnswer(
            f"cannot connect to the S3 endpoint for {what}: {err}",
            "check --endpoint-url / AWS_ENDPOINT_URL and the network",
        )
    if isinstance(
        err,
        (
            bce.HTTPClientError,
            bce.ConnectionError,
            bce.IncompleteReadError,
            bce.ChecksumError,
            bce.FlexibleChecksumError,
        ),
    ):
        return TransientError(f"network error on {what}: {_short(err)}")
    if _is_network_error(err):
        return TransientError(f"network error on {what}: {_short(err)}")
    return err


def _from_client_error(err: BaseException, what: str) -> LadingError:
    code, status = client_error_code(err)
    message = getattr(err, "response", {}).get("Error", {}).get("Message") or ""
    return from_response(code, status, message, what)


def from_response(code: str, status: int, message: str, what: str) -> LadingError:
    """An S3 error response (error ``code`` from its XML body, HTTP ``status``) as a project
    error; shared by the boto3 and obstore paths (:mod:`lading.stores.objstore`)."""
    if code in _DENIED or status in (401, 403):
        return AccessDenied(_denied(what, code, message), CREDENTIALS_HINT)
    message = message or code or str(status)
    if code in _CHANGED or status in (304, 412):
        return ObjectChanged(
            f"{what} changed (precondition failed: the ETag no longer matches)",
            "the object was replaced while lading read it; run again",
        )
    if code in _NOT_FOUND or status == 404:
        if code == "NoSuchBucket":
            return bucket_not_found(what)
        if not code:  # S3 answers a listing's 404 with an error code (NoSuchBucket): this is no S3
            return NotFound(
                f"the endpoint did not answer as S3 for {what}: HTTP 404 without an S3 error",
                "check --endpoint-url / AWS_ENDPOINT_URL: it should be the address of an S3 API",
            )
        return NotFound(f"object not found: {what}")
    if code in _THROTTLED or status in (429, 503):
        return Throttled(f"throttled by S3 on {what}: {message}")
    if code in _TRANSIENT or status >= 500:
        return TransientError(f"S3 server error on {what}: {message}")
    return LadingError(f"S3 refused the request on {what}: {code or status}: {message}")


def _denied(what: str, code: str, message: str) -> str:
    """``access denied to WHAT``, with the server's reason when it gave more than "denied"."""
    reason = message if message not in ("", code, "Access Denied") else code
    return f"access denied to {what}" + (f": {reason}" if reason not in ("", "AccessDenied", "401", "403") else "")


def bucket_not_found(what: str) -> NotFound:
    """``bucket X not found``, one line: the server's answer adds only an XML fragment."""
    bucket = what.removeprefix("s3://").split("/", 1)[0]
    return NotFound(f"bucket {bucket} not found", "check its name, and --endpoint-url or AWS_ENDPOINT_URL")


def _is_network_error(err: BaseException) -> bool:
    """urllib3 / socket level failures that botocore did not wrap (mostly while reading a body)."""
    import http.client  # here, not at the top: it imports the email package (a command's start-up)

    if isinstance(err, (ConnectionError, TimeoutError, http.client.HTTPException)):
        return True
    try:
        from urllib3 import exceptions as u3
    except ImportError:  # pragma: no cover - urllib3 ships with botocore
        return False
    return isinstance(
        err,
        (
            u3.ProtocolError,
            u3.ReadTimeoutError,
            u3.IncompleteRead,
            u3.NewConnectionError,
            u3.ConnectTimeoutError,
            u3.SSLError,
        ),
    )


def _short(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."
