"""What identifies a build: a fingerprint of the function's code and the arguments it was called with.

``code:<sha256>`` hashes

- the function's source from its ``def`` on (decorators left out), as Python tokens: comments,
  blank lines and spacing inside a line do not count, so reformatting or commenting the function
  does not change the fingerprint, while any change to what it does (a constant, a call, a
  default) does; when the source cannot be read (a function defined in an interactive session),
  its compiled code object instead (constants, names and bytecode, specific to the Python version);
- its arguments, bound to its signature with the defaults applied, as canonical JSON. Arguments
  must be ``None``, booleans, numbers, strings, paths, or lists, tuples and dicts of those (anything
  else has no stable text: pass ``fingerprint=``).

Not covered: globals, closures, files and helper functions the code reads or calls. When those
change the data, publish a new version, or pass ``fingerprint="..."``: an explicit fingerprint
is recorded as given (``explicit:...``) and replaces both parts.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import logging
import marshal
import os
import textwrap
import tokenize
from typing import Any, Callable

from lading.core.errors import UsageError

log = logging.getLogger(__name__)

_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}


def fingerprint(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], explicit: str | None = None
) -> str:
    """The build fingerprint of ``function(*args, **kwargs)`` (see the module docstring)."""
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit.strip():
            raise UsageError(f"fingerprint={explicit!r} must be a non-empty string")
        return "explicit:" + explicit.strip()
    target = inspect.unwrap(function)
    digest = hashlib.sha256(b"lading-fingerprint-1\n")
    digest.update(code_text(target).encode("utf-8", "surrogateescape"))
    digest.update(b"\n")
    digest.update(arguments_text(target, args, kwargs).encode("utf-8", "surrogateescape"))
    return "code:" + digest.hexdigest()


def code_text(function: Callable[..., Any]) -> str:
    """The function's tokens from ``def`` on, one per line; its code object when there is no source."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (OSError, TypeError, tokenize.TokenError, IndentationError, SyntaxError):
        return _code_object_text(function)
    start = 0
    while start < len(tokens) and tokens[start].type == tokenize.OP and tokens[start].string == "@":
        while start < len(tokens) and tokens[start].type != tokenize.NEWLINE:
            start += 1
        start += 1
        while start < len(tokens) and tokens[start].type in _SKIPPED:
            start += 1
    return "\n".join(f"{token.type}:{token.string}" for token in tokens[start:] if token.type not in _SKIPPED)


def _code_object_text(function: Callable[..., Any]) -> str:
    code = getattr(function, "__code__", None)
    if code is None:
        raise UsageError(
            f"cannot fingerprint {function!r}: no source and no code object",
            'pass fingerprint="..." (any string that changes when the data does)',
        )
    log.info(
        "no source for %s; fingerprinting its code object (Python-version specific)",
        getattr(function, "__qualname__", function),
    )
    return "code-object:" + hashlib.sha256(marshal.dumps(code)).hexdigest()


def arguments_text(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The call's arguments, bound and with defaults, as canonical JSON."""
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
    except TypeError as err:
        raise UsageError(f"cannot call {getattr(function, '__qualname__', function)}: {err}") from None
    except ValueError:  # no signature (a builtin): positional order is all there is
        return json.dumps(
            {
                "args": [_canonical(a, "argument") for a in args],
                "kwargs": {k: _canonical(v, k) for k, v in sorted(kwargs.items())},
            },
            sort_keys=True,
        )
    bound.apply_defaults()
    return json.dumps({name: _canonical(value, name) for name, value in bound.arguments.items()}, sort_keys=True)


def _canonical(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, os.PathLike):
        return {"path": os.fspath(value)}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_canonical(item, where) for item in value]}
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {"dict": {key: _canonical(item, where) for key, item in sorted(value.items())}}
    raise UsageError(
        f"argument {where!r} is a {type(value).__name__}, which has no stable text for the build fingerprint",
        'pass fingerprint="..." to cached(), or pass plain values (strings, numbers, lists, dicts)',
    )
