"""Check DEST's files against its index lines: the half of a re-sync's comparison that needs
only DEST, done apart from the listing (for a large index in a helper process, so that its
``stat`` calls and their Python work run on another core than the listing's).

An index line ``[key,size,version,mtime_ns,local_size]`` (:mod:`lading.sync.state`) is
*verified* when DEST holds a regular file (not following a last symlink) at ``key`` whose
``mtime_ns`` and size end the line exactly as a fetch would write them now: lading wrote it and
nobody changed it since. :func:`verified` passes a verified line on as its start, up to the
source's side (``[key,size,version,``, newline added), and any other (malformed, an unusable
key, no such file, another file) as ``"?"`` + the line, in the order read. The planner takes
a row as up to date when its verified line is the start it would write for it (key, size and
version: then the whole line is what a fetch would record now), and looks again (parses,
stats) only at the others.

Standard library only: run as a script (``python -S verify.py DEST``) it reads the index
(its header line first) on stdin and writes the lines on stdout, encoded in UTF-8.
"""

from __future__ import annotations

import io
import os
import stat as stat_mode
import sys
from json.decoder import scanstring  # type: ignore[attr-defined]  # (typeshed lacks it; the C scanner)
from typing import IO, Iterable, Iterator

#: Lines written out at a time by :func:`main`.
_BATCH = 4096
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def verified(root: str, lines: Iterable[str]) -> Iterator[str]:
    """Each index line's start (``[key,size,version,`` and a newline) when its file under
    ``root`` ends it as a fetch would write it now, else ``"?"`` + the line; one ``lstat`` per
    line, relative to its folder's descriptor."""
    folder: str | None = None
    fd = -1
    stat = os.stat
    try:
        for line in lines:
            key = _key(line) if line.startswith('["') else None
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
            if st is not None and stat_mode.S_ISREG(st.st_mode):
                end = f",{st.st_mtime_ns},{st.st_size}]\n"
                if line.endswith(end):
                    yield line[: len(line) - len(end) + 1] + "\n"
                    continue
            yield "?" + line
    finally:
        if fd >= 0:
            os.close(fd)


def _key(line: str) -> str | None:
    """The key of a line's first JSON string, or None when it is not a plain relative path (no
    empty, ``.`` or ``..`` segment, no NUL) or not a string: such a line is never verified."""
    try:
        key = scanstring(line, 2)[0] if "\\" in line else line[2 : line.index('"', 2)]
    except ValueError:
        return None
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
