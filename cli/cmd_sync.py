"""`lading sync` and `lading topology`: parse options, call lading.sync, render progress and results."""

from __future__ import annotations

import os
import sys
import threading
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Mapping

import click
from lading.cli.context import AppState
from lading.cli.option_rules import conflicts, needs
from lading.cli.output import print_json
from lading.cli.progress import (
    DEFAULT_INTERVAL,
    Throttle,
    byte_bar,
    human,
    line_interval,
)
from lading.cli.store_options import pop_store_config, store_options, unused_roots_skipped
from lading.cli.topology_options import resolve_topology, topology_options, topology_options_with
from lading.core.cacheroot import CACHE_ROOT_RULE
from lading.core.errors import UsageError
from lading.selection.topology import FIELDS, Topology

DEFAULT_DEST = "/tmp/data-rank{rank}"
PLACEHOLDERS = ("rank", "local_rank", "node_rank", "world_size")

SYNC_HELP = """Copy SOURCE (s3://, gs://, a path) into DEST for this rank, incrementally.

\b
DEST is a template (default /tmp/data-rank{rank}) with {rank}, {local_rank},
{node_rank} and {world_size}. Files appear atomically and verified; keys
that would escape DEST are refused. In a SageMaker job, DEST defaults to the
input channel's directory ($SM_CHANNEL_<NAME>) when the job has one channel,
or the one --channel names.

\b
Examples:
  lading sync s3://bucket/train                 # -> /tmp/data-rank{rank}, every rank gets all
  lading sync s3://bucket/train /data/r{rank} --distribution sharded --balance bytes
  lading sync gs://bucket/imgs --include '*.jpg' --exclude 'tmp/*' --dry-run --json
  lading sync s3://bucket/p --manifest keys.json --delete
  lading sync s3://bucket/p --manifest train.manifest    # augmented: writes DEST/manifest.jsonl
  lading sync s3://bucket/train --channel training      # SageMaker: into $SM_CHANNEL_TRAINING

\b
Topology: flags > torchrun/Determined/Ray (RANK...) > Horovod > OpenMPI > MPICH/Intel MPI >
SLURM > SageMaker (SM_CURRENT_HOST) > Kubernetes Indexed Job (JOB_COMPLETION_INDEX) >
rank 0 of 1. See `lading topology`.
Sharding: keys sorted, key i -> rank i mod world_size; --balance bytes: largest first to
the least-loaded rank. The union over ranks is exactly the source.
Node cache: with several ranks on this node (or --cache-dir), a replicated source is
downloaded once into the cache under a lock and hard-linked into each DEST.
A packed dataset (lading pack) in the cache is reused without a GET when the bucket still
shows its index's ETags; a listing that disagrees with its index is refused (exit 1).
Incremental: DEST/.lading-sync.json records what was fetched; a re-run with nothing changed
lists the source and makes no GET. --delete removes only files lading put in DEST.

\b
Exit codes: 0 ok, 1 some keys failed or unsafe keys, 2 usage (also: SOURCE is one object or
file, not a prefix), 3 not found (also: nothing at SOURCE, unless --allow-empty), 4 access
denied or DEST not writable, 5 transient failure after retries, 6 local disk (full, quota,
name too long), 130 interrupted."""

TOPOLOGY_HELP = """Show the rank, world size and node layout lading detects, and where each value came from.

\b
Sources, first match wins: flags; torchrun/Determined/Ray Train/PyTorchJob (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK or NODE_RANK); Horovod
(HOROVOD_*); OpenMPI (OMPI_COMM_WORLD_*); MPICH/Intel MPI (PMI_RANK, PMI_SIZE,
MPI_LOCALRANKID, MPI_LOCALNRANKS); SLURM (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
SLURM_NTASKS_PER_NODE, SLURM_NODEID); SageMaker (node rank = SM_CURRENT_HOST's index
in SM_HOSTS or /opt/ml/input/config/resourceconfig.json, local world size =
SM_NUM_GPUS, rank = node rank x local world size + local rank); a Kubernetes Indexed
Job / JobSet pod (node rank = JOB_COMPLETION_INDEX; with --world-size the rank is
derived the same way); otherwise rank 0 of 1.

\b
Examples:
  lading topology                               # a table: field, value, variable
  lading topology --json                        # for scripts
  RANK=3 WORLD_SIZE=8 LOCAL_WORLD_SIZE=4 lading topology
  lading topology --rank 1 --world-size 2       # flags win over the environment
  SM_CURRENT_HOST=algo-2 SM_HOSTS='["algo-1","algo-2"]' SM_NUM_GPUS=8 lading topology

\b
Exit codes: 0 ok, 2 usage (a value that is not an integer, rank >= world size)."""


def default_dest(dest: str | None, channel: str | None, env: Mapping[str, str] = os.environ) -> str:
    """DEST as given; else the SageMaker channel's directory (--channel, or the only one); else
    /tmp/data-rank{rank}."""
    from lading.selection.sagemaker import channel_dest

    if dest is not None:
        if channel is not None:
            raise UsageError("give DEST or --channel, not both")
        return dest
    directory = channel_dest(env, channel)
    return DEFAULT_DEST if directory is None else directory.replace("{", "{{").replace("}", "}}")


def render_dest(template: str, topology: Topology) -> Path:
    """Fill ``{rank}``, ``{local_rank}``, ``{node_rank}``, ``{world_size}``; anything else is a usage error."""
    values = {name: getattr(topology, name) for name in PLACEHOLDERS}
    try:
        rendered = template.format_map(values)
    except (KeyError, IndexError, ValueError, AttributeError) as err:
        raise UsageError(
            f"bad placeholder in DEST {template!r}: {err}",
            "use {rank}, {local_rank}, {node_rank} or {world_size} ({{ and }} for braces)",
        ) from None
    if not rendered:
        raise UsageError("DEST is empty")
    return Path(os.path.abspath(os.path.expanduser(rendered)))


class LineProgress:
    """Progress for logs (stdout not a terminal): a line on stderr every few seconds."""

    def __init__(self, echo: Callable[[str], None], interval: float = DEFAULT_INTERVAL) -> None:
        self.echo = echo
        self.throttle = Throttle(interval)
        self.lock = threading.Lock()
        self._reset("download", 0, 0)

    def _reset(self, phase: str, files: int, nbytes: int) -> None:
        self.phase, self.total_files, self.total_bytes = phase, files, nbytes
        self.files = self.nbytes = 0
        self.throttle.restart()

    def on_phase(self, phase: str, plan: Any) -> None:
        """Announce a phase (or that we wait for another rank's download)."""
        if plan is None:
            self.echo(f"lading sync: {phase}")
            return
        with self.lock:
            self._reset(phase, plan.fetch_files, plan.fetch_bytes)
        if plan.fetch_files:
            verb = "linking from node cache" if phase == "link" else "fetching"
            self.echo(f"lading sync: {verb} {plan.fetch_files} file(s), {human(plan.fetch_bytes)}")

    def on_bytes(self, nbytes: int) -> None:
        """Count bytes; maybe print."""
        with self.lock:
            self.nbytes += nbytes
        self._maybe_print()

    def on_done(self, result: Any) -> None:
        """Count files; maybe print."""
        with self.lock:
            self.files += 1
        self._maybe_print()

    def _maybe_print(self) -> None:
        with self.lock:
            if not self.throttle.due():
                return
            line = (
                f"lading sync: {self.phase} {self.files}/{self.total_files} files, "
                f"{human(self.nbytes)}/{human(self.total_bytes)}, {human(self.throttle.rate(self.nbytes))}/s"
            )
        self.echo(line)

    def close(self) -> None:
        """Nothing to tear down."""


class BarProgress:
    """Progress on a terminal: a tqdm bar of bytes with the file count beside it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bar: Any = None
        self.files = self.total_files = 0

    def on_phase(self, phase: str, plan: Any) -> None:
        """Start a new bar for each phase."""
        self.close()
        if plan is None:
            click.echo(f"lading sync: {phase}", err=True)
            return
        if not plan.fetch_files:
            return
        with self.lock:
            self.files, self.total_files = 0, plan.fetch_files
            self.bar = byte_bar(plan.fetch_bytes, "link" if phase == "link" else "sync")
            self.bar.set_postfix_str(f"0/{self.total_files} files", refresh=False)

    def on_bytes(self, nbytes: int) -> None:
        """Advance the bar."""
        with self.lock:
            if self.bar is not None:
                self.bar.update(nbytes)

    def on_done(self, result: Any) -> None:
        """Count a file."""
        with self.lock:
            self.files += 1
            if self.bar is not None:
                self.bar.set_postfix_str(f"{self.files}/{self.total_files} files", refresh=False)

    def close(self) -> None:
        """Remove the bar."""
        with self.lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None


class Silent:
    """No progress (--json, --quiet)."""

    def on_phase(self, phase: str, plan: Any) -> None:
        """Ignore."""

    def on_bytes(self, nbytes: int) -> None:
        """Ignore."""

    def on_done(self, result: Any) -> None:
        """Ignore."""

    def close(self) -> None:
        """Ignore."""


def _progress(state: AppState, json_out: bool) -> Any:
    if json_out or state.quiet:
        return Silent()
    if sys.stdout.isatty() and sys.stderr.isatty():
        return BarProgress()
    return LineProgress(lambda line: click.echo(line, err=True), line_interval())


def _check_sharded_dest(template: str, distribution: str, topology: Topology) -> None:
    if distribution != "sharded" or topology.world_size == 1 or topology.local_world_size == 1:
        return
    if "{rank}" not in template and "{local_rank}" not in template:
        raise UsageError(
            f"sharded ranks on one node would share DEST {template!r}",
            "put {rank} or {local_rank} in DEST, e.g. /tmp/data-rank{rank}",
        )


def _print_plan(plan: Any) -> None:
    totals = plan.totals()
    click.echo(f"plan for rank {plan.rank}/{plan.world_size} ({plan.distribution}): {plan.source} -> {plan.dest}")
    click.echo(f"  listed {totals['listed']}, selected {totals['selected_files']} ({human(totals['selected_bytes'])})")
    click.echo(
        f"  fetch {totals['fetch_files']} file(s) ({human(totals['fetch_bytes'])}), "
        f"{totals['up_to_date_files']} up to date, delete {totals['delete_files']}"
    )
    for item in islice(plan.to_fetch(), 20):
        click.echo(f"  + {item.info.key}  ({human(item.info.size)}, {item.reason})")
    for key in islice(plan.to_delete(), 20):
        click.echo(f"  - {key}")
    hidden = max(0, plan.fetch_files - 20) + max(0, plan.delete_files - 20)
    if hidden:
        click.echo(f"  ... and {hidden} more (--json lists them all)")


def _print_summary(state: AppState, summary: Any) -> None:
    via = f" via node cache ({human(summary.downloaded_bytes)} downloaded)" if summary.cache else ""
    if summary.reused:
        names = ", ".join(f"{d['name']} {d['version']}" if d["version"] else d["name"] for d in summary.reused)
        via += f", reused cached packed dataset {names} (ETags match the bucket)"
    state.result(
        f"synced {summary.files} file(s), {human(summary.bytes)} to {summary.dest} in "
        f"{summary.seconds:.1f}s ({human(summary.throughput)}/s){via}; {summary.skipped} up to date, "
        f"{summary.deleted} deleted, {len(summary.failed)} failed"
    )


def _by_cause(failed: list[Any]) -> list[list[Any]]:
    """Failures grouped by cause (the message with the key left out: a full disk is one cause for
    every key), keys in order, the most frequent cause first."""
    groups: dict[tuple[int, str], list[Any]] = {}
    for failure in sorted(failed, key=lambda failure: failure.key):
        groups.setdefault((failure.exit_code, failure.error.replace(failure.key, "")), []).append(failure)
    return sorted(groups.values(), key=len, reverse=True)


def _report_failures(summary: Any) -> int:
    """Name the failed keys on stderr; the exit code for them."""
    if not summary.failed:
        return 0
    click.echo(f"lading: error: {len(summary.failed)} key(s) failed:", err=True)
    causes = _by_cause(summary.failed)
    for failures in causes[:50]:
        first = failures[0]
        alike = f"{len(failures)} keys, e.g. " if len(failures) > 1 else ""
        click.echo(f"  {alike}{first.key}: {first.error}", err=True)
    if len(causes) > 50:
        click.echo(f"  ... and {len(causes) - 50} more causes (--json lists every key)", err=True)
    from lading.core.errors import exit_code_for_failures
    from lading.sync.apply import common_hint

    hint = common_hint(summary.failed)
    if hint:
        click.echo(f"  (hint: {hint})", err=True)

    return exit_code_for_failures((failed.exit_code for failed in summary.failed), summary.files + summary.skipped)


@click.command(help=SYNC_HELP, short_help="Copy a bucket into per-rank directories, incrementally.")
@click.argument("source")
@click.argument("dest", required=False, default=None)
@topology_options_with("Ranks on this node (more than 1 turns the node cache on).")
@click.option(
    "--channel",
    metavar="NAME",
    default=None,
    help="SageMaker: sync into this input channel's directory ($SM_CHANNEL_<NAME>) "
    "(default without DEST: the job's only channel).",
)
@click.option(
    "--distribution",
    type=click.Choice(["replicated", "sharded"]),
    default="replicated",
    show_default=True,
    help="Every rank gets everything, or a disjoint shard per rank.",
)
@click.option(
    "--balance",
    type=click.Choice(["count", "bytes"]),
    default="count",
    show_default=True,
    help="Sharding rule: by key order (i mod world size) or by size (largest first).",
)
@click.option("--include", multiple=True, metavar="GLOB", help="Only keys matching a glob (repeatable).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Leave out keys matching a glob (repeatable).")
@click.option(
    "--manifest",
    "manifest_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Sync the keys in FILE instead of listing (SageMaker ManifestFile JSON or one key per line).",
)
@click.option("--delete", is_flag=True, help="Remove files lading synced earlier that left the source.")
@click.option(
    "--allow-empty",
    is_flag=True,
    help="Accept a source with no objects (or none matching the filters); default: exit 3.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, readable=False),
    default=None,
    envvar="LADING_CACHE_DIR",
    help=f"Node cache directory, yours alone (default: {CACHE_ROOT_RULE}; mode 0700; "
    "giving it, or LADING_CACHE_DIR, turns the cache on).",
)
@click.option("--no-cache", is_flag=True, help="Never use the node cache.")
@click.option(
    "--workers", type=click.IntRange(min=1, max=512), default=64, show_default=True, help="Parallel transfers."
)
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option("--json", "json_out", is_flag=True, help="Print only JSON: the summary, or the plan with --dry-run.")
@click.option(
    "--snapshot",
    metavar="FILE",
    default=None,
    help="Take the objects and their versions from a snapshot (lading snapshot) instead of "
    "listing SOURCE; every read is pinned to them. SOURCE may also be the snapshot itself.",
)
@store_options
@click.pass_obj
def sync(
    state: AppState,
    source: str,
    dest: str,
    distribution: str,
    balance: str,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    manifest_file: str | None,
    snapshot: str | None,
    delete: bool,
    allow_empty: bool,
    cache_dir: str | None,
    no_cache: bool,
    workers: int,
    dry_run: bool,
    json_out: bool,
    **options: Any,
) -> int:
    """``lading sync``: see SYNC_HELP."""
    from lading.stores import open_store, parse_uri

    conflicts("no_cache", "cache_dir", "--no-cache never uses the node cache")
    needs("balance", "distribution", "sharded")
    config = pop_store_config(options)
    topology = resolve_topology(options)  # what is left: the topology flags
    uri = parse_uri(source)
    dest = default_dest(dest, options.pop("channel", None))
    target = render_dest(dest, topology)
    _check_sharded_dest(dest, distribution, topology)
    manifest = None
    if manifest_file:
        from lading.selection.manifest import load_manifest  # (and hashlib) after the listing started, without one

        manifest = load_manifest(manifest_file)
    store = open_store(uri, config, snapshot=snapshot)  # SOURCE may itself be a snapshot file
    with unused_roots_skipped(config, uri.scheme):
        store.connect()
    if manifest is None:
        store.prefetch_listing()  # the first page is asked for while the sync's code loads (below)
    uri = parse_uri(store.url)
    from lading.sync import (
        DEFAULT_CACHE_ROOT,
        SyncRequest,
        plan_only,
        run_sync,
        use_node_cache,
    )
    from lading.transfer import TransferOptions

    request = SyncRequest(
        str(uri),
        target,
        include,
        exclude,
        manifest,
        distribution,
        balance,
        topology.rank,
        topology.world_size,
        delete,
        allow_empty,
    )
    if dry_run:
        with plan_only(store, request, workers) as plan:  # lists streamed from disk, never held whole
            if json_out:
                plan.write_json(sys.stdout)
            else:
                _print_plan(plan)
        return 0
    cached = use_node_cache(topology.local_world_size, cache_dir is not None, no_cache, uri.scheme == "file")
    cache_root = Path(cache_dir).expanduser().resolve() if cache_dir else DEFAULT_CACHE_ROOT
    progress = _progress(state, json_out)
    try:
        summary = run_sync(store, request, TransferOptions(workers=workers), progress, cache_root if cached else None)
    finally:
        progress.close()
    if json_out:
        print_json(summary.to_json())
    else:
        _print_summary(state, summary)
    return _report_failures(summary)


@click.command(help=TOPOLOGY_HELP, short_help="Show the rank/world size detected from the launcher.")
@topology_options
@click.option("--json", "json_out", is_flag=True, help="Print JSON.")
def topology(json_out: bool, **topology_values: int | None) -> None:
    """``lading topology``: see TOPOLOGY_HELP."""
    detected = resolve_topology(topology_values)
    if json_out:
        print_json(detected.to_json())
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"topology (launcher: {detected.launcher})", title_justify="left")
    table.add_column("field")
    table.add_column("value", justify="right")
    table.add_column("from")
    for name in FIELDS:
        table.add_row(name, str(getattr(detected, name)), detected.sources.get(name, ""))
    Console().print(table)
