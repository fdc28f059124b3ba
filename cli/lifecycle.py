"""How every long-running command starts, serves and stops.

As uvicorn does: the first SIGINT/SIGTERM drains, and says so on stderr
(``draining 3 calls for up to 10 s; Ctrl-C again to stop now``); the second
stops at once; an idle process stops within a second. Ctrl-C while starting
(waiting for Redis, say) stops at once too. SIGHUP, where a command gives
``reload``, reloads (TLS certificates) without dropping connections.

A start that fails on something the user can fix prints one line and exits
2 (a busy port, a bad file or option) or 1 (a dependency that cannot be
reached), never a traceback; a traceback is for a bug.

:func:`serve` runs one service (the one lifecycle of ``rustext.service``,
plus :meth:`Service.draining` for the message) on the running loop: the
first signal calls its ``drain()``, the second its ``abort()``. Batch tools
(benchmarks, load generators) have the same two-step Ctrl-C through
``rustext.interrupt``.

With ``gc_threshold``, :func:`serve` also settles Python's cyclic garbage
collector once the service has started (:func:`settle_collector`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from rustext.net import ListenError, raise_open_files_limit

__all__ = ["GC_THRESHOLD", "Service", "StartError", "serve", "settle_collector"]

#: seconds a drain gets to finish once aborted (the second signal)
ABORT_GRACE = 5.0

#: the first-generation threshold a server runs with by default (Python's is 700)
GC_THRESHOLD = 10_000

S = TypeVar("S", bound="Service")


class StartError(Exception):
    """A start that failed for a reason the user can act on: the message is
    printed as is. ``status`` is the exit status (2: fix the command line or
    a file; 1: something it needs is not there)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


class Service(Protocol):
    """What :func:`serve` needs of a started command: a
    :class:`rustext.service.Service` that can say what its drain waits for."""

    def draining(self) -> str:
        """What the drain waits for, for the message of the first signal
        (``draining 3 calls for up to 10 s``); empty when nothing is in flight.
        Optional: without it the message says "stopping"."""

    async def drain(self, timeout: float | None = None) -> None:
        """Stop accepting, let work in flight finish within its own drain time, close."""

    def abort(self) -> None:
        """Stop now: make a :meth:`drain` in progress finish at once (drop
        what is in flight, skip the closing handshakes)."""


class _Signals:
    """Counts SIGINT/SIGTERM on the loop; ``first``/``second`` are set in turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop, reload: Callable[[], None] | None) -> None:
        self.loop = loop
        self.first = asyncio.Event()
        self.second = asyncio.Event()
        self._reload = reload
        self._installed: list[int] = []

    def __enter__(self) -> _Signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.loop.add_signal_handler(sig, self._on_stop)
            self._installed.append(sig)
        if self._reload is not None:
            self.loop.add_signal_handler(signal.SIGHUP, self._reload)
            self._installed.append(signal.SIGHUP)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig in self._installed:
            self.loop.remove_signal_handler(sig)

    def _on_stop(self) -> None:
        if self.first.is_set():
            self.second.set()
        else:
            self.first.set()


async def _race(aw: Awaitable[object], event: asyncio.Event) -> bool:
    """Await `aw` unless `event` comes first (then `aw` is cancelled): True if `aw` finished."""
    task = asyncio.ensure_future(aw)
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if task.done():
        task.result()  # re-raise its exception
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return False


def settle_collector(threshold: int) -> None:
    """Once a server has started: collect, freeze what survived (the imports,
    the configuration, the listeners: never garbage, so no later collection
    walks them) and raise the first generation's threshold to `threshold`.

    Why: a full collection walks every tracked object, and while thousands of
    clients connect the growing heap triggers one after another (seven over
    10,000 websocket connections, each a pause of the event loop). The first generation counts container objects
    allocated minus those freed, which a request path that frees what it
    allocates barely moves, so a higher threshold leaves that path as it is
    and makes the full collections of a growing heap rare.
    Memory stays bounded: cyclic garbage waits for at most ``threshold``
    net allocations instead of 700. 0 leaves the collector as Python set it.
    """
    if threshold < 0:
        raise ValueError(f"the collector's threshold must be 0 or more, got {threshold}")
    if threshold == 0:
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(threshold, *gc.get_threshold()[1:])


def say(prog: str, message: str) -> None:
    print(f"{prog}: {message}", file=sys.stderr, flush=True)


async def serve(
    prog: str,
    start: Callable[[], Awaitable[S]],
    *,
    ready: Callable[[S], None] | None = None,
    reload: Callable[[S], None] | None = None,
    wait: Callable[[S], Awaitable[object]] | None = None,
    gc_threshold: int = 0,
) -> int:
    """Start a service, serve until a signal (or until ``wait(service)``
    returns: the service ended by itself), drain, stop; returns the exit status
    (after ``wait`` returned: 1, or the int it returned, e.g. 0 for a planned end).

    ``ready`` runs once started (the start-up line); ``reload`` on SIGHUP;
    ``gc_threshold`` (0: none) is given to :func:`settle_collector` just before ``ready``.
    """
    loop = asyncio.get_running_loop()
    raise_open_files_limit()  # thousands of connections: not the distribution's 1024
    holder: list[S] = []

    def on_hup() -> None:
        if holder and reload is not None:
            reload(holder[0])

    with _Signals(loop, on_hup if reload is not None else None) as signals:
        try:
            started = await _race(_start(start, holder), signals.first)
        except ListenError as exc:
            say(prog, str(exc))
            return 2
        except StartError as exc:
            say(prog, str(exc))
            return exc.status
        if not started:
            say(prog, "stopped while starting")
            return 130
        service = holder[0]
        settle_collector(gc_threshold)
        if ready is not None:
            ready(service)
        ended = False
        status_after_wait: object = None
        if wait is not None:
            async def waited() -> None:
                nonlocal status_after_wait
                status_after_wait = await wait(service)

            ended = await _race(waited(), signals.first)
        else:
            await signals.first.wait()
        describe = getattr(service, "draining", None)
        what = describe() if describe is not None else ""
        if not ended:
            say(prog, f"{what}; Ctrl-C again to stop now" if what else "stopping")
        drain = asyncio.ensure_future(service.drain())
        second = asyncio.ensure_future(signals.second.wait())
        try:
            await asyncio.wait([drain, second], return_when=asyncio.FIRST_COMPLETED)
        finally:
            second.cancel()
        if not drain.done():
            say(prog, "stopping now")
            service.abort()
            try:
                async with asyncio.timeout(ABORT_GRACE):
                    await asyncio.shield(drain)
            except TimeoutError:
                say(prog, f"still stopping after {ABORT_GRACE:g} s; giving up")
                drain.cancel()
                return 1
            return 130
        drain.result()
        if not ended:
            return 0
        return status_after_wait if isinstance(status_after_wait, int) else 1


async def _start(start: Callable[[], Awaitable[S]], holder: list[S]) -> None:
    holder.append(await start())
