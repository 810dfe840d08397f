"""Per-process state in one registry, reset in a forked child.

Every client, pool, event loop and cache that must not cross a ``fork`` lives in a
:class:`ProcessLocal`. One ``os.register_at_fork(after_in_child=...)`` hook resets them all, so no
code checks ``os.getpid()`` before using its state.

The registry also tracks obstore's runtime, which is not fork-safe (one process-wide tokio
runtime, no fork handler: a child forked after it started hangs or panics on its first call):

- :func:`obstore_allowed` is False in a process forked after an ancestor started the runtime.
  Such a process reads through the SDKs and says so once (:func:`warn_fallback`).
- :func:`control_plane` marks reads made while a dataset is constructed (index, offsets,
  listing, stat). They go through the SDKs unless obstore already runs in this process, so a
  training process that only builds datasets never starts the runtime, and the DataLoader
  workers it forks can all use obstore.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import weakref
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

_holders: "weakref.WeakSet[ProcessLocal[Any]]" = weakref.WeakSet()
_holders_lock = threading.Lock()
#: Values a forked child inherited, kept and never dropped there: dropping one runs its
#: destructor, and obstore's may wait on a lock of the parent's runtime (tokio's task queue) that
#: a parent thread held at the fork and no thread of the child will ever release.
_inherited: list[Any] = []


class ProcessLocal(Generic[T]):
    """A value built on first use in each process, shared by that process's threads.

    The fork hook forgets the value (and replaces the lock) in a child; pickling drops it, so a
    dataset sent to a spawned worker builds its own there.
    """

    def __init__(self, factory: Callable[[], T] | None = None) -> None:
        self._factory = factory
        self._value: T | None = None
        self._lock = threading.Lock()
        with _holders_lock:
            _holders.add(self)

    def get(self, factory: Callable[[], T] | None = None) -> T:
        """This process's value, built by ``factory`` (or the constructor's) if there is none."""
        value = self._value
        if value is None:
            with self._lock:
                value = self._value
                if value is None:
                    build = factory or self._factory
                    if build is None:
                        raise RuntimeError("ProcessLocal.get() needs a factory")
                    value = self._value = build()
        return value

    @property
    def built(self) -> bool:
        """Whether this process holds a value (for tests and diagnostics)."""
        return self._value is not None

    def reset(self) -> None:
        """Forget the value (it is stale; this process built it)."""
        self._value = None
        self._lock = threading.Lock()

    def _forget_inherited(self) -> None:
        """In a forked child: forget the parent's value without dropping it (see ``_inherited``)."""
        if self._value is not None:
            _inherited.append(self._value)
        self.reset()

    def __getstate__(self) -> dict[str, Any]:
        return {"factory": self._factory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["factory"])  # type: ignore[misc]


class _Runtime:
    """What this process knows of obstore's runtime."""

    def __init__(self) -> None:
        self.started_pid: int | None = None
        self.inherited = False  # forked after an ancestor started it
        self.warned = False


_runtime = _Runtime()
_plane: contextvars.ContextVar[bool] = contextvars.ContextVar("lading_control_plane", default=False)
#: obstore's runtime starts one worker thread per core per process unless capped (tokio reads
#: ``TOKIO_WORKER_THREADS`` once, when the runtime starts). A process that uses lading keeps every
#: core (``lading sync``); a child forked from it (a DataLoader worker, one of many per node) gets
#: this many unless the variable says otherwise. The cap is set by the fork hook, in the child,
#: while it has one thread: nothing else is running to read the environment at that moment.
RUNTIME_THREADS = 2


def obstore_allowed() -> bool:
    """False in a process forked after obstore's runtime started in an ancestor."""
    return not _runtime.inherited


def obstore_started_here() -> bool:
    """Whether this process has started obstore's runtime."""
    return _runtime.started_pid == os.getpid()


def note_obstore_start() -> None:
    """Call before the first obstore call of a process: records the runtime's owner."""
    if _runtime.started_pid is None:
        _runtime.started_pid = os.getpid()


def use_obstore() -> bool:
    """Whether a read in this process and context should go through obstore."""
    if _runtime.inherited:
        return False
    return not _plane.get() or obstore_started_here()


@contextlib.contextmanager
def control_plane() -> Iterator[None]:
    """Reads inside go through the SDKs unless obstore already runs in this process (see the
    module docstring). Used by dataset constructors."""
    token = _plane.set(True)
    try:
        yield
    finally:
        _plane.reset(token)


def warn_fallback(what: str) -> None:
    """Log, once per process, that reads go through the SDK because obstore cannot run here."""
    if _runtime.warned:
        return
    _runtime.warned = True
    log.warning(
        "process %d was forked after obstore started in its parent (obstore is not fork-safe), so "
        "%s reads through the SDK here, at several times the CPU per request. Do not read data in "
        "the training process before DataLoader workers start, or pass "
        'multiprocessing_context="forkserver" (or "spawn") to the DataLoader.',
        os.getpid(),
        what,
    )


def _after_fork_in_child() -> None:
    if "TOKIO_WORKER_THREADS" not in os.environ:  # a value the user set wins
        os.environ["TOKIO_WORKER_THREADS"] = str(RUNTIME_THREADS)
    _runtime.inherited = _runtime.inherited or _runtime.started_pid is not None
    _runtime.started_pid = None
    _runtime.warned = False
    global _holders_lock
    _holders_lock = threading.Lock()
    for holder in list(_holders):
        holder._forget_inherited()


os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = [
    "ProcessLocal",
    "RUNTIME_THREADS",
    "control_plane",
    "note_obstore_start",
    "obstore_allowed",
    "obstore_started_here",
    "use_obstore",
    "warn_fallback",
]
