"""The one place where exceptions become exit codes and one-line messages."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable, NoReturn

import click
from click.core import ParameterSource
from lading.core.errors import LadingError

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_ACCESS = 4
EXIT_TRANSIENT = 5
EXIT_LOCAL_IO = 6
EXIT_INTERRUPTED = 130


def _fail(message: str, hint: str | None, code: int) -> NoReturn:
    line = f"lading: error: {message}"
    if hint:
        line += f" (hint: {hint})"
    click.echo(line, err=True)
    sys.exit(code)


def click_message(err: click.ClickException) -> tuple[str, str | None]:
    """A click error as (one-line message, hint): the same shape as every other error, where
    click would print a usage block, a "Try --help" line and the message (4 lines)."""
    if isinstance(err, click.BadParameter):
        _name_the_variable(err)
    message = " ".join(err.format_message().split())
    ctx = getattr(err, "ctx", None)
    if not isinstance(err, click.UsageError) or ctx is None:
        return message, None
    return message, f"see '{ctx.command_path} --help'"


def _name_the_variable(err: click.BadParameter) -> None:
    """A bad value an environment variable gave (``LADING_CACHE_DIR=somefile``) names that
    variable, not only the option it stands for, which the user did not type."""
    param, ctx = err.param, err.ctx
    if err.param_hint is not None or param is None or param.name is None or ctx is None:
        return
    if ctx.get_parameter_source(param.name) is not ParameterSource.ENVIRONMENT:
        return
    names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
    given = [name for name in names if os.environ.get(name)]
    if given:
        err.param_hint = f"{given[0]} (the environment variable behind {param.get_error_hint(ctx)})"


def run_guarded(entry: Callable[[], object], debug: Callable[[], bool]) -> NoReturn:
    """Run the click entry point and translate every failure into an exit code."""
    try:
        result = entry()
    except LadingError as err:
        if debug():
            traceback.print_exc()
        _fail(err.message, err.hint, err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("lading: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.exceptions.NoArgsIsHelpError as err:  # `lading` alone: the help, as before
        err.show()
        sys.exit(EXIT_USAGE)
    except click.ClickException as err:
        _fail(*click_message(err), EXIT_USAGE if isinstance(err, click.UsageError) else err.exit_code)
    except KeyboardInterrupt:
        click.echo("lading: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        sys.exit(EXIT_OK)
    except Exception as err:  # a bug: say so in one line unless --debug
        if debug():
            traceback.print_exc()
        _fail(f"internal error: {type(err).__name__}: {err}", "rerun with --debug and report it", EXIT_PROBLEM)
    sys.exit(result if isinstance(result, int) else EXIT_OK)
