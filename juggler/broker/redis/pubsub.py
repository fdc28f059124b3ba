"""Pub-sub: ONE Redis connection fanning events out to every local subscriber.

Subscriptions are reference-counted: a channel (or pattern) is subscribed in
Redis while at least one local subscriber wants it. A new subscriber gets
exactly the messages published after its subscription took effect, as on a
connection of its own (see :meth:`PubSubFanout.subscribe`). The connection
reconnects by itself with the suite's backoff and re-subscribes; a PING
every ``pubsub_health_interval`` s detects a silently dead one. PUBLISH goes
through the command connections (on a cluster, any node reaches every
subscriber).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import rustext
from juggler.broker.base import BrokerError, Event, EventHandler
from juggler.broker.cluster import ClusterRouter, SingleRouter
from juggler.broker.redis.config import RedisBrokerConfig, RedisBrokerStats
from juggler.broker.redis.pops import RECONNECT_BACKOFF
from juggler.broker.resp import RedisReplyError, RespConnection
from rustext.backoff import Backoff
from rustext.throttledlog import ThrottledLog

__all__ = ["PubSubFanout"]

log = logging.getLogger("juggler.broker.redis")


@dataclass(slots=True)
class _Barrier:
    """A SUBSCRIBE (or a PING) sent on the pub-sub connection, and the local
    subscribers that become active when Redis answers it."""

    fut: asyncio.Future[None]
    activate: list[tuple[tuple[bool, str], object]] = field(default_factory=list)
    #: run when Redis answers, in the step that reads the answer (see PubSubFanout.barrier)
    callbacks: list[Callable[[], object]] = field(default_factory=list)


@dataclass(slots=True)
class _Sub:
    """One channel or pattern: its active local handlers, the ones waiting for
    their barrier, and where its Redis subscription stands."""

    handlers: dict[object, EventHandler] = field(default_factory=dict)
    pending: dict[object, EventHandler] = field(default_factory=dict)
    confirms: deque[_Barrier] = field(default_factory=deque)  # one per SUBSCRIBE in flight
    state: str = "idle"  # idle (not subscribed / UNSUBSCRIBE sent) | subscribing | subscribed


class PubSubFanout:
    """The pub-sub side of a :class:`juggler.broker.redis.RedisBroker` (see module doc)."""

    def __init__(self, router: SingleRouter | ClusterRouter, config: RedisBrokerConfig,
                 stats: RedisBrokerStats) -> None:
        self.router = router
        self.config = config
        self.stats = stats
        #: the pub-sub connection, once opened
        self.conn: RespConnection | None = None
        self.closed = False
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None
        self._subs: dict[tuple[bool, str], _Sub] = {}
        self._pings: deque[_Barrier] = deque()  # PINGs in flight on the pub-sub connection
        self._by_subscriber: dict[object, set[tuple[bool, str]]] = {}
        self._warn = ThrottledLog(log)
        #: reconnections of the pub-sub connection (each after a backoff)
        self.reconnects = 0
        #: told ``(pattern, channel)`` when a subscription is in effect again after a
        #: reconnect: what was published meanwhile was not delivered (see juggler.recovery)
        self.on_resubscribed: Callable[[bool, str], None] | None = None

    async def aclose(self) -> None:
        """Stop the connection task, close the connection, fail what waits on it. Idempotent."""
        self.closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=5.0)
        if self.conn is not None:
            self.conn.close()
        for sub in self._subs.values():
            for b in sub.confirms:
                _fail_future(b.fut, BrokerError("broker closed"))
        for b in self._pings:
            _fail_future(b.fut, BrokerError("broker closed"))

    async def publish(self, channel: str, msg_uuid: str, args: bytes | None) -> None:
        payload = rustext.build_pub_payload(msg_uuid, args)
        try:
            # a cluster: PUBLISH on any node reaches subscribers on every node
            await self.router.run(None, lambda c: c.execute("PUBLISH", channel, payload))
        except RedisReplyError as exc:
            raise BrokerError(str(exc)) from exc
        self.stats.published += 1

    async def subscribe(self, subscriber: object, channel: str, pattern: bool, handler: EventHandler) -> None:
        """Subscribe `subscriber`; returns once Redis has it subscribed.

        Sharing one Redis connection keeps Redis' own semantics: a new local
        subscriber gets exactly the messages published after its
        subscription took effect, as it would on a connection of its own. A
        first subscriber waits for Redis' SUBSCRIBE confirmation; joining a
        channel already subscribed waits for a PING sent behind it. Either
        barrier activates the subscriber in the same step that reads the
        reply, so no message slips between them.
        """
        key = (bool(pattern), channel)
        by = self._by_subscriber.setdefault(subscriber, set())
        sub = self._subs.get(key)
        if sub is not None and subscriber in sub.handlers:
            sub.handlers[subscriber] = handler  # subscribing twice counts once
            by.add(key)
            return
        by.add(key)
        try:
            conn = await self._connection()
        except BrokerError:
            await self.unsubscribe(subscriber, channel, pattern)
            raise
        if key not in self._by_subscriber.get(subscriber, ()):
            return  # unsubscribed while we waited for the connection
        sub = self._subs.get(key)
        if sub is None:
            sub = self._subs[key] = _Sub()
        if subscriber in sub.handlers:
            sub.handlers[subscriber] = handler
            return
        sub.pending[subscriber] = handler
        loop = asyncio.get_running_loop()
        if sub.state == "subscribed":
            barrier = _Barrier(loop.create_future(), [(key, subscriber)])
            self._pings.append(barrier)
            conn.send_push("PING")
        elif sub.state == "subscribing" and sub.confirms:
            barrier = sub.confirms[-1]
            barrier.activate.append((key, subscriber))
        else:
            barrier = _Barrier(loop.create_future(), [(key, subscriber)])
            sub.confirms.append(barrier)
            sub.state = "subscribing"
            conn.send_push("PSUBSCRIBE" if pattern else "SUBSCRIBE", channel)
        try:
            async with asyncio.timeout(self.config.command_timeout):  # not wait_for (3.11)
                await asyncio.shield(barrier.fut)
        except (BrokerError, TimeoutError) as exc:
            await self.unsubscribe(subscriber, channel, pattern)
            raise BrokerError(f"subscribe failed: {exc or 'no answer from Redis'}") from exc

    async def barrier(self, callback: Callable[[], object]) -> None:
        """Run `callback` at the point of the pub-sub stream where everything
        published before this call has been delivered and nothing published
        after it yet (a PING behind it, as for a subscriber joining a channel
        already subscribed). Raises BrokerError when the connection is lost first;
        `callback` then never runs."""
        conn = await self._connection()
        barrier = _Barrier(asyncio.get_running_loop().create_future(), callbacks=[callback])
        self._pings.append(barrier)
        conn.send_push("PING")
        try:
            async with asyncio.timeout(self.config.command_timeout):  # not wait_for (3.11)
                await asyncio.shield(barrier.fut)
        except TimeoutError:
            barrier.callbacks.clear()
            raise BrokerError("subscribe failed: no answer from Redis") from None

    async def unsubscribe(self, subscriber: object, channel: str, pattern: bool) -> None:
        """Remove one subscription (a no-op when absent); no event reaches it afterwards."""
        key = (bool(pattern), channel)
        keys = self._by_subscriber.get(subscriber)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_subscriber[subscriber]
        sub = self._subs.get(key)
        if sub is None:
            return
        sub.handlers.pop(subscriber, None)
        sub.pending.pop(subscriber, None)
        if sub.handlers or sub.pending:
            return
        if sub.state != "idle":
            sub.state = "idle"
            conn = self.conn
            if conn is not None and not conn.closed:
                conn.send_push("PUNSUBSCRIBE" if pattern else "UNSUBSCRIBE", channel)
        if not sub.confirms:
            del self._subs[key]

    async def unsubscribe_all(self, subscriber: object) -> None:
        for pattern, channel in list(self._by_subscriber.get(subscriber, ())):
            await self.unsubscribe(subscriber, channel, pattern)

    async def _connection(self) -> RespConnection:
        if self.closed:
            raise BrokerError("broker closed")
        if self._task is None:
            self._ready = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="juggler-redis-pubsub")
        assert self._ready is not None
        if not (self.conn is not None and not self.conn.closed):
            try:
                async with asyncio.timeout(self.config.connect_timeout):  # not wait_for (3.11)
                    await self._ready.wait()
            except TimeoutError:
                raise BrokerError("no pub-sub connection to Redis") from None
        assert self.conn is not None
        if self.conn.closed:
            raise BrokerError("the pub-sub connection to Redis is down")
        return self.conn

    async def _run(self) -> None:
        """Keep the one pub-sub connection up; re-subscribe after a reconnect."""
        backoff = Backoff(RECONNECT_BACKOFF)
        assert self._ready is not None
        loop = asyncio.get_running_loop()
        while not self.closed:
            lost = loop.create_future()
            try:
                conn = await RespConnection.open(
                    self.router.pubsub_address(), connect_timeout=self.config.connect_timeout, command_timeout=None,
                    on_push=self._on_push,
                    on_close=lambda c, exc: lost.done() or lost.set_result(exc),
                )
            except BrokerError as exc:
                self.router.request_refresh()
                delay = backoff.next_delay()
                self._warn.warning("pub-sub connection: %s; retrying in %.2fs", exc, delay, key="connect")
                await asyncio.sleep(delay)
                continue
            opened_at = loop.time()
            self.conn = conn
            # re-subscribe what local subscribers still want (after a reconnect)
            for key, sub in list(self._subs.items()):
                pattern, channel = key
                if sub.handlers:
                    sub.confirms.append(_Barrier(loop.create_future(), callbacks=[partial(self._resubscribed, key)]))
                    sub.state = "subscribing"
                    conn.send_push("PSUBSCRIBE" if pattern else "SUBSCRIBE", channel)
            self._ready.set()
            try:
                exc = await self._watch(conn, lost)
            finally:
                conn.close()
            self._ready.clear()
            self.stats.redis_subscriptions = 0
            # what was in flight will never be answered: subscribers waiting
            # for it fail (their SUB gets NACK 500); active ones are
            # re-subscribed by the reconnect
            err = BrokerError("pub-sub connection lost")
            pings, self._pings = self._pings, deque()
            for b in pings:
                _fail_future(b.fut, err)
            for key, sub in list(self._subs.items()):
                while sub.confirms:
                    _fail_future(sub.confirms.popleft().fut, err)
                sub.state = "idle"
                if not sub.handlers and not sub.pending:
                    del self._subs[key]
            if not self.closed:
                self.router.request_refresh()
                # the delays start afresh only after a connection that stayed up a while: one
                # that drops as soon as it opens (Redis at maxclients) is not retried in a loop
                delay = backoff.after_loss(loop.time() - opened_at)
                self._warn.warning("pub-sub connection lost (%s); reconnecting in %.2fs", exc, delay, key="lost")
                self.reconnects += 1
                await asyncio.sleep(delay)

    async def _watch(self, conn: RespConnection, lost: asyncio.Future[Any]) -> Any:
        """Wait until the pub-sub connection is lost; a PING every
        ``pubsub_health_interval`` s that gets no answer by the next one
        declares a silently dead connection lost (then it reconnects)."""
        loop = asyncio.get_running_loop()
        probe: _Barrier | None = None
        while True:
            try:
                async with asyncio.timeout(self.config.pubsub_health_interval):  # not wait_for (3.11)
                    return await asyncio.shield(lost)
            except TimeoutError:
                pass
            if probe is not None and not probe.fut.done():
                log.warning("pub-sub connection: no answer to PING; reconnecting")
                conn.close()
                return await lost
            probe = _Barrier(loop.create_future())
            self._pings.append(probe)
            conn.send_push("PING")

    def _resubscribed(self, key: tuple[bool, str]) -> None:
        if self.on_resubscribed is not None:
            self.on_resubscribed(*key)

    def _activate(self, barrier: _Barrier) -> None:
        for callback in barrier.callbacks:
            try:
                callback()
            except Exception:
                log.exception("pub-sub barrier callback failed")
        for key, subscriber in barrier.activate:
            sub = self._subs.get(key)
            if sub is not None:
                handler = sub.pending.pop(subscriber, None)
                if handler is not None:
                    sub.handlers[subscriber] = handler
        if not barrier.fut.done():
            barrier.fut.set_result(None)

    def _on_push(self, reply: Any) -> None:
        if not isinstance(reply, list) or not reply:
            if reply == b"PONG" and self._pings:  # PING outside subscribed mode
                self._activate(self._pings.popleft())
            return
        kind = reply[0]
        if kind == b"message":
            ch = reply[1].decode("utf-8", "replace")
            self._deliver(ch, None, ch, reply[2])
            return
        if kind == b"pmessage":
            pat = reply[1].decode("utf-8", "replace")
            self._deliver(reply[2].decode("utf-8", "replace"), pat, pat, reply[3])
            return
        if kind in (b"subscribe", b"psubscribe"):
            key = (kind == b"psubscribe", reply[1].decode("utf-8", "replace"))
            self.stats.redis_subscriptions = int(reply[2])
            sub = self._subs.get(key)
            if sub is not None and sub.confirms:
                self._activate(sub.confirms.popleft())
                if not sub.confirms and sub.state == "subscribing":
                    sub.state = "subscribed"
                if not sub.confirms and not sub.handlers and not sub.pending and sub.state == "idle":
                    del self._subs[key]
            return
        if kind in (b"unsubscribe", b"punsubscribe"):
            self.stats.redis_subscriptions = int(reply[2])
            return
        if kind == b"pong" and self._pings:
            self._activate(self._pings.popleft())

    def _deliver(self, channel: str, pattern: str | None, sub_name: str, data: bytes) -> None:
        sub = self._subs.get((pattern is not None, sub_name))
        if sub is None or not sub.handlers:
            return
        try:
            msg_uuid, args, offset, epoch = rustext.parse_pub_payload_at(data)
        except ValueError as exc:
            log.debug("dropping an invalid pub-sub payload on %s: %s", channel, exc)
            return
        event = Event(channel=channel, pattern=pattern, msg_uuid=msg_uuid, args=args, offset=offset, epoch=epoch)
        for handler in list(sub.handlers.values()):
            self.stats.events += 1
            try:
                handler(event)
            except Exception:
                log.exception("event handler failed")


def _fail_future(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
        fut.exception()  # retrieved: nobody may be waiting any more
