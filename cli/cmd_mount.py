"""`lading mount` and `lading unmount`: parse options, call mounts.lifecycle, render."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from lading.cli.context import AppState
from lading.cli.option_rules import needs
from lading.cli.output import print_json
from lading.cli.params import size
from lading.cli.store_options import pop_store_config, store_options

if TYPE_CHECKING:
    from lading.mounts.lifecycle import MountReady
    from lading.mounts.listing import ViewSpec

MOUNT_HELP = """Mount URI read-only at MOUNTPOINT with lazy, prefetched reads.

\b
Lists the objects once, then streams their bytes on demand: training starts without
waiting for a download. Returns when the mount is ready; the daemon runs detached unless
--foreground. Stop it with `lading unmount MOUNTPOINT` (or fusermount3 -u).

\b
Examples:
  lading mount s3://bucket/imagenet /mnt/imagenet
  lading mount gs://bucket/data /mnt/data --cache-dir /scratch/cache --cache-size 200GiB
  lading mount s3://bucket/data /mnt/shard --distribution sharded   # rank from torchrun/SLURM/...
  lading mount s3://bucket/data /mnt/data -f --log-file /tmp/mount.log   # attached, logged
  lading unmount /mnt/imagenet

\b
The mount is read-only and immutable: objects are listed once, when mounting. An object
replaced afterwards reads as EIO (never mixed bytes); remount to see changes. A key that is
both a file and a directory prefix ("a" and "a/b") shows as the directory; the file is hidden
and logged. Zero-byte "dir/" marker objects only create directories.

\b
Exit codes: 0 mounted (with -f: unmounted cleanly), 1 FUSE failed, 2 usage (bad option,
already mounted, URI is one object or file), 3 not found (bucket, nothing at URI unless
--allow-empty, mount point, a manifest key), 4 access denied, 5 transient failure after
retries, 130 interrupted."""

UNMOUNT_HELP = """Unmount a lading mount (same as fusermount3 -u MOUNTPOINT).

\b
Examples:
  lading unmount /mnt/imagenet
  lading unmount --lazy /mnt/imagenet     # files still open: detach now, finish later

\b
Exit codes: 0 unmounted, 1 busy (files open; --lazy) or no fusermount, 2 a mount that is not
FUSE (tmpfs, NFS...: left alone, even as root), 3 not a mount point."""


@click.command(help=MOUNT_HELP, short_help="Mount a bucket read-only with lazy, prefetched reads.")
@click.argument("uri")
@click.argument("mountpoint", type=click.Path(file_okay=False, path_type=Path))
@click.option("--foreground", "-f", is_flag=True, help="Stay attached; serve until Ctrl-C or unmount.")
@click.option(
    "--manifest",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Show only the keys this manifest lists (no bucket listing; one HEAD per key).",
)
@click.option(
    "--distribution",
    type=click.Choice(["replicated", "sharded"]),
    default="replicated",
    show_default=True,
    help="sharded: show only this rank's shard (same rule as sync).",
)
@click.option(
    "--balance",
    type=click.Choice(["count", "bytes"]),
    default="count",
    show_default=True,
    help="Sharding rule: every n-th key, or balanced bytes.",
)
@click.option("--rank", type=click.IntRange(min=0), help="This rank (default: from the launcher's environment).")
@click.option(
    "--world-size", type=click.IntRange(min=1), help="Number of ranks (default: from the launcher's environment)."
)
@click.option(
    "--max-memory",
    callback=size,
    metavar="SIZE",
    help="The daemon's memory budget (RSS): readahead and cached data get what the listed "
    "tree leaves of it, at least 16MiB [default: 128MiB].",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, readable=False, path_type=Path),
    help="Keep fetched data on local disk so later epochs skip the store.",
)
@click.option(
    "--cache-size",
    callback=size,
    metavar="SIZE",
    help="Disk cache limit, least recently used data evicted first [default: 10GiB].",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds a read may wait for the store before failing with EIO.",
)
@click.option(
    "--workers",
    "--concurrency",
    "workers",
    type=click.IntRange(1, 256),
    default=32,
    show_default=True,
    help="Readahead GETs in flight at most; a reader's own misses never wait behind them "
    "(--concurrency: the old name).",
)
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Daemon log (stats on SIGUSR1 and at unmount). Default: none when detached.",
)
@click.option("--allow-other", is_flag=True, help="Let other users read the mount (FUSE allow_other).")
@click.option("--allow-empty", is_flag=True, help="Mount a prefix with no objects; default: exit 3.")
@click.option("--json", "json_out", is_flag=True, help="Print a JSON line once mounted.")
@store_options
@click.pass_obj
def mount(
    state: AppState,
    uri: str,
    mountpoint: Path,
    foreground: bool,
    manifest: Path | None,
    distribution: str,
    balance: str,
    rank: int | None,
    world_size: int | None,
    max_memory: int | None,
    cache_dir: Path | None,
    cache_size: int | None,
    timeout: float,
    workers: int,
    log_file: Path | None,
    allow_other: bool,
    allow_empty: bool,
    json_out: bool,
    **store: Any,
) -> int:
    """``lading mount``: see MOUNT_HELP."""
    from dataclasses import replace

    from lading.core.retry import RetryPolicy
    from lading.mounts.lifecycle import DEFAULT_MAX_MEMORY, MountOptions
    from lading.mounts.lifecycle import mount as do_mount
    from lading.mounts.reader import ReaderConfig
    from lading.selection.topology import detect_topology
    from lading.stores import parse_uri

    needs("balance", "distribution", "sharded")
    parse_uri(uri)
    topology = detect_topology(os.environ, {"rank": rank, "world_size": world_size})
    # A read must fail within --timeout: a couple of quick retries, never minutes of backoff.
    config = pop_store_config(store)
    config = replace(
        config,
        timeout=timeout,
        retry=RetryPolicy(attempts=3, base_delay=0.1, max_delay=min(2.0, timeout / 4)),
        max_pool_connections=max(config.max_pool_connections, workers + 8),
    )
    options = MountOptions(
        source=uri,
        mountpoint=mountpoint.absolute(),
        store=config,
        view=_view(uri, manifest, topology.rank, topology.world_size, distribution, balance, allow_empty),
        reader=ReaderConfig(concurrency=workers, timeout=timeout),
        max_memory=max_memory or DEFAULT_MAX_MEMORY,
        cache_dir=cache_dir.absolute() if cache_dir else None,
        cache_size=cache_size or 10 << 30,
        foreground=foreground,
        log_file=log_file.absolute() if log_file else None,
        allow_other=allow_other,
        debug=state.debug,
    )
    shard = f" (rank {topology.rank} of {topology.world_size})" if distribution == "sharded" else ""

    hidden = _entries(options.mountpoint)  # counted now: once mounted, the mount hides them

    def announce(ready: MountReady) -> None:
        if hidden:
            state.status(
                f"lading: warning: {ready.mountpoint} is not empty: the mount hides its {hidden} "
                f"entr{'y' if hidden == 1 else 'ies'} until unmounted"
            )
        _report(state, json_out, uri, ready, shard, foreground)

    ready = do_mount(options, on_ready=announce)
    if not foreground:
        announce(ready)
    return 0


def _entries(mountpoint: Path) -> int:
    """How many entries a mount at ``mountpoint`` would hide (0 when it cannot be read or is a mount)."""
    try:
        with os.scandir(mountpoint) as entries:
            count = sum(1 for _ in entries)
    except OSError:
        return 0  # missing or not a directory: the mount refuses it with its own error
    return 0 if os.path.ismount(mountpoint) else count


def _report(state: AppState, json_out: bool, uri: str, ready: MountReady, shard: str, foreground: bool) -> None:
    if json_out:
        print_json(
            {
                "mountpoint": str(ready.mountpoint),
                "source": uri,
                "pid": ready.pid,
                "seconds": round(ready.seconds, 3),
            }
        )
        return
    tail = " (Ctrl-C to unmount)" if foreground else f"; unmount with: lading unmount {ready.mountpoint}"
    state.result(f"mounted {uri}{shard} at {ready.mountpoint} in {ready.seconds:.1f}s (pid {ready.pid}){tail}")


@click.command(help=UNMOUNT_HELP, short_help="Unmount a lading mount.")
@click.argument("mountpoint", type=click.Path(file_okay=False, path_type=Path))
@click.option("--lazy", "-z", is_flag=True, help="Detach now; finish when no file is in use.")
@click.pass_obj
def unmount(state: AppState, mountpoint: Path, lazy: bool) -> int:
    """``lading unmount``: see UNMOUNT_HELP."""
    from lading.mounts.lifecycle import unmount as do_unmount

    do_unmount(mountpoint.absolute(), lazy=lazy)
    state.result(f"unmounted {mountpoint}")
    return 0


def _view(
    source: str,
    manifest: Path | None,
    rank: int,
    world_size: int,
    distribution: str,
    balance: str,
    allow_empty: bool = False,
) -> ViewSpec:
    """The mount's selection, by the same manifest and sharding rules as ``lading sync``."""
    from functools import partial

    from lading.mounts.listing import ViewSpec
    from lading.selection.manifest import keys_under, load_manifest
    from lading.selection.sharding import select_for_rank

    keys = tuple(keys_under(load_manifest(manifest), source)) if manifest else None
    select = None
    if distribution == "sharded" and world_size > 1:
        select = partial(select_for_rank, rank=rank, world_size=world_size, distribution="sharded", balance=balance)
    return ViewSpec(
        keys=keys, manifest=manifest.absolute() if manifest else None, select=select, allow_empty=allow_empty
    )
