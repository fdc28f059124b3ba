"""The presence service of a server: entries for its subscribers, their
refresh, and join/leave notices.

The server calls two methods (see :class:`Presence`): :meth:`Presence.joined`
after a subscription to a channel succeeded and :meth:`Presence.left` after
an unsubscription or when the connection closed (:meth:`Presence.left_all`
does every channel of a connection at once). Both are no-ops for channels
without ``presence``, idempotent, and never raise for a broker failure: it
is logged and counted, and the next refresh puts a missing entry back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, Self

import rustext
from juggler.broker.base import BrokerError
from juggler.channels import ChannelRules
from juggler.errors import JugglerError
from juggler.presence.notices import (
    LocalNotices,
    notice_channel,
    notice_frame,
    notice_payload,
    parse_notice,
)
from juggler.presence.store import (
    Info,
    MemoryPresenceStore,
    PresenceStore,
    RedisPresenceStore,
)

__all__ = ["Presence", "PresenceCounters", "PresenceDisabled"]

log = logging.getLogger("juggler.presence")

_EVNT = rustext.EVNT
#: seconds between two warnings about the same kind of failed broker operation
WARN_INTERVAL = 10.0


class PresenceDisabled(JugglerError, ValueError):
    """Presence is not kept for that channel (no ``[[channels]]`` rule with ``presence = true``)."""


class _Subscriber(Protocol):
    """What the service needs of a connection (a :class:`juggler.conn.Conn`)."""

    id: str
    identity: Any

    @property
    def closed(self) -> bool: ...

    def send(self, msg_type: int, for_uuid: str, frame: bytes) -> None: ...


class _Bus(Protocol):
    async def publish(self, channel: str, data: bytes) -> int: ...
    async def subscribe(self, channel: str) -> None: ...
    def unsubscribe(self, channel: str) -> None: ...
    async def aclose(self) -> None: ...


@dataclass(slots=True)
class PresenceCounters:
    """Counters of one presence service."""

    entries: int = 0  # entries of this server now
    joins: int = 0  # entries added
    leaves: int = 0  # entries removed
    refreshes: int = 0  # refresh rounds done
    refreshed: int = 0  # entries re-added by those rounds
    failures: int = 0  # broker operations that failed (logged)
    notices_sent: int = 0  # join/leave notices published
    notices_delivered: int = 0  # notice frames written to local connections


@dataclass(eq=False, slots=True)
class _Entry:
    info: Info
    notify: bool
    announced: bool = False  # its join notice went out (so its leave will too)


def _user(conn: _Subscriber) -> tuple[str | None, Any]:
    ident = conn.identity
    if ident is None or getattr(ident, "anonymous", False):
        return None, None
    claims = getattr(ident, "claims", None) or {}
    return ident.name, claims.get("info")


class Presence:
    """Presence and join/leave for the channels whose rule has ``presence``.

    `broker` is where subscriptions live (the server's pub-sub broker):

    - a :class:`juggler.broker.redis.RedisBroker`: entries in its Redis or
      Redis Cluster (``juggler.presence.store``), shared by every server on
      it; notices by sharded pub-sub (Redis >= 7), so a subscriber on any of
      those servers gets them;
    - a :class:`juggler.broker.memory.MemoryBroker`: entries and notices in
      this process.

    Every server sharing the broker must have the same channel rules.
    Lifecycle: :meth:`start` (the refresh loop), :meth:`aclose` (removes
    what entries remain, with their leave notices, then stops; idempotent).
    Also an async context manager.
    """

    def __init__(self, broker: Any, rules: ChannelRules, *, store: PresenceStore | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from juggler.broker.memory import MemoryBroker

        self.rules = rules
        self.counters = PresenceCounters()
        self._clock = clock
        self._bus: _Bus
        if isinstance(broker, MemoryBroker):
            self.store: PresenceStore = store or MemoryPresenceStore(clock=clock)
            self._bus = LocalNotices(self._on_notice)
        else:
            from juggler.broker.redis import RedisBroker
            from juggler.broker.redis.sharded import ShardedPubSub

            if not isinstance(broker, RedisBroker):
                raise TypeError(f"presence needs a MemoryBroker or a RedisBroker, not {type(broker).__name__}")
            cfg = broker.config
            self.store = store or RedisPresenceStore(broker.router)
            self._bus = ShardedPubSub(
                broker.router, self._on_notice, connect_timeout=cfg.connect_timeout,
                command_timeout=cfg.command_timeout, health_interval=cfg.pubsub_health_interval,
            )
        # channel -> subscriber -> its entry; subscriber -> its channels
        self._entries: dict[str, dict[_Subscriber, _Entry]] = {}
        self._by_conn: dict[_Subscriber, set[str]] = {}
        # channel -> the subscribers that asked for its notices
        self._listeners: dict[str, set[_Subscriber]] = {}
        self._due: dict[str, float] = {}  # channel -> when its entries are refreshed next
        ttls = [r.presence_ttl for r in rules.rules if r.presence]
        #: seconds between two passes of the refresh loop (each channel is refreshed every presence_ttl / 3)
        self.period = min(ttls) / 3 if ttls else None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._warned: dict[str, float] = {}  # kind of operation -> when its last warning was logged

    # lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Start the refresh loop (none when no rule has presence). Idempotent."""
        if self._task is None and self.period is not None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._refresh_loop(), name="juggler-presence")

    async def aclose(self) -> None:
        """Remove the entries still here (leave notices included, bounded by
        ~5 s), stop the refresh loop, close the notice connections. Idempotent."""
        if self._closed:
            return
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
        conns = list(self._by_conn)
        if conns:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await asyncio.gather(*(self.left_all(c) for c in conns))
        self._closed = True
        await self._bus.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # the server's two calls ----------------------------------------------------

    def enabled(self, channel: str) -> bool:
        """Whether presence is kept for `channel`."""
        return self.rules.lookup(channel).presence

    async def joined(self, conn: _Subscriber, channel: str, *, notify: bool = False) -> None:
        """`conn` subscribed to `channel` (not a pattern): add its entry.

        `notify`: `conn` asked for join/leave notices (sent only where the
        channel has ``join_leave``); it gets its own join too. The join
        notice goes to every subscriber of the channel that asked, on every
        server sharing the broker. Subscribing twice counts once (a second
        call may turn `notify` on). Never raises for a broker failure.
        """
        opts = self.rules.lookup(channel)
        if not opts.presence or self._closed:
            return
        notify = notify and opts.join_leave
        conns = self._entries.setdefault(channel, {})
        entry = conns.get(conn)
        if entry is not None:
            if notify and not entry.notify:
                entry.notify = True
                self._listeners.setdefault(channel, set()).add(conn)
                await self._listen(channel)
            return
        user, conn_info = _user(conn)
        info: Info = {"client": conn.id, "user": user}
        if conn_info is not None:
            info["conn_info"] = conn_info
        entry = conns[conn] = _Entry(info, notify)
        self._by_conn.setdefault(conn, set()).add(channel)
        self._due.setdefault(channel, self._clock() + opts.presence_ttl / 3)
        self.counters.entries += 1
        self.counters.joins += 1
        jobs = [self._add(channel, conn.id, info, opts.presence_ttl)]
        if notify:  # listening before the join goes out: the joiner gets its own
            self._listeners.setdefault(channel, set()).add(conn)
            jobs.append(self._listen(channel))
        await asyncio.gather(*jobs)
        current = self._entries.get(channel, {}).get(conn)
        if current is not entry:
            if current is None:  # left while its entry was being added: make sure it is gone
                await self._remove(channel, conn.id)
            return
        if opts.join_leave:
            entry.announced = True
            await self._publish(channel, "join", info)

    async def left(self, conn: _Subscriber, channel: str) -> None:
        """`conn` unsubscribed from `channel`, or closed: remove its entry and
        send the leave notice. A no-op when it had none. Never raises for a
        broker failure (an entry left behind expires after ``presence_ttl``)."""
        conns = self._entries.get(channel)
        entry = conns.pop(conn, None) if conns is not None else None
        if entry is None:
            return
        if not conns:
            del self._entries[channel]
            self._due.pop(channel, None)
        chans = self._by_conn.get(conn)
        if chans is not None:
            chans.discard(channel)
            if not chans:
                del self._by_conn[conn]
        self.counters.entries -= 1
        self.counters.leaves += 1
        if entry.notify:
            self._unlisten(channel, conn)
        await self._remove(channel, conn.id)
        if entry.announced:
            await self._publish(channel, "leave", entry.info)

    async def left_all(self, conn: _Subscriber) -> None:
        """:meth:`left` for every channel `conn` has an entry in (it closed)."""
        chans = self._by_conn.get(conn)
        if chans:
            await asyncio.gather(*(self.left(conn, ch) for ch in list(chans)))

    # the server API ------------------------------------------------------------

    async def members(self, channel: str) -> dict[str, Info]:
        """Who is subscribed to `channel` on every server sharing the broker:
        client id -> ``{"client", "user"[, "conn_info"]}``. Raises
        :class:`PresenceDisabled`, or BrokerError when the broker fails."""
        self._check(channel)
        return await self.store.members(channel)

    async def stats(self, channel: str) -> dict[str, int]:
        """``{"clients": n, "users": distinct user ids}`` of `channel` (connections
        without a user are clients, not users). Raises as :meth:`members`."""
        self._check(channel)
        return await self.store.stats(channel)

    def local_members(self, channel: str) -> list[Any]:
        """The subscribers of this server with an entry in `channel`."""
        return list(self._entries.get(channel, ()))

    def _check(self, channel: str) -> None:
        if not self.enabled(channel):
            raise PresenceDisabled(f"presence is not kept for channel {channel!r}")

    # refresh -------------------------------------------------------------------

    async def _refresh_loop(self) -> None:
        assert self.period is not None
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.refresh()
            except Exception:  # a bug: keep the entries alive all the same
                log.exception("presence refresh failed")

    async def refresh(self, *, force: bool = False) -> int:
        """Re-add this server's entries of the channels due (all with `force`),
        so they do not expire while their connections live; returns how many
        entries were re-added. A channel that fails is retried at the next pass."""
        now = self._clock()
        due = [ch for ch, t in self._due.items() if force or t <= now]
        if not due:
            self.counters.refreshes += 1
            return 0
        done = 0

        async def one(channel: str) -> None:
            nonlocal done
            conns = self._entries.get(channel)
            if not conns:
                return
            opts = self.rules.lookup(channel)
            entries = {c.id: e.info for c, e in conns.items()}
            try:
                await self.store.add_many(channel, entries, opts.presence_ttl)
            except BrokerError as exc:
                self._failed("refresh", "presence of %s not refreshed: %s", channel, exc)
                return
            if channel in self._due:
                self._due[channel] = now + opts.presence_ttl / 3
            done += len(entries)

        for i in range(0, len(due), 64):  # bounded concurrency: 64 channels at a time
            await asyncio.gather(*(one(ch) for ch in due[i : i + 64]))
        self.counters.refreshes += 1
        self.counters.refreshed += done
        return done

    # broker operations (never raising) ----------------------------------------

    def _failed(self, what: str, msg: str, *args: Any) -> None:
        """Count a failed broker operation; log it, as a warning at most once
        every 10 s per kind of operation (a Redis down is not a log flood)."""
        self.counters.failures += 1
        now = time.monotonic()
        if now - self._warned.get(what, -WARN_INTERVAL) >= WARN_INTERVAL:
            self._warned[what] = now
            log.warning(msg, *args)
        else:
            log.debug(msg, *args)

    async def _add(self, channel: str, client_id: str, info: Info, ttl: float) -> None:
        try:
            await self.store.add(channel, client_id, info, ttl)
        except BrokerError as exc:
            self._failed("add", "presence of %s: entry of %s not added (the next refresh retries): %s",
                         channel, client_id, exc)

    async def _remove(self, channel: str, client_id: str) -> None:
        try:
            await self.store.remove(channel, client_id)
        except BrokerError as exc:
            self._failed("remove", "presence of %s: entry of %s not removed (it expires): %s", channel, client_id, exc)

    async def _publish(self, channel: str, kind: str, info: Info) -> None:
        try:
            await self._bus.publish(notice_channel(channel), notice_payload(channel, kind, info))
        except BrokerError as exc:
            self._failed("publish", "%s notice of %s on %s not sent: %s", kind, info.get("client"), channel, exc)
            return
        self.counters.notices_sent += 1

    # notices to local subscribers ----------------------------------------------

    async def _listen(self, channel: str) -> None:
        """Wait until this server gets `channel`'s notices (its listeners are already registered)."""
        if not self._listeners.get(channel):
            return  # they left before this ran: nothing to subscribe
        try:
            # every caller waits for the subscription to hold (a no-op once it
            # does); the bus registers it before its first await, so a listener
            # leaving from now on unsubscribes it
            await self._bus.subscribe(notice_channel(channel))
        except BrokerError as exc:
            if self._listeners.get(channel):  # else: nobody wants them any more
                self._failed("listen", "join/leave notices of %s: %s", channel, exc)

    def _unlisten(self, channel: str, conn: _Subscriber) -> None:
        listeners = self._listeners.get(channel)
        if listeners is None:
            return
        listeners.discard(conn)
        if not listeners:
            del self._listeners[channel]
            self._bus.unsubscribe(notice_channel(channel))

    def _on_notice(self, bus_channel: str, data: bytes) -> None:
        notice = parse_notice(data)
        if notice is None or notice_channel(notice[0]) != bus_channel:
            log.debug("ignoring a malformed notice on %s", bus_channel)
            return
        listeners = self._listeners.get(notice[0])
        if not listeners:
            return
        payload = notice_payload(*notice)
        for conn in list(listeners):
            if not conn.closed:
                self.counters.notices_delivered += 1
                conn.send(_EVNT, "", notice_frame(payload))
