"""`lading cat`: stream objects in order to stdout or a named pipe (SageMaker's Pipe mode)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from lading.cli.option_rules import needs
from lading.cli.params import size
from lading.cli.store_options import pop_store_config, store_options, unused_roots_skipped
from lading.cli.topology_options import resolve_topology, topology_options

CAT_HELP = """Stream the objects of SOURCE, in order, to stdout or a named pipe.

\b
For readers that consume one stream (tar, TFRecord readers, ffmpeg), like SageMaker's
Pipe mode. SOURCE is a prefix (objects in key order), one object, a shard list in
braces (s3://b/pets/pets-{000000..000031}.tar, in that order), a snapshot file
(lading snapshot) or, with --manifest, the manifest's objects in its order
(ManifestFile, augmented manifest or key list).
Several GETs run ahead of the reader (--workers), in memory bounded by --max-memory,
each pinned to the version the listing reported: an object replaced mid-stream stops
the stream with exit 1 naming it, never mixed bytes.

\b
Examples:
  lading cat s3://bucket/shards --include '*.tar' | tar -t -i   # -i: read past each shard's end
  lading cat s3://bucket/train/data.tfrecord | python read_records.py
  lading cat 's3://bucket/pets/pets-{000000..000007}.tar' --fifo /opt/ml/input/data/train_0
  lading cat s3://bucket/shards --distribution sharded --shuffle --seed 3   # this rank's share
  lading cat s3://bucket/videos --include '*.ts' | ffmpeg -i - out.mp4
  lading cat s3://bucket/shards --dry-run                        # the order: key, size, version

\b
Sharding is sync's rule (keys sorted, key i -> rank i mod world size, or --balance bytes),
with the rank from flags or the launcher (see `lading topology`); the stream keeps SOURCE's
order. --shuffle orders this rank's objects by --seed. --fifo PATH creates the named pipe
if it is missing and waits for a reader. A reader that stops early (| head) ends the
stream quietly with exit 0.

\b
Exit codes: 0 ok (also: the reader closed the pipe), 1 an object changed mid-stream,
2 usage (bad option, a --fifo path that is not a pipe), 3 not found (also: nothing at
SOURCE, unless --allow-empty), 4 access denied, 5 transient failure after retries,
6 local disk (stdout or the --fifo: full, quota, name too long), 130 interrupted."""


@click.command(help=CAT_HELP, short_help="Stream objects in order to stdout or a named pipe (Pipe mode).")
@click.argument("source")
@click.option("--fifo", metavar="PATH", default=None, help="Write into this named pipe (created if missing).")
@click.option(
    "--manifest",
    "manifest_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Stream the objects FILE names, in its order (ManifestFile, augmented manifest, key list).",
)
@click.option("--include", multiple=True, metavar="GLOB", help="Only keys matching a glob (repeatable).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Leave out keys matching a glob (repeatable).")
@click.option(
    "--distribution",
    type=click.Choice(["replicated", "sharded"]),
    default="replicated",
    show_default=True,
    help="Every rank streams everything, or its disjoint share (sync's rule).",
)
@click.option(
    "--balance",
    type=click.Choice(["count", "bytes"]),
    default="count",
    show_default=True,
    help="Sharding rule: by key order (i mod world size) or by size (largest first).",
)
@topology_options
@click.option("--shuffle", is_flag=True, help="Stream this rank's objects in a seeded random order.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --shuffle.")
@click.option(
    "--workers", type=click.IntRange(1, 256), default=16, show_default=True, help="GETs in flight ahead of the reader."
)
@click.option(
    "--part-size", callback=size, metavar="SIZE", default="8MiB", show_default=True, help="Bytes per ranged GET."
)
@click.option(
    "--max-memory",
    callback=size,
    metavar="SIZE",
    default="256MiB",
    show_default=True,
    help="Bound on bytes fetched but not yet written.",
)
@click.option(
    "--snapshot",
    metavar="FILE",
    default=None,
    help="Take the objects and versions from a snapshot (lading snapshot) instead of listing SOURCE.",
)
@click.option("--allow-empty", is_flag=True, help="Stream nothing when SOURCE has no objects; default: exit 3.")
@click.option("--dry-run", is_flag=True, help="List the objects in stream order (key, size, version); read none.")
@store_options
def cat(
    source: str,
    fifo: str | None,
    manifest_file: str | None,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    distribution: str,
    balance: str,
    shuffle: bool,
    seed: int,
    workers: int,
    part_size: int,
    max_memory: int,
    snapshot: str | None,
    allow_empty: bool,
    dry_run: bool,
    **options: Any,
) -> int:
    """``lading cat``: see CAT_HELP."""
    from lading.selection import stream
    from lading.selection.manifest import load_manifest
    from lading.stores.base import Store
    from lading.stores.uri import parse_uri

    needs("seed", "shuffle")
    needs("balance", "distribution", "sharded")
    config = pop_store_config(options)
    topology = resolve_topology(options)
    manifest = load_manifest(manifest_file) if manifest_file else None

    def connect(store: Store) -> None:
        with unused_roots_skipped(config, parse_uri(store.url).scheme):
            store.connect()

    store, location, keys = stream.open_source(source, config, manifest, snapshot, connect)
    request = stream.StreamRequest(
        location,
        manifest,
        include,
        exclude,
        distribution,
        balance,
        topology.rank,
        topology.world_size,
        shuffle,
        seed,
        allow_empty,
    )
    try:
        objects = stream.select_stream(store, request, keys)
    except BaseException:
        if fifo and not dry_run:
            stream.release_waiting_reader(fifo)
        raise
    if dry_run:
        try:
            for info in objects:
                click.echo(f"{info.key}\t{info.size}\t{info.version}")
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
        return 0
    fd = stream.open_fifo(stream.make_fifo(fifo)) if fifo else sys.stdout.fileno()
    try:
        stream.stream_objects(
            store,
            objects,
            stream.fd_sink(fd, fifo or "stdout"),
            stream.StreamOptions(workers, part_size, max(max_memory, 1)),
        )
    except BrokenPipeError:  # the reader went away (| head): like cat, quietly
        if not fifo:
            _silence_stdout()
        return 0
    finally:
        if fifo:
            os.close(fd)
    return 0


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so nothing tries to flush into the closed pipe at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
