"""`lading pack SOURCE DEST`: parse options, call lading.pack, render progress and the summary."""

from __future__ import annotations

import gc
import sys
from typing import Any

import click
from lading.cli.context import AppState
from lading.cli.output import print_json
from lading.cli.progress import Throttle, byte_bar, counted, human, line_interval
from lading.cli.option_rules import needs
from lading.cli.params import size as size_option
from lading.cli.store_options import pop_store_config, store_options
from lading.core.install import install_command
from lading.core.sizes import format_size

PACK_HELP = """Pack the files under SOURCE into WebDataset tar shards at DEST.

\b
SOURCE and DEST are local directories or bucket prefixes (s3://bucket/prefix,
gs://bucket/prefix).

\b
Examples:
  lading pack ./images s3://bucket/datasets/ --name imagenet --version v1
  lading pack s3://bucket/raw/train /data/shards --shard-size 500MB --shuffle --seed 7
  lading pack ./images ./shards --dry-run --json        # the plan, nothing written

\b
Samples: files are grouped WebDataset-style: the key is the path up to the first dot of
the file name, the extension is the rest (train/cat.0001.jpg -> key train/cat,
extension 0001.jpg). A sample's files sit side by side in one shard. Names that would
be misread (no extension, leading dot, extensions equal but for case, a file that is
also a directory) are refused before anything is written.
Output (under DEST, or DEST/NAME/VERSION/ with --version):
  NAME-000000.tar ...   POSIX tar shards, balanced by bytes around --shard-size,
                        fixed mtime/owner/mode: same input and seed, same bytes
  NAME.manifest.json    a SageMaker ManifestFile listing the shards
  NAME.offsets.safetensors  where each sample and file sits in the shards
                        (random access: lading.datasets.PackedDataset)
  NAME.index.json       the wids shard index (url, nsamples, filesize, etag);
                        written last, so a reader never sees it before its shards
Read the shards from training code with lading.datasets.ShardDataset.
Engines: --engine local (default) writes on this machine; --engine ray runs one Ray
task per shard (on the cluster at --ray-address / RAY_ADDRESS, else a local Ray),
each writing its shard straight to DEST; the index is written last by this process.
A failed Ray pack leaves no index; run it again to reuse the shards already written.

\b
Exit codes: 0 ok, 1 problem (a file changed while packing, names clash),
2 usage (bad option, refused name, already packed), 3 not found, 4 access denied,
5 transient failure after retries, 6 local disk (full, quota, name too long),
130 interrupted."""


class _Bar:
    """PackEvents drawing a tqdm bar of input bytes on stderr."""

    def __init__(self, total: int) -> None:
        self.bar = byte_bar(total, "packing")

    def on_bytes(self, nbytes: int) -> None:
        """Advance the bar."""
        self.bar.update(nbytes)

    def on_shard(self, name: str, nbytes: int) -> None:
        """Show the shard just finished."""
        self.bar.set_postfix_str(name, refresh=False)

    def close(self) -> None:
        """Remove the bar."""
        self.bar.close()


class _LogLines:
    """PackEvents for logs (stderr not a terminal): a progress line every few seconds."""

    def __init__(self, total: int, interval: float | None = None) -> None:
        self.total = total
        self.throttle = Throttle(line_interval() if interval is None else interval)
        self.done = 0
        self.shards = 0

    def on_bytes(self, nbytes: int) -> None:
        """Count bytes; maybe print a line."""
        self.done += nbytes
        if self.throttle.due():
            click.echo(
                f"lading pack: {format_size(self.done)} of {format_size(self.total)} "
                f"({100 * self.done / max(self.total, 1):.0f}%), {self.shards} shard(s) done, "
                f"{human(self.throttle.rate(self.done))}/s",
                err=True,
            )

    def on_shard(self, name: str, nbytes: int) -> None:
        """Count shards."""
        self.shards += 1

    def close(self) -> None:
        """Nothing to clean up."""


def _plan_summary(plan: Any) -> dict[str, Any]:
    return {
        "dry_run": True,
        "name": plan.options.name,
        "version": plan.options.version,
        "samples": plan.nsamples,
        "files": sum(shard.nfiles for shard in plan.shards),
        "input_bytes": plan.input_bytes,
        "shard_bytes": plan.nbytes,
        "shards": [{"name": plan.shard_key(s), "samples": len(s.samples), "bytes": s.nbytes} for s in plan.shards],
        "index": plan.index_key,
        "manifest": plan.manifest_key,
    }


def _render(state: AppState, summary: dict[str, Any], dry_run: bool) -> None:
    shards = summary["shards"]
    sizes = [shard["bytes"] for shard in shards]
    verb = "would pack" if dry_run else "packed"
    state.result(
        f"{verb} {counted(summary['files'], 'file')} ({counted(summary['samples'], 'sample')}, "
        f"{format_size(summary['input_bytes'])}) into {counted(len(shards), 'shard')} of "
        f"{format_size(min(sizes))}..{format_size(max(sizes))}" + ("" if dry_run else f" in {summary['seconds']:.1f} s")
    )
    if not dry_run:
        state.status(f"index:    {summary['index']}")
        state.status(f"manifest: {summary['manifest']}")


@click.command(help=PACK_HELP, short_help="Pack many small files into WebDataset tar shards.")
@click.argument("source")
@click.argument("dest")
@click.option(
    "--shard-size",
    callback=size_option,
    default="150MB",
    show_default=True,
    metavar="SIZE",
    help="Target shard size (B, KB, MB, GB, KiB, MiB, GiB); shards are balanced around it.",
)
@click.option("--name", default=None, help="Dataset name, used in the file names (default: SOURCE's last folder).")
@click.option("--version", "version", default=None, metavar="V", help="Store the dataset under DEST/NAME/V/.")
@click.option("--shuffle", is_flag=True, help="Shuffle samples (a sample's files stay together), seeded.")
@click.option("--seed", type=int, default=None, help="Seed for --shuffle (default 0). Same seed, same shards.")
@click.option("--dry-run", is_flag=True, help="Show the plan (samples, shards, sizes); write nothing.")
@click.option("--json", "json_out", is_flag=True, help="Print a JSON summary on stdout.")
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help=f"Write the shards on this machine, or one Ray task per shard ({install_command('ray')}); "
    "same plan, byte-identical shards.",
)
@click.option(
    "--ray-address",
    default=None,
    metavar="ADDR",
    help="With --engine ray: the cluster to join (default: RAY_ADDRESS, else a local Ray started "
    "and stopped for this pack).",
)
@store_options
@click.pass_obj
def pack(
    state: AppState,
    source: str,
    dest: str,
    shard_size: int,
    name: str | None,
    version: str | None,
    shuffle: bool,
    seed: int | None,
    dry_run: bool,
    json_out: bool,
    engine: str,
    ray_address: str | None,
    **options: Any,
) -> int:
    """``lading pack``: see PACK_HELP."""
    from lading.pack import PackOptions, default_name, plan_pack, run_pack

    needs("seed", "shuffle")
    needs("ray_address", "engine", "ray")
    config = pop_store_config(options)
    # An empty --name is refused by the name rule, not replaced by the default.
    pack_options = PackOptions(
        name=default_name(source) if name is None else name,
        shard_size=shard_size,
        shuffle=shuffle,
        seed=seed or 0,
        version=version,
    )
    plan = plan_pack(source, dest, pack_options, config)
    # This process ends with the pack: keep the plan's objects (several per file, no cycles)
    # out of the garbage collector's generations, which would traverse them again and again.
    gc.freeze()
    if dry_run:
        summary = _plan_summary(plan)
    else:
        bar: _Bar | _LogLines | None = None
        if not json_out and not state.quiet:
            bar = _Bar(plan.input_bytes) if sys.stderr.isatty() else _LogLines(plan.input_bytes)
        try:
            if engine == "ray":
                from lading.pack.ray import run_pack_ray

                result = run_pack_ray(plan, source, dest, config, bar, address=ray_address)  # type: ignore[arg-type]
            else:
                result = run_pack(plan, source, dest, config, bar)  # type: ignore[arg-type]
        finally:
            if bar is not None:
                bar.close()
        summary = result.summary()
    if json_out:
        print_json(summary)
    else:
        _render(state, summary, dry_run)
    return 0
