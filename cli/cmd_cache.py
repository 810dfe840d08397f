"""`lading cache`: list and clear the node cache (lading sync's entries and the datasets' shards; parse, call, render)."""

from __future__ import annotations

import re
import time

import click
from lading.cli.output import print_json
from lading.cli.progress import human
from lading.core.errors import NotFound, UsageError
from lading.sync import cache as node_cache
from lading.core.cacheroot import CACHE_ROOT_RULE

CACHE_EPILOG = """\b
Examples:
  lading cache                                   # what is cached, by dataset
  lading cache clear --older-than 7d             # shards unused for a week
  lading cache clear --dataset s3://b/datasets/pets/v1/ --json

\b
One cache for lading sync and the datasets. Its root is --cache-dir, else
{CACHE_ROOT_RULE}.
Shards live under its datasets/ folder (a synced file is linked there, stored once),
sync's entries next to it. clear removes shards only; those a process is reading are
skipped (and counted as busy); files the cache did not download are never removed.

\b
Exit codes: 0 ok, 2 usage (bad option or duration), 3 nothing cached matches
--dataset (clear), 4 a cache root that is not yours or that others can write to.""".format(
    CACHE_ROOT_RULE=CACHE_ROOT_RULE
)

LIST_EPILOG = """\b
Examples:
  lading cache list                              # size, files, last use, by dataset
  lading cache list --cache-dir /scratch/lading --json | jq '.datasets[].uri'

\b
Exit codes: 0 ok, 2 usage (bad option), 4 a cache root that is not yours or that
others can write to."""

CLEAR_EPILOG = """\b
Examples:
  lading cache clear                             # every cached shard not in use
  lading cache clear --older-than 7d             # shards unused for a week
  lading cache clear --dataset s3://b/datasets/pets/v1/ --json

\b
--dataset takes a URI as `lading cache list` shows it, a prefix above it, or a cache
folder name. Shards a process is reading are kept and counted as busy; files the
cache did not download are never removed.

\b
Exit codes: 0 ok, 2 usage (bad option or duration), 3 nothing cached matches
--dataset, 4 a cache root that is not yours or that others can write to."""

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str | None) -> float | None:
    """``90``, ``30m``, ``12h``, ``7d``, ``2w`` -> seconds."""
    if text is None:
        return None
    match = _DURATION.match(text)
    if match is None:
        raise UsageError(f"--older-than {text!r} is not a duration", "use seconds or a unit: 30m, 12h, 7d, 2w")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return "just now"


cache_dir_option = click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, readable=False),
    default=None,
    help=f"Cache root (default: {CACHE_ROOT_RULE}).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Only JSON on stdout.")


@click.group(invoke_without_command=True, epilog=CACHE_EPILOG)
@cache_dir_option
@json_option
@click.pass_context
def cache(ctx: click.Context, cache_dir: str | None, as_json: bool) -> None:
    """List (default) or clear the node cache (lading sync's and the datasets')."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_cache, cache_dir=cache_dir, as_json=as_json)


@cache.command("list", epilog=LIST_EPILOG)
@cache_dir_option
@json_option
def list_cache(cache_dir: str | None, as_json: bool) -> None:
    """Cached datasets: files (shards and offsets file), size, last use, where they come from."""
    root = node_cache.open_root(cache_dir)
    datasets = node_cache.summarize(root)
    total = sum(dataset.bytes for dataset in datasets)
    if as_json:
        print_json(
            {
                "root": str(root),
                "bytes": total,
                "files": sum(d.files for d in datasets),
                "datasets": [dataset.as_json() for dataset in datasets],
            }
        )
        return
    now = time.time()
    click.echo(f"node cache {root}: {len(datasets)} datasets, {sum(d.files for d in datasets)} files, {human(total)}")
    if datasets:
        click.echo(f"{'size':>10}  {'files':>6}  {'last used':>10}  {'downloaded':>10}  {'kind':<8}  dataset")
    for dataset in datasets:
        click.echo(
            f"{human(dataset.bytes):>10}  {dataset.files:>6}  {_age(now - dataset.last_used):>10}  "
            f"{_age(now - dataset.downloaded):>10}  {dataset.kind:<8}  {dataset.uri or dataset.folder.name}"
        )


@cache.command("clear", epilog=CLEAR_EPILOG)
@cache_dir_option
@click.option("--dataset", default=None, help="Only this dataset: its URI (as listed) or cache folder name.")
@click.option("--older-than", default=None, help="Only shards unused for this long: 30m, 12h, 7d.")
@json_option
def clear_cache(cache_dir: str | None, dataset: str | None, older_than: str | None, as_json: bool) -> None:
    """Remove cached shards (all, one dataset's, or those unused for a while)."""
    result = node_cache.clear(cache_dir, dataset=dataset, older_than=parse_age(older_than))
    if dataset is not None and result.matched == 0:
        raise NotFound(
            f"nothing cached matches --dataset {dataset}",
            "`lading cache list` shows the cached datasets' URIs and folders",
        )
    if as_json:
        print_json({"files": result.files, "bytes": result.bytes, "busy": result.busy})
        return
    busy = f"; {result.busy} in use, kept" if result.busy else ""
    click.echo(f"removed {result.files} files, {human(result.bytes)}{busy}", err=True)
