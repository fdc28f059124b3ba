"""History and recovery on the server: what a subscriber missed, sent in order.

For channels with history (``juggler.channels``), every EVNT carries the
publication's ``offset`` and the history's ``epoch``. On the wire (extension
fields; original clients never send them, so never see the notices):

- a SUB may carry ``"since": {"offset": N, "epoch": "E"}``: the ACK then says
  ``"recovered": true`` and is followed by every EVNT after offset N, in
  order, then the live ones, with no gap and no duplicate; or it says
  ``"recovered": false`` (the history is shorter than the gap, or the epoch
  changed) and the client reloads its state. An empty epoch (``"epoch": ""``)
  asks for no recovery but opts in to the notices below. Every SUB ACK of a
  channel with history carries the channel's current ``offset`` and ``epoch``.
- while subscribed, a gap in what the broker delivers live (the server's
  pub-sub connection to Redis was down) is filled from the history before
  later events go out; when it cannot be, subscribers that opted in get an
  EVNT notice ``{"channel": CH, "recovered": false, "offset": N, "epoch": E}``
  (no ``for``, no ``args``).

A :class:`Stream` per subscribed channel keeps the position delivered last
and the connections joining (reading history while live events arrive: those
are buffered and sent after the history, without duplicates).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import rustext

from juggler.broker.base import BrokerError, Event
from juggler.broker.history import HistoryPage
from juggler.channels import ChannelOptions, ChannelRules

if TYPE_CHECKING:
    from juggler.conn import Conn
    from juggler.metrics import ServerStats

__all__ = ["Delivery", "JoinResult", "PublishResult", "Recovery", "Stream", "Subscription"]


class Subscription(Protocol):
    """What a :class:`Stream` knows of the subscription it follows."""

    @property
    def channel(self) -> str: ...


class Delivery(Protocol):
    """Where a :class:`Stream` sends the events it recovers (the server's
    subscriptions, :class:`juggler.subscriptions.Subscriptions`)."""

    stats: ServerStats

    def deliver(self, sub: Any, event: Event) -> None: ...

log = logging.getLogger("juggler.recovery")

EVNT = rustext.EVNT
_POSITION_ONLY = 1 << 62  # read no publications, only the position


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What a publication became: its uuid and, on channels with history, its position."""

    msg_uuid: str
    offset: int | None = None
    epoch: str | None = None


@dataclass(slots=True)
class JoinResult:
    """The outcome of a SUB on a channel with history (what its ACK says and what follows it)."""

    offset: int
    epoch: str
    #: None: the SUB did not ask to recover
    recovered: bool | None
    #: the EVNTs to send after the ACK, in order
    events: list[Event] = field(default_factory=list)


def unrecovered_notice(channel: str, offset: int, epoch: str) -> bytes:
    """The EVNT telling a subscriber that events were lost and cannot be recovered."""
    return (
        '{"meta":{"type":10,"uuid":"%s"},"payload":{"channel":%s,"recovered":false,"offset":%d,"epoch":%s}}\n'
        % (rustext.new_uuid(), json.dumps(channel), offset, json.dumps(epoch))
    ).encode()


class Recovery:
    """The server's history side: publishing with history, reading it, one Stream per channel."""

    def __init__(self, subscriptions: Delivery, pubsub: Any, rules: ChannelRules) -> None:
        self.subscriptions = subscriptions
        self.pubsub = pubsub
        self.rules = rules
        self.supported = hasattr(pubsub, "publish_history")

    def options(self, channel: str) -> ChannelOptions:
        return self.rules.lookup(channel)

    def history_of(self, channel: str) -> ChannelOptions | None:
        opts = self.rules.lookup(channel)
        return opts if opts.history and self.supported else None

    def stream_for(self, sub: Subscription) -> Stream | None:
        opts = self.history_of(sub.channel)
        return Stream(self, sub, opts) if opts is not None else None

    async def publish(self, channel: str, msg_uuid: str, args: bytes | None) -> PublishResult:
        opts = self.history_of(channel)
        if opts is None:
            await self.pubsub.publish(channel, msg_uuid, args)
            return PublishResult(msg_uuid)
        offset, epoch = await self.pubsub.publish_history(channel, msg_uuid, args, opts)
        return PublishResult(msg_uuid, offset, epoch)

    async def history(self, channel: str, *, after: int = 0, limit: int = 0) -> HistoryPage:
        """Publications of `channel` after offset `after` (the server API); BrokerError without history."""
        opts = self.history_of(channel)
        if opts is None:
            raise BrokerError(f"channel {channel!r} keeps no history")
        return await self.pubsub.read_history(channel, after, limit, opts)


class Stream:
    """Recovery state of one subscribed channel with history (see module doc)."""

    def __init__(self, recovery: Recovery, sub: Subscription, opts: ChannelOptions) -> None:
        self.recovery = recovery
        self.sub = sub
        self.opts = opts
        self.offset: int | None = None  # position delivered last
        self.epoch: str | None = None
        self.joining: dict[Conn, list[Event]] = {}
        self.notify: set[Conn] = set()  # opted in to notices (their SUB had `since`)
        self._held: list[Event] | None = None  # live events waiting behind a gap being filled

    def forget(self, conn: Conn) -> None:
        self.notify.discard(conn)
        self.joining.pop(conn, None)

    # live events --------------------------------------------------------------------

    def on_live(self, event: Event) -> bool:
        """True: deliver `event` now; False: it is a duplicate or waits behind a gap."""
        for buf in self.joining.values():
            buf.append(event)
        if event.offset is None or event.epoch is None:
            return True  # published without history (another publisher)
        if self._held is not None:
            self._held.append(event)
            return False
        if self.epoch is None or self.offset is None:
            self.offset, self.epoch = event.offset, event.epoch
            return True
        if event.epoch != self.epoch:
            self._lost(event.offset, event.epoch)
            self.offset, self.epoch = event.offset, event.epoch
            return True
        if event.offset <= self.offset:
            return False
        if event.offset == self.offset + 1:
            self.offset = event.offset
            return True
        self._held = [event]
        task = asyncio.get_running_loop().create_task(self._fill())
        task.add_done_callback(_log_task_error)
        return False

    def catch_up(self) -> None:
        """The broker subscribed this channel again after losing its pub-sub
        connection: what was published meanwhile never came live. Read from
        the history after the position delivered last (live events wait
        meanwhile), so that a gap at the end of a burst is filled too, not
        only one that a later event reveals."""
        if self.offset is None or self._held is not None:
            return
        self._held = []
        task = asyncio.get_running_loop().create_task(self._fill())
        task.add_done_callback(_log_task_error)

    async def _fill(self) -> None:
        """Fill a gap from the history, then let the held events out."""
        assert self.offset is not None and self._held is not None
        page: HistoryPage | None = None
        try:
            page = await self.recovery.pubsub.read_history(self.sub.channel, self.offset, 0, self.opts)
        except Exception as exc:
            log.warning("channel %s: history unreadable (%s); the gap is reported", self.sub.channel, exc)
        held, self._held = self._held, None
        subs = self.recovery.subscriptions
        gaps = subs.stats.history_gaps
        if page is not None and page.epoch == self.epoch and (
            not page.publications or page.publications[0].offset == self.offset + 1
        ):
            events = page.publications + held
            if page.publications:
                gaps["filled"] = gaps.get("filled", 0) + 1
        elif held:
            gaps["lost"] = gaps.get("lost", 0) + 1
            first = held[0]
            assert first.offset is not None and first.epoch is not None
            self._lost(first.offset - 1, first.epoch)
            self.offset, self.epoch = first.offset - 1, first.epoch
            events = held
        elif page is not None:
            # nothing came live since, and the history no longer joins up (trimmed, or a new epoch)
            gaps["lost"] = gaps.get("lost", 0) + 1
            start = page.publications[0].offset - 1 if page.publications else page.offset
            self._lost(start, page.epoch)
            self.offset, self.epoch = start, page.epoch
            events = page.publications
        else:
            events = []  # the history could not be read: the next live event reveals the gap
        for event in events:
            if event.offset is None or (event.epoch == self.epoch and event.offset <= (self.offset or 0)):
                continue
            self.offset, self.epoch = event.offset, event.epoch
            subs.deliver(self.sub, event)

    def _lost(self, offset: int, epoch: str) -> None:
        if not self.notify:
            return
        log.info("channel %s: events lost and not recoverable; %d subscribers told", self.sub.channel,
                 len(self.notify))
        frame = unrecovered_notice(self.sub.channel, offset, epoch)
        for conn in list(self.notify):
            if not conn.closed:
                conn.send(EVNT, "", frame)

    # joining --------------------------------------------------------------------------

    async def join(self, conn: Conn, since: tuple[int, str] | None) -> JoinResult:
        """Read what `conn` missed (or only the position); live events meanwhile are
        buffered and returned after it. The caller adds `conn` to the live fan-out
        in the same step as it sends the result (no event can slip between)."""
        buf: list[Event] = []
        self.joining[conn] = buf
        try:
            after = since[0] if since is not None and since[1] else _POSITION_ONLY
            page = await self.recovery.pubsub.read_history(self.sub.channel, after, 0, self.opts)
        finally:
            self.joining.pop(conn, None)
        if self.epoch is None and self._held is None:
            self.offset, self.epoch = page.offset, page.epoch
        recovered: bool | None = None
        events: list[Event] = []
        if since is not None:
            self.notify.add(conn)
            offset, epoch = since
            if epoch:
                pubs = page.publications
                recovered = page.epoch == epoch and offset <= page.offset and (
                    offset == page.offset or (bool(pubs) and pubs[0].offset == offset + 1)
                )
                if recovered:
                    events = list(pubs)
        last = events[-1].offset if events else page.offset
        for event in buf:  # live events that came while the history was read
            if event.offset is None or event.epoch != page.epoch or event.offset > (last or 0):
                events.append(event)
                if event.offset is not None and event.epoch == page.epoch:
                    last = event.offset
        return JoinResult(page.offset, page.epoch, recovered, events)


def _log_task_error(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("history fill failed: %s", task.exception())
