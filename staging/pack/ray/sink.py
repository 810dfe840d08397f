"""``ShardSink``: any Ray Dataset written as WebDataset tar shards with lading's index and offsets.

.. code-block:: python

    ds.write_datasink(ShardSink("s3://bucket/sets/imgs", name="imgs", shard_size="256MiB"))

Each row is a dict: ``__key__`` (a string; without it rows are keyed by write task and position)
plus fields named like extensions (``{"__key__": "n01/x1", "jpg": b"...", "cls": 3}`` becomes
the members ``n01/x1.jpg`` and ``n01/x1.cls``). ``bytes`` are stored as they are; other values
with the data layer's typed encoding (:mod:`lading.core.values`: ``str`` as UTF-8, ``int`` as
decimal text, numpy arrays as ``.npy``, ...); ``None`` fields are left out; other fields starting
with ``__`` are ignored.

Each write task cuts its rows into shards of about ``shard_size`` bytes named
``NAME-TTTTTT-KKKK.tar`` (write task, shard of the task), uploads each as it is complete, and
returns its shards' metadata (keys, member offsets and sizes). ``on_write_complete`` on the
driver merges them, in task order, into one offsets file and one index, written last, after it
has deleted any ``NAME-*.tar`` the index does not list (shards of retried or failed attempts).
``on_write_failed`` deletes what the write produced. So nothing under DEST is unlisted.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ray.data import Datasink
from ray.data.block import BlockAccessor

from lading.core.checksums import crc32c_of_bytes, crc32c_of_file
from lading.core.errors import LadingError, ProblemFound, UsageError
from lading.core.sizes import parse_size
from lading.core.values import encode_value
from lading.pack import offsets
from lading.pack.index import INDEX_KIND, PublishedShard, dump
from lading.pack.ray.engine import make_directory
from lading.pack.plan import DEFAULT_SHARD_SIZE, OFFSETS_SUFFIX, check_name
from lading.pack.tarformat import member_size, padding
from lading.pack.writer import ShardWriter
from lading.stores import claims, open_store
from lading.stores.base import Store
from lading.stores.config import StoreConfig
from lading.stores.uri import parse_uri

log = logging.getLogger(__name__)


class RowEncoder:
    """Turns one write task's rows into ``(key, [(extension, bytes), ...])``; :meth:`summary`
    is returned with the task's shards and merged on the driver (see ShardSink.merge_summaries)."""

    def __init__(self, task: int) -> None:
        self.task = task
        self.rows = 0

    def encode(self, row: dict[str, Any]) -> tuple[str, list[tuple[str, bytes]]]:
        """The row's key and members: fields as extensions, non-bytes values typed-encoded."""
        position = self.rows
        self.rows += 1
        key = row.get("__key__")
        if key is None:
            key = f"{self.task:06d}-{position:09d}"
        elif not isinstance(key, str) or not key or "." in key.rpartition("/")[2]:
            raise UsageError(
                f"row {position} of write task {self.task}: __key__ {key!r} is not a string "
                "without dots in its last segment",
                "WebDataset readers end the key at the first dot",
            )
        members = []
        for name, value in row.items():
            if name.startswith("__") or value is None:
                continue
            if not name or name != name.lower() and name.lower() in row:
                raise UsageError(f"sample {key!r}: field {name!r} is not a usable extension")
            if not isinstance(value, (bytes, bytearray, memoryview)):
                value = encode_value(
                    value.item() if _numpy_scalar(value) else value, f"sample {key!r}, field {name!r}"
                )[1]
            members.append((name, bytes(value)))
        if not members:
            raise UsageError(f"sample {key!r} has no fields", "a row needs at least one field besides __key__")
        return key, members

    def summary(self) -> Any:
        """Nothing to merge for plain rows."""
        return None


def _numpy_scalar(value: Any) -> bool:
    import sys

    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.generic)


@dataclass
class TaskShard:
    """One shard a write task published, with what the offsets file needs."""

    key: str
    nsamples: int
    filesize: int
    etag: str
    crc32c: str | None = None
    keys: list[str] = field(default_factory=list)
    members_per_sample: list[int] = field(default_factory=list)
    member_offset: list[int] = field(default_factory=list)
    member_size: list[int] = field(default_factory=list)
    member_ext: list[str] = field(default_factory=list)
    payload: int = 0

    def published(self) -> PublishedShard:
        """The shard as the index lists it."""
        return PublishedShard(self.key, self.nsamples, self.filesize, self.etag, self.crc32c)


@dataclass
class TaskResult:
    """What a write task returns: its shards in order and its encoder's summary."""

    task: int
    shards: list[TaskShard]
    summary: Any


class _ShardFile:
    """The shard a task is filling: a local file and a ShardWriter, plus its member table."""

    def __init__(self, folder: str, key: str) -> None:
        self.path = Path(folder) / Path(key).name
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.writer = ShardWriter(self.fd)
        self.meta = TaskShard(key, 0, 0, "")

    def add(self, key: str, members: list[tuple[str, bytes]]) -> None:
        meta = self.meta
        for ext, data in members:
            name = f"{key}.{ext}"
            start = self.writer.position
            self.writer.add_bytes(name, data)
            meta.member_offset.append(start + member_size(name, len(data)) - len(data) - padding(len(data)))
            meta.member_size.append(len(data))
            meta.member_ext.append(ext.lower())
            meta.payload += len(data)
        meta.keys.append(key)
        meta.members_per_sample.append(len(members))
        meta.nsamples += 1

    def finish(self) -> int:
        """End the archive and close the file; its size."""
        try:
            return self.writer.finish()
        finally:
            self.close_file()

    def close_file(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        self.close_file()
        self.path.unlink(missing_ok=True)


class ShardSink(Datasink):
    """Writes a Ray Dataset's rows as WebDataset tar shards at ``dest`` with lading's index
    (``NAME.index.json``, written last), offsets file and manifest (see the module docstring).

    Args:
        dest: a directory or bucket prefix (``s3://``, ``gs://``) every worker can write to.
        name: the dataset's name (letters, digits, ``.``, ``_``, ``-``): file names and index.
        shard_size: target shard size: bytes, or a size string as ``lading pack --shard-size``
            takes (``"256KB"``, ``"64MiB"``); a shard ends at the first row past it.
        config: store settings (default: ``StoreConfig.from_env()`` on the driver), sent to the
            tasks without the credentials read from the driver's environment: each worker
            resolves its own through its credential chain; credentials put in ``config``
            explicitly travel with it.
    """

    def __init__(
        self, dest: str, *, name: str, shard_size: int | str = DEFAULT_SHARD_SIZE, config: StoreConfig | None = None
    ) -> None:
        check_name(name, "name")
        self.dest = str(parse_uri(dest)) if parse_uri(dest).scheme != "file" else parse_uri(dest).prefix
        self.name = name
        self.shard_size = _shard_size(shard_size)
        self.config = config or StoreConfig.from_env()
        self.folder = ""  # shards and documents go into this folder of dest ("" or "x/")
        self.index: dict[str, Any] | None = None
        self.shards: list[PublishedShard] = []
        self._pattern = re.compile(rf"^{re.escape(name)}-\d{{6}}-\d{{4}}\.tar$")

    def __getstate__(self) -> dict[str, Any]:
        """What travels to Ray's write tasks: the settings without credentials read from the
        driver's environment, so each worker resolves its own (StoreConfig.for_workers)."""
        state = dict(self.__dict__)
        state["config"] = self.config.for_workers()
        return state

    # -- what subclasses (lading.datalayer.ray) change ------------------------------------------

    def row_encoder(self, task: int) -> RowEncoder:
        """The encoder of one write task's rows."""
        return RowEncoder(task)

    def merge_summaries(self, summaries: list[Any]) -> dict[str, Any]:
        """Extra index fields from the tasks' encoder summaries (none for plain rows)."""
        return {}

    def publish_index(self, store: Store, key: str, index: dict[str, Any]) -> dict[str, Any]:
        """Write the index (an upload: it replaces nothing, on_write_start refused an existing one);
        return it as written."""
        _put(store, key, dump(index))
        return index

    @property
    def index_key(self) -> str:
        """The index's key under dest."""
        return f"{self.name}.index.json"

    # -- Datasink -------------------------------------------------------------------------------

    def get_name(self) -> str:
        """Names Ray's write tasks."""
        return "LadingShards"

    def _store(self) -> Store:
        return open_store(self.dest, self.config)

    def on_write_start(self, schema: Any = None) -> None:
        """Refuse a dest that already holds a dataset of this name."""
        if "://" not in self.dest:
            make_directory(Path(self.dest))
        store = self._store()
        if any(info.key == self.index_key for info in store.list(self.index_key)):
            raise UsageError(
                f"{store.url}/{self.index_key} already exists: a dataset with this name was written there",
                "use another name or dest, or delete the old dataset first",
            )

    def write(self, blocks: Iterable[Any], ctx: Any) -> TaskResult:
        """One write task: rows into shards of about shard_size, each uploaded when complete."""
        task = int(ctx.task_idx)
        encoder = self.row_encoder(task)
        store = self._store()
        done: list[TaskShard] = []
        with tempfile.TemporaryDirectory(prefix="lading-shardsink-") as folder:
            current: _ShardFile | None = None
            try:
                for block in blocks:
                    row: Any
                    for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True):
                        if current is None:
                            current = _ShardFile(folder, f"{self.folder}{self.name}-{task:06d}-{len(done):04d}.tar")
                        current.add(*encoder.encode(dict(row)))
                        if current.writer.position >= self.shard_size:
                            done.append(self._publish(store, current))
                            current = None
                if current is not None:
                    done.append(self._publish(store, current))
                    current = None
            finally:
                if current is not None:
                    current.close()
        return TaskResult(task, done, encoder.summary())

    def _publish(self, store: Store, shard: _ShardFile) -> TaskShard:
        size = shard.finish()
        shard.meta.crc32c = crc32c_of_file(shard.path)
        info = store.upload(shard.path, shard.meta.key)
        shard.close()
        if info.size != size:
            raise ProblemFound(f"{store.url}/{shard.meta.key} holds {info.size} bytes once uploaded, written {size}")
        shard.meta.filesize, shard.meta.etag = info.size, info.version
        return shard.meta

    def on_write_complete(self, write_result: Any) -> None:
        """Merge every task's shards into the offsets file and the index; delete unlisted shards;
        then write the index."""
        results = sorted((r for r in write_result.write_returns if r is not None), key=lambda r: r.task)
        shards = [shard for result in results for shard in result.shards]
        if not shards:
            raise UsageError("the dataset has no rows, so there is nothing to write")
        extra = self.merge_summaries([result.summary for result in results])
        store = self._store()
        table = _offsets_table(shards)
        offsets_key, manifest_key = (
            f"{self.folder}{self.name}{OFFSETS_SUFFIX}",
            f"{self.folder}{self.name}.manifest.json",
        )
        encoded = offsets.encode(table)
        offsets_info = _put(store, offsets_key, encoded)
        manifest = [{"prefix": f"{store.url.rstrip('/')}/{self.folder}"}, *(Path(s.key).name for s in shards)]
        _put(store, manifest_key, dump(manifest))
        self._remove_unlisted(store, {shard.key for shard in shards})
        self.shards = [shard.published() for shard in shards]
        offsets_file = PublishedShard(offsets_key, 0, offsets_info.size, offsets_info.version, crc32c_of_bytes(encoded))
        index = self._index(shards, table, offsets_file)
        index.update(extra)
        self.index = self.publish_index(store, self.index_key, index)

    def _index(
        self, shards: list[TaskShard], table: offsets.OffsetsTable, offsets_file: PublishedShard
    ) -> dict[str, Any]:
        return {
            "__kind__": INDEX_KIND,
            "wids_version": 1,
            "name": self.name,
            "shardlist": [shard.published().entry() for shard in shards],
            "lading": {
                "format": 1,
                "version": None,
                "shuffle": False,
                "seed": None,
                "shard_size": self.shard_size,
                "nsamples": table.nsamples,
                "nfiles": len(table.member_size),
                "input_bytes": sum(s.payload for s in shards),
                "writer": "ray.ShardSink",
                "offsets": offsets_file.entry(without=("nsamples",)),
            },
        }

    def _remove_unlisted(self, store: Store, listed: set[str]) -> int:
        """Delete this dataset's shards (by name pattern) that ``listed`` does not name."""
        removed = 0
        for info in store.list(f"{self.folder}{self.name}-"):
            if info.key not in listed and self._pattern.match(info.key[len(self.folder) :]):
                claims.delete(store, info.key)
                removed += 1
        if removed:
            log.info("removed %d shards of retried or failed write attempts under %s", removed, store.url)
        return removed

    def on_write_failed(self, error: Exception) -> None:
        """Delete every shard and document this write produced (best effort); no index is written."""
        try:
            store = self._store()
            self._remove_unlisted(store, set())
            for key in (f"{self.folder}{self.name}{OFFSETS_SUFFIX}", f"{self.folder}{self.name}.manifest.json"):
                claims.delete(store, key)
        except LadingError as err:
            log.warning("could not remove the shards of the failed write under %s: %s", self.dest, err)


def _shard_size(value: int | str) -> int:
    """``shard_size`` in bytes: a positive int, or a size string parsed as ``--shard-size`` is."""
    if isinstance(value, str):
        try:
            return parse_size(value)
        except UsageError as err:
            raise UsageError(f"shard_size={value!r}: {err.message}", err.hint) from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(
            f"shard_size={value!r} is not a size", 'a positive number of bytes or a string such as "256KB" or "64MiB"'
        )
    return value


def _put(store: Store, key: str, data: bytes) -> Any:
    with tempfile.TemporaryDirectory(prefix="lading-shardsink-") as folder:
        path = Path(folder) / "document"
        path.write_bytes(data)
        return store.upload(path, key)


def _offsets_table(shards: list[TaskShard]) -> offsets.OffsetsTable:
    """The offsets file of the merged shards (samples numbered in index order)."""
    shard_samples, sample_members, key_offsets = array("Q", [0]), array("Q", [0]), array("Q", [0])
    member_offset, member_sizes, member_ext = array("Q"), array("Q"), array("I")
    ext_ids: dict[str, int] = {}
    keys = bytearray()
    seen: set[str] = set()
    for shard in shards:
        member_offset.extend(shard.member_offset)
        member_sizes.extend(shard.member_size)
        member_ext.extend(ext_ids.setdefault(ext, len(ext_ids)) for ext in shard.member_ext)
        for key, count in zip(shard.keys, shard.members_per_sample):
            if key in seen:
                raise UsageError(
                    f"__key__ {key!r} appears in more than one row", "keys identify samples: make them unique"
                )
            seen.add(key)
            sample_members.append(sample_members[-1] + count)
            keys += key.encode("utf-8", "surrogateescape")
            key_offsets.append(len(keys))
        shard_samples.append(shard_samples[-1] + shard.nsamples)
    return offsets.OffsetsTable(
        shard_samples,
        sample_members,
        member_offset,
        member_sizes,
        member_ext,
        key_offsets,
        bytes(keys),
        list(ext_ids),
        [(Path(s.key).name, s.nsamples) for s in shards],
    )
