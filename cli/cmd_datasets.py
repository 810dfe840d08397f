"""`lading datasets list | show | rm`: the versions lading.datalayer cached (parse, call, render)."""

from __future__ import annotations

from typing import Any

import click
from lading.cli.output import print_json
from lading.cli.progress import human
from lading.cli.store_options import pop_store_config, store_options
from lading.core.errors import UsageError
from lading.core.cacheroot import CACHE_ROOT_RULE

DATASETS_EPILOG = """\b
Examples:
  lading datasets list s3://bucket/cache
  lading datasets show s3://bucket/cache/mnist/v1
  lading datasets show gs://bucket/cache/mnist/v1 --json | jq .encoding
  lading datasets rm s3://bucket/cache/mnist/v1 --yes

\b
Datasets get there from training code:
  @lading.datalayer.cached("s3://bucket/cache", "mnist", "v1", shuffle=True, seed=0)
  def mnist(): yield {"image": array, "label": 3}

\b
Exit codes: 0 ok, 1 problem (rm: the version is claimed by a process building or removing
it), 2 usage (not STORE_URI/NAME/VERSION, rm without --yes), 3 not found, 4 access denied,
5 transient failure after retries, 130 interrupted."""

LIST_EPILOG = """\b
Examples:
  lading datasets list s3://bucket/cache
  lading datasets list ./cache --json

\b
States: complete (an index), building or removing (a live claim), failed (the last
build raised; the next call builds again), expired-claim (its process stopped beating),
incomplete (objects without an index or a claim: lading datasets rm removes them).

\b
Exit codes: 0 ok (also when there are none), 2 usage, 3 no such bucket or directory,
4 access denied, 5 transient failure after retries."""

SHOW_EPILOG = """\b
Examples:
  lading datasets show s3://bucket/cache/mnist/v1
  lading datasets show s3://bucket/cache/mnist/v1 --json --cache-dir /scratch/lading

\b
Shows samples, shards, bytes, the fields and their types, the fingerprint, who built it
and when, its claim, whether the store still holds every object at the ETag/generation
the index recorded, and how much of it this node's cache holds at those versions.

\b
Exit codes: 0 ok, 2 usage, 3 no dataset there, 4 access denied, 5 transient failure."""

RM_EPILOG = """\b
Examples:
  lading datasets rm s3://bucket/cache/mnist/v1 --yes
  lading datasets rm ./cache/toy/v1 ./cache/toy/v2 --yes --json

\b
rm claims the version first, like a build: a version some process has claimed (building
or removing it) is never removed (exit 1). A failed build's claim, or one without a
heartbeat for two of its TTLs, is taken over. The index goes first, so no reader takes
a half-removed version as complete.

\b
Exit codes: 0 removed, 1 claimed by another process, 2 usage (no --yes), 3 nothing
there, 4 access denied, 5 transient failure after retries."""

_CONTEXT = {"help_option_names": ["-h", "--help"]}
json_option = click.option("--json", "as_json", is_flag=True, help="Only JSON on stdout.")


@click.group(epilog=DATASETS_EPILOG, context_settings=_CONTEXT)
def datasets() -> None:
    """Datasets cached by lading.datalayer: list, show, rm."""


@datasets.command("list", epilog=LIST_EPILOG)
@click.argument("store_uri")
@json_option
@store_options
def list_datasets(store_uri: str, as_json: bool, **options: Any) -> None:
    """Every NAME/VERSION under STORE_URI, with its state."""
    from lading.datalayer import list_versions

    found = list_versions(store_uri, pop_store_config(options))
    if as_json:
        print_json({"store": store_uri, "datasets": [item.as_json() for item in found]})
        return
    if not found:
        click.echo(f"no datasets under {store_uri}")
        return
    click.echo(f"{'dataset':<28} {'state':<13} {'samples':>10} {'shards':>6} {'size':>10}  built / claimed")
    for item in found:
        click.echo(
            f"{item.location.name + '/' + item.location.version:<28} {item.state:<13} "
            f"{_count(item.samples):>10} {_count(item.shards):>6} {human(item.bytes):>10}  {_when(item)}"
        )


@datasets.command("show", epilog=SHOW_EPILOG)
@click.argument("uri", metavar="STORE_URI/NAME/VERSION")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, readable=False),
    default=None,
    help=f"Node cache root to check (default: {CACHE_ROOT_RULE}).",
)
@json_option
@store_options
def show(uri: str, cache_dir: str | None, as_json: bool, **options: Any) -> None:
    """One version: what it holds, how it was built, whether it is intact."""
    from lading.datalayer import describe

    details = describe(uri, pop_store_config(options), cache_dir=cache_dir)
    if as_json:
        print_json(details)
        return
    for line in _details(details):
        click.echo(line)


@datasets.command("rm", epilog=RM_EPILOG)
@click.argument("uris", metavar="STORE_URI/NAME/VERSION...", nargs=-1, required=True)
@click.option("--yes", is_flag=True, help="Really remove (required).")
@json_option
@store_options
def rm(uris: tuple[str, ...], yes: bool, as_json: bool, **options: Any) -> None:
    """Remove dataset versions that no process has claimed."""
    from lading.datalayer import remove

    if not yes:
        raise UsageError(
            f"refusing to remove {', '.join(uris)} without --yes",
            f"see what it holds first: lading datasets show {uris[0]}",
        )
    config = pop_store_config(options)
    removed = [remove(uri, config) for uri in uris]
    if as_json:
        print_json({"removed": [item.as_json() for item in removed]})
        return
    for item in removed:
        click.echo(f"removed {item.location}: {item.objects} objects, {human(item.bytes)}", err=True)


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _when(item: Any) -> str:
    claim = item.claim
    if claim and item.state != "complete":
        return f"pid {claim['pid']} on {claim['host']}, heartbeat {claim['heartbeat_age']:.0f}s ago"
    return item.built_at or ""


def _details(details: dict[str, Any]) -> list[str]:
    lines = [f"{details['uri']}: {details['state']}"]
    claim = details.get("claim")
    if "samples" in details:
        fields = (details.get("encoding") or {}).get("fields", {})
        built_by = details.get("built_by") or {}
        cache = details.get("node_cache")
        lines += [
            f"  samples      {_count(details['samples'])}",
            (
                f"  shards       {details['shards']} ({human(details['shard_bytes'])}; {details['objects']} objects, "
                f"{human(details['bytes'])} in all)"
            ),
            "  fields       " + (", ".join(f"{e['field']} ({e['type']})" for e in fields.values()) or "-"),
            f"  keys         {(details.get('encoding') or {}).get('keys', '-')}",
            f"  fingerprint  {details.get('fingerprint') or '- (not built by lading.datalayer)'}",
            f"  function     {details.get('function') or '-'}",
            (
                f"  built        {details.get('built_at') or '-'} by pid {built_by.get('pid', '?')} on "
                f"{built_by.get('host', '?')} (user {built_by.get('user', '?')}) in {details.get('build_seconds')}s"
            ),
            f"  store check  {details.get('store_check')}",
            "  node cache   "
            + (
                "none here"
                if cache is None
                else (
                    f"{cache['current']} current, {cache['stale']} stale, {cache['absent']} absent in {cache['root']}"
                )
            ),
        ]
    else:
        lines.append(f"  objects      {details['objects']} ({human(details['bytes'])}), no index")
    if claim:
        lines.append(
            f"  claim        {claim['purpose']} {claim['state']} by pid {claim['pid']} on {claim['host']}, "
            f"heartbeat {claim['heartbeat_age']:.0f}s ago (ttl {claim['ttl']:g}s)"
            + (f": {claim['error']}" if claim.get("error") else "")
        )
    return lines
