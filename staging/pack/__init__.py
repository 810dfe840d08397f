"""``lading pack``: many small files into WebDataset tar shards, with a wids index and a
SageMaker manifest. Plan first (:func:`plan_pack`), then write (:func:`run_pack`)."""

from __future__ import annotations

import gc
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from lading.core.errors import UsageError
from lading.pack import offsets
from lading.pack.execute import write_shards
from lading.pack.grouping import ListedFile, group_samples
from lading.pack.index import PublishedShard, build_index, build_manifest, dump
from lading.pack.plan import PackOptions, PackPlan, plan_shards
from lading.pack.sources import LocalSource, MemberSource, StoreSource, list_local
from lading.pack.upload import LocalPublisher, Publisher, StorePublisher
from lading.stores import open_store
from lading.stores.config import StoreConfig
from lading.stores.uri import StoreURI, parse_uri

__all__ = [
    "PackEvents",
    "PackOptions",
    "PackPlan",
    "PackResult",
    "default_name",
    "index_maker",
    "open_source",
    "pack_documents",
    "plan_pack",
    "run_pack",
    "write_pack",
]


class PackEvents:
    """Progress callbacks; the CLI overrides them to draw a bar. ``on_shard`` comes from the
    calling thread; ``on_bytes`` may come from writer threads, never two at once."""

    def on_bytes(self, nbytes: int) -> None:
        """``nbytes`` more input bytes were written into shards."""

    def on_shard(self, name: str, nbytes: int) -> None:
        """A shard was completed (its upload may still be running)."""


@dataclass(frozen=True)
class PackResult:
    """What was published, for ``--json`` and the final message."""

    plan: PackPlan
    dest: str
    shards: list[PublishedShard]
    seconds: float

    def summary(self) -> dict:
        """A JSON-ready summary."""
        plan = self.plan
        base = self.dest.rstrip("/") + "/" + plan.prefix
        return {
            "name": plan.options.name,
            "version": plan.options.version,
            "dest": base,
            "index": base + Path(plan.index_key).name,
            "manifest": base + Path(plan.manifest_key).name,
            "offsets": base + Path(plan.offsets_key).name,
            "samples": plan.nsamples,
            "files": sum(shard.nfiles for shard in plan.shards),
            "input_bytes": plan.input_bytes,
            "shard_bytes": plan.nbytes,
            "shuffle": plan.options.shuffle,
            "seed": plan.options.seed if plan.options.shuffle else None,
            "seconds": round(self.seconds, 3),
            "shards": [
                {"name": s.name, "samples": s.nsamples, "bytes": s.filesize, "etag": s.etag} for s in self.shards
            ],
        }


def default_name(source: str) -> str:
    """A dataset name from SOURCE's last path segment (``s3://b/train/`` -> ``train``)."""
    uri = parse_uri(source)
    last = uri.prefix.rstrip("/").rsplit("/", 1)[-1] or uri.bucket
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", last).lstrip("._-")[:64]
    return name or "dataset"


def _refuse_overlap(source: StoreURI, dest: StoreURI) -> None:
    if (source.scheme, source.bucket) != (dest.scheme, dest.bucket):
        return
    src, dst = source.prefix.rstrip("/"), dest.prefix.rstrip("/")
    if not src or dst == src or dst.startswith(src + "/"):
        raise UsageError(
            f"DEST {dest} is inside SOURCE {source}",
            "the shards would be packed into themselves; pick a DEST outside SOURCE",
        )


def plan_pack(source: str, dest: str, options: PackOptions, config: StoreConfig | None = None) -> PackPlan:
    """List SOURCE, group its files into samples and cut them into shards. Writes nothing."""
    source_uri, dest_uri = parse_uri(source), parse_uri(dest)
    _refuse_overlap(source_uri, dest_uri)
    collecting = gc.isenabled()
    gc.disable()  # listing and grouping build a few small objects per file; no cycles among them
    try:
        objects: Sequence[ListedFile]
        if source_uri.scheme == "file":
            objects = list_local(Path(source_uri.prefix))
        else:
            objects = [info for info in open_store(source_uri, config).list() if not info.key.endswith("/")]
        return plan_shards(group_samples(objects, directories_possible=source_uri.scheme != "file"), options)
    finally:
        if collecting:
            gc.enable()


def pack_documents(plan: PackPlan, dest: str) -> list[tuple[str, bytes]]:
    """The documents published after the shards and before the index, in order: the manifest,
    then the offsets file (every engine publishes these)."""
    manifest = dump(build_manifest(dest.rstrip("/") + "/" + plan.prefix, plan))
    return [(plan.manifest_key, manifest), (plan.offsets_key, offsets.encode(offsets.table_from_plan(plan)))]


def index_maker(plan: PackPlan) -> Callable[[list[PublishedShard], list[PublishedShard]], bytes]:
    """``make_index(published shards, published documents)``: the index bytes, recording the
    offsets file (the second document of :func:`pack_documents`) as published."""

    def make_index(published: list[PublishedShard], extras: list[PublishedShard]) -> bytes:
        return dump(build_index(plan, published, offsets=extras[1]))

    return make_index


def open_source(uri: StoreURI, config: StoreConfig) -> MemberSource:
    """SOURCE's files as pack's member source (a local directory, or any store)."""
    if uri.scheme == "file":
        return LocalSource(Path(uri.prefix))
    return StoreSource(open_store(uri, config))


def _open_publisher(uri: StoreURI, plan: PackPlan, config: StoreConfig) -> Publisher:
    if uri.scheme == "file":
        return LocalPublisher(Path(uri.prefix), plan)
    return StorePublisher(open_store(uri, config), plan)


def _write_all_shards(plan: PackPlan, source: MemberSource, publisher: Publisher, events: PackEvents) -> None:
    """Write every shard (see :mod:`lading.pack.execute`); commit each to the publisher in order."""
    paths = [publisher.shard_path(shard) for shard in plan.shards]

    def done(number: int) -> None:
        shard = plan.shards[number]
        publisher.commit_shard(shard, paths[number])
        events.on_shard(shard.name, shard.nbytes)

    local = isinstance(publisher, LocalPublisher)
    write_shards(
        plan, source, paths, events.on_bytes, done, processes_allowed=local, shards_ahead=None if local else 2
    )  # temporary shards for a bucket: a few at a time


def run_pack(
    plan: PackPlan, source: str, dest: str, config: StoreConfig | None = None, events: PackEvents | None = None
) -> PackResult:
    """Write the planned shards, then publish manifest and index. Nothing is indexed on failure."""
    config = config or StoreConfig.from_env()
    dest_uri = parse_uri(dest)
    member_source = open_source(parse_uri(source), config)
    try:
        publisher = _open_publisher(dest_uri, plan, config)
    except BaseException:
        member_source.close()
        raise
    return write_pack(plan, member_source, publisher, str(dest_uri), events)


def write_pack(
    plan: PackPlan,
    source: MemberSource,
    publisher: Publisher,
    dest: str,
    events: PackEvents | None = None,
    now: Callable[[], float] = time.monotonic,
) -> PackResult:
    """Write every shard from ``source`` through ``publisher``; the index goes last, or not at all."""
    events = events or PackEvents()
    started = now()
    try:
        _write_all_shards(plan, source, publisher, events)

        shards = publisher.finish(pack_documents(plan, dest), index_maker(plan))
    except BaseException:
        publisher.abort()
        raise
    finally:
        source.close()
    return PackResult(plan, dest, shards, now() - started)
