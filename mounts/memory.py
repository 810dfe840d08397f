"""Raw memory for the read path: the address of a (read-only) buffer, and the daemon's RSS.

The store client hands a GET's answer back as a read-only buffer; the kernel's page for a FUSE
read is a raw address. :func:`buffer_address` lets one ``memmove`` copy the first into the
second (the GIL released) without a writable copy in between.
"""

from __future__ import annotations

import ctypes
import os


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (stable since 3.3)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def buffer_address(data: object) -> int:
    """The address of the first byte of a contiguous buffer (valid while ``data`` lives)."""
    view = _PyBuffer()
    _get_buffer(data, ctypes.byref(view), 0)  # PyBUF_SIMPLE: contiguous bytes, read-only is fine
    try:
        return view.buf or 0
    finally:
        _release_buffer(ctypes.byref(view))


def rss_bytes() -> int:
    """This process's resident set size."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
