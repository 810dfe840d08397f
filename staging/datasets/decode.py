"""Decoders: sample fields from bytes to objects, by extension, with no hard dependency.

``decode=True`` uses :data:`DEFAULT_DECODERS`; a mapping ``{extension: function(bytes)}`` uses
exactly those; ``None``/``False`` leaves bytes. A field's extension is matched whole first
(``seg.png``), then by its last part (``png``), as WebDataset does; extensions are lower-case.
numpy, torch and Pillow are imported only when a field of theirs is decoded.
"""

from __future__ import annotations

import io
import json
from typing import Any, Callable, Mapping, Union

from lading.core.errors import LadingError, ProblemFound, UsageError

Decoder = Callable[[bytes], Any]
DecodeOption = Union[bool, None, Mapping[str, Decoder]]
#: Where a sample comes from, for error messages: the shard or object, or a function giving it.
Where = Union[str, Callable[[], str], None]


class DecodeError(ProblemFound):
    """A field's bytes are not what its extension says (``decode=True`` on a ``.jpg`` that is not
    an image): names the field, the sample's key and the shard or object it was read from. The
    decoder's own exception is its ``__cause__``."""


def decode_field(function: Decoder, data: bytes, field: str, key: str | None, where: Where) -> Any:
    """``function(data)``; a failure becomes a :class:`DecodeError` naming field, key and where."""
    try:
        return function(data)
    except LadingError:
        raise
    except Exception as err:
        place = where() if callable(where) else where
        sample = f" of sample {key!r}" if key is not None else ""
        source = f" in {place}" if place else ""
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise DecodeError(
            f"cannot decode field {field!r}{sample}{source}: {type(err).__name__}: {reason}",
            f"check that data, or leave {field!r} out of decode= (a mapping of the extensions to decode)",
        ) from err


def _text(data: bytes) -> str:
    return bytes(data).decode("utf-8")


def _json(data: bytes) -> Any:
    return json.loads(data)


def _int(data: bytes) -> int:
    return int(bytes(data).strip())


def _needs(module: str, ext: str, package: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(
            f"decoding .{ext} fields needs {package}, which is not installed",
            f"pip install {package}, or pass decode= without '{ext}'",
        ) from None


def _npy(data: bytes) -> Any:
    numpy = _needs("numpy", "npy", "numpy")
    return numpy.load(io.BytesIO(data), allow_pickle=False)


def _pth(data: bytes) -> Any:
    torch = _needs("torch", "pth", "torch")
    return torch.load(io.BytesIO(data), weights_only=True)


def _image(data: bytes) -> Any:
    """A loaded Pillow image; the bytes unchanged when Pillow is not installed."""
    try:
        from PIL import Image
    except ImportError:
        return data
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


#: What ``decode=True`` applies. Copy and extend it for a mapping of your own.
DEFAULT_DECODERS: dict[str, Decoder] = {
    "json": _json,
    "jsn": _json,
    "txt": _text,
    "text": _text,
    "cls": _int,
    "cls2": _int,
    "index": _int,
    "inx": _int,
    "id": _int,
    "npy": _npy,
    "pth": _pth,
    "pt": _pth,
    **{ext: _image for ext in ("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "gif", "tif", "tiff", "webp")},
}


def decoders_for(decode: DecodeOption) -> dict[str, Decoder] | None:
    """The extension -> decoder table for a ``decode=`` argument (None: leave bytes)."""
    if decode is None or decode is False:
        return None
    if decode is True:
        return dict(DEFAULT_DECODERS)
    if isinstance(decode, Mapping):
        table = {}
        for ext, function in decode.items():
            if not callable(function):
                raise UsageError(f"decode={{{ext!r}: ...}} is not callable")
            table[str(ext).lower().lstrip(".")] = function
        return table
    raise UsageError(f"decode={decode!r}: use True, a mapping of extension to function, or None")


def decoder_for(table: Mapping[str, Decoder], ext: str) -> Decoder | None:
    """The decoder for extension ``ext``: whole (``seg.png``), else its last part (``png``)."""
    found = table.get(ext)
    if found is None and "." in ext:
        found = table.get(ext.rpartition(".")[2])
    return found


def decode_sample(sample: dict[str, Any], table: Mapping[str, Decoder], where: Where = None) -> dict[str, Any]:
    """Decode the fields of a sample dict in place (``__key__`` and other ``__`` fields stay).

    ``where`` names the shard the sample was read from, in a :class:`DecodeError`."""
    for ext, data in sample.items():
        if ext.startswith("__"):
            continue
        function = decoder_for(table, ext)
        if function is not None:
            sample[ext] = decode_field(function, data, ext, sample.get("__key__"), where)
    return sample
