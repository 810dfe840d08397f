"""decode= on every dataset: the defaults by extension, a mapping of one's own, and lazy imports
(numpy, torch and Pillow only when a field of theirs is decoded)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from lading.core.errors import UsageError
from lading.datasets import (
    DEFAULT_DECODERS,
    PackedDataset,
    RecordDataset,
    ShardDataset,
    StoreDataset,
)
from lading.datasets.decode import decode_sample, decoders_for
from lading.pack import PackOptions, plan_pack, run_pack


def png_bytes() -> bytes | None:
    try:
        from PIL import Image
    except ImportError:
        return None
    out = io.BytesIO()
    Image.new("RGB", (3, 2), (10, 20, 30)).save(out, format="PNG")
    return out.getvalue()


def npy_bytes() -> bytes | None:
    try:
        import numpy
    except ImportError:
        return None
    out = io.BytesIO()
    numpy.save(out, numpy.arange(6, dtype=numpy.int16).reshape(2, 3))
    return out.getvalue()


def pth_bytes() -> bytes | None:
    try:
        import torch
    except ImportError:
        return None
    out = io.BytesIO()
    torch.save({"w": torch.arange(4)}, out)
    return out.getvalue()


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("decode")
    source = root / "src"
    source.mkdir()
    fields = {
        "json": json.dumps({"label": "cat", "n": 3}).encode(),
        "txt": "héllo wörld".encode(),
        "cls": b" 7\n",
        "bin": b"\x00\x01raw",
        "seg.png": png_bytes(),
        "npy": npy_bytes(),
        "pth": pth_bytes(),
    }
    for ext, data in fields.items():
        if data is not None:
            (source / f"a.{ext}").write_bytes(data)
    plan = plan_pack(str(source), str(root / "out"), PackOptions("ds"))
    run_pack(plan, str(source), str(root / "out"))
    return str(root / "out" / "ds.index.json")


def test_defaults_for_common_extensions(packed):
    for sample in (next(iter(ShardDataset(packed, decode=True))), PackedDataset(packed, decode=True)[0]):
        assert sample["json"] == {"label": "cat", "n": 3}
        assert sample["txt"] == "héllo wörld" and sample["cls"] == 7
        assert sample["bin"] == b"\x00\x01raw"  # unknown extensions stay bytes
        if "npy" in sample:
            assert sample["npy"].tolist() == [[0, 1, 2], [3, 4, 5]] and str(sample["npy"].dtype) == "int16"
        if "pth" in sample:
            assert sample["pth"]["w"].tolist() == [0, 1, 2, 3]
        if "seg.png" in sample:  # matched by its last part, as WebDataset does
            assert sample["seg.png"].size == (3, 2) and sample["seg.png"].getpixel((0, 0)) == (10, 20, 30)


def test_optional_libraries_are_exercised_here():
    """The npy/pth/image defaults above only run when those libraries are installed."""
    for module in ("numpy", "PIL", "torch"):
        pytest.importorskip(module)


def test_a_mapping_decodes_only_what_it_names(packed):
    sample = next(iter(ShardDataset(packed, decode={".TXT": lambda data: data.decode().upper(), "cls": int})))
    assert sample["txt"] == "HÉLLO WÖRLD" and sample["cls"] == 7 and isinstance(sample["json"], bytes)
    table = decoders_for({"txt": lambda data: data.decode()[::-1]})
    assert decode_sample({"__key__": "k", "txt": b"abc", "json": b"{}"}, table) == {
        "__key__": "k",
        "txt": "cba",
        "json": b"{}",
    }
    with pytest.raises(UsageError, match="not callable"):
        decoders_for({"txt": "utf-8"})
    with pytest.raises(UsageError, match="decode="):
        decoders_for("yes")  # type: ignore[arg-type]
    extended = {**DEFAULT_DECODERS, "bin": len}
    assert next(iter(ShardDataset(packed, decode=extended)))["bin"] == 5


def test_decode_then_transform(packed):
    dataset = ShardDataset(packed, decode=True, transform=lambda s: (s["json"]["label"], s["cls"]))
    assert list(dataset) == [("cat", 7)]


def test_store_and_record_datasets_decode(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.json").write_text('{"a": 1}')
    (tmp_path / "d" / "y.txt").write_text("why")
    assert [StoreDataset(str(tmp_path / "d"), decode=True)[i] for i in range(2)] == [{"a": 1}, "why"]
    (tmp_path / "labels.cls").write_bytes(b"1\n2\n3\n")
    assert RecordDataset(str(tmp_path / "labels.cls"), 2, decode=True).__getitems__([2, 0]) == [3, 1]
    assert RecordDataset(str(tmp_path / "labels.cls"), 2, decode=bytes.strip)[1] == b"2"


def test_nothing_heavy_is_imported_until_a_field_needs_it(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.json").write_text('{"n": 3}')
    (tmp_path / "src" / "a.txt").write_text("héllo wörld")
    (tmp_path / "src" / "a.npy").write_bytes(b"not decoded unless asked")
    plan = plan_pack(str(tmp_path / "src"), str(tmp_path / "out"), PackOptions("ds"))
    run_pack(plan, str(tmp_path / "src"), str(tmp_path / "out"))
    packed = str(tmp_path / "out" / "ds.index.json")
    # (the iterable datasets import torch when created, if installed, to be IterableDatasets;
    # the map-style ones never do)
    code = f"""
import sys
from lading.datasets import DEFAULT_DECODERS, PackedDataset
sample = PackedDataset({packed!r}, decode={{"json": DEFAULT_DECODERS["json"], "txt": DEFAULT_DECODERS["txt"]}})[0]
assert sample["json"]["n"] == 3 and sample["txt"] == "héllo wörld" and isinstance(sample["npy"], bytes)
heavy = [name for name in ("numpy", "torch", "PIL") if name in sys.modules]
assert not heavy, heavy
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_missing_library_is_a_usage_error_with_a_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "numpy", None)  # as if not installed
    with pytest.raises(UsageError, match="needs numpy"):
        DEFAULT_DECODERS["npy"](b"\x93NUMPY")
    monkeypatch.setitem(sys.modules, "PIL", None)
    assert DEFAULT_DECODERS["png"](b"png bytes") == b"png bytes"  # images stay bytes without Pillow
