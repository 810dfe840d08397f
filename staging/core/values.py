"""Typed values as bytes: the encoding of one field value that ``lading.datalayer`` records per
field and ``lading.pack.ray.ShardSink`` applies to non-bytes values (see
:mod:`lading.datalayer.encoding` for the table of types and suffixes). Kept in the core so that
every layer may use it."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

from lading.core.errors import UsageError

#: type name -> member suffix
SUFFIX = {
    "bytes": "bin",
    "str": "txt",
    "bool": "bool",
    "int": "cls",
    "float": "float",
    "json": "json",
    "numpy": "npy",
    "numpy-scalar": "scalar.npy",
    "tensor": "tensor.npy",
    "torch": "pth",
}


def _json_safe(value: Any, where: str) -> None:
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, list):
        for item in value:
            _json_safe(item, where)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise UsageError(
                    f"{where}: a dict key {key!r} is not a string, so JSON would change it",
                    "use string keys, or encode the value yourself (bytes)",
                )
            _json_safe(item, where)
        return
    raise UsageError(
        f"{where}: a {type(value).__name__} inside a list or dict cannot be stored as JSON"
        + (" (a tuple would come back as a list)" if isinstance(value, tuple) else ""),
        "use lists, dicts, strings and numbers there, or store it as a field of its own",
    )


def _is_instance(value: Any, module: str, name: str) -> bool:
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(value, getattr(loaded, name))


def _npy(array: Any) -> bytes:
    import numpy

    buffer = io.BytesIO()
    numpy.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def encode_value(value: Any, where: str) -> tuple[str, bytes]:
    """``(type name, bytes)`` of one field value; UsageError for a type that cannot round-trip."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes", bytes(value)
    if isinstance(value, str):
        try:
            return "str", value.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"{where}: the string is not valid Unicode (a lone surrogate?)") from None
    if isinstance(value, bool):
        return "bool", b"true" if value else b"false"
    if isinstance(value, int):
        return "int", str(value).encode()
    if isinstance(value, float):
        return "float", repr(value).encode()
    if value is None or isinstance(value, (list, dict)):
        _json_safe(value, where)
        return "json", json.dumps(value, ensure_ascii=False).encode("utf-8")
    if _is_instance(value, "numpy", "ndarray"):
        if value.dtype.hasobject:
            raise UsageError(
                f"{where}: a numpy array of Python objects cannot be stored without pickle",
                "convert it to a numeric or string dtype",
            )
        return "numpy", _npy(value)
    if _is_instance(value, "numpy", "generic"):
        if value.dtype.hasobject:
            raise UsageError(f"{where}: a numpy object scalar cannot be stored without pickle")
        return "numpy-scalar", _npy(value)
    if _is_instance(value, "torch", "Tensor"):
        return _tensor(value)
    raise UsageError(
        f"{where}: values of type {type(value).__module__}.{type(value).__qualname__} are not stored",
        "use bytes, str, int, float, bool, None, lists/dicts of those, numpy arrays "
        "or torch tensors (an image: its encoded bytes, or a numpy array)",
    )


def _tensor(value: Any) -> tuple[str, bytes]:
    import torch

    tensor = value.detach().cpu()
    if tensor.layout != torch.strided or tensor.is_quantized:
        buffer = io.BytesIO()
        torch.save(tensor.clone(), buffer)
        return "torch", buffer.getvalue()
    try:
        array = tensor.contiguous().numpy()
    except (TypeError, RuntimeError):  # a dtype numpy does not have (bfloat16, ...)
        buffer = io.BytesIO()
        torch.save(tensor.clone(), buffer)  # clone: only this tensor's bytes, not a view's whole storage
        return "torch", buffer.getvalue()
    return "tensor", _npy(array)
