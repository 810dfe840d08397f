"""Parsing of store URIs: ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``file:///dir``, ``/dir``."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from lading.core.errors import UsageError

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
SCHEMES = ("s3", "gs", "file")


@dataclass(frozen=True)
class StoreURI:
    """A parsed location. For ``file`` the bucket is empty and ``prefix`` is an absolute path."""

    scheme: str
    bucket: str
    prefix: str

    def __str__(self) -> str:
        if self.scheme == "file":
            return self.prefix
        return f"{self.scheme}://{self.bucket}/{self.prefix}"

    def join(self, key: str) -> str:
        """The full object name (S3/GCS) or path (file) of ``key`` under this prefix."""
        if not self.prefix:
            return key
        sep = "" if self.prefix.endswith("/") else "/"
        return f"{self.prefix}{sep}{key}"

    def split_name(self) -> tuple["StoreURI", str]:
        """``(parent, name)`` for addressing one object: ``s3://b/d/f.bin`` -> ``(s3://b/d/, "f.bin")``.

        A URI names a prefix (see the README); to fetch a single object, open the parent as the
        store and use ``name`` as the key. ``name`` is empty when the URI ends in ``/``.
        """
        if not self.prefix or self.prefix.endswith("/"):
            return self, ""
        head, sep, name = self.prefix.rpartition("/")
        return StoreURI(self.scheme, self.bucket, head + sep), name


def parse_uri(text: str) -> StoreURI:
    """Parse a store location, raising :class:`UsageError` with a hint when malformed.

    A bucket prefix with a ``.`` or ``..`` segment (``s3://b/..``, ``s3://b/a/../b``,
    ``s3://b/p/.``) is refused: stores take it literally, so it would select nothing, or an
    object whose name is not a safe file name. So is one with an empty segment (``s3://b//p``,
    ``s3://b/p//``): listings normalise it away, so keys would not start with the prefix.
    """
    if not text or "\x00" in text:
        raise UsageError(f"invalid location {text!r}", "use s3://bucket/prefix, gs://bucket/prefix or a path")
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$", text)
    if match is None or len(match.group(1)) == 1:  # no scheme, or a Windows drive letter
        return StoreURI("file", "", os.path.abspath(text))
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "gcs":
        scheme = "gs"
    if scheme not in SCHEMES:
        raise UsageError(f"unsupported scheme {scheme!r} in {text!r}", "lading reads s3://, gs:// and local paths")
    if not rest.startswith("//"):
        form = (
            "use file:///absolute/path, or a plain path"
            if scheme == "file"
            else f"write it as {scheme}://bucket/prefix"
        )
        raise UsageError(f"malformed location {text!r}", form)
    rest = rest[2:]
    if scheme == "file":
        if not rest.startswith("/"):
            raise UsageError(f"malformed file URI {text!r}", "use file:///absolute/path")
        return StoreURI("file", "", os.path.abspath(rest))
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise UsageError(f"no bucket in {text!r}", f"write it as {scheme}://bucket/prefix")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise UsageError(
            f"invalid bucket name {bucket!r} in {text!r}",
            "bucket names are 3-222 characters of a-z, 0-9, '.', '-' and '_'",
        )
    if "//" in f"/{prefix}":
        raise UsageError(
            f"refusing {text!r}: a bucket location may not have an empty segment ('//')",
            "stores would list it as another prefix; write the prefix with single slashes, "
            f"e.g. {scheme}://{bucket}/{_single_slashes(prefix)}",
        )
    dotted = [segment for segment in prefix.split("/") if segment in (".", "..")]
    if dotted:
        raise UsageError(
            f"refusing {text!r}: {dotted[0]!r} is not allowed as a segment of a bucket location",
            "S3 and GCS take it as a literal key name, not a relative path; write the prefix "
            "without '.' or '..' segments",
        )
    return StoreURI(scheme, bucket, prefix)


def _single_slashes(prefix: str) -> str:
    joined = "/".join(segment for segment in prefix.split("/") if segment)
    return joined + "/" if joined and prefix.endswith("/") else joined


def root_prefix(prefix: str) -> str:
    """The key prefix a URI's path names: empty (whole bucket) or ending in ``/``."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"
