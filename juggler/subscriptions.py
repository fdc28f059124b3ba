"""The server's subscriptions: who on this server subscribes to what, and the
fan-out of each event to them.

The broker sees ONE subscriber per channel or pattern (this object), however
many connections want it; the connections of each key are held natively by a
``rustext.FanoutHub``. An event's EVNT frame is built once per key and handed
to the hub with the other frames of the same event-loop turn; the hub writes
each connection's frames with one ``sendmsg``, without a Python call per
subscriber. A connection that negotiated permessage-deflate is written the
event's compressed frame, built once per event too (``juggler.deflate``: no
context takeover, so one compressed frame fits every such connection), the
others the plain one. Connections the hub cannot write itself (TLS, outgoing
middleware, or Python output queued for them) are handed back and written
through :meth:`juggler.conn.Conn.send`, behind what is already queued, so
each connection gets its frames in order.

A new subscriber of a key already subscribed in the broker joins at once and
gets every event the broker delivers after that; the first subscriber of a
key waits for the broker's subscription (its SUB's ACK says it took effect).

Channels with history (``juggler.channels``) add recovery, see
:mod:`juggler.recovery`: their EVNTs carry offset and epoch, a SUB may ask for
what it missed (``since``), and a gap in what the broker delivers live is
filled from the history before later events go out.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import rustext

from juggler.broker.base import Event, PubSubBroker
from juggler.deflate import Deflate
from juggler.metrics import ServerStats
from juggler.recovery import JoinResult, PublishResult

if TYPE_CHECKING:
    from juggler.conn import Conn

__all__ = ["Subscriptions"]

log = logging.getLogger("juggler.subscriptions")

EVNT = rustext.EVNT
_build_evnt = rustext.build_evnt
_ws_text_frames = rustext.ws_text_frames

Key = tuple[bool, str]  # (pattern, channel)


@dataclass(slots=True, eq=False)
class _Sub:
    """One channel or pattern subscribed in the broker on behalf of local connections."""

    id: int
    pattern: bool
    channel: str
    conns: set[Conn] = field(default_factory=set)
    #: the broker subscription: None until asked, then a future done when it took effect
    ready: asyncio.Future[None] | None = None
    waiting: int = 0  # SUBs waiting for `ready`
    #: recovery state of a channel with history (juggler.recovery.Stream), else None
    stream: Any = None


class Subscriptions:
    """Local subscribers per channel/pattern, one broker subscription each (see module doc).

    ``hub`` is the native fan-out; ``None`` writes every event through
    :meth:`Conn.send` (a reference path, and what the benchmarks compare with).
    """

    def __init__(self, pubsub: PubSubBroker, stats: ServerStats, *, native: bool = True,
                 write_limit: int = 0, deflate: Deflate | None = None) -> None:
        self.pubsub = pubsub
        self.write_limit = write_limit
        self.stats = stats
        self.hub: rustext.FanoutHub | None = rustext.FanoutHub() if native else None
        self._subs: dict[Key, _Sub] = {}
        self._by_conn: dict[Conn, set[Key]] = {}
        self._conns: dict[int, Conn] = {}  # hub id -> connection
        self._ids = itertools.count(1)
        self._batch: list[tuple[int, bytes, bytes | None]] = []  # (key id, ws frame, compressed) of this turn
        self._deflate = deflate
        self._deflating: set[int] = set()  # hub ids of the connections that negotiated deflate
        self._batch_json: list[tuple[bytes, str]] = []  # (EVNT json, for uuid), same order
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: set by the recovery layer (juggler.recovery.Recovery) when channels have history
        self.recovery: Any = None
        #: the presence service (juggler.presence.Presence) when channels keep presence
        self.presence: Any = None
        register = getattr(pubsub, "on_resubscribed", None)
        if register is not None:
            register(self._resubscribed)

    def _resubscribed(self, pattern: bool, channel: str) -> None:
        """The broker re-subscribed after losing its pub-sub connection: a
        channel with history reads what was published meanwhile."""
        sub = self._subs.get((pattern, channel))
        if sub is not None and sub.stream is not None:
            sub.stream.catch_up()

    # connections ------------------------------------------------------------------

    def has_history(self, channel: str) -> bool:
        """Whether `channel` keeps history (a SUB may ask to recover from it)."""
        return self.recovery is not None and self.recovery.history_of(channel) is not None

    def sends_join_leave(self, channel: str) -> bool:
        """Whether subscribers of `channel` may ask for join/leave notices."""
        if self.presence is None:
            return False
        opts = self.presence.rules.lookup(channel)
        return opts is not None and bool(opts.join_leave)

    def add_conn(self, conn: Conn, fd: int, deflate: bool = False) -> int:
        """Register a connection that may subscribe; `fd` is its socket (-1: written by Python);
        `deflate`: it negotiated permessage-deflate."""
        hub_id = next(self._ids)
        self._conns[hub_id] = conn
        if deflate:
            self._deflating.add(hub_id)
        if self.hub is not None:
            try:
                self.hub.add_conn(hub_id, fd, deflate)
            except OSError as exc:  # out of descriptors: Python writes this one
                log.warning("connection %s: no native fan-out (%s)", conn.remote, exc)
                self.hub.add_conn(hub_id, -1, deflate)
        return hub_id

    def hold(self, hub_id: int, held: bool) -> None:
        """Python has output queued for this connection (True) or not any more."""
        if self.hub is not None:
            self.hub.hold(hub_id, held)

    def detach(self, hub_id: int) -> None:
        """The connection is closing: nothing more is written to it natively."""
        self._deflating.discard(hub_id)
        if self.hub is not None:
            self.hub.remove_conn(hub_id)

    async def drop(self, conn: Conn) -> None:
        """The connection is gone: every subscription of it ends."""
        hub_id = conn.hub_id
        if hub_id is not None:
            self._conns.pop(hub_id, None)
            self.detach(hub_id)
        for pattern, channel in list(self._by_conn.get(conn, ())):
            await self.unsubscribe(conn, channel, pattern)
        self._by_conn.pop(conn, None)
        if self.presence is not None:
            await self.presence.left_all(conn)

    # subscribing ------------------------------------------------------------------

    async def publish(self, channel: str, msg_uuid: str, args: bytes | None) -> PublishResult:
        """Publish (with history on channels that keep it)."""
        if self.recovery is not None:
            return await self.recovery.publish(channel, msg_uuid, args)
        await self.pubsub.publish(channel, msg_uuid, args)
        return PublishResult(msg_uuid)

    async def subscribe(self, conn: Conn, channel: str, pattern: bool,
                        since: tuple[int, str] | None = None, join_leave: bool = False) -> JoinResult | None:
        """Subscribe `conn`; returns once its events flow (raises BrokerError if the
        broker refused). On a channel with history: what the ACK says and the
        events to send after it (see juggler.recovery), else None."""
        key = (bool(pattern), channel)
        sub = self._subs.get(key)
        if sub is None:
            sub = self._subs[key] = _Sub(next(self._ids), bool(pattern), channel)
            if self.recovery is not None and not pattern:
                sub.stream = self.recovery.stream_for(sub)
        # without history, Redis's own semantics: the connection gets exactly the
        # events published after its subscription took effect (with history,
        # positions make it exact: see juggler.recovery)
        exact = sub.stream is None
        if sub.ready is None:
            sub.ready = asyncio.get_running_loop().create_future()
            task = asyncio.get_running_loop().create_task(self._subscribe_broker(sub))
            task.add_done_callback(_log_task_error)
        if not sub.ready.done():
            # not active in the broker yet: joined now, events flow from when it is
            if exact:
                self._join(conn, sub)
            sub.waiting += 1
            try:
                await asyncio.shield(sub.ready)
            except BaseException:
                if exact:
                    self._leave(conn, sub)
                raise
            finally:
                sub.waiting -= 1
        else:
            sub.ready.result()  # a failed subscription raises for every waiter
            if exact:
                barrier = getattr(self.pubsub, "barrier", None)
                if barrier is None:  # an in-process broker: nothing is in flight
                    self._join(conn, sub)
                else:
                    # joined where the broker's stream shows the SUB took effect: not
                    # on events published before it and still on their way
                    sub.waiting += 1
                    try:
                        await barrier(lambda: conn.closed or self._join(conn, sub))
                    finally:
                        sub.waiting -= 1
        result = None
        if sub.stream is not None:
            sub.waiting += 1
            try:
                result = await sub.stream.join(conn, since)
            finally:
                sub.waiting -= 1
        if conn.closed:
            if conn in sub.conns:
                await self.unsubscribe(conn, channel, pattern)
            else:
                await self._release(sub)
            return None
        if not exact:
            self._join(conn, sub)
        presence = self.presence
        if presence is not None and not pattern and presence.enabled(channel):
            await presence.joined(conn, channel, notify=join_leave)
        return result

    def _join(self, conn: Conn, sub: _Sub) -> None:
        sub.conns.add(conn)
        self._by_conn.setdefault(conn, set()).add((sub.pattern, sub.channel))
        if self.hub is not None and conn.hub_id is not None:
            # the hub resolves a batch's subscribers when it writes it: events
            # queued before this join go out first, to the subscribers they had
            if self._batch:
                self.flush()
            conn.subscribing()
            self.hub.subscribe(conn.hub_id, sub.id)

    def _leave(self, conn: Conn, sub: _Sub) -> None:
        """Undo :meth:`_join` (the broker refused the subscription)."""
        sub.conns.discard(conn)
        keys = self._by_conn.get(conn)
        if keys is not None:
            keys.discard((sub.pattern, sub.channel))
        if self.hub is not None and conn.hub_id is not None:
            self.hub.unsubscribe(conn.hub_id, sub.id)
        key = (sub.pattern, sub.channel)
        if not sub.conns and sub.ready is None and self._subs.get(key) is sub:
            del self._subs[key]

    async def _subscribe_broker(self, sub: _Sub) -> None:
        assert sub.ready is not None
        try:
            await self.pubsub.subscribe(self, sub.channel, sub.pattern, functools.partial(self._on_event, sub))
        except BaseException as exc:
            fut = sub.ready
            sub.ready = None  # the next SUB tries again
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved: the waiters have it
            if self._subs.get((sub.pattern, sub.channel)) is sub and not sub.conns:
                del self._subs[(sub.pattern, sub.channel)]
            if not isinstance(exc, Exception):
                raise
            return
        if not sub.ready.done():
            sub.ready.set_result(None)

    async def unsubscribe(self, conn: Conn, channel: str, pattern: bool) -> bool:
        """End one subscription of `conn`; False when it had none."""
        key = (bool(pattern), channel)
        keys = self._by_conn.get(conn)
        if keys is not None:
            keys.discard(key)
        sub = self._subs.get(key)
        if sub is None or conn not in sub.conns:
            return False
        sub.conns.discard(conn)
        if self.hub is not None and conn.hub_id is not None:
            if self._batch:  # events queued before the UNSB took effect are still its
                self.flush()
            self.hub.unsubscribe(conn.hub_id, sub.id)
        if sub.stream is not None:
            sub.stream.forget(conn)
        if self.presence is not None and not sub.pattern:
            await self.presence.left(conn, channel)
        await self._release(sub)
        return True

    async def _release(self, sub: _Sub) -> None:
        """Unsubscribe from the broker once no local connection wants the key."""
        if sub.conns or sub.waiting or sub.ready is None or not sub.ready.done():
            return
        key = (sub.pattern, sub.channel)
        if self._subs.get(key) is sub:
            del self._subs[key]
        sub.ready = None
        await self.pubsub.unsubscribe(self, sub.channel, sub.pattern)

    # what the server API and metrics read ------------------------------------------

    def channels(self) -> dict[Key, int]:
        """(pattern, channel) -> local subscribers, for every key with one."""
        return {key: len(sub.conns) for key, sub in self._subs.items() if sub.conns}

    def of(self, conn: Conn) -> frozenset[Key]:
        """The (pattern, channel) keys `conn` subscribes to."""
        return frozenset(self._by_conn.get(conn, ()))

    def subscribers(self, channel: str, pattern: bool = False) -> set[Conn]:
        sub = self._subs.get((bool(pattern), channel))
        return set(sub.conns) if sub is not None else set()

    # fan-out ----------------------------------------------------------------------

    def _on_event(self, sub: _Sub, event: Event) -> None:
        """One event of `sub` from the broker (on the event loop)."""
        if sub.stream is not None and not sub.stream.on_live(event):
            return  # a duplicate, or held back behind a gap being filled
        self.deliver(sub, event)

    def deliver(self, sub: _Sub, event: Event) -> None:
        """Queue `event` for every connection subscribed to `sub` (written at the end of this turn)."""
        if not sub.conns:
            return
        json = _build_evnt(event.msg_uuid, event.channel, event.pattern, event.args, event.offset, event.epoch)
        if self.hub is None or (self.write_limit and len(json) > self.write_limit):
            # (an EVNT over write_limit: Conn.write closes each connection it was for)
            for conn in list(sub.conns):
                if not conn.closed:
                    self.stats.events += 1
                    conn.send(EVNT, event.msg_uuid, json)
            return
        deflate = self._deflate
        compressed = None
        if deflate is not None and self._deflating and len(json) >= deflate.threshold:
            compressed = deflate.frames.text_frames([json])  # once per event, for every deflate subscriber
        self._batch.append((sub.id, _ws_text_frames([json]), compressed))
        self._batch_json.append((json, event.msg_uuid))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop = self._loop or asyncio.get_running_loop()
            self._loop = loop
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write the frames of this turn: natively where possible, the rest through Python."""
        self._flush_scheduled = False
        batch, self._batch = self._batch, []
        jsons, self._batch_json = self._batch_json, []
        if not batch:
            return
        assert self.hub is not None
        written, held, partial, failed = self.hub.publish(batch)
        stats = self.stats
        if written:
            stats.events += written
            stats.written[EVNT] += written
        conns = self._conns
        if held is not None:
            for hub_id, i in held:
                conn = conns.get(hub_id)
                if conn is not None and not conn.closed:
                    json, for_uuid = jsons[i]
                    stats.events += 1
                    conn.send(EVNT, for_uuid, json)
        if partial is not None:
            for hub_id, rest in partial:
                conn = conns.get(hub_id)
                if conn is not None:
                    conn.write_rest(rest)
        if failed is not None:
            for hub_id in failed:
                conn = conns.get(hub_id)
                if conn is not None:
                    conn.abort()


def _log_task_error(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("broker subscription failed: %s", task.exception())
