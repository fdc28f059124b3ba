"""The in-memory broker: one process, the embedded default of ``juggler up``.

Same semantics as the Redis broker (``redis.py``), without Redis:

- calls queue per URI (FIFO, like LPUSH + BRPOP) with a deadline each; a
  call popped after its deadline is dropped and counted (``expired_calls``),
  never handed to a callee; at most ``call_cap`` calls wait per URI, past that
  ``call`` raises :class:`CapacityExceeded` ("list capacity exceeded");
- results are stored with the TTL the callee gives (its call's remaining
  time) and popped by the process's one results sink in batches, once per
  event-loop turn; a result whose TTL ran out by then is dropped and counted
  (``expired_results``); at most ``result_cap`` wait;
- pub-sub with Redis semantics: exact channels and Redis glob patterns; a
  message matching a channel and a pattern subscription of the same
  subscriber is delivered twice (only the pattern one carries ``pattern``);
  subscribing twice counts once and one unsubscribe removes it; counts of
  distinct channels/patterns subscribed are kept like Redis's;
- ``args`` stay raw JSON bytes; like the Redis path (which builds and parses
  payloads), they are validated and normalized on the way in.

Time comes from an injectable ``clock`` (seconds, monotonic) so tests can
control expiry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import rustext

from juggler.broker.base import (
    BrokerBase,
    BrokerError,
    NoCallee,
    Call,
    CapacityExceeded,
    Event,
    EventHandler,
    Result,
    ResultHandler,
)
from juggler.broker.glob import glob_match
from juggler.broker.history import HistoryPage, MemoryHistory
from juggler.channels import ChannelOptions

__all__ = ["MemoryBroker", "MemoryBrokerConfig", "MemoryBrokerStats"]

log = logging.getLogger("juggler.broker.memory")

CAPACITY_MESSAGE = "list capacity exceeded"


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBrokerConfig:
    """In-memory broker options: queue capacities (Redis semantics in one process)."""

    #: max calls waiting per URI (more: NACK 500 "list capacity exceeded"); 0 = unbounded
    call_cap: int = 10_000
    #: max results waiting for the sink; 0 = unbounded
    result_cap: int = 100_000
    #: the routing key put in calls (a fresh UUID when None)
    conn_uuid: str | None = None
    #: refuse (NACK 404 "no callee serves URI") calls to URIs no callee of this process serves,
    #: instead of letting them wait until they expire
    refuse_unserved: bool = True

    def __post_init__(self) -> None:
        if self.call_cap < 0 or self.result_cap < 0:
            raise ValueError("capacities must be >= 0")


@dataclass(slots=True)
class MemoryBrokerStats:
    """The same counters as RedisBrokerStats."""

    calls: int = 0
    call_failures: int = 0
    results_received: int = 0
    expired_results: int = 0
    calls_popped: int = 0
    expired_calls: int = 0
    results_sent: int = 0
    published: int = 0
    events: int = 0
    redis_subscriptions: int = 0  # distinct channels + patterns subscribed


@dataclass(slots=True)
class _Waiter:
    uris: list[str]
    wake: asyncio.Future[None] | None = None


@dataclass(slots=True)
class _Subs:
    handlers: dict[object, EventHandler] = field(default_factory=dict)


class MemoryBroker(BrokerBase):
    """CallerBroker + CalleeBroker + PubSubBroker in one process (see module doc).

    Lifecycle: ``await start()``, use, ``await aclose()`` (idempotent: ends
    every ``calls()`` stream, drops what is queued). Async context manager.
    """

    def __init__(
        self,
        config: MemoryBrokerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        **kw: object,
    ) -> None:
        self.config = config or MemoryBrokerConfig(**kw)  # type: ignore[arg-type]
        self._clock = clock
        self._history = MemoryHistory(clock)
        self._conn_uuid = self.config.conn_uuid or rustext.new_uuid()
        self.stats = MemoryBrokerStats()
        # uri -> deque of (deadline, msg_uuid, conn_uuid, args, trace); append left, pop right
        self._calls: dict[str, deque[tuple[float, str, str, bytes | None]]] = {}
        self._waiters: dict[str, list[_Waiter]] = {}
        self._registered = asyncio.Event()  # set when a callee stream registers
        self._results: list[tuple[float, Result]] = []
        self._flush_scheduled = False
        self._result_handler: ResultHandler | None = None
        self._channels: dict[str, _Subs] = {}
        self._patterns: dict[str, _Subs] = {}
        self._by_subscriber: dict[object, set[tuple[bool, str]]] = {}
        self._closed = False

    # lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for waiters in self._waiters.values():
            for w in waiters:
                if w.wake is not None and not w.wake.done():
                    w.wake.set_result(None)
        self._calls.clear()
        self._results.clear()

    # CallerBroker ---------------------------------------------------------------

    @property
    def conn_uuid(self) -> str:
        return self._conn_uuid

    async def call(
        self, msg_uuid: str, uri: str, args: bytes | None, timeout_ms: int, *, trace: bytes | None = None
    ) -> None:
        self.push_call(msg_uuid, uri, args, timeout_ms, trace=trace)

    def push_call(
        self, msg_uuid: str, uri: str, args: bytes | None, timeout_ms: int, *, trace: bytes | None = None
    ) -> None:
        """Synchronous form of :meth:`call` (the server's fast path)."""
        if self._closed:
            self.stats.call_failures += 1
            raise BrokerError("broker closed")
        if timeout_ms <= 0:
            self.stats.call_failures += 1
            raise BrokerError(f"invalid call timeout: {timeout_ms} ms")
        if args is not None:
            try:
                args = rustext.normalize_json(args)
            except ValueError as exc:
                self.stats.call_failures += 1
                raise BrokerError(f"invalid args: {exc}") from exc
        if self.config.refuse_unserved and uri not in self._waiters:
            self.stats.call_failures += 1
            raise NoCallee(f"no callee serves {uri}")
        q = self._calls.get(uri)
        if q is None:
            q = self._calls[uri] = deque()
        cap = self.config.call_cap
        if cap and len(q) >= cap:
            self.stats.call_failures += 1
            raise CapacityExceeded(CAPACITY_MESSAGE)
        q.appendleft((self._clock() + timeout_ms / 1000.0, msg_uuid, self._conn_uuid, args, trace))
        self.stats.calls += 1
        waiters = self._waiters.get(uri)
        if waiters:
            for w in waiters:
                if w.wake is not None and not w.wake.done():
                    w.wake.set_result(None)
                    break

    def serves(self, uri: str) -> bool:
        """Whether a callee of this process takes calls for ``uri`` now."""
        return uri in self._waiters

    async def until_served(self, uris: list[str]) -> None:
        """Wait until callees take calls for every one of ``uris`` (a callee
        registers when its stream first asks for a call)."""
        while not all(u in self._waiters for u in uris):
            self._registered.clear()
            await self._registered.wait()

    def on_result(self, handler: ResultHandler) -> None:
        self._result_handler = handler
        if self._results:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_results)

    def _flush_results(self) -> None:
        self._flush_scheduled = False
        handler = self._result_handler
        if handler is None or not self._results:
            return
        batch, self._results = self._results, []
        now = self._clock()
        for deadline, result in batch:
            if deadline <= now:
                self.stats.expired_results += 1
                continue
            self.stats.results_received += 1
            try:
                handler(result)
            except Exception:
                log.exception("result handler failed")

    # CalleeBroker ---------------------------------------------------------------

    async def calls(self, uris: list[str]) -> AsyncIterator[Call]:  # type: ignore[override]
        """Yield unexpired calls for `uris` (checked in order, like BRPOP) until closed."""
        if not uris:
            raise ValueError("no URI")
        uris = list(uris)
        waiter = _Waiter(uris)
        for u in uris:
            self._waiters.setdefault(u, []).append(waiter)
        self._registered.set()
        loop = asyncio.get_running_loop()
        try:
            while not self._closed:
                call = self._pop(uris)
                if call is not None:
                    yield call
                    continue
                waiter.wake = loop.create_future()
                try:
                    await waiter.wake
                finally:
                    waiter.wake = None
        finally:
            for u in uris:
                ws = self._waiters.get(u)
                if ws is not None:
                    try:
                        ws.remove(waiter)
                    except ValueError:
                        pass
                    if not ws:
                        del self._waiters[u]

    def _pop(self, uris: list[str]) -> Call | None:
        now = self._clock()
        for u in uris:
            q = self._calls.get(u)
            while q:
                deadline, msg_uuid, conn_uuid, args, trace = q.pop()
                left = int((deadline - now) * 1000)
                if left <= 0:
                    self.stats.expired_calls += 1
                    continue
                self.stats.calls_popped += 1
                return Call(conn_uuid=conn_uuid, msg_uuid=msg_uuid, uri=u, args=args, ttl_ms=left, trace=trace)
        return None

    async def send_result(self, result: Result, ttl_ms: int) -> None:
        if ttl_ms <= 0:
            return
        if self._closed:
            raise BrokerError("broker closed")
        if result.args is not None:
            try:
                result = Result(
                    conn_uuid=result.conn_uuid, msg_uuid=result.msg_uuid, uri=result.uri,
                    args=rustext.normalize_json(result.args),
                )
            except ValueError as exc:
                raise BrokerError(f"invalid result args: {exc}") from exc
        if result.conn_uuid != self._conn_uuid:
            # nobody in this process pops that list: like a Redis list nobody reads
            self.stats.expired_results += 1
            return
        cap = self.config.result_cap
        if cap and len(self._results) >= cap:
            raise CapacityExceeded(CAPACITY_MESSAGE)
        self._results.append((self._clock() + ttl_ms / 1000.0, result))
        self.stats.results_sent += 1
        if self._result_handler is not None:
            self._schedule_flush()

    # PubSubBroker ---------------------------------------------------------------

    async def publish(self, channel: str, msg_uuid: str, args: bytes | None) -> None:
        self.publish_now(channel, msg_uuid, args)

    def publish_now(self, channel: str, msg_uuid: str, args: bytes | None,
                    position: tuple[int, str] | None = None) -> int:
        """Synchronous publish; returns the number of deliveries (Redis's PUBLISH reply)."""
        if self._closed:
            raise BrokerError("broker closed")
        args = _normalized(args)
        self.stats.published += 1
        offset, epoch = position if position is not None else (None, None)
        n = 0
        subs = self._channels.get(channel)
        if subs is not None and subs.handlers:
            n += self._deliver(subs, Event(channel=channel, pattern=None, msg_uuid=msg_uuid, args=args,
                                           offset=offset, epoch=epoch))
        if self._patterns:
            for pattern, subs in list(self._patterns.items()):
                if subs.handlers and glob_match(pattern, channel):
                    n += self._deliver(subs, Event(channel=channel, pattern=pattern, msg_uuid=msg_uuid, args=args,
                                                   offset=offset, epoch=epoch))
        return n

    async def publish_history(self, channel: str, msg_uuid: str, args: bytes | None,
                              opts: ChannelOptions) -> tuple[int, str]:
        """Store the publication in the channel's history and publish it; returns (offset, epoch)."""
        if self._closed:
            raise BrokerError("broker closed")
        args = _normalized(args)
        event = self._history.append(channel, msg_uuid, args, opts)
        assert event.offset is not None and event.epoch is not None
        self.publish_now(channel, msg_uuid, args, (event.offset, event.epoch))
        return event.offset, event.epoch

    async def read_history(self, channel: str, after: int, limit: int, opts: ChannelOptions) -> HistoryPage:
        """The channel's publications with offset > `after` (at most `limit`; 0 = all) and its position."""
        if self._closed:
            raise BrokerError("broker closed")
        return self._history.read(channel, after, limit, opts)

    def _deliver(self, subs: _Subs, event: Event) -> int:
        n = 0
        for handler in list(subs.handlers.values()):
            n += 1
            self.stats.events += 1
            try:
                handler(event)
            except Exception:
                log.exception("event handler failed")
        return n

    async def subscribe(self, subscriber: object, channel: str, pattern: bool, handler: EventHandler) -> None:
        if self._closed:
            raise BrokerError("broker closed")
        table = self._patterns if pattern else self._channels
        subs = table.get(channel)
        if subs is None:
            subs = table[channel] = _Subs()
            self.stats.redis_subscriptions += 1
        subs.handlers[subscriber] = handler
        self._by_subscriber.setdefault(subscriber, set()).add((bool(pattern), channel))

    async def unsubscribe(self, subscriber: object, channel: str, pattern: bool) -> None:
        self._unsubscribe(subscriber, channel, bool(pattern))

    def _unsubscribe(self, subscriber: object, channel: str, pattern: bool) -> None:
        keys = self._by_subscriber.get(subscriber)
        if keys is not None:
            keys.discard((pattern, channel))
            if not keys:
                del self._by_subscriber[subscriber]
        table = self._patterns if pattern else self._channels
        subs = table.get(channel)
        if subs is None or subscriber not in subs.handlers:
            return
        del subs.handlers[subscriber]
        if not subs.handlers:
            del table[channel]
            self.stats.redis_subscriptions -= 1

    async def unsubscribe_all(self, subscriber: object) -> None:
        for pattern, channel in list(self._by_subscriber.get(subscriber, ())):
            self._unsubscribe(subscriber, channel, pattern)

    def queued_calls(self, uri: str) -> int:
        """Calls waiting for `uri` (expired ones included until popped)."""
        q = self._calls.get(uri)
        return len(q) if q else 0


def _normalized(args: bytes | None) -> bytes | None:
    """`args` validated and normalized as the Redis path does (BrokerError if not JSON)."""
    if args is None:
        return None
    try:
        return rustext.normalize_json(args)
    except ValueError as exc:
        raise BrokerError(f"invalid args: {exc}") from exc
