"""Where the command line's data output goes: stdout, and the one shape of its JSON."""

from __future__ import annotations

import io
import os
import sys
from typing import Any

from lading.core.errors import local_error

#: Every ``--json`` document is indented by this much (what most commands printed already).
JSON_INDENT = 2


def print_json(doc: Any) -> None:
    """Print ``doc`` as a ``--json`` document on stdout: indented by :data:`JSON_INDENT`, one
    document and a newline."""
    import json  # here, not at start-up: most commands print no JSON

    sys.stdout.write(json.dumps(doc, indent=JSON_INDENT) + "\n")  # not click.echo: no ANSI regex over it
    sys.stdout.flush()  # now: a foreground mount's document is its "ready"


class _Stdout(io.RawIOBase):
    """File descriptor 1 under ``sys.stdout``, whose write failures say what they are.

    A reader that went away is ``BrokenPipeError``, as before (the command ends quietly with exit
    0); any other failure (a full disk under ``> file``, a quota, an I/O error) is the local error
    it is, ``cannot write stdout: No space left on device``, exit 6, whichever command's output,
    click, rich or a plain ``write`` was flushing when it happened."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int | None:
        try:
            return os.write(self._fd, data)
        except BlockingIOError:  # a non-blocking stdout that is full: the buffer keeps the rest
            return None
        except BrokenPipeError:
            raise
        except OSError as err:
            raise local_error(err, "write stdout") from err


def install_stdout() -> None:
    """Put :class:`_Stdout` under ``sys.stdout`` (the process's real stdout only; before anything
    is written), keeping its encoding, error handler and buffering (by line on a terminal)."""
    current = sys.stdout
    try:
        fd = current.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): left alone
        return
    if fd != 1:
        return
    raw = _Stdout(fd)
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding=current.encoding,
        errors=current.errors,
        line_buffering=raw.isatty(),
    )


def flush_stdout() -> None:
    """Write out what stdout still buffers: a full disk then fails the command that printed it
    (``cannot write stdout``, exit 6) instead of passing unnoticed at exit."""
    sys.stdout.flush()
