"""Where every sample and member sits in the shards: ``NAME.offsets.safetensors``.

``lading pack`` writes this file next to the index (after the shards and the manifest, before the
index), so a reader can fetch sample ``i`` of the dataset with one ranged read, without opening the
tar headers first. It is a valid `safetensors <https://github.com/huggingface/safetensors>`_ file
(any safetensors reader opens it), made of plain little-endian integer arrays:

=================  =====  ==========  ==========================================================
array              dtype  length      meaning
=================  =====  ==========  ==========================================================
``shard_samples``  U64    shards + 1  cumulative samples: shard ``s`` holds global samples
                                      ``shard_samples[s] .. shard_samples[s+1]-1``
``sample_members`` U64    N + 1       cumulative members: sample ``i`` has members
                                      ``sample_members[i] .. sample_members[i+1]-1``
``member_offset``  U64    M           byte offset of the member's *data* in its shard
``member_size``    U64    M           the member's data size in bytes
``member_ext``     U32    M           index into the metadata's ``exts`` list (lower-cased
                                      extensions, as WebDataset readers name sample fields)
``key_offsets``    U64    N + 1       sample ``i``'s key is ``keys[key_offsets[i]:key_offsets[i+1]]``
``keys``           U8     K           the sample keys, UTF-8, concatenated
=================  =====  ==========  ==========================================================

``__metadata__`` holds ``format`` (``lading-offsets``), ``version`` (``1``), ``exts`` (a JSON list)
and ``shards`` (a JSON list of ``[url, nsamples]``, the index's shardlist order). Samples are
numbered in index order (shard by shard, samples in shard order). A sample's members are
adjacent, so its bytes are one range: ``member_offset[first]`` to
``member_offset[last] + member_size[last]`` (tar headers of later members included).
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from dataclasses import dataclass
from typing import Any

from lading.core.errors import ProblemFound
from lading.pack.plan import OFFSETS_SUFFIX, PackPlan
from lading.pack.tarformat import member_size, padding

FORMAT = "lading-offsets"
VERSION = "1"
SUFFIX = OFFSETS_SUFFIX

#: (name, safetensors dtype, array typecode), in file order.
_ARRAYS = (
    ("shard_samples", "U64", "Q"),
    ("sample_members", "U64", "Q"),
    ("member_offset", "U64", "Q"),
    ("member_size", "U64", "Q"),
    ("member_ext", "U32", "I"),
    ("key_offsets", "U64", "Q"),
    ("keys", "U8", "B"),
)
_ITEMSIZE = {"U64": 8, "U32": 4, "U8": 1}


@dataclass
class OffsetsTable:
    """The arrays of an offsets file (see the module docstring), plus ``exts`` and ``shards``."""

    shard_samples: array
    sample_members: array
    member_offset: array
    member_size: array
    member_ext: array
    key_offsets: array
    keys: bytes
    exts: list[str]
    shards: list[tuple[str, int]]

    @property
    def nsamples(self) -> int:
        """Samples in the dataset."""
        return len(self.sample_members) - 1

    def key(self, sample: int) -> str:
        """The key of global sample ``sample``."""
        return self.keys[self.key_offsets[sample] : self.key_offsets[sample + 1]].decode("utf-8", "surrogateescape")

    def byte_range(self, sample: int) -> tuple[int, int]:
        """``[start, end)`` of the sample's members in its shard."""
        first, last = self.sample_members[sample], self.sample_members[sample + 1] - 1
        return self.member_offset[first], self.member_offset[last] + self.member_size[last]


def _check_typecodes() -> None:
    for _, dtype, code in _ARRAYS:
        if array(code).itemsize != _ITEMSIZE[dtype]:  # pragma: no cover - exotic platforms
            raise RuntimeError(f"array typecode {code!r} is not {_ITEMSIZE[dtype]} bytes here")


def table_from_plan(plan: PackPlan) -> OffsetsTable:
    """Every member's data offset and size, computed from the plan (the writer follows it)."""
    shard_samples, sample_members, key_offsets = array("Q", [0]), array("Q", [0]), array("Q", [0])
    member_offset, member_sizes, member_ext = array("Q"), array("Q"), array("I")
    ext_ids: dict[str, int] = {}
    keys = bytearray()
    members = 0
    for shard in plan.shards:
        for sample, start in zip(shard.samples, shard.offsets):
            position = start
            for member in sample.members:
                name, size = member.info.key, member.info.size
                total = member_size(name, size)
                member_offset.append(position + total - size - padding(size))
                member_sizes.append(size)
                ext = member.ext.lower()
                member_ext.append(ext_ids.setdefault(ext, len(ext_ids)))
                position += total
            members += len(sample.members)
            sample_members.append(members)
            keys += sample.key.encode("utf-8", "surrogateescape")
            key_offsets.append(len(keys))
        shard_samples.append(shard_samples[-1] + len(shard.samples))
    return OffsetsTable(
        shard_samples,
        sample_members,
        member_offset,
        member_sizes,
        member_ext,
        key_offsets,
        bytes(keys),
        list(ext_ids),
        [(shard.name, len(shard.samples)) for shard in plan.shards],
    )


def encode(table: OffsetsTable) -> bytes:
    """The file's bytes: an 8-byte header length, the JSON header, then the arrays."""
    _check_typecodes()
    header: dict[str, Any] = {
        "__metadata__": {
            "format": FORMAT,
            "version": VERSION,
            "exts": json.dumps(table.exts),
            "shards": json.dumps([list(shard) for shard in table.shards]),
        }
    }
    blobs = []
    position = 0
    for name, dtype, _ in _ARRAYS:
        values = getattr(table, name)
        blob = values if isinstance(values, bytes) else _little_endian(values)
        header[name] = {
            "dtype": dtype,
            "shape": [len(blob) // _ITEMSIZE[dtype]],
            "data_offsets": [position, position + len(blob)],
        }
        blobs.append(blob)
        position += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)  # safetensors aligns the data to 8 bytes with spaces
    return b"".join([struct.pack("<Q", len(text)), text, *blobs])


def _little_endian(values: array) -> bytes:
    if sys.byteorder == "little":
        return values.tobytes()
    swapped = array(values.typecode, values)  # pragma: no cover - big-endian hosts
    swapped.byteswap()
    return swapped.tobytes()


def decode(data: bytes | memoryview, where: str) -> OffsetsTable:
    """Parse an offsets file; :class:`ProblemFound` when it is not one."""
    _check_typecodes()
    view = memoryview(data)
    try:
        (length,) = struct.unpack_from("<Q", view, 0)
        header = json.loads(bytes(view[8 : 8 + length]))
        meta = header["__metadata__"]
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise ValueError(f"format {meta.get('format')!r} version {meta.get('version')!r}")
        base = 8 + length
        arrays: dict[str, Any] = {}
        for name, dtype, code in _ARRAYS:
            entry = header[name]
            if entry["dtype"] != dtype:
                raise ValueError(f"{name} has dtype {entry['dtype']}, expected {dtype}")
            start, end = entry["data_offsets"]
            if not 0 <= start <= end <= len(view) - base:
                raise ValueError(f"{name} lies outside the file")
            chunk = view[base + start : base + end]
            if code == "B":
                arrays[name] = bytes(chunk)
                continue
            values = array(code)
            values.frombytes(chunk)
            if sys.byteorder != "little":  # pragma: no cover
                values.byteswap()
            arrays[name] = values
        table = OffsetsTable(
            **arrays,
            exts=json.loads(meta["exts"]),
            shards=[(str(url), int(count)) for url, count in json.loads(meta["shards"])],
        )
    except (struct.error, ValueError, KeyError, TypeError) as err:
        raise ProblemFound(f"{where} is not a lading offsets file: {err}") from err
    _check_consistent(table, where)
    return table


def _check_consistent(table: OffsetsTable, where: str) -> None:
    members = len(table.member_offset)
    problems = []
    if table.shard_samples[-1] != table.nsamples or len(table.shard_samples) != len(table.shards) + 1:
        problems.append("shard counts disagree with the sample count")
    if table.sample_members[-1] != members or len(table.member_size) != members or len(table.member_ext) != members:
        problems.append("member arrays disagree")
    if len(table.key_offsets) != table.nsamples + 1 or table.key_offsets[-1] != len(table.keys):
        problems.append("keys disagree with the sample count")
    if len(table.member_ext) and max(table.member_ext) >= len(table.exts):
        problems.append("an extension index is out of range")
    if problems:
        raise ProblemFound(f"{where} is not a consistent lading offsets file: {'; '.join(problems)}")
