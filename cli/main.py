"""The ``lading`` click group. Subcommands live in their own modules and load on demand."""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from typing import NoReturn

import click
from lading import __version__
from lading.cli.context import AppState
from lading.cli.errors import run_guarded
from lading.cli.output import flush_stdout, install_stdout
from lading.core.errors import LadingError

#: command name -> (module, attribute, one-line help). Loaded lazily so `lading --help` is fast.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "check": ("lading.cli.cmd_check", "check", "Will det accept this context directory? Offline, exact."),
    "sync": ("lading.cli.cmd_sync", "sync", "Copy a bucket into per-rank directories, incrementally."),
    "topology": ("lading.cli.cmd_sync", "topology", "Show the rank/world size detected from the launcher."),
    "mount": ("lading.cli.cmd_mount", "mount", "Mount a bucket read-only with lazy, prefetched reads."),
    "unmount": ("lading.cli.cmd_mount", "unmount", "Unmount a lading mount."),
    "pack": ("lading.cli.cmd_pack", "pack", "Pack many small files into WebDataset tar shards."),
    "hook": ("lading.cli.cmd_hook", "hook", "Startup-hook downloads for Determined (init, run)."),
    "fetch": ("lading.cli.cmd_hook", "fetch", "Download one object or prefix if missing or changed."),
    "cache": ("lading.cli.cmd_cache", "cache", "List or clear the node cache of lading.datasets."),
    "cat": ("lading.cli.cmd_cat", "cat", "Stream objects in order to stdout or a named pipe (Pipe mode)."),
    "snapshot": ("lading.cli.cmd_snapshot", "snapshot", "List a prefix once; pin every later read to it (diff two)."),
    "datasets": ("lading.cli.cmd_datasets", "datasets", "Datasets cached by lading.datalayer: list, show, rm."),
    "bind-mounts": ("lading.cli.cmd_hook", "bind_mounts", "Validate an experiment config's bind_mounts."),
}

EXIT_CODES_HELP = """\b
Exit codes:
    0  success                 4  permission or credentials
    1  problem found           5  transient failure after retries
    2  usage error             6  local disk: full, quota, name too long
    3  not found             130  interrupted"""


def enable_debug_logging() -> None:
    """Show the library's ``lading`` logger on stderr (``--debug``); once per process."""
    import logging

    logger = logging.getLogger("lading")
    if any(getattr(handler, "lading_debug", False) for handler in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("lading: %(levelname)s %(name)s: %(message)s"))
    handler.lading_debug = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)


def _set_global(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--debug`` or ``-q`` given after the subcommand: the same as before it."""
    if not value:
        return
    state = ctx.find_object(AppState)
    if state is None:
        return
    setattr(state, param.name or "", True)
    if param.name == "debug":
        enable_debug_logging()


#: The global flags every subcommand also accepts (aws, rclone and s5cmd users put them last).
GLOBAL_FLAGS = (("debug", ("--debug",)), ("quiet", ("-q", "--quiet")))


def accept_global_flags(command: click.Command) -> click.Command:
    """Let ``command`` (and a group's subcommands) take the global flags anywhere on the line.

    A command with an option of the same name keeps its own (``check -q`` means the verdict only).
    """
    if getattr(command, "_lading_global_flags", False):
        return command
    taken = {opt for param in command.params for opt in getattr(param, "opts", [])}
    for name, opts in GLOBAL_FLAGS:
        if not taken.intersection(opts):
            command.params.append(
                click.Option(list(opts), name, is_flag=True, hidden=True, expose_value=False, callback=_set_global)
            )
    command._lading_global_flags = True  # type: ignore[attr-defined]
    subcommands = command.commands if isinstance(command, click.Group) else getattr(command, "subcommands", {})
    for sub in subcommands.values():  # a group's, or `snapshot diff` of the command `snapshot`
        accept_global_flags(sub)
    return command


class LazyGroup(click.Group):
    """A group whose subcommands are imported only when invoked."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return accept_global_flags(getattr(importlib.import_module(module), attr))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> object:
        """Run the subcommand. A reader that closed stdout early (``lading sync ... --json | head``)
        ends it quietly with exit 0, as :func:`lading.cli.errors.run_guarded` means it to: click
        catches ``EPIPE`` before that and exits 1 without a word."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)  # nothing flushes into the closed pipe at exit
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            raise click.exceptions.Exit(0) from None


@click.group(cls=LazyGroup, epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="lading")
@click.option(
    "--debug",
    is_flag=True,
    envvar="LADING_DEBUG",
    help="Show tracebacks for errors and the library's log (anywhere on the line).",
)
@click.option("-q", "--quiet", is_flag=True, help="Only errors and the final result (anywhere on the line).")
@click.pass_context
def lading(ctx: click.Context, debug: bool, quiet: bool) -> None:
    """Package, stage and mount datasets for ML training jobs.

    \b
    lading check ./model          will `det experiment create` accept it?
    lading sync s3://b/data       bucket -> /tmp/data-rank{rank}, per rank
    lading mount s3://b/data /mnt lazy read-only FUSE view of a bucket
    """
    ctx.obj = AppState(debug=debug, quiet=quiet)
    if debug:  # the library logs to the "lading" logger; show it with --debug
        enable_debug_logging()


def quiet_dependency_warnings() -> None:
    """Hide google-api-core's FutureWarnings about Python and dependency versions, which every
    gs:// command printed on stderr. A process-wide filter, so it lives here in the CLI, never in
    the library (which leaves its host application's warning filters alone)."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning, module=r"google\.api_core\._python_\w+_support")


#: Commands that move object data through obstore (its body pieces are malloc'd by the runtime).
_DATA_COMMANDS = {"sync", "cat", "hook", "mount"}
#: Of those, the ones whose only busy threads are the runtime's and the I/O core's: one heap for all.
_ONE_ARENA_COMMANDS = {"sync", "cat", "hook"}


def keep_freed_memory(one_arena: bool = False) -> None:
    """glibc: serve allocations up to 16 MiB from the heap and keep up to 128 MiB of freed memory
    for reuse. A download's part buffers (one per part in flight, 8 MiB each, allocated by obstore's
    runtime) and body pieces then reuse the same pages instead of each being mapped, faulted in page
    by page and unmapped: 115,000 -> 30,000 page faults and about 0.4 CPU-s less per GiB, measured
    (bench/RESULTS.md). ``one_arena``: every thread allocates from that one heap (``M_ARENA_MAX``
    1), so a part buffer freed after one runtime thread collected it is reused by the next part
    whichever thread collects that; with an arena per thread, each grows heaps of its own that
    glibc unmaps once empty and the next parts fault in again (25,000-34,000 -> 17,000-21,000
    page faults and about 0.1 CPU-s less per GiB, session 8). Not for a mount: its many FUSE
    threads would all take the one heap's lock (its daemon sets its own). A process-wide setting,
    so it lives here in the CLI, never in the library; set before any thread allocates."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 16 << 20)  # M_MMAP_THRESHOLD: above a part (lading.stores.download.PART_SIZE)
        libc.mallopt(-1, 128 << 20)  # M_TRIM_THRESHOLD
        if one_arena:
            libc.mallopt(-8, 1)  # M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc: its defaults stay
        pass


#: The cyclic garbage collector's thresholds for the data commands (Python's default: 700, 10, 10).
GC_THRESHOLDS = (20_000, 50, 100)


def collect_garbage_less_often() -> None:
    """Run the cyclic garbage collector after 20,000 net allocations instead of 700. A data
    command allocates a few short-lived objects per object moved (requests, results, journal
    lines) and makes almost no cycles, so the default ran about 80 collections in a 2,000-object
    sync for nothing: 35-40 ms of CPU against 18-22 ms (session 11, `lading sync` of
    2,000 x 64 KiB from RGW, three alternating rounds). A process-wide setting, so it lives
    here in the CLI, never in the library."""
    import gc

    gc.set_threshold(*GC_THRESHOLDS)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    args = sys.argv[1:] if argv is None else argv
    quiet_dependency_warnings()
    if _DATA_COMMANDS.intersection(args):
        keep_freed_memory(one_arena=bool(_ONE_ARENA_COMMANDS.intersection(args)))
        collect_garbage_less_often()

    def debug() -> bool:
        return "--debug" in args or os.environ.get("LADING_DEBUG", "") not in ("", "0")

    def entry() -> object:
        """The command, then what stdout still buffers written out: a write that fails there (a
        full disk under ``> file``) is the command's error, not something to pass over at exit."""
        try:
            result = lading.main(args=args, prog_name="lading", standalone_mode=False)
        except click.exceptions.Exit:  # `ctx.exit(n)`, and a reader that closed stdout (now /dev/null)
            flush_stdout()
            raise
        flush_stdout()
        return result

    run_guarded(entry, debug)


def stand_in_for_closed_streams() -> None:
    """Give a process started with stdout or stderr closed (``>&-``) /dev/null in its place.
    Python leaves ``sys.stdout`` None then, so the first write or ``isatty()`` was an internal
    error and the final flush a traceback (and a file opened later would take descriptor 1)."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is None:
            devnull = os.open(os.devnull, os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
            setattr(sys, name, open(fd, "w", closefd=False))


def console() -> NoReturn:
    """The ``lading`` command (console script and ``python -m lading``): :func:`main`, then exit
    without finalizing the interpreter.

    obstore's runtime threads may still hand a finished request's result to Python while the
    interpreter finalizes, which aborts the process (SIGABRT) after the command has done its work.
    The command's output and exit code are final by then, so it runs the ``atexit`` callbacks
    (the I/O core's shutdown, logging), flushes its streams and leaves with ``os._exit``.
    Its stdout is :func:`lading.cli.output.install_stdout`'s: a write to it that fails (a full
    disk) is ``cannot write stdout``, exit 6.
    """
    stand_in_for_closed_streams()
    install_stdout()
    try:
        main()
        code: object = 0
    except SystemExit as done:
        code = done.code
    if isinstance(code, str):
        sys.stderr.write(code + "\n")
        code = 1
    iocore = sys.modules.get("lading.stores.iocore")  # only a command that read objects started one
    if iocore is not None:
        iocore.shutdown(grace=False)  # os._exit below: no finalizing interpreter to wait for
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, LadingError):  # a closed pipe; a closed stream; stdout's
            pass  # full disk, which failed the command already (main flushed it)
    os._exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    console()
