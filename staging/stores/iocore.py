"""The I/O core: one asyncio event loop per process, on its own thread, where object reads run.

Callers on any thread hand it coroutines: :meth:`IOCore.run` for one, :meth:`IOCore.run_all`
for a batch (one hop to the loop, the requests concurrent inside it, bounded by a semaphore).
The loop is built on first use in each process (:func:`io_core`), never inherited across a
fork (:mod:`lading.stores.process`).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
import time
from typing import Any, Awaitable, Callable, Coroutine, Sequence, TypeVar

from lading.stores.process import ProcessLocal

T = TypeVar("T")

#: Seconds the interpreter's exit waits, once the loop stopped, for runtime threads to leave Python.
_EXIT_GRACE = 0.05
#: Requests in flight at once per process. Enough to hide a round trip behind many small GETs;
#: few enough that a batch of large ones does not hold more than a few hundred MB.
MAX_REQUESTS = 64


class IOCore:
    """An event loop on a daemon thread, and a bound on the requests it runs at once."""

    def __init__(self, max_requests: int = MAX_REQUESTS) -> None:
        self.max_requests = max_requests
        self._pid = os.getpid()
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._slots: asyncio.Semaphore | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="lading-io", daemon=True)
        self._thread.start()
        ready.wait()
        # Requests still in flight when the interpreter shuts down would complete into a
        # finalizing interpreter (an abort): let them finish and stop the loop first.
        atexit.register(self.close)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._slots = asyncio.Semaphore(self.max_requests)
        ready.set()
        self._loop.run_forever()

    async def bounded(self, work: Awaitable[T]) -> T:
        """``work`` once a request slot is free (inside the loop)."""
        assert self._slots is not None
        async with self._slots:
            return await work

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run one coroutine on the loop and wait for its result (from any other thread)."""
        if threading.current_thread() is self._thread:
            work.close()
            raise RuntimeError("IOCore.run called from the I/O loop itself")
        if self._closing:  # a daemon thread still reading while the interpreter exits
            work.close()
            raise RuntimeError("the I/O core is shut down: the interpreter is exiting")
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        return _wait(future)

    def spawn(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start one coroutine on the loop and return at once (from any other thread): for callers
        that wait on their own terms, such as the mount's readers waiting on many GETs at once."""
        if self._closing:
            work.close()
            raise RuntimeError("the I/O core is shut down: the interpreter is exiting")
        return asyncio.run_coroutine_threadsafe(work, self._loop)

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        """Run a plain callback on the loop, from any other thread, and return at once: one wake-up
        of the loop and no future (for callers that learn the outcome their own way, such as the
        mount's reader starting the GETs its readers queued)."""
        if self._closing:
            raise RuntimeError("the I/O core is shut down: the interpreter is exiting")
        self._loop.call_soon_threadsafe(callback, *args)

    def run_all(self, works: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
        """Run a batch concurrently (at most ``max_requests`` at a time); results in order. The
        first failure is raised once every request of the batch has ended."""
        if not works:
            return []
        return self.run(self._gather(works))

    async def _gather(self, works: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
        results = await asyncio.gather(*(self.bounded(work) for work in works), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]

    def close(self, timeout: float = 10.0, grace: float = _EXIT_GRACE) -> None:
        """Let what is in flight finish, then stop the loop (at exit; a forked child's copy of its
        parent's core is left alone).

        Requests are not cancelled: obstore's Rust side would still complete a cancelled one
        later, calling into an interpreter that is finalizing, which aborts the process. Only
        requests still running after ``timeout`` are cancelled. ``grace``: see :func:`shutdown`."""
        if self._pid != os.getpid() or not self._thread.is_alive():
            return
        self._closing = True  # from here on no new request starts (see run)
        try:
            asyncio.run_coroutine_threadsafe(_settle(), self._loop).result(timeout=timeout)
        except Exception:  # noqa: BLE001 - best effort at exit
            try:
                asyncio.run_coroutine_threadsafe(_cancel_all(), self._loop).result(timeout=timeout)
            except Exception:  # noqa: BLE001
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=timeout)
        # A runtime thread that delivered the last result may still be inside the loop's wake-up
        # write, without the GIL; if it wants the GIL back once finalization has begun, the process
        # aborts. Holding off a moment (the GIL released) lets it finish first.
        if grace:
            time.sleep(grace)


async def _settle() -> None:
    """Wait until every other task of the running loop has ended (new ones included)."""
    current = asyncio.current_task()
    while True:
        await asyncio.sleep(0)  # requests submitted just before closing become tasks first
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        if not tasks:
            return
        await asyncio.wait(tasks)


async def _cancel_all() -> None:
    """Cancel every other task of the running loop and wait until they have ended."""
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _wait(future: concurrent.futures.Future[T]) -> T:
    # Ctrl-C in the caller leaves the request running to its end on the loop (its result dropped):
    # cancelling it would let obstore complete it later into an interpreter that may be finalizing.
    # At exit, close() waits for it.
    return future.result()


_core: ProcessLocal[IOCore] = ProcessLocal(IOCore)


def io_core() -> IOCore:
    """This process's I/O core (started on first use)."""
    return _core.get()


def shutdown(grace: bool = True) -> None:
    """Stop this process's I/O core, if it started, letting requests in flight finish (what the
    interpreter's exit does). ``grace=False`` for a process about to leave with ``os._exit``
    (the command line): no runtime thread can meet a finalizing interpreter there, so the exit
    does not hold off for one."""
    if _core.built:
        _core.get().close(grace=_EXIT_GRACE if grace else 0.0)


__all__ = ["IOCore", "MAX_REQUESTS", "io_core", "shutdown"]
