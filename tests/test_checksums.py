"""CRC32C over the views a download hands over: the same value as google-crc32c over the bytes,
for every kind of view, and a long view hashed where it lies, not copied first."""

from __future__ import annotations

import mmap
import os
import tracemalloc

import google_crc32c
import pytest
from lading.core.checksums import IN_PLACE, crc32c_extend


@pytest.mark.parametrize("size", [0, 1, IN_PLACE - 1, IN_PLACE, IN_PLACE + 4097, 3 << 20])
def test_every_kind_of_view_gives_the_crc_of_its_bytes(tmp_path, size):
    body = os.urandom(size + 16)
    path = tmp_path / "body"
    path.write_bytes(body)
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        views = [
            memoryview(body)[:size],  # a part of a bytes object
            memoryview(bytearray(body))[16:],  # writable, at an offset
            memoryview(mapped)[3 : 3 + size],  # read-only, not bytes (as obstore's buffers are)
            memoryview(body)[: size * 2 : 2],  # not contiguous
        ]
        for view in views:
            assert crc32c_extend(12345, view) == google_crc32c.extend(12345, view.tobytes())
            view.release()


def test_a_long_view_is_hashed_in_place_without_a_copy(tmp_path):
    body = os.urandom(8 << 20)
    path = tmp_path / "part"
    path.write_bytes(body)
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)[1:]
        crc32c_extend(0, view[: IN_PLACE * 2])  # first use: find the C function (imports happen here)
        tracemalloc.start()
        try:
            crc = crc32c_extend(0, view)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        view.release()
    assert crc == google_crc32c.value(body[1:])
    assert peak < len(body) // 8  # a copy to bytes would be the whole 8 MiB
