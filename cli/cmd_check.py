"""`lading check`: will `det experiment create CONFIG CONTEXT_DIR` accept this context?"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import click
from lading.cli.context import AppState
from lading.cli.option_rules import needs
from lading.cli.output import JSON_INDENT
from lading.cli.params import size as size_option
from lading.cli.progress import counted
from lading.cli.store_options import pop_store_config, store_options
from lading.context import CheckReport, check_context, format_size

if TYPE_CHECKING:
    from rich.console import Console

HELP = """Will det accept CONTEXT_DIR? Offline and exact, without a cluster.

\b
Walks CONTEXT_DIR (default: .) exactly as `det experiment create` does in
det 0.38: det's default ignores plus CONTEXT_DIR/.detignore (gitignore
syntax, `!` re-includes), directories pruned when ignored, links to files
counted by their target, links to directories uploaded empty. Each file
counts ceil(size/3)*3 bytes; det refuses a total above 95 MiB
(99,614,720 bytes). Only file metadata is read, never contents.

\b
Examples:
  lading check ./model                      verdict, largest files/dirs, warnings
  lading check ./model -i ../shared/utils   as with `det ... -i ../shared/utils`
  lading check ./model --explain data/x.pt  which pattern decides this path
  lading check ./model --json | jq .fits    for scripts (only JSON on stdout)
  lading check ./model --config const.yaml  also check the experiment config

When over the limit it prints the .detignore lines that bring it under
(verified by walking again) and the startup-hook route for data.

Exit codes: 0 fits, 1 over the limit, 2 usage error, 3 not found,
4 permission denied, 5 transient failure after retries (--fix's uploads),
130 interrupted.
"""


@click.command(help=HELP, short_help="Will det accept this context directory?")
@click.argument("context_dir", default=".", required=False)
@click.option(
    "-i",
    "--include",
    "includes",
    multiple=True,
    metavar="PATH",
    help="Also upload PATH, as det's -i/--include (repeatable): a directory lands "
    "under its own name, a file at the top.",
)
@click.option(
    "--top",
    default=10,
    show_default=True,
    type=click.IntRange(min=0),
    metavar="N",
    help="How many of the largest files and directories to list.",
)
@click.option(
    "--explain",
    "explain_path",
    metavar="PATH",
    help="Say whether PATH is uploaded and which pattern in which file decided it. "
    "PATH as det names it (relative to CONTEXT_DIR) or a path inside the context.",
)
@click.option(
    "--limit",
    callback=size_option,
    default="95MiB",
    show_default=True,
    metavar="SIZE",
    help="The limit to check against: bytes, or with a unit (96MB, 100MiB, 1GiB).",
)
@click.option("--json", "as_json", is_flag=True, help="Print only JSON on stdout (see README).")
@click.option(
    "--config",
    "config_path",
    metavar="FILE",
    help="The experiment config: warn when it is uploaded with the context and when "
    "its bind_mounts break det's schema.",
)
@click.option("-q", "--quiet", is_flag=True, help="Print only the verdict line.")
@click.option(
    "--fix",
    is_flag=True,
    help="Over the limit: upload the largest data-like paths to --bucket, "
    "add them to .detignore and to startup-hook.sh (a dry run unless --yes).",
)
@click.option("--bucket", metavar="URI", help="Where --fix uploads: s3://bucket/prefix, gs://..., or a path.")
@click.option("--yes", is_flag=True, help="With --fix: apply (upload and verify first, then edit the context).")
@store_options
@click.pass_obj
def check(
    state: AppState | None,
    context_dir: str,
    includes: tuple[str, ...],
    top: int,
    explain_path: str | None,
    limit: int,
    as_json: bool,
    config_path: str | None,
    quiet: bool,
    fix: bool = False,
    bucket: str | None = None,
    yes: bool = False,
    **store: Any,
) -> int:
    """Will det accept CONTEXT_DIR?"""
    if fix or bucket or yes:
        _check_fix_options(bucket)
    with _progress(enabled=sys.stderr.isatty() and not quiet) as progress:
        report = check_context(
            context_dir,
            includes,
            limit=limit,
            config_path=config_path,
            explain_path=explain_path,
            progress=progress,
            fork=True,
        )
    if fix or bucket or yes:  # `check --fix` lives with the startup-hook code (cli/cmd_hook.py)
        from lading.cli.cmd_hook import run_check_fix

        return run_check_fix(report, bucket, yes, as_json, state, pop_store_config(store))
    if as_json:
        sys.stdout.write(report.to_json(top, indent=JSON_INDENT) + "\n")  # print_json's shape; no click regex
    else:
        render(report, top=top, quiet=quiet or bool(state and state.quiet))
    return 0 if report.fits else 1


def _check_fix_options(bucket: str | None) -> None:
    """--bucket and --yes need --fix, and --bucket must be a location: checked before the walk,
    so that a typo is an error even when the context fits and nothing would be uploaded."""
    needs("bucket", "fix")
    needs("yes", "fix")
    if bucket is not None:
        from lading.stores import parse_uri

        parse_uri(bucket)


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[int], None] | None]:
    """A file counter on stderr for big trees (after half a second, at most 10 updates/s)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.status import Status

    started = last = time.monotonic()
    status: Status | None = None

    def update(files: int) -> None:
        """Show the count, throttled."""
        nonlocal status, last
        now = time.monotonic()
        if now - last < 0.1 or now - started < 0.5:
            return
        last = now
        if status is None:
            status = Status("", console=Console(stderr=True))
            status.start()
        status.update(f"walking the context: {files:,} files so far")

    try:
        yield update
    finally:
        if status is not None:
            status.stop()


def render(report: CheckReport, top: int, quiet: bool) -> None:
    """The human report: verdict, totals, largest entries, warnings, remedy, explanation."""
    from rich.console import Console  # imported here: --json never pays for rich

    console = Console(highlight=False, soft_wrap=True)
    if report.explanation is not None:  # the verdict after it is the whole context's, not PATH's
        _render_explanation(console, report)
        console.print("the whole context: " + _verdict(report))
    else:
        console.print(_verdict(report))
    if quiet or report.explanation is not None:
        return
    walked = report.walked
    console.print(
        f"  {counted(len(walked.files), 'file')} in {counted(len(walked.dirs), 'directory')}; "
        f"{format_size(report.raw_bytes)} on disk, {report.total_bytes:,} bytes as det "
        "counts them (ceil(size/3)*3 per file)"
    )
    _render_tables(console, report, top)
    _render_warnings(console, report)
    if report.remedy is not None:
        _render_remedy(console, report)


def _verdict(report: CheckReport) -> str:
    total, limit = format_size(report.total_bytes), format_size(report.limit_bytes)
    where = report.roots[0].given + "".join(f" + {r.given}" for r in report.roots[1:])
    if report.fits:
        return (
            f"[bold green]fits[/]: {where} uploads {total} of {limit} ({format_size(report.headroom_bytes)} headroom)"
        )
    return (
        f"[bold red]over the limit by {format_size(-report.headroom_bytes)}[/]: {where} uploads "
        f"{total} of {limit}; det experiment create would refuse it"
    )


def _render_tables(console: Console, report: CheckReport, top: int) -> None:
    from rich.table import Table

    if top == 0 or not report.walked.files:
        return
    files = Table(title=f"Largest files (top {top})", title_justify="left", box=None, pad_edge=False)
    files.add_column("size", justify="right")
    files.add_column("path", overflow="fold")
    for path, size in report.largest_files(top):
        files.add_row(format_size(size), _escape(path))
    dirs = Table(title=f"Largest directories (top {top})", title_justify="left", box=None, pad_edge=False)
    dirs.add_column("size", justify="right")
    dirs.add_column("files", justify="right")
    dirs.add_column("path", overflow="fold")
    for stat in report.largest_dirs(top):
        dirs.add_row(format_size(stat.raw_bytes), f"{stat.files:,}", _escape(stat.path) + "/")
    console.print()
    console.print(files)
    if dirs.row_count:
        console.print()
        console.print(dirs)


def _render_warnings(console: Console, report: CheckReport) -> None:
    if not report.warnings:
        return
    console.print()
    console.print(f"[bold yellow]Warnings ({len(report.warnings)})[/]")
    for warning in report.warnings:
        console.print(f"  [yellow]![/] {_escape(warning.path)}: {_escape(warning.message)}")


def _render_remedy(console: Console, report: CheckReport) -> None:
    remedy = report.remedy
    assert remedy is not None
    console.print()
    for detignore, lines in remedy.lines.items():
        console.print(f"[bold]To fit, add to {_escape(detignore)}:[/]")
        for line in lines:
            console.print(f"    {_escape(line)}")
    outcome = "fits" if remedy.fits_after else "still over"
    console.print(
        f"  then det would upload {format_size(remedy.total_after)}: {outcome} "
        f"(checked by walking again with these lines)"
    )
    named = [f"{p}/" if p in report.dirs else p for p in remedy.hook_paths]
    moved = ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "") or "the data"
    console.print(
        f"[bold]Or keep {_escape(moved)} out of the context[/]: put it in a bucket and "
        "download it when the task starts, from a startup hook "
        "(startup-hook.sh next to the model code; see `lading hook --help`)."
    )


def _render_explanation(console: Console, report: CheckReport) -> None:
    explanation = report.explanation
    verdict = "[green]uploaded[/]" if explanation.uploaded else "[red]not uploaded[/]"
    console.print(f"{_escape(explanation.path)} ({explanation.kind}): {verdict}: {_escape(explanation.reason)}")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
