"""The project's exceptions. Each carries the exit code and a hint the CLI shows.

Exit codes (documented in the README, mapped in exactly one place: ``lading.cli.errors``):
0 success, 1 problem found, 2 usage, 3 not found, 4 permission/credentials,
5 transient failure after retries, 6 local file system error, 130 interrupted.
"""

from __future__ import annotations

import errno
from typing import Iterable


class LadingError(Exception):
    """Base class: a failure lading can explain in one line."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ProblemFound(LadingError):
    """The command ran and found a problem (over the limit, some transfers failed)."""

    exit_code = 1


class UsageError(LadingError):
    """Bad input from the user: malformed URI, bad option value, bad config."""

    exit_code = 2


class NotFound(LadingError):
    """A bucket, object, file or directory does not exist."""

    exit_code = 3


class AccessDenied(LadingError):
    """Permission denied, or credentials missing or invalid."""

    exit_code = 4


class TransientError(LadingError):
    """A failure that may succeed when retried: reset connection, timeout, truncated body."""

    exit_code = 5


class LocalIOError(LadingError):
    """The local file system failed a write: no space left, quota exceeded, a name or file too
    large, an I/O error. Never retried: trying again cannot help."""

    exit_code = 6


class NoAnswer(TransientError):
    """A request got no answer at all: the connection was refused, or no response came in time
    (not a body cut short after the response began)."""


class Throttled(TransientError):
    """The server asked us to slow down (503 SlowDown, 429)."""


class ObjectChanged(LadingError):
    """An object was replaced while we read it (ETag / generation precondition failed)."""

    exit_code = 1


class UnsafeKey(LadingError):
    """A key that would escape the destination or collide with another key."""

    exit_code = 1


_BY_CODE: dict[int, type[LadingError]] = {
    1: ProblemFound,
    2: UsageError,
    3: NotFound,
    4: AccessDenied,
    5: TransientError,
    6: LocalIOError,
}


def exit_code_for_failures(codes: Iterable[int], succeeded: int) -> int:
    """The one rule for commands with per-item failures (sync, fetch, hook run).

    When nothing succeeded and every failure has the same cause (say, access denied), the exit
    code is that cause's; otherwise it is 1: some items failed. No failure at all is 0.
    """
    distinct = set(codes)
    if not distinct:
        return 0
    if succeeded == 0 and len(distinct) == 1:
        return distinct.pop()
    return ProblemFound.exit_code


def error_for_exit_code(code: int) -> type[LadingError]:
    """The exception class whose exit code is ``code`` (ProblemFound for anything unknown)."""
    return _BY_CODE.get(code, ProblemFound)


#: errno values that mean "you may not write here": permission bits, immutable files, read-only mounts.
_DENIED = {
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
}
#: errno values of a file system that cannot take the write (exit 6), with what to do.
_LOCAL_IO = {
    errno.ENOSPC: "free space on that file system, or choose another destination",
    errno.EDQUOT: "the disk quota is used up: free space, or choose another destination",
    errno.ENAMETOOLONG: "a name is longer than the file system allows",
    errno.EFBIG: "the file is larger than the file system allows",
    errno.EIO: "the disk reported an I/O error",
}


def local_error(err: OSError, action: str, hint: str | None = None) -> LadingError:
    """A local file-system ``OSError`` as a one-line project error: ``cannot {action}: {reason}``.

    Permission denied, an immutable file and a read-only file system are exit 4; a missing
    path 3; a file where a directory belongs (or the reverse) 2; a full disk, a quota, a name
    or file too large, an I/O error 6; anything else 1.
    """
    if err.errno in _DENIED:
        return AccessDenied(f"cannot {action}: {_DENIED[err.errno]}", hint)
    reason = err.strerror or str(err)
    if err.errno in _LOCAL_IO:
        return LocalIOError(f"cannot {action}: {reason}", hint or _LOCAL_IO[err.errno])
    if err.errno == errno.ENOENT:
        return NotFound(f"cannot {action}: {reason}", hint)
    if err.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
        return UsageError(f"cannot {action}: {reason}", hint)
    return ProblemFound(f"cannot {action}: {reason}", hint)
