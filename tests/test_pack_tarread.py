"""The streaming tar reader agrees with Python's tarfile on archives made by tarfile (GNU, PAX and
ustar formats) and by GNU tar, and refuses damaged ones."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile

import pytest
from lading.pack.tarread import TarFormatError, iter_files

NAMES = [
    "a.txt",
    "empty.bin",
    "dir/" + "n" * 120 + ".json",
    "x" * 130 + "/" + "y" * 110 + ".txt",
    "ünï/cødé.txt",
    "deep/" * 40 + "leaf.dat",
]


def build(fmt: int, names: list[str] = NAMES) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        folder = tarfile.TarInfo("dir")
        folder.type = tarfile.DIRTYPE
        archive.addfile(folder)
        for index, name in enumerate(names):
            data = b"" if name == "empty.bin" else os.urandom(100 * index + 7)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("link.txt")
        link.type = tarfile.SYMTYPE
        link.linkname = "a.txt"
        archive.addfile(link)
    return buffer.getvalue()


def with_tarfile(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return [(m.name, archive.extractfile(m).read()) for m in archive.getmembers() if m.isfile()]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_agrees_with_tarfile(fmt):
    # ustar holds ASCII names of up to 100 bytes, or longer ones split at a slash (prefix field)
    names = ["a.txt", "empty.bin", "deep/" * 20 + "leaf.dat"] if fmt == tarfile.USTAR_FORMAT else NAMES
    data = build(fmt, names)
    expected = with_tarfile(data)
    assert list(iter_files(io.BytesIO(data).read)) == expected
    assert len(expected) == len(names)


def test_reads_gnu_tar_output(tmp_path):
    root = tmp_path / "tree"
    (root / ("long" * 40)).mkdir(parents=True)
    (root / ("long" * 40) / "file.bin").write_bytes(b"\x01" * 700)
    (root / "small.txt").write_text("hi")
    archive = tmp_path / "gnu.tar"
    subprocess.run(["tar", "cf", str(archive), "-C", str(root), "."], check=True)
    data = archive.read_bytes()
    assert list(iter_files(io.BytesIO(data).read)) == with_tarfile(data)


def test_damaged_and_truncated_archives_are_refused():
    data = build(tarfile.PAX_FORMAT)
    damaged = bytearray(data)
    damaged[600] ^= 0xFF  # inside the first header after the directory entry
    with pytest.raises(TarFormatError, match="checksum"):
        list(iter_files(io.BytesIO(bytes(damaged)).read))
    with pytest.raises(TarFormatError, match="truncated"):
        list(iter_files(io.BytesIO(data[:1800]).read))
    with pytest.raises(TarFormatError):
        list(iter_files(io.BytesIO(b"not a tar file at all" * 40).read))
