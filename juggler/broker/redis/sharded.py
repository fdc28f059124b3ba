"""Sharded pub-sub (Redis >= 7): ``SPUBLISH`` and ``SSUBSCRIBE`` over the broker's router.

Sharded channels are a namespace of their own: a message sent with
``SPUBLISH`` reaches only ``SSUBSCRIBE`` subscribers, never a ``SUBSCRIBE``
of the same name nor any ``PSUBSCRIBE`` pattern. That makes them the place
for messages of this project's extensions (presence's join/leave notices)
that an original juggler client or server sharing the Redis must never see.

Model:

- ``publish`` is one ``SPUBLISH`` through the router (on a cluster, on the
  node serving the channel's hash slot, with the router's redirections and
  retries).
- Subscriptions are per channel, not per subscriber: the owner (the presence
  service) counts its local subscribers itself and gives one ``handler`` for
  every message. One connection per node carries the subscriptions of the
  channels that node serves (one connection on a single Redis); it is opened
  on the first subscription and kept until :meth:`ShardedPubSub.aclose`.
- :meth:`ShardedPubSub.subscribe` returns once Redis confirmed the
  subscription, so a message published after it returns is delivered. A
  channel stays wanted until :meth:`ShardedPubSub.unsubscribe`: a lost
  connection is reopened (backoff) and its channels subscribed again; on a
  cluster a channel whose slot moved (``MOVED``, or the ``sunsubscribe``
  Redis sends when a slot leaves a node) is subscribed again on the slot's
  new node. Messages published while a channel is being moved are lost, as
  with classic pub-sub across a reconnect.
- A ``PING`` every ``health_interval`` seconds that gets no answer by the
  next one declares a silently dead connection lost.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from juggler.broker.base import BrokerError
from juggler.broker.cluster import (
    RETRY_BACKOFF,
    ClusterRouter,
    SingleRouter,
    cluster_error_kind,
)
from juggler.broker.redis.pops import RECONNECT_BACKOFF
from juggler.broker.resp import RedisAddress, RedisReplyError, RespConnection
from rustext.backoff import Backoff
from rustext.throttledlog import ThrottledLog

__all__ = ["ShardedPubSub"]

log = logging.getLogger("juggler.broker.redis")

#: called (on the event loop, never blocking) with (channel, message) for each message received
ShardedHandler = Callable[[str, bytes], None]


@dataclass(eq=False, slots=True)
class _Chan:
    """One wanted channel: the link it is subscribed on and who waits for that."""

    name: str
    link: _Link | None = None
    confirmed: bool = False
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    retry: asyncio.TimerHandle | None = None
    backoff: Backoff = field(default_factory=lambda: Backoff(RETRY_BACKOFF))


@dataclass(eq=False, slots=True)
class _Link:
    """The connection to one node and the channels subscribed through it."""

    address: RedisAddress
    channels: set[str] = field(default_factory=set)
    conn: RespConnection | None = None
    # commands whose reply is still to come, in order: ("sub", chan) / ("unsub", name) / ("ping", None)
    expected: deque[tuple[str, Any]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    probe_answered: bool = True


def _set_lost(lost: asyncio.Future[Any], conn: RespConnection, exc: BaseException) -> None:
    if not lost.done():
        lost.set_result(exc)


def _addr_key(a: RedisAddress) -> tuple[str, int, str | None]:
    return (a.host, a.port, a.unix_path)


class ShardedPubSub:
    """``SPUBLISH``/``SSUBSCRIBE`` over a router (see the module doc).

    Lifecycle: usable once constructed (connections open on demand);
    :meth:`aclose` closes every connection and fails what waits (idempotent).
    """

    def __init__(self, router: SingleRouter | ClusterRouter, handler: ShardedHandler, *,
                 connect_timeout: float = 5.0, command_timeout: float = 10.0,
                 health_interval: float = 15.0) -> None:
        self.router = router
        self.handler = handler
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.health_interval = health_interval
        self.closed = False
        #: messages handed to the handler
        self.received = 0
        self._chans: dict[str, _Chan] = {}
        self._links: dict[tuple[str, int, str | None], _Link] = {}
        self._warn = ThrottledLog(log)

    # public -------------------------------------------------------------------

    async def publish(self, channel: str, data: bytes) -> int:
        """``SPUBLISH``; returns how many subscribers Redis reached (on that node)."""
        if self.closed:
            raise BrokerError("broker closed")
        try:
            return int(await self.router.run(channel, lambda c: c.execute("SPUBLISH", channel, data)))
        except RedisReplyError as exc:
            raise BrokerError(f"SPUBLISH failed: {exc}") from exc

    async def subscribe(self, channel: str) -> None:
        """Want `channel`; returns once Redis confirmed the subscription.

        Raises BrokerError when Redis refuses it (e.g. a Redis older than 7)
        or gives no answer within ``command_timeout``; in the latter case the
        channel stays wanted and is subscribed as soon as Redis can. Safe to
        cancel (the channel stays wanted: call :meth:`unsubscribe`).
        Subscribing to a channel already subscribed returns at once.
        """
        if self.closed:
            raise BrokerError("broker closed")
        chan = self._chans.get(channel)
        if chan is None:
            chan = self._chans[channel] = _Chan(channel)
        if chan.confirmed:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        chan.waiters.append(fut)
        if chan.link is None and chan.retry is None:
            self._assign(chan)
        try:
            async with asyncio.timeout(self.command_timeout):  # not wait_for (3.11)
                await asyncio.shield(fut)
        except TimeoutError:
            raise BrokerError(f"no answer to SSUBSCRIBE {channel} from Redis") from None
        finally:
            if fut in chan.waiters:
                chan.waiters.remove(fut)

    def unsubscribe(self, channel: str) -> None:
        """Stop wanting `channel` (a no-op when not wanted); no message of it is handled afterwards."""
        chan = self._chans.pop(channel, None)
        if chan is None:
            return
        self._drop(chan, BrokerError(f"unsubscribed from {channel}"))
        link = chan.link
        chan.link = None
        if link is not None:
            link.channels.discard(channel)
            conn = link.conn
            if conn is not None and not conn.closed:
                link.expected.append(("unsub", channel))
                conn.send_push("SUNSUBSCRIBE", channel)

    @property
    def channels(self) -> int:
        """Channels wanted now."""
        return len(self._chans)

    @property
    def connections(self) -> int:
        """Connections open now (one per node serving a wanted channel)."""
        return sum(1 for link in self._links.values() if link.conn is not None and not link.conn.closed)

    def subscribed(self, channel: str) -> bool:
        """Whether Redis confirmed the subscription to `channel` (and it still holds)."""
        chan = self._chans.get(channel)
        return chan is not None and chan.confirmed

    async def aclose(self) -> None:
        """Close every connection; subscribers still waiting fail. Idempotent."""
        if self.closed:
            return
        self.closed = True
        err = BrokerError("broker closed")
        for chan in self._chans.values():
            self._drop(chan, err)
        self._chans.clear()
        tasks = []
        for link in self._links.values():
            if link.conn is not None:
                link.conn.close()
            if link.task is not None:
                link.task.cancel()
                tasks.append(link.task)
        self._links.clear()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)

    # routing ------------------------------------------------------------------

    def _drop(self, chan: _Chan, exc: BaseException) -> None:
        if chan.retry is not None:
            chan.retry.cancel()
            chan.retry = None
        for fut in chan.waiters:
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()
        chan.waiters.clear()

    def _assign(self, chan: _Chan) -> None:
        """Subscribe `chan` on the node serving its slot (now if connected,
        else once the link connects)."""
        chan.retry = None
        if self.closed or self._chans.get(chan.name) is not chan:
            return
        try:
            address = self.router.address_for(chan.name)
        except BrokerError:  # a cluster with no node for that slot now
            self.router.request_refresh()
            self._retry_later(chan)
            return
        key = _addr_key(address)
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = _Link(address)
            link.task = asyncio.get_running_loop().create_task(self._run(link), name="juggler-redis-sharded")
        link.channels.add(chan.name)
        chan.link = link
        chan.confirmed = False
        conn = link.conn
        if conn is not None and not conn.closed:
            link.expected.append(("sub", chan))
            conn.send_push("SSUBSCRIBE", chan.name)

    def _retry_later(self, chan: _Chan) -> None:
        if chan.retry is None and not self.closed:
            chan.retry = asyncio.get_running_loop().call_later(chan.backoff.next_delay(), self._assign, chan)

    def _move(self, link: _Link, chan: _Chan) -> None:
        """`chan` is no longer subscribed on `link`: subscribe it again where its slot lives now."""
        link.channels.discard(chan.name)
        if chan.link is link:
            chan.link = None
            chan.confirmed = False
        self.router.request_refresh()
        self._retry_later(chan)

    # one connection per node --------------------------------------------------

    async def _run(self, link: _Link) -> None:
        """Keep `link`'s connection up while it has channels; subscribe them on each (re)connect."""
        backoff = Backoff(RECONNECT_BACKOFF)
        loop = asyncio.get_running_loop()
        key = _addr_key(link.address)
        try:
            while not self.closed and link.channels:
                lost: asyncio.Future[Any] = loop.create_future()
                try:
                    conn = await RespConnection.open(
                        link.address, connect_timeout=self.connect_timeout, command_timeout=None,
                        on_push=lambda reply: self._on_push(link, reply),
                        on_close=functools.partial(_set_lost, lost),
                    )
                except BrokerError as exc:
                    delay = backoff.next_delay()
                    self._warn.warning("sharded pub-sub connection to %s: %s; retrying in %.2fs", link.address, exc,
                                       delay, key=f"connect {key}")
                    self._reroute(link)
                    await asyncio.sleep(delay)
                    continue
                opened_at = loop.time()
                link.conn = conn
                link.expected.clear()
                link.probe_answered = True
                for name in list(link.channels):
                    chan = self._chans.get(name)
                    if chan is None or chan.link is not link:
                        link.channels.discard(name)
                        continue
                    link.expected.append(("sub", chan))
                    conn.send_push("SSUBSCRIBE", name)
                try:
                    exc = await self._watch(link, conn, lost)
                finally:
                    conn.close()
                    link.conn = None
                for name in link.channels:
                    chan = self._chans.get(name)
                    if chan is not None and chan.link is link:
                        chan.confirmed = False
                if self.closed:
                    break
                delay = backoff.after_loss(loop.time() - opened_at)  # afresh only after a healthy connection
                self._warn.warning("sharded pub-sub connection to %s lost (%s); reconnecting in %.2fs",
                                   link.address, exc, delay, key=f"lost {key}")
                self._reroute(link)
                await asyncio.sleep(delay)
        finally:
            if self._links.get(key) is link:
                del self._links[key]
            if link.conn is not None:
                link.conn.close()
                link.conn = None

    def _reroute(self, link: _Link) -> None:
        """After a failure: channels whose slot another node serves now move there."""
        if not self.router.cluster:
            return
        self.router.request_refresh()
        for name in list(link.channels):
            chan = self._chans.get(name)
            if chan is None:
                link.channels.discard(name)
                continue
            try:
                moved = _addr_key(self.router.address_for(name)) != _addr_key(link.address)
            except BrokerError:
                moved = False
            if moved:
                link.channels.discard(name)
                chan.link = None
                chan.confirmed = False
                self._assign(chan)

    async def _watch(self, link: _Link, conn: RespConnection, lost: asyncio.Future[Any]) -> Any:
        while True:
            try:
                async with asyncio.timeout(self.health_interval):  # not wait_for (3.11)
                    return await asyncio.shield(lost)
            except TimeoutError:
                pass
            if not link.probe_answered:
                log.warning("sharded pub-sub connection to %s: no answer to PING; reconnecting", link.address)
                conn.close()
                return await lost
            link.probe_answered = False
            link.expected.append(("ping", None))
            conn.send_push("PING")

    def _expect(self, link: _Link, kind: str, name: str | None) -> tuple[str, Any] | None:
        """Take the first command of `kind` (for `name`) still waiting for its reply."""
        for i, item in enumerate(link.expected):
            if item[0] != kind:
                continue
            if kind == "sub" and item[1].name != name or kind == "unsub" and item[1] != name:
                continue
            del link.expected[i]
            return item
        return None

    def _on_push(self, link: _Link, reply: Any) -> None:
        if isinstance(reply, RedisReplyError):
            # the answer to the oldest command still waiting (unsolicited pushes are never errors)
            item = link.expected.popleft() if link.expected else None
            if item is not None and item[0] == "sub":
                self._refused(link, item[1], reply)
            return
        if not isinstance(reply, list) or not reply:
            if reply == b"PONG":  # PING outside subscribed mode
                self._expect(link, "ping", None)
                link.probe_answered = True
            return
        kind = reply[0]
        if kind == b"smessage":
            name = reply[1].decode("utf-8", "replace")
            chan = self._chans.get(name)
            if chan is not None and chan.link is link:
                self.received += 1
                try:
                    self.handler(name, reply[2])
                except Exception:
                    log.exception("sharded pub-sub handler failed")
        elif kind == b"ssubscribe":
            name = reply[1].decode("utf-8", "replace")
            item = self._expect(link, "sub", name)
            chan = item[1] if item is not None else None
            if chan is not None and self._chans.get(name) is chan and chan.link is link:
                chan.confirmed = True
                chan.backoff.reset()
                for fut in chan.waiters:
                    if not fut.done():
                        fut.set_result(None)
                chan.waiters.clear()
        elif kind == b"sunsubscribe":
            name = reply[1].decode("utf-8", "replace")
            if self._expect(link, "unsub", name) is not None:
                return  # ours
            # unsolicited: the channel's slot left this node (a cluster resharding)
            chan = self._chans.get(name)
            if chan is not None and chan.link is link and chan.confirmed:
                log.info("sharded pub-sub: %s left %s; subscribing where its slot is now", name, link.address)
                self._move(link, chan)
        elif kind == b"pong":
            self._expect(link, "ping", None)
            link.probe_answered = True

    def _refused(self, link: _Link, chan: _Chan, exc: RedisReplyError) -> None:
        """Redis answered an SSUBSCRIBE with an error."""
        if self._chans.get(chan.name) is not chan or chan.link is not link:
            return
        if cluster_error_kind(exc) is not None:  # MOVED, CLUSTERDOWN…: subscribe where the slot lives
            self.router.note_error(exc)
            self._move(link, chan)
            return
        # not something a retry fixes (a Redis without sharded pub-sub): fail the waiters
        link.channels.discard(chan.name)
        chan.link = None
        chan.confirmed = False
        self._drop(chan, BrokerError(f"SSUBSCRIBE {chan.name} refused: {exc}"))
