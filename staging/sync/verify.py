"""Check DEST's files against its index lines: the half of a re-sync's comparison that needs
only DEST, done apart from the listing (for a large index in a helper process, so that its
``stat`` calls and their Python work run on another core than the listing's).

An index line ``[key, size, version, mtime_ns, local_size]`` (:mod:`lading.sync.state`) is
*verified* when DEST holds a regular file (not following a last symlink) at ``key`` with that
``mtime_ns`` and size: lading wrote it and nobody changed it since. :func:`verified` passes
each line on as it is when verified, and as ``"?"`` + the line when not (malformed, an
unusable key, no such file, another file), in the order read; the planner then compares only
the source's side (key, size, version) with a verified line's start, and looks again (parses,
stats) only at the others.

Standard library only: run as a script (``python -I -S verify.py DEST``) it reads the index
(its header line first) on stdin and writes the lines on stdout, encoded in UTF-8.
"""

from __future__ import annotations

import io
import os
import re
import stat as stat_mode
import sys
from json.decoder import scanstring  # type: ignore[attr-defined]  # (typeshed lacks it; the C scanner)
from typing import IO, Iterable, Iterator

#: A row line of the shape the index is written in, its key (as JSON), mtime_ns and size caught:
#: first without escapes in its strings (a fast match), then any.
_PLAIN_LINE = re.compile(r'\["([^"\\\x00-\x1f]*)",-?\d+,"[^"\\\x00-\x1f]*",(-?\d+),(-?\d+)\]\n')
_LINE = re.compile(r'\["((?:[^"\\\x00-\x1f]|\\.)*)",-?\d+,"(?:[^"\\\x00-\x1f]|\\.)*",(-?\d+),(-?\d+)\]\n')
#: Lines written out at a time by :func:`main`.
_BATCH = 4096
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def verified(root: str, lines: Iterable[str]) -> Iterator[str]:
    """Each index line as it is when its file under ``root`` is what the line records, else
    ``"?"`` + the line; one ``lstat`` per line, relative to its folder's descriptor."""
    folder: str | None = None
    fd = -1
    stat = os.stat
    try:
        for line in lines:
            match = _PLAIN_LINE.fullmatch(line) or _LINE.fullmatch(line)
            if match is None:
                yield "?" + line
                continue
            raw, mtime_ns, size = match.groups()
            key = _key(raw)
            if key is None:
                yield "?" + line
                continue
            parent, _, name = key.rpartition("/")
            if parent != folder:
                if fd >= 0:
                    os.close(fd)
                folder, fd = parent, _open_folder(root, parent)
            try:
                st = stat(name, dir_fd=fd, follow_symlinks=False) if fd >= 0 else None
            except OSError:
                st = None
            if (
                st is not None
                and stat_mode.S_ISREG(st.st_mode)
                and st.st_mtime_ns == int(mtime_ns)
                and st.st_size == int(size)
            ):
                yield line
            else:
                yield "?" + line
    finally:
        if fd >= 0:
            os.close(fd)


def _key(raw: str) -> str | None:
    """The key of a line's JSON string, or None when it is not a plain relative path (no empty,
    ``.`` or ``..`` segment, no NUL): such a line is never verified (the planner looks at it
    again)."""
    key = scanstring(raw + '"', 0)[0] if "\\" in raw else raw
    wrapped = f"/{key}/"
    if key and "//" not in wrapped and "/./" not in wrapped and "/../" not in wrapped and "\x00" not in key:
        return key
    return None


def _open_folder(root: str, folder: str) -> int:
    """A descriptor of ``root/folder`` (-1: none, so no file under it)."""
    try:
        return os.open(f"{root}/{folder}" if folder else root, _FOLDER_FLAGS)
    except OSError:
        return -1


def main(root: str, index: IO[bytes], out: IO[bytes]) -> None:
    """The script: :func:`verified` over the index's row lines read from ``index`` (after
    its header line; UTF-8, read as the planner reads the index), written to ``out`` a batch
    at a time."""
    lines = io.TextIOWrapper(index, encoding="utf-8")
    lines.readline()  # the header
    pending: list[str] = []
    for line in verified(root, lines):
        pending.append(line)
        if len(pending) >= _BATCH:
            out.write("".join(pending).encode("utf-8"))
            pending = []
    out.write("".join(pending).encode("utf-8"))
    out.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.stdin.buffer, sys.stdout.buffer)
