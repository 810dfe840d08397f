"""`lading snapshot SOURCE -o FILE` and `lading snapshot diff OLD NEW`."""

from __future__ import annotations

import sys
from typing import Any

import click
from lading.cli.context import AppState
from lading.cli.output import print_json
from lading.cli.progress import human
from lading.cli.store_options import pop_store_config, store_options

SNAPSHOT_HELP = """List SOURCE once and write a snapshot FILE: every object's key, size and
version (ETag or generation), plus checksums where the store has them.

\b
Pass the FILE wherever a prefix goes, and nothing is listed again and every read is
pinned to the recorded versions; an object changed or removed since is an error naming
the key (exit 1), never newer bytes:
  lading snapshot s3://bucket/train -o train.snap.jsonl
  lading sync train.snap.jsonl /tmp/data-rank{rank} --distribution sharded
  lading mount train.snap.jsonl /mnt/train
  lading fetch train.snap.jsonl /data/train/
  lading sync s3://mirror/train /data --snapshot train.snap.jsonl   # same ETags elsewhere
  lading snapshot diff old.snap.jsonl new.snap.jsonl --json
  ShardDataset / StoreDataset("train.snap.jsonl")                    # training code

\b
Format: JSON Lines (gzip when FILE ends in .gz): a header line {"lading_snapshot": 1,
"source": ..., "taken": ...}, then one object per line sorted by key, {"key", "size",
"version", "md5"?, "crc32c"?, "mtime"?}. Written to a temporary and renamed, so a FILE
is always whole.

\b
Exit codes: 0 ok, 1 unsafe key, 2 usage (also: SOURCE is one object or file), 3 not found
(nothing at SOURCE), 4 access denied, 5 transient failure after retries, 6 local disk, 130
interrupted."""

DIFF_HELP = """Keys added, removed and changed (size or version) between two snapshots.

\b
Examples:
  lading snapshot diff monday.snap.jsonl tuesday.snap.jsonl
  lading snapshot diff old.snap.jsonl new.snap.jsonl --json | jq '.changed | length'

\b
Exit codes: 0 no difference, 1 differences found, 2 usage (not a snapshot), 3 not found."""


class _SnapshotCommand(click.Command):
    """``snapshot SOURCE -o FILE`` is this command itself; ``snapshot diff OLD NEW`` is handed to
    :data:`diff`, under the path ``lading snapshot diff``. A command rather than a group, so that
    ``lading snapshot --help`` lists the options of taking a snapshot and a usage error names
    ``lading snapshot``, the command the user typed."""

    #: The subcommands, for ``lading --help``-style listing and for the global flags (cli/main.py).
    subcommands: dict[str, click.Command] = {}

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        if args and args[0] in self.subcommands:
            # A bare command (no SOURCE argument) so that the path reads `lading snapshot diff`.
            ctx = click.Context(click.Command(info_name), info_name=info_name, parent=parent)
            return self.subcommands[args[0]].make_context(args[0], args[1:], parent=ctx, **extra)
        return super().make_context(info_name, args, parent, **extra)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "SOURCE -o FILE [OPTIONS]")
        formatter.write_usage(ctx.command_path, "diff OLD NEW [--json]", prefix="   or: ")

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, command.get_short_help_str(60)) for name, command in self.subcommands.items()])
        formatter.write_paragraph()
        formatter.write_text(f"See '{ctx.command_path} diff --help' for its options.")


@click.command(cls=_SnapshotCommand, help=SNAPSHOT_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("source")
@click.option("-o", "--output", "output", required=True, metavar="FILE", help="Where to write the snapshot.")
@click.option(
    "--sagemaker-manifest",
    metavar="FILE",
    default=None,
    help="Also write a SageMaker ManifestFile of the same objects (JSON).",
)
@click.option("--allow-empty", is_flag=True, help="Write a snapshot of nothing instead of failing.")
@click.option("--json", "json_out", is_flag=True, help="Print the summary as JSON.")
@store_options
@click.pass_obj
def snapshot(
    state: AppState,
    source: str,
    output: str,
    sagemaker_manifest: str | None,
    allow_empty: bool,
    json_out: bool,
    **options: Any,
) -> int:
    """``lading snapshot SOURCE -o FILE``."""
    from lading.core.errors import NotFound
    from lading.stores import open_store, refuse_an_object
    from lading.stores.snapshot import write_sagemaker_manifest, write_snapshot

    store = open_store(source, pop_store_config(options))
    progress = (
        None
        if state.quiet or json_out or not sys.stderr.isatty()
        else (lambda count: click.echo(f"\rlisted {count:,} objects", err=True, nl=False))
    )
    summary = write_snapshot(store, store.url, output, progress)
    if progress is not None:
        click.echo("", err=True)
    if summary.objects == 0 and not allow_empty:
        import os

        os.unlink(summary.path)
        refuse_an_object(store, "snapshot the prefix that holds it, {parent}")
        raise NotFound(f"nothing at {store.url}", "check the prefix, or pass --allow-empty")
    if sagemaker_manifest:
        write_sagemaker_manifest(summary.path, sagemaker_manifest)
    if json_out:
        print_json(
            {
                "snapshot": summary.path,
                "source": summary.source,
                "taken": summary.taken,
                "objects": summary.objects,
                "bytes": summary.total_bytes,
                "file_bytes": summary.file_bytes,
                "sagemaker_manifest": sagemaker_manifest,
            }
        )
    else:
        state.result(
            f"{summary.path}: {summary.objects:,} objects, {human(summary.total_bytes)} at "
            f"{summary.source} (taken {summary.taken}; the file is {human(summary.file_bytes)})"
        )
    return 0


@click.command("diff", help=DIFF_HELP, short_help="Keys added, removed and changed between two snapshots.")
@click.argument("old")
@click.argument("new")
@click.option("--json", "json_out", is_flag=True, help="Print {added, removed, changed} as JSON.")
@click.pass_obj
def diff(state: AppState, old: str, new: str, json_out: bool) -> int:
    """``lading snapshot diff OLD NEW``."""
    from lading.stores.snapshot import diff_snapshots

    result = diff_snapshots(old, new)
    if json_out:
        print_json({"added": result.added, "removed": result.removed, "changed": result.changed})
    else:
        for mark, keys in (("+", result.added), ("-", result.removed), ("~", result.changed)):
            for key in keys:
                click.echo(f"{mark} {key}")
        state.result(f"{len(result.added)} added, {len(result.removed)} removed, {len(result.changed)} changed")
    return 1 if (result.added or result.removed or result.changed) else 0


_SnapshotCommand.subcommands = {"diff": diff}
