"""Callee runtime: run registered functions for calls popped from a broker.

A :class:`CalleeApp` maps URIs to functions; a :class:`Callee` serves an app
over any :class:`~juggler.broker.base.CalleeBroker` (Redis for a separate
process, the in-memory broker inside ``juggler up``).

Function kinds (``CalleeApp.register``):

- ``raw=False`` (default): the function gets the decoded JSON ``args``
  (``None`` when the CALL had none) and returns any JSON-serialisable value.
- ``raw=True``: it gets the raw JSON bytes (or ``None``) and returns raw JSON
  (``bytes``/``str``), which is stored as is: nothing is decoded or
  re-encoded (the fast path of the test callees).
- Coroutine functions run on the event loop. Plain functions run in a thread
  pool of ``workers`` threads, unless registered ``inline=True`` (cheap,
  non-blocking functions run directly on the loop).

Contract:

- At most ``workers`` calls run at once; the callee pulls a call from the
  broker only when a worker is free.
- TTL-aware: a call that has expired before it starts is skipped; a result
  is stored only while the call has time left, and with that remaining time
  as its TTL (upstream semantics). Skipped calls and dropped results are
  counted in ``stats.expired``.
- An exception raised by a function (or an unknown URI, a bad return value)
  becomes the result ``{"error":{"message":"..."}}`` — never a crash.
- ``drain()`` stops taking calls, lets running calls finish within a
  deadline, then cancels the rest; ``aclose()`` is idempotent.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rustext.backoff import Backoff
from rustext.service import ServiceBase
from rustext.throttledlog import ThrottledLog

from juggler.broker.base import Call, CalleeBroker, CapacityExceeded, Result

__all__ = [
    "Callee",
    "CalleeApp",
    "CalleeStats",
    "error_result",
    "load_app",
    "make_test_app",
]

log = logging.getLogger("juggler.callee")

Function = Callable[[Any], Any] | Callable[[Any], Awaitable[Any]]


def error_result(message: str) -> bytes:
    """The raw JSON of a callee error, as upstream: ``{"error":{"message":...}}``."""
    return json.dumps({"error": {"message": message}}, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class _Entry:
    fn: Function
    raw: bool
    is_async: bool
    inline: bool


class CalleeApp:
    """A registry of functions by URI (what ``--app module:object`` names)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def register(
        self, uri: str, fn: Function | None = None, *, raw: bool = False, inline: bool = False
    ) -> Any:
        """Register `fn` for `uri`; usable as a decorator (``@app.register("x")``).

        Registering a URI twice replaces the function.
        """
        if not uri:
            raise ValueError("empty URI")

        def add(f: Function) -> Function:
            is_async = inspect.iscoroutinefunction(f)
            self._entries[uri] = _Entry(fn=f, raw=raw, is_async=is_async, inline=inline and not is_async)
            return f

        return add if fn is None else add(fn)

    @property
    def uris(self) -> list[str]:
        return list(self._entries)

    def get(self, uri: str) -> _Entry | None:
        return self._entries.get(uri)

    def __contains__(self, uri: object) -> bool:
        return uri in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def from_mapping(cls, functions: Mapping[str, Function]) -> CalleeApp:
        app = cls()
        for uri, fn in functions.items():
            app.register(uri, fn)
        return app


def load_app(spec: str) -> CalleeApp:
    """Load ``module:object`` where object is a CalleeApp, a mapping URI→function,
    or a zero-argument callable returning one of those."""
    from rustext.appspec import import_object

    obj = import_object(spec)
    if callable(obj) and not isinstance(obj, CalleeApp) and not isinstance(obj, Mapping):
        obj = obj()
    if isinstance(obj, CalleeApp):
        return obj
    if isinstance(obj, Mapping):
        return CalleeApp.from_mapping(obj)
    raise TypeError(f"{spec} is neither a CalleeApp nor a mapping of URI to function")


# --- test callees -----------------------------------------------------------

_INT = re.compile(rb'^"\s*([+-]?[0-9]{1,18})\s*"$')


def _echo(args: bytes | None) -> bytes:
    if args is None:
        raise ValueError("test.echo: missing argument (a JSON string)")
    if not args.lstrip().startswith(b'"'):
        raise ValueError("test.echo: the argument must be a JSON string")
    return args


def _reverse(args: bytes | None) -> bytes:
    if args is None:
        raise ValueError("test.reverse: missing argument (a JSON string)")
    value = json.loads(args)
    if not isinstance(value, str):
        raise ValueError("test.reverse: the argument must be a JSON string")
    return json.dumps(value[::-1], ensure_ascii=False).encode()


async def _delay(args: bytes | None) -> bytes:
    if args is None:
        raise ValueError("test.delay: missing argument (a JSON string holding an integer of ms)")
    m = _INT.match(args.strip())
    if m is None:
        raise ValueError(f"test.delay: the argument must be a JSON string holding an integer, got {args[:64].decode(errors='replace')}")
    ms = int(m.group(1))
    if ms > 0:
        await asyncio.sleep(ms / 1000)
    return b"%d" % ms


def make_test_app(extra_delay: int = 0) -> CalleeApp:
    """The test callees: ``test.echo`` (returns its string), ``test.reverse``
    (reverses it by code point), ``test.delay`` (argument a JSON string of ms:
    sleeps, returns the integer) and ``test.delay.0 .. test.delay.<N-1>``."""
    app = CalleeApp()
    app.register("test.echo", _echo, raw=True, inline=True)
    app.register("test.reverse", _reverse, raw=True, inline=True)
    app.register("test.delay", _delay, raw=True)
    for i in range(extra_delay):
        app.register(f"test.delay.{i}", _delay, raw=True)
    return app


def _is_invalid_result(exc: BaseException) -> bool:
    """The broker refused a result because it is not JSON (the codec's ValueError)."""
    return isinstance(exc, ValueError) or str(exc).startswith("invalid result")


# --- the runtime ------------------------------------------------------------


@dataclass(slots=True)
class CalleeStats:
    """Counters since start (read them any time)."""

    calls: int = 0  # calls taken from the broker
    results: int = 0  # results stored
    errors: int = 0  # results that are {"error":...}
    expired: int = 0  # calls skipped or results dropped because the TTL ran out
    store_failures: int = 0  # results the broker failed to store until their call's deadline
    store_retries: int = 0  # results stored after their first attempt failed
    running: int = 0  # calls being executed now


class Callee(ServiceBase):
    """Serve a :class:`CalleeApp` over a :class:`CalleeBroker` with `workers` slots."""

    def __init__(
        self,
        broker: CalleeBroker,
        app: CalleeApp | Mapping[str, Function],
        *,
        workers: int = 50,
        uris: Iterable[str] | None = None,
        logger: logging.Logger | None = None,
        tracing: Any = None,
        drain_timeout: float = 10.0,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.broker = broker
        self.app = app if isinstance(app, CalleeApp) else CalleeApp.from_mapping(app)
        self.uris = list(uris) if uris is not None else self.app.uris
        if not self.uris:
            raise ValueError("no URI to serve")
        self.workers = workers
        #: seconds running calls get to finish when the callee drains
        self.drain_timeout = drain_timeout
        self.stats = CalleeStats()
        #: a ``juggler.tracing.CalleeTracing`` (a span per call), or None
        self.tracing = tracing
        self._log = logger or log
        self._warn = ThrottledLog(self._log)
        self._slots = _Slots(workers)
        self._running: set[asyncio.Task[None]] = set()
        self._pump: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._outbox: list[tuple[Result, int]] = []
        self._flush_scheduled = False
        self._flushing: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._closed = False

    # lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Start pulling calls (idempotent)."""
        if self._pump is None:
            self._pump = asyncio.create_task(self._run_pump(), name="juggler-callee-pump")

    async def wait(self) -> None:
        """Wait until the pump stops (broker closed, or drain())."""
        if self._pump is not None:
            await asyncio.shield(self._pump)

    async def drain(self, timeout: float | None = None) -> None:
        """Stop taking calls (those popped and not started go back to Redis);
        wait up to `timeout` s (None: ``drain_timeout``) for running calls and
        their results, then cancel what still runs; release the thread pool.
        Idempotent (see rustext.service)."""
        if timeout is None:
            timeout = self.drain_timeout
        self._stopping = True
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            await asyncio.wait([self._pump])
        self._flush_outbox()
        if self._running or self._flushing:
            done, pending = await asyncio.wait(self._running | self._flushing, timeout=timeout)
            for t in pending:
                t.cancel()
            if pending:
                self._log.warning("drain: cancelled %d running calls after %ss", len(pending), timeout)
                await asyncio.wait(pending, timeout=1.0)
        if not self._closed:
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)

    def abort(self) -> None:
        """Stop now: no more calls taken, running ones cancelled (a drain under
        way then ends at once)."""
        self._stopping = True
        if self._pump is not None:
            self._pump.cancel()
        for task in list(self._running):
            task.cancel()

    # internals ------------------------------------------------------------------

    async def _run_pump(self) -> None:
        """One call stream per group of URIs the broker can pop together
        (one on one Redis; one per hash slot on a Redis Cluster)."""
        split = getattr(self.broker, "call_groups", None)
        groups = split(self.uris) if split is not None else [self.uris]
        if len(groups) == 1:
            await self._run_stream(groups[0])
            return
        tasks = [asyncio.ensure_future(self._run_stream(g)) for g in groups]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks)

    async def _run_stream(self, uris: list[str]) -> None:
        loop = asyncio.get_running_loop()
        calls = self.broker.calls(uris)
        it = calls.__aiter__()
        try:
            slots = self._slots
            while not self._stopping:
                if not slots.try_take():
                    await slots.take()
                try:
                    call = await it.__anext__()
                except StopAsyncIteration:
                    self._slots.release()
                    break
                except BaseException:
                    self._slots.release()
                    raise
                deadline = loop.time() + call.ttl_ms / 1000.0
                self.stats.calls += 1
                entry = self.app.get(call.uri)
                if entry is not None and entry.inline and self.tracing is None:
                    # fast path: cheap functions run right here, no task per call;
                    # their results are stored in batches once per loop turn
                    try:
                        self._run_inline(call, entry, deadline, loop)
                    finally:
                        slots.release()
                    continue
                task = loop.create_task(self._execute(call, deadline))
                self._running.add(task)
                task.add_done_callback(self._done)
        except asyncio.CancelledError:
            raise
        except Exception:
            self._log.exception("callee: the broker's call stream failed")
            raise
        finally:
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                try:
                    await asyncio.shield(aclose())
                except Exception:
                    self._log.exception("callee: closing the call stream failed")

    def _run_inline(self, call: Call, entry: _Entry, deadline: float, loop: asyncio.AbstractEventLoop) -> None:
        if loop.time() >= deadline:
            self.stats.expired += 1
            return
        args = self._call_sync(call, entry)
        remaining_ms = int((deadline - loop.time()) * 1000)
        if remaining_ms <= 0:
            self.stats.expired += 1
            return
        self._outbox.append(
            (Result(conn_uuid=call.conn_uuid, msg_uuid=call.msg_uuid, uri=call.uri, args=args), remaining_ms)
        )
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush_outbox)

    def _flush_outbox(self) -> None:
        self._flush_scheduled = False
        batch, self._outbox = self._outbox, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._store_batch(batch))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)

    async def _store_batch(self, batch: list[tuple[Result, int]]) -> None:
        started = asyncio.get_running_loop().time()
        send_many = getattr(self.broker, "send_results", None)
        if send_many is not None:
            try:
                outcomes = await send_many(batch)
            except Exception as exc:
                outcomes = [exc] * len(batch)
        else:
            outcomes = await asyncio.gather(
                *(self.broker.send_result(r, ttl) for r, ttl in batch), return_exceptions=True
            )
        retries = []
        for (result, ttl_ms), outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if _is_invalid_result(outcome):
                    await self._store_invalid(result, ttl_ms)
                    continue
                retries.append(self._store_until(result, started + ttl_ms / 1000, outcome))
            else:
                self.stats.results += 1
        if retries:
            await asyncio.gather(*retries)

    async def _store_until(self, result: Result, deadline: float, first: BaseException) -> None:
        """A result whose storing failed (Redis lost, say): tried again with a
        backoff until it is stored or its call's deadline passes. A result is
        never dropped while its caller may still get it."""
        loop = asyncio.get_running_loop()
        backoff = Backoff()
        exc: BaseException = first
        while not isinstance(exc, CapacityExceeded) and not _is_invalid_result(exc):
            wait = min(backoff.next_delay(), deadline - loop.time())
            if wait <= 0:
                break
            await asyncio.sleep(wait)
            remaining_ms = int((deadline - loop.time()) * 1000)
            if remaining_ms <= 0:
                break
            try:
                await self.broker.send_result(result, remaining_ms)
            except Exception as again:
                exc = again
                continue
            self.stats.results += 1
            self.stats.store_retries += 1
            return
        self.stats.store_failures += 1
        self._warn.warning("storing the result of %s %s failed until its deadline: %s", result.msg_uuid, result.uri,
                           exc, key="store")

    async def _store_invalid(self, result: Result, ttl_ms: int) -> None:
        """A function returned something that is not JSON: the caller gets an error result."""
        self.stats.errors += 1
        try:
            await self.broker.send_result(
                Result(conn_uuid=result.conn_uuid, msg_uuid=result.msg_uuid, uri=result.uri,
                       args=error_result("the function's result is not valid JSON")),
                ttl_ms,
            )
            self.stats.results += 1
        except Exception as exc:
            self.stats.store_failures += 1
            self._log.warning("storing the result of %s %s failed: %s", result.msg_uuid, result.uri, exc)

    def _call_sync(self, call: Call, entry: _Entry) -> bytes:
        try:
            value = entry.fn(call.args if entry.raw else (None if call.args is None else json.loads(call.args)))
            return self._encode(entry, value)
        except Exception as exc:
            self.stats.errors += 1
            return error_result(str(exc) or type(exc).__name__)

    @staticmethod
    def _encode(entry: _Entry, value: Any) -> bytes:
        if entry.raw:
            if isinstance(value, str):
                value = value.encode()
            if not isinstance(value, bytes | bytearray | memoryview):
                raise TypeError(f"a raw function must return JSON bytes, got {type(value).__name__}")
            return bytes(value)
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._slots.release()

    async def _execute(self, call: Call, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline:
            self.stats.expired += 1
            return
        self.stats.running += 1
        try:
            if self.tracing is None:
                args = await self._invoke(call)
            else:
                args = await self.tracing.invoke(call, self._invoke)
        finally:
            self.stats.running -= 1
        remaining_ms = int((deadline - loop.time()) * 1000)
        if remaining_ms <= 0:
            self.stats.expired += 1
            self._log.debug("expired call %s %s: no result stored", call.msg_uuid, call.uri)
            return
        result = Result(conn_uuid=call.conn_uuid, msg_uuid=call.msg_uuid, uri=call.uri, args=args)
        try:
            await self.broker.send_result(result, remaining_ms)
        except Exception as exc:
            if _is_invalid_result(exc):
                await self._store_invalid(result, remaining_ms)
                return
            await self._store_until(result, deadline, exc)
            return
        self.stats.results += 1

    async def _invoke(self, call: Call) -> bytes:
        entry = self.app.get(call.uri)
        if entry is None:
            self.stats.errors += 1
            return error_result(f"no function registered for URI {call.uri!r}")
        try:
            if entry.raw:
                arg: Any = call.args
            else:
                arg = None if call.args is None else json.loads(call.args)
            if entry.is_async:
                value = await entry.fn(arg)  # type: ignore[misc]
            elif entry.inline:
                value = entry.fn(arg)
            else:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="juggler-callee")
                value = await asyncio.get_running_loop().run_in_executor(self._executor, entry.fn, arg)
            return self._encode(entry, value)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.stats.errors += 1
            message = str(exc) or type(exc).__name__
            return error_result(message)


class _Slots:
    """The callee's ``workers`` slots: a counting semaphore whose uncontended
    take is a plain method call. The callee takes one per call, and
    ``asyncio.Semaphore`` costs a coroutine and a few calls each time."""

    def __init__(self, n: int) -> None:
        self.free = n
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_take(self) -> bool:
        """Take a slot if one is free now (and nobody waits for one)."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        """Wait for a slot: a release hands it over directly."""
        if self.try_take():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed over as the wait was cancelled: pass it on
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def release(self) -> None:
        """Give a slot back, to the first waiter if there is one."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1
