"""AWS Signature Version 4 for the lean S3 path's GET/HEAD requests (empty bodies only).

Checked against botocore's own signer in tests/test_transfer_s3.py.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class Credentials:
    """Static keys, or refreshable credentials from boto3's chain; ``None`` means unsigned."""

    def __init__(self, source: object | None) -> None:
        self._source = source

    def current(self) -> tuple[str, str, str | None] | None:
        """``(access_key, secret_key, token)``, refreshed by botocore when due."""
        if self._source is None or isinstance(self._source, tuple):
            return self._source
        frozen = self._source.get_frozen_credentials()  # type: ignore[attr-defined]
        return frozen.access_key, frozen.secret_key, frozen.token


class Signer:
    """AWS Signature Version 4 for S3 GET/HEAD requests with an empty body."""

    def __init__(self, region: str) -> None:
        self.region = region
        self._keys: dict[tuple[str, str], bytes] = {}

    def _signing_key(self, secret: str, day: str) -> bytes:
        cached = self._keys.get((secret, day))
        if cached is None:
            key = ("AWS4" + secret).encode()
            for part in (day, self.region, "s3", "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            self._keys = {(secret, day): key}
            cached = key
        return cached

    def sign(self, method: str, host: str, path: str, query: str, headers: dict[str, str],
             creds: tuple[str, str, str | None], now: _dt.datetime | None = None) -> None:
        """Add ``x-amz-date``, ``x-amz-content-sha256`` and ``Authorization`` to ``headers``."""
        access, secret, token = creds
        now = now or _dt.datetime.now(_dt.timezone.utc)
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        day = stamp[:8]
        headers["x-amz-date"] = stamp
        headers["x-amz-content-sha256"] = EMPTY_SHA256
        if token:
            headers["x-amz-security-token"] = token
        signed = {"host": host, **{k.lower(): v.strip() for k, v in headers.items()}}
        names = sorted(signed)
        canonical = "\n".join([
            method, path, query,
            "".join(f"{name}:{signed[name]}\n" for name in names),
            ";".join(names), EMPTY_SHA256,
        ])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac.new(self._signing_key(secret, day), to_sign.encode(), hashlib.sha256).hexdigest()
        headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={access}/{scope}, "
                                    f"SignedHeaders={';'.join(names)}, Signature={signature}")
