"""`lading hook init|run`, `lading fetch`, `lading bind-mounts`: getting data into det containers."""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import click
from lading.cli.context import AppState
from lading.cli.output import print_json
from lading.cli.progress import Throttle, human, line_interval
from lading.cli.store_options import pop_store_config, store_options
from lading.core.errors import LadingError, NotFound, UsageError
from lading.stores.config import StoreConfig
from lading.transfer import TransferResult

if TYPE_CHECKING:
    from lading.context import CheckReport
    from lading.context.fix import FixPlan
    from lading.hooks.stage import StageResult
    from lading.sync.plan import SyncPlan

SCHEMA_HELP = """\b
Schema (only data.datasets is read; the rest of data: is yours):
  data:
    datasets:
      - source: s3://bucket/train/   # object or prefix (s3://, gs://, path)
        dest: /tmp/train             # absolute
        distribution: replicated     # or sharded (needs the whole trial
                                     # in this container)
        slots: true                  # also {dest}-rank{i} hard-link views"""


class LogProgress:
    """Progress for logs: a line when work starts, then one every ``interval`` seconds, no bars."""

    def __init__(self, label: str, echo: Callable[[str], None], interval: float | None = None) -> None:
        self.label, self.echo = label, echo
        self.throttle = Throttle(line_interval() if interval is None else interval)
        self.files = self.done = 0
        self.total = self.nbytes = 0
        self._lock = threading.Lock()

    def on_wait(self, lock_path: Path) -> None:
        """Say why we are idle."""
        self.echo(f"lading: {self.label}: another process on this node is staging it; waiting ({lock_path})")

    def on_phase(self, phase: str, plan: "SyncPlan | None") -> None:
        """Announce the download (sync's plan says how much), or pass a notice on."""
        if plan is None and phase != "download":
            self.echo(f"lading: {self.label}: {phase}")
            return
        self.files = plan.fetch_files if plan is not None else 1
        self.total = plan.fetch_bytes if plan is not None else 0
        self.throttle.restart()
        if self.files:
            size = f", {human(self.total)}" if plan is not None else ""
            self.echo(f"lading: {self.label}: fetching {self.files} object(s){size}")

    def on_bytes(self, nbytes: int) -> None:
        """Count bytes; print a line when the interval has passed."""
        with self._lock:
            self.nbytes += nbytes
            if not self.throttle.due():
                return
            line = self._line()
        self.echo(line)

    def on_done(self, result: TransferResult) -> None:
        """Count finished objects."""
        with self._lock:
            self.done += 1

    def _line(self) -> str:
        rate = self.throttle.rate(self.nbytes)
        files = f"{self.done}/{self.files} files, " if self.done else ""
        return f"lading: {self.label}: {files}{human(self.nbytes)}/{human(self.total)}, {human(rate)}/s"


def _echo_for(state: AppState) -> Callable[[str], None]:
    return state.status


def _slot_count(env: Mapping[str, str]) -> int:
    """How many slots this container has, from ``DET_SLOT_IDS`` (``[0,1]``; ``0,1`` accepted)."""
    raw = env.get("DET_SLOT_IDS", "").strip()
    if not raw:
        raise UsageError("--slots needs DET_SLOT_IDS (set by Determined in each container), and it is not set")
    try:
        ids = json.loads(raw) if raw.startswith("[") else [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"DET_SLOT_IDS={raw!r} is not a list of slot ids like [0,1]") from None
    if not isinstance(ids, list):
        raise UsageError(f"DET_SLOT_IDS={raw!r} is not a list of slot ids like [0,1]")
    return len(ids)


def _stage_one(
    state: AppState,
    config: StoreConfig,
    source: str,
    dest: str,
    views: Callable[[StageResult], dict[int, Callable[[], Iterator[str]]]],
    json_out: bool = False,
    force: bool = False,
) -> tuple[dict, LadingError | None]:
    """Stage SOURCE at DEST once per node, build the per-slot views, print a summary line.

    Returns the JSON summary and, when some objects failed, the error to raise once the caller
    printed that summary (``--json`` lists the failures whatever the exit code, as sync's does);
    the views are not built then."""
    from lading.hooks.fetch import stage_source
    from lading.hooks.stage import build_views, raise_for_failures

    progress = LogProgress(f"{source} -> {dest}", _echo_for(state))
    staged = stage_source(source, dest, config, events=progress, force=force)
    with staged.result as result:
        try:
            raise_for_failures(result)
        except LadingError as failed:
            return result.to_json() | {"view_links": 0}, failed
        linked = build_views(staged.root, result.path_of, views(result))
    if not json_out:
        state.result(
            _summary_line(
                progress.label,
                result.fetched,
                result.fetched_bytes,
                result.unchanged,
                result.removed,
                time.monotonic() - progress.throttle.started,
            )
        )
    return result.to_json() | {"view_links": linked}, None


def _summary_line(label: str, fetched: int, nbytes: int, unchanged: int, removed: int, seconds: float) -> str:
    if fetched == 0 and removed == 0:
        return f"lading: {label}: up to date ({unchanged} object(s) already staged, nothing downloaded)"
    rate = human(nbytes / max(seconds, 1e-6))
    extra = f", {removed} removed" if removed else ""
    return (
        f"lading: {label}: {fetched} fetched ({human(nbytes)} in {seconds:.1f}s, {rate}/s), "
        f"{unchanged} unchanged{extra}"
    )


HOOK_HELP = """Startup-hook downloads for Determined: write the hook, run it.

\b
Determined sources CONTEXT_DIR/startup-hook.sh in every container before the trial
starts; `hook init` writes a block there that stages datasets with `lading fetch` or
`lading hook run`, once per node, skipped when already there.

\b
Examples:
  lading hook init ./model s3://b/train/ /tmp/train   add a dataset to ./model/startup-hook.sh
  lading hook init ./model                            stage the config's data.datasets
  lading hook run --config const.yaml                 what the hook runs, for a local try

\b
Exit codes: 0 ok, 1 some objects failed, 2 usage (arguments, config), 3 not found,
4 access denied or not writable, 5 transient failure after retries, 6 local disk (full,
quota, name too long), 130 interrupted."""

HOOK_INIT_HELP = """Add a dataset to CONTEXT_DIR/startup-hook.sh (created if missing).

\b
With SOURCE and DEST the hook runs `lading fetch SOURCE DEST` in every container; without
them it runs `lading hook run` (the experiment config's data.datasets). The block lives
between marker comments: your lines outside it are kept, the same arguments twice change
nothing, and a new SOURCE for the same DEST replaces the old one.

\b
The generated block works when Determined sources it under `set -ex`: it never exits the
sourcing shell, holds no credential (lading reads the standard AWS/Google chains), and
fails the task with a clear message when lading is missing or a download fails. DEST, and
a SOURCE that is a local path, must be absolute; --slots reads DET_SLOT_IDS when the hook
runs.

\b
Examples:
  lading hook init ./model s3://bucket/train/ /tmp/train        one dataset, every container
  lading hook init ./model s3://bucket/train/ /tmp/train --slots  plus /tmp/train-rank{i} views
  lading hook init s3://bucket/data.csv /tmp/data.csv           ./startup-hook.sh
  lading hook init ./model                                      the config's data.datasets
  lading hook init ./model s3://bucket/train/ /tmp/train --dry-run   print, change nothing

\b
Exit codes: 0 written or already up to date, 2 usage (arguments, DEST or a local SOURCE
not absolute, CONTEXT_DIR not a directory, damaged markers), 3 CONTEXT_DIR does not exist,
4 startup-hook.sh not writable."""

HOOK_RUN_HELP = """Stage the experiment config's data.datasets on this node.

\b
Each dataset is staged once per node: the first container takes DEST's lock and
downloads; containers started at the same moment wait and then find it done. A completion
marker records each object's ETag/generation, so a restarted trial lists the source,
finds nothing changed, and downloads and rewrites nothing. Output is one line per step and
a progress line every few seconds (made for task logs).

\b
Examples:
  lading hook run                            in a det container ($DET_EXPERIMENT_CONFIG)
  lading hook run --config const.yaml        the same, tried locally
  lading hook run --config const.yaml --json a JSON summary per dataset

\b
Exit codes: 0 ok, 1 some objects failed, 2 usage (bad config, sharded without the whole
trial here), 3 not found, 4 access denied or DEST not writable, 5 transient failure after
retries, 6 local disk (full, quota, name too long), 130 interrupted."""


@click.group(help=HOOK_HELP, short_help="Startup-hook downloads for Determined (init, run).")
def hook() -> None:
    """``lading hook``: see HOOK_HELP."""


@hook.command("init", help=HOOK_INIT_HELP, short_help="Add a dataset to CONTEXT_DIR/startup-hook.sh.")
@click.argument("args", nargs=-1, metavar="[CONTEXT_DIR] [SOURCE DEST]")
@click.option("--slots", is_flag=True, help="Also build {DEST}-rank{i} hard-link views, one per slot in DET_SLOT_IDS.")
@click.option("--dry-run", is_flag=True, help="Print the hook as it would be written; change nothing.")
def hook_init(args: tuple[str, ...], slots: bool, dry_run: bool) -> int:
    """``lading hook init``: see HOOK_INIT_HELP."""
    from lading.hooks.script import HOOK_NAME, HookEntry, read_hook, updated_text, write_hook
    from lading.stores import parse_uri

    context, pair = _init_arguments(args)
    if pair:
        if parse_uri(pair[0]).scheme == "file" and not pair[0].lower().startswith("file:"):
            if not os.path.isabs(pair[0]):  # the hook runs elsewhere: a relative path would name another place
                raise UsageError(
                    f"a local SOURCE must be an absolute path inside the container, got {pair[0]!r}",
                    "the hook runs in the container's working directory, not here",
                )
        if not os.path.isabs(pair[1]):
            raise UsageError(f"DEST must be an absolute path inside the container, got {pair[1]!r}")
        entry = HookEntry(pair[0], pair[1], slots)
    else:
        if slots:
            raise UsageError("--slots goes with SOURCE DEST; for data.datasets set `slots: true` per dataset")
        entry = HookEntry()
    path = context / HOOK_NAME
    current = read_hook(path)
    text = updated_text(current, entry, str(path))
    if dry_run:
        click.echo(text, nl=False)
        return 0
    changed = write_hook(path, text)
    click.echo(f"{path}: {'updated' if changed else 'already up to date'}", err=True)  # the result: shown with -q
    return 0


def _init_arguments(args: tuple[str, ...]) -> tuple[Path, tuple[str, ...]]:
    """``[CONTEXT_DIR] [SOURCE DEST]`` -> (context, (SOURCE, DEST) or ()), saying what is missing."""
    usage = "lading hook init [CONTEXT_DIR] [SOURCE DEST]"
    if len(args) > 3:
        raise UsageError(f"too many arguments ({len(args)})", usage)
    missing_dest = "lading hook init [CONTEXT_DIR] SOURCE DEST (DEST: an absolute path in the container)"
    if len(args) == 1 and "://" in args[0]:
        raise UsageError(f"SOURCE {args[0]} needs a DEST: none was given", missing_dest)
    if len(args) == 2 and "://" in args[1] and "://" not in args[0]:
        raise UsageError(
            f"SOURCE {args[1]} needs a DEST: only CONTEXT_DIR {args[0]} and SOURCE were given", missing_dest
        )
    context = Path(args[0] if len(args) in (1, 3) else ".")
    if not context.exists():
        raise NotFound(f"context directory {str(context)!r} does not exist")  # as `lading check` says it
    if not context.is_dir():
        raise UsageError(
            f"context directory {str(context)!r} is not a directory",
            "CONTEXT_DIR is the model directory that holds startup-hook.sh",
        )
    return context, (args[-2:] if len(args) >= 2 else ())


@hook.command(
    "run",
    help=HOOK_RUN_HELP,
    epilog=SCHEMA_HELP,
    short_help="Stage the experiment config's data.datasets on this node.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="Experiment config (YAML). Default: $DET_EXPERIMENT_CONFIG (JSON), as in a det container.",
)
@click.option("--json", "json_out", is_flag=True, help="Print a JSON summary on stdout.")
@store_options
@click.pass_obj
def hook_run(state: AppState, config_file: str | None, json_out: bool, **options: Any) -> int:
    """``lading hook run``: see HOOK_RUN_HELP."""
    from lading.hooks.run import check_sharding, datasets_from_config, dest_path, slots_per_trial, views_for

    connection = pop_store_config(options)
    config, origin = _load_experiment_config(config_file, os.environ)
    specs = datasets_from_config(config, origin)
    if not specs:
        state.result(f"lading: {origin} lists no data.datasets; nothing to stage")
    trial_slots = slots_per_trial(config)
    summaries = []
    failed = None
    for spec in specs:
        needs_slots = spec.slots or spec.distribution == "sharded"
        count = _slot_count(os.environ) if needs_slots else 0
        check_sharding(spec, count, trial_slots)
        summary, failed = _stage_one(
            state,
            connection,
            spec.source,
            dest_path(spec),
            functools.partial(views_for, spec, slot_count=count, trial_slots=trial_slots),
            json_out=json_out,
        )
        summaries.append(summary)
        if failed:  # the datasets after it are not staged, as before
            break
    if json_out:  # the summaries so far, the failed dataset's too
        print_json({"datasets": summaries})
    if failed:
        raise failed
    return 0


def _load_experiment_config(config_file: str | None, env: Mapping[str, str]) -> tuple[Mapping, str]:
    from lading.context.config import load_config, parse_config

    if config_file is not None:
        return load_config(str(config_file)), config_file
    raw = env.get("DET_EXPERIMENT_CONFIG")
    if not raw:
        raise UsageError(
            "no experiment config: DET_EXPERIMENT_CONFIG is not set",
            "outside a det container, name the experiment config file (const.yaml)",
        )
    return parse_config(raw, "DET_EXPERIMENT_CONFIG"), "DET_EXPERIMENT_CONFIG"


FETCH_HELP = """Download URI (one object or a prefix) to DEST unless already there and unchanged.

\b
A trailing '/' on DEST (or an existing directory) means "into this directory". Files are
written under a temporary name and renamed once verified; transient errors are retried.
A completion record holds each object's ETag/generation (for a prefix, `lading sync`'s
state file in DEST; for one object, one hidden marker beside the file), so a second run
only lists or stats and downloads nothing. Concurrent runs on one machine download once.
A file at DEST that lading did not write is never replaced, unless --force.

\b
Examples:
  lading fetch s3://bucket/data.csv /tmp/data-rank0/    into the directory
  lading fetch s3://bucket/data.csv /tmp/train.csv      to that file
  lading fetch s3://bucket/train/ /tmp/train            a prefix, as a tree
  lading fetch --slots s3://bucket/train/ /tmp/train    plus /tmp/train-rank{i} views

\b
Exit codes: 0 ok, 1 some objects failed or unsafe keys, 2 usage (malformed URI, a file
lading did not write at DEST, a file where DEST's directory should be), 3 not found,
4 access denied or DEST not writable, 5 transient failure after retries, 6 local disk (full,
quota, name too long), 130 interrupted."""


@click.command(help=FETCH_HELP, short_help="Download one object or prefix if missing or changed.")
@click.argument("uri")
@click.argument("dest")
@click.option("--slots", is_flag=True, help="Also build {DEST}-rank{i} hard-link views, one per slot in DET_SLOT_IDS.")
@click.option("--force", is_flag=True, help="Replace a file at DEST that lading did not write (refused otherwise).")
@click.option("--json", "json_out", is_flag=True, help="Print a JSON summary on stdout (lading sync's fields).")
@store_options
@click.pass_obj
def fetch(state: AppState, uri: str, dest: str, slots: bool, force: bool, json_out: bool, **options: Any) -> int:
    """``lading fetch``: see FETCH_HELP."""
    count = _slot_count(os.environ) if slots else 0
    summary, failed = _stage_one(
        state,
        pop_store_config(options),
        uri,
        dest,
        lambda result: dict.fromkeys(range(count), result.keys),
        json_out=json_out,
        force=force,
    )
    if json_out:  # with the failed keys too, as sync's: the exit code is the error's below
        print_json(summary)
    if failed:
        raise failed
    return 0


BIND_MOUNTS_HELP = """Validate CONFIG's bind_mounts against det's schema, and check host paths exist here.

\b
det's rules: host_path absolute; container_path not "."; read_only true/false;
propagation a string (the container runtime accepts private, rprivate, shared,
rshared, slave, rslave); no other keys. Beyond det: each host_path must exist on
this machine (run it on an agent host, or where the data lives).
CONFIG defaults to $DET_EXPERIMENT_CONFIG (inside a det container).

\b
Examples:
  lading bind-mounts const.yaml
  lading bind-mounts const.yaml --json
  lading bind-mounts --suggest /mnt/datasets/imagenet    read-only, same path inside

\b
--suggest prints the snippet even when PATH does not exist here (a laptop), with a
warning on stderr.

\b
Exit codes: 0 no problem, 1 problems found (listed), 2 unreadable config, 3 missing file."""


@click.command("bind-mounts", help=BIND_MOUNTS_HELP, short_help="Validate an experiment config's bind_mounts.")
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--suggest",
    "suggest",
    multiple=True,
    metavar="PATH",
    help="Print a ready-to-paste bind_mounts snippet for PATH (repeatable).",
)
@click.option("--json", "json_out", is_flag=True, help="Print the problems as JSON on stdout.")
def bind_mounts(config: str | None, suggest: tuple[str, ...], json_out: bool) -> int:
    """``lading bind-mounts``: see BIND_MOUNTS_HELP."""
    from lading.context.bindmounts import missing_here, render_snippet, suggest_bind_mount, validate_bind_mounts

    if suggest:
        mounts = [suggest_bind_mount(path) for path in suggest]
        click.echo(render_snippet(mounts), nl=False)
        for path in missing_here(mounts):
            click.echo(
                f"lading: warning: {path} does not exist on this machine; the snippet is fine if it "
                "exists on the agent hosts",
                err=True,
            )
        if config is None:
            return 0
    loaded, origin = _load_experiment_config(config, os.environ)
    problems = validate_bind_mounts(loaded, exists=os.path.exists)
    mounts = loaded.get("bind_mounts") or []
    count = len(mounts) if isinstance(mounts, list) else 1
    if json_out:
        print_json(
            {
                "config": origin,
                "bind_mounts": count,
                "ok": not problems,
                "problems": [problem.to_json() for problem in problems],
            }
        )
    else:
        for problem in problems:
            click.echo(f"{origin}: {problem.message}")
        verdict = "ok" if not problems else f"{len(problems)} problem(s)"
        click.echo(f"{origin}: {count} bind mount(s), {verdict}", err=bool(problems))
    return 1 if problems else 0


def run_check_fix(
    report: "CheckReport", bucket: str | None, yes: bool, as_json: bool, state: AppState | None, config: StoreConfig
) -> int:
    """`lading check --fix --bucket URI [--yes]`: print the plan, or apply it and check again."""
    from lading.context import check_context
    from lading.context.fix import apply_fix, plan_fix
    from lading.stores import open_store

    if not bucket:
        raise UsageError(
            "--fix needs --bucket URI (where the large paths go)", "e.g. --bucket s3://my-bucket/model-data"
        )
    quiet = bool(state and state.quiet)
    if report.fits:
        if as_json:
            print_json({"fits": True, "plan": None})
        else:
            click.echo(f"fits ({human(report.total_bytes)} of {human(report.limit_bytes)}): nothing to fix")
        return 0
    plan = plan_fix(report, bucket)
    if not yes:
        if as_json:
            print_json({"fits": False, "applied": False, "plan": plan.to_json()})
        else:
            click.echo(_render_fix_plan(plan))
        return 1
    progress = LogProgress(f"upload to {plan.bucket}", _echo_for(AppState(quiet=quiet or as_json)))
    progress.total = plan.upload_bytes
    result = apply_fix(plan, open_store(plan.bucket, config), progress.on_bytes)
    after = check_context(str(plan.context), limit=report.limit_bytes, remedies=False)
    if as_json:
        print_json(
            {
                "fits": after.fits,
                "applied": True,
                "plan": plan.to_json(),
                "result": result.to_json(),
                "total_bytes": after.total_bytes,
            }
        )
    else:
        if not quiet:
            click.echo(
                f"uploaded {result.uploaded} file(s) ({human(result.uploaded_bytes)}), "
                f"{result.already_there} already in {plan.bucket}; all verified"
            )
            click.echo(
                f"{plan.context / '.detignore'}: +{len(result.detignore_added)} line(s); "
                f"startup-hook.sh: {'updated' if result.hook_changed else 'already up to date'}"
            )
        verdict = "fits" if after.fits else "STILL OVER"
        click.echo(
            f"now: {verdict}, {human(after.total_bytes)} of {human(after.limit_bytes)}; "
            "your files are untouched (only ignored); the hook downloads them when the task starts"
        )
    return 0 if after.fits else 1


def _render_fix_plan(plan: "FixPlan") -> str:
    lines = [
        f"over the limit: {human(plan.total_before)} of {human(plan.limit_bytes)}. Plan (dry run; add --yes to apply):"
    ]
    for item in plan.items:
        name = item.path + ("/" if item.is_dir else "")
        where = (
            f"upload {len(item.files)} file(s) to {item.uri}"
            if item.restore
            else "ignore only (a cache or virtualenv: rebuilt, not restored)"
        )
        lines.append(f"  {human(item.det_bytes):>10}  {name}: {where}")
    lines.append(f"then add to {plan.context / '.detignore'}: " + " ".join(plan.detignore_lines))
    for entry in plan.hook_entries():
        lines.append(f"and to {plan.context / 'startup-hook.sh'}: lading fetch {entry.source} {entry.dest}")
    verdict = "fits" if plan.fits_after else "STILL OVER"
    lines.append(
        f"after: {human(plan.total_after)} ({verdict}); uploads are verified before any "
        "file in the context changes, and no file is deleted"
    )
    return "\n".join(lines)
