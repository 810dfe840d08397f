"""How samples from Python code become tar members, and back: the encoding the index records.

A sample is a dict of fields. Each field becomes one member named ``KEY.FIELD.TYPE``:

============================  ===============  ==========================================================
value                         TYPE (suffix)    member bytes
============================  ===============  ==========================================================
``bytes``, ``bytearray``,     ``bin``          the bytes (read back as ``bytes``)
``memoryview``
``str``                       ``txt``          UTF-8
``bool``                      ``bool``         ``true`` / ``false``
``int``                       ``cls``          ASCII decimal (WebDataset's class-label suffix)
``float``                     ``float``        ``repr()``: the shortest text that reads back exactly (``nan``, ``inf`` too)
``None``, ``list``, ``dict``  ``json``         JSON (dict keys strings; no tuples: they would come back as lists)
numpy array                   ``npy``          ``numpy.save`` without pickle (no object arrays)
numpy scalar                  ``scalar.npy``   a 0-d ``.npy``; read back as the same numpy scalar type
torch tensor                  ``tensor.npy``   the CPU, detached values as ``.npy`` (dtypes numpy has)
torch tensor (bfloat16, ...)  ``pth``          ``torch.save`` (read with ``weights_only=True``)
============================  ===============  ==========================================================

``KEY`` is the sample's ``__key__`` (a string) percent-encoded so that WebDataset's grouping rule
(the key ends at the first dot of the file name) gives it back: every byte outside ``A-Z a-z 0-9
_ - ~`` is written ``%XX`` (a ``.`` and a ``/`` too). Samples without ``__key__`` are keyed by
their position, ``000000000000``, ``000000000001``, ... (and are stored in that order; samples with
keys are stored in the order of their encoded keys). ``FIELD`` is the field name encoded the same way.

The index records the table ``{"label.cls": {"field": "label", "type": "int"}, ...}`` (member
extensions as readers name them, lower-cased), so reading restores field names exactly (case
included) and each value's type. Plain WebDataset readers see ``label.cls``, ``image.npy``,
``caption.txt`` and decode most of them with their default decoders.
"""

from __future__ import annotations

import io
import json
from typing import Any, Callable, Mapping
from urllib.parse import quote, unquote

from lading.core.errors import UsageError
from lading.core.values import SUFFIX, encode_value  # the value encoding lives in the core layer

ENCODING = "lading-datalayer-1"
KEY_WIDTH = 12


def escape(text: str) -> str:
    """``text`` with every character outside ``A-Za-z0-9_-~`` percent-encoded (UTF-8)."""
    try:
        return quote(text, safe="").replace(".", "%2E")
    except UnicodeEncodeError:
        raise UsageError(f"{text!r} is not valid Unicode (a lone surrogate?)") from None


def unescape(text: str) -> str:
    """The inverse of :func:`escape`."""
    return unquote(text)


# -- bytes -> values ---------------------------------------------------------------------------------


def _load_npy(data: Any) -> Any:
    try:
        import numpy
    except ImportError:
        raise UsageError("this dataset has numpy fields: reading them needs numpy", "pip install numpy") from None
    return numpy.load(io.BytesIO(bytes(data)), allow_pickle=False)


def _load_tensor(data: Any) -> Any:
    try:
        import torch
    except ImportError:
        raise UsageError("this dataset has torch tensors: reading them needs torch", "pip install torch") from None
    return torch.from_numpy(_load_npy(data))


def _load_torch(data: Any) -> Any:
    try:
        import torch
    except ImportError:
        raise UsageError("this dataset has torch tensors: reading them needs torch", "pip install torch") from None
    return torch.load(io.BytesIO(bytes(data)), weights_only=True)


def _bool(data: Any) -> bool:
    text = bytes(data)
    if text not in (b"true", b"false"):
        raise ValueError(f"not a bool: {text[:20]!r}")
    return text == b"true"


DECODERS: dict[str, Callable[[Any], Any]] = {
    "bytes": bytes,
    "str": lambda data: bytes(data).decode("utf-8"),
    "bool": _bool,
    "int": lambda data: int(bytes(data)),
    "float": lambda data: float(bytes(data)),
    "json": lambda data: json.loads(bytes(data)),
    "numpy": _load_npy,
    "numpy-scalar": lambda data: _load_npy(data)[()],
    "tensor": _load_tensor,
    "torch": _load_torch,
}


# -- samples -----------------------------------------------------------------------------------------


class Encoder:
    """Turns samples into ``(stored key, [(extension, bytes), ...])`` and collects the field table.

    Refuses, naming the sample: a sample that is not a dict, a ``__key__`` that is not a string
    or repeats, some samples with a key and others without, other ``__`` fields, two field names
    equal but for case (readers lower-case extensions), a sample without fields.
    """

    def __init__(self) -> None:
        self.fields: dict[str, dict[str, str]] = {}
        self.keyed: bool | None = None
        self._keys: set[str] = set()
        self.samples = 0

    def encode(self, sample: Any) -> tuple[str, list[tuple[str, bytes]]]:
        """The stored key and the members of the next sample."""
        position = self.samples
        if not isinstance(sample, Mapping):
            raise UsageError(
                f"sample {position} is a {type(sample).__name__}, not a dict",
                'yield dicts of fields, e.g. {"image": array, "label": 3}',
            )
        key = sample.get("__key__")
        keyed = key is not None
        if self.keyed is None:
            self.keyed = keyed
        elif keyed != self.keyed:
            raise UsageError(
                f"sample {position} {'has' if keyed else 'has no'} __key__, the samples before it "
                f"{'do not' if keyed else 'do'}",
                "give every sample a __key__, or none",
            )
        if keyed:
            if not isinstance(key, str) or not key:
                raise UsageError(f"sample {position}: __key__ {key!r} is not a non-empty string")
            if key in self._keys:
                raise UsageError(
                    f"sample {position}: __key__ {key!r} was used by an earlier sample",
                    "keys identify samples: make them unique, or leave them out",
                )
            self._keys.add(key)
            stored = escape(key)
            where = f"sample {key!r}"
        else:
            stored = f"{position:0{KEY_WIDTH}d}"
            where = f"sample {position}"
        members = []
        for name, value in sample.items():
            if name == "__key__":
                continue
            if not isinstance(name, str) or not name:
                raise UsageError(f"{where}: field name {name!r} is not a non-empty string")
            if name.startswith("__"):
                raise UsageError(
                    f"{where}: field {name!r} starts with '__', which WebDataset reserves",
                    "rename it (only __key__ is read as the sample's key)",
                )
            kind, data = encode_value(value, f"{where}, field {name!r}")
            ext = f"{escape(name)}.{SUFFIX[kind]}"
            self._record(ext.lower(), name, kind, where)
            members.append((ext, data))
        if not members:
            raise UsageError(f"{where} has no fields", "a sample needs at least one field besides __key__")
        folded = [ext.lower() for ext, _ in members]
        if len(set(folded)) != len(folded):
            raise UsageError(
                f"{where}: two field names differ only by case",
                "WebDataset readers lower-case extensions; rename one of them",
            )
        self.samples += 1
        return stored, members

    def _record(self, ext: str, name: str, kind: str, where: str) -> None:
        known = self.fields.get(ext)
        if known is None:
            self.fields[ext] = {"field": name, "type": kind}
        elif known["field"] != name:
            raise UsageError(
                f"{where}: field {name!r} and field {known['field']!r} of an earlier sample differ only by case",
                "WebDataset readers lower-case extensions; use one spelling",
            )

    def table(self) -> dict[str, Any]:
        """What the index records (see the module docstring)."""
        return {
            "format": ENCODING,
            "keys": "given" if self.keyed else "position",
            "fields": dict(sorted(self.fields.items())),
        }


class Decode:
    """A sample as read (``{"__key__": stored key, ext: bytes}``) back into the fields and types
    that were stored; then ``then(sample)`` when given. Picklable (DataLoader workers)."""

    def __init__(self, encoding: Mapping[str, Any], then: Callable[[dict[str, Any]], Any] | None = None) -> None:
        if not isinstance(encoding, Mapping) or encoding.get("format") != ENCODING:
            raise UsageError(
                f"unknown sample encoding {encoding.get('format') if isinstance(encoding, Mapping) else encoding!r}",
                "this dataset was written by a newer lading; upgrade lading-data",
            )
        self.fields = {
            str(ext): (str(entry["field"]), str(entry["type"]))
            for ext, entry in dict(encoding.get("fields", {})).items()
        }
        unknown = sorted({kind for _, kind in self.fields.values()} - set(DECODERS))
        if unknown:
            raise UsageError(
                f"unknown field types {unknown} in this dataset's encoding",
                "it was written by a newer lading; upgrade lading-data",
            )
        self.then = then

    def __call__(self, sample: dict[str, Any]) -> Any:
        out: dict[str, Any] = {}
        for ext, data in sample.items():
            if ext == "__key__":
                out["__key__"] = unescape(data)
                continue
            found = self.fields.get(ext)
            if found is None:
                out[ext] = data if ext.startswith("__") else bytes(data)
                continue
            name, kind = found
            out[name] = DECODERS[kind](data)
        return out if self.then is None else self.then(out)
