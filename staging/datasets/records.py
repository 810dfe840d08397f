"""RecordDataset: map-style over fixed-size records stored in one object (token files, arrays)."""

from __future__ import annotations

from typing import Any, Sequence

from lading.core.errors import UsageError
from lading.datasets.decode import DecodeOption, Decoder, decode_field, decoder_for, decoders_for
from lading.datasets.index import store_for
from lading.stores.base import ObjectInfo
from lading.stores.batch import RangeRequest, read_batch
from lading.stores.config import StoreConfig
from lading.stores.process import control_plane
from lading.stores.uri import parse_uri

#: Records within this many bytes of each other are fetched in one read by ``__getitems__``.
DEFAULT_GAP = 64 << 10
#: For :class:`~lading.datasets.NodeLocalSampler`: records are ordered in chunks of about this many bytes.
DEFAULT_CHUNK = 64 << 20


class RecordDataset:
    """Record ``i`` of an object made of ``header_bytes`` then records of ``record_size`` bytes.

    ``ds[i]`` is one ranged read (pinned to the version seen at construction: a replaced object
    fails with "object changed" instead of mixing). ``__getitems__`` (DataLoader's batch call)
    sorts the batch and reads neighbouring records (gaps up to ``max_gap`` bytes) in one range,
    the ranges in one call to the I/O core (concurrent GETs). ``decode`` is a function of the record's bytes, or
    ``True``/a mapping applied by the object's extension; trailing bytes short of a whole record
    are refused unless ``allow_partial``.
    """

    def __init__(
        self,
        uri: str,
        record_size: int,
        header_bytes: int = 0,
        *,
        decode: DecodeOption | Decoder = None,
        config: StoreConfig | None = None,
        max_gap: int = DEFAULT_GAP,
        threads: int = 8,
        allow_partial: bool = False,
    ) -> None:
        if record_size < 1 or header_bytes < 0:
            raise UsageError(f"record_size={record_size} must be positive and header_bytes={header_bytes} not negative")
        self.uri = uri
        self.record_size, self.header_bytes = record_size, header_bytes
        self.config = config or StoreConfig.from_env()
        store, key = store_for(uri, self.config)
        with control_plane():  # not obstore: DataLoader workers forked after this still may use it
            self.info: ObjectInfo = store.stat(key)
        body = self.info.size - header_bytes
        if body < 0 or (body % record_size and not allow_partial):
            raise UsageError(
                f"{uri} has {self.info.size} bytes: not {header_bytes} header bytes plus whole "
                f"records of {record_size}",
                "check record_size and header_bytes, or pass allow_partial=True",
            )
        self.count = max(0, body) // record_size
        #: The file's extension: picks the decoder, and is named in a decoder's error.
        self._field = parse_uri(uri).prefix.rpartition("/")[2].partition(".")[2].lower()
        if callable(decode) and not isinstance(decode, bool):
            self.decoder: Decoder | None = decode
        else:
            table = decoders_for(decode)
            self.decoder = None if table is None else decoder_for(table, self._field)
        self.max_gap, self.threads = max_gap, max(1, threads)  # threads: kept for compatibility

    def __len__(self) -> int:
        return self.count

    def chunk_counts(self, chunk_bytes: int = DEFAULT_CHUNK) -> list[int]:
        """Records per chunk of about ``chunk_bytes`` (the last one shorter): the "shards" the epoch
        order (:class:`~lading.datasets.NodeLocalSampler`) deals to nodes and walks a block at a time."""
        per = max(1, chunk_bytes // self.record_size)
        full, rest = divmod(self.count, per)
        return [per] * full + ([rest] if rest else [])

    def _checked(self, index: int) -> int:
        position = index + self.count if index < 0 else index
        if not 0 <= position < self.count:
            raise IndexError(f"index {index} out of range for {self.count} records")
        return position

    def _read(self, first: int, last: int) -> bytes:
        """Records ``first .. last`` (inclusive), one ranged read."""
        return bytes(self._read_runs([(first, last)])[0])

    def _read_runs(self, runs: Sequence[tuple[int, int]]) -> list[memoryview]:
        """Each run of records ``(first, last)``, in one batched read."""
        store, key = store_for(self.uri, self.config)
        size, base = self.record_size, self.header_bytes
        return read_batch(
            [
                (store, RangeRequest(key, base + first * size, base + (last + 1) * size, self.info.version or None))
                for first, last in runs
            ]
        )

    def _finish(self, data: bytes, position: int) -> Any:
        if self.decoder is None:
            return data
        return decode_field(self.decoder, data, self._field or "record", f"record {position}", self.uri)

    def __getitem__(self, index: int) -> Any:
        position = self._checked(index)
        return self._finish(self._read(position, position), position)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch of records; neighbours coalesced into one read each."""
        positions = [self._checked(index) for index in indices]
        gap = max(0, self.max_gap // self.record_size)
        runs: list[list[int]] = []  # [first, last]
        for position in sorted(set(positions)):
            if runs and position - runs[-1][1] - 1 <= gap:
                runs[-1][1] = position
            else:
                runs.append([position, position])
        chunks = self._read_runs([(first, last) for first, last in runs])
        found: dict[int, bytes] = {}
        size = self.record_size
        for (first, last), data in zip(runs, chunks):
            for position in range(first, last + 1):
                # bytes, not a view: samples cross process boundaries (DataLoader pickles them)
                found[position] = bytes(data[(position - first) * size : (position - first + 1) * size])
        return [self._finish(found[position], position) for position in positions]
