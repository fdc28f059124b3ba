"""The juggler.0 session of one connection, without I/O.

What the server does with the messages a client sends is decided here,
the way :mod:`juggler.wsproto` decides the websocket protocol: no socket,
no task, no clock (times are passed in). A driver (:class:`juggler.conn.Conn`
for websockets) feeds it the text frames received and the outcome of the
broker work it asked for, and writes the frames it hands back.

The rules it holds:

- **Parsing and types.** A frame that is not a juggler.0 client message
  (invalid JSON, unknown, server-only or forbidden type, bad uuid) ends the
  connection without a NACK, after the replies to the messages before it.
- **Rate.** Over ``rate_limit`` messages/s: NACK 429, in order, or (with
  ``rate_limit_action = "close"``) a 1008 close after the replies before it,
  every later message ignored.
- **Order.** What the protocol orders stays ordered, the rest runs side by
  side (:meth:`Session.next_item`): up to ``max_concurrent_messages`` of a
  connection's messages are handled at once, so that a slow Redis does not
  make every message wait for the one before it. CALLs do not wait for each
  other; a PUB waits for the PUBs to its channel before it; a SUB or UNSB
  waits for everything before it, and everything after waits for it (its
  ACK comes before the events it brings, and a PUB after it is seen by it).
  ACKs and NACKs go out in request order all the same: the replies of a
  message are held (:meth:`Session.reply`) until those of the messages
  before it are out (:meth:`Session.done`).
- **Extensions** (:mod:`juggler.extensions`): a message of a type from 256
  up is accepted only when the server handles that type
  (:attr:`Session.extensions`); it is ordered like a SUB and its handler
  decides everything else.
- **Admission** (:meth:`Session.admit`): authorization (401/403), a draining
  server (CALL: 503), calls in flight (429), the call timeout (nanoseconds
  to milliseconds, the server default under 1 ms, NACK 500 when negative),
  subscriptions per connection, recovery and join/leave options.
- **Replies** (:meth:`Session.ack`, :meth:`Session.nack`,
  :meth:`Session.subscribed`): the frames, counted.
- **Outgoing size** (:meth:`Session.frame_fits`): a frame over
  ``write_limit`` closes the connection with 1009.
- **Why it closed** (:attr:`Session.close_reason`): the first reason wins.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container
from typing import Any, Protocol

import rustext

from juggler.config import ServerConfig
from juggler.extensions import EXTENSION_MIN, parse_extension
from juggler.limits import TokenBucket
from juggler.metrics import ServerStats
from juggler.protocol import ALL_CLIENT_TYPES, ClientMessage, JugglerDecodeError, call_timeout_ms

__all__ = ["CloseAfter", "Refused", "Session", "Work"]

CALL, PUB, SUB, UNSB = rustext.CALL, rustext.PUB, rustext.SUB, rustext.UNSB
NACK, ACK, RES, EVNT = rustext.NACK, rustext.ACK, rustext.RES, rustext.EVNT

_parse = rustext.parse_client_message
_build_ack = rustext.build_ack
_build_nack = rustext.build_nack
_build_sub_ack = rustext.build_sub_ack
_build_evnt = rustext.build_evnt

_KIND = {CALL: "call", PUB: "pub", SUB: "sub"}
_CLOSE_REASONS = {1000: "server_close", 1001: "shutdown", 1008: "policy", 1011: "internal_error"}

#: one outgoing frame: (message type, the uuid it answers or carries, the frame)
Frame = tuple[int, str, bytes]


class Work:
    """A message to handle (through the middleware, then the broker): its
    turn came (:meth:`Session.next_item`)."""

    __slots__ = ("finished", "key", "msg", "received_at", "replies")

    def __init__(self, msg: ClientMessage, received_at: float) -> None:
        self.msg = msg
        #: when it was received (the driver's clock): what a slow message is measured from
        self.received_at = received_at
        t = msg.type
        #: what it must not run beside: "" (anything: a SUB/UNSB), a PUB's channel, None (a CALL)
        self.key: str | None = None if t == CALL else msg.channel if t == PUB else ""
        #: replies held until the messages before it have their replies out (made when needed)
        self.replies: list[Frame] | None = None
        self.finished = False


class Refused:
    """A message refused on arrival (the rate limit): NACK it, in its turn."""

    __slots__ = ("code", "msg", "text")

    def __init__(self, msg: ClientMessage, code: int, text: str) -> None:
        self.msg = msg
        self.code = code
        self.text = text


class CloseAfter:
    """The end of the connection, in its turn (after the replies to the
    messages before it): with a close frame (``code``), or without one
    (``code`` None: bad input drops the TCP connection)."""

    __slots__ = ("code", "reason")

    def __init__(self, code: int | None, reason: str = "") -> None:
        self.code = code
        self.reason = reason


Item = Work | Refused | CloseAfter


class Channels(Protocol):
    """What a SUB's admission asks of the server's channels."""

    def has_history(self, channel: str) -> bool: ...

    def sends_join_leave(self, channel: str) -> bool: ...


class Session:
    """The juggler.0 rules of one connection (see the module doc).

    ``stats`` are the server's counters; ``reject(reason)`` counts one
    refusal by reason (``juggler_rejections_total``). Neither does I/O.
    """

    __slots__ = (
        "_bucket", "_ignore_text", "_reject", "_running", "_subs", "allowed", "close_reason", "config",
        "extensions", "identity", "messages_in", "open", "queue", "stats",
    )

    def __init__(self, config: ServerConfig, stats: ServerStats, reject: Callable[[str], None], *,
                 now: float) -> None:
        self.config = config
        self.stats = stats
        self._reject = reject
        #: the message types this client may send (the Juggler-Allowed-Messages handshake header)
        self.allowed = ALL_CLIENT_TYPES
        #: the extension message types (256 and above) the server handles; any other is bad input
        self.extensions: Container[int] = ()
        #: who the client is (juggler.auth.Identity), when the server authenticates
        self.identity: Any = None
        #: why the connection ended, once it is ending (logs, juggler_connections_closed_total)
        self.close_reason: str | None = None
        #: messages received (juggler.0 text frames parsed)
        self.messages_in = 0
        #: items waiting for their turn (read-only for drivers: the hot path tests it without a call)
        self.queue: deque[Item] = deque()
        #: Works handed out whose replies are not all out yet, oldest first (read-only for drivers)
        self.open: deque[Work] = deque()
        self._running = 0  # Works handed out and not done
        self._ignore_text = False  # closing for the rate limit: later messages are ignored
        self._subs: set[tuple[bool, str]] = set()  # (pattern, channel) subscribed
        self._bucket: TokenBucket | None = None
        if config.rate_limit:
            self._bucket = TokenBucket(config.rate_limit, config.rate_burst or max(1.0, config.rate_limit), now)

    # --- what the client sent ------------------------------------------------------------

    def receive_text(self, data: bytes, now: float) -> CloseAfter | None:
        """One text frame received. It is queued (a message, a refusal, or
        the end of the connection after what is queued); or, with nothing
        queued before it, the end is returned to be acted on now."""
        if self._ignore_text:
            return None
        try:
            msg = _parse(data, self.allowed)
            self.stats.read[msg.type] += 1
        except JugglerDecodeError as exc:
            msg = parse_extension(data, self.extensions) if self.extensions else None
            if msg is None:
                return self._end(self._bad_input(str(exc)))
            read = self.stats.extensions_read
            read[msg.type] = read.get(msg.type, 0) + 1
        self.messages_in += 1
        bucket = self._bucket
        if bucket is not None and not bucket.take(now):
            self._reject("rate_limited")
            if self.config.rate_limit_action == "close":
                # later messages are ignored; control frames are still read (the
                # client's answer to the close frame ends the connection)
                self._ignore_text = True
                self.set_reason("rate_limited")
                return self._end(CloseAfter(1008, "rate limit exceeded"))
            self.queue.append(Refused(msg, 429, "rate limit exceeded"))
            return None
        self.queue.append(Work(msg, now))
        return None

    def receive_binary(self) -> CloseAfter | None:
        """A binary frame: juggler.0 is text only."""
        return self._end(self._bad_input("binary frame"))

    def _bad_input(self, why: str) -> CloseAfter:
        self.set_reason("bad_input")
        self.stats.protocol_errors += 1
        return CloseAfter(None, why)

    def _end(self, end: CloseAfter) -> CloseAfter | None:
        if not self.queue and not self.open:
            return end
        self.queue.append(end)
        return None

    @property
    def queued(self) -> int:
        """Items waiting for their turn."""
        return len(self.queue)

    @property
    def running(self) -> int:
        """Works handed out and not :meth:`done` yet."""
        return self._running

    def next_item(self) -> Item | None:
        """The next item that may be handled now, or None (nothing queued,
        or what is queued must wait for work handed out). A
        :class:`Refused` or :class:`CloseAfter` (and a SUB/UNSB) waits until
        the replies of everything before it are out; a :class:`CloseAfter`
        is the last: what was queued after it is forgotten."""
        queue = self.queue
        if not queue:
            return None
        head = queue[0]
        if not self.open:  # nothing handed out: the head goes, whatever it is
            queue.popleft()
            if head.__class__ is Work:  # the common case, without a call
                self.open.append(head)  # type: ignore[arg-type]
                self._running += 1
                return head
            return self._hand_out(head)
        if head.__class__ is not Work or head.key == "" or self._running >= self.config.max_concurrent_messages:
            return None
        # CALLs and PUBs may overtake work handed out, and each other, but never a PUB to
        # their channel (running or queued before them) nor anything queued behind a barrier
        running = {w.key for w in self.open if not w.finished and w.key is not None}
        if "" in running:
            return None
        earlier: set[str] = set()
        for i, item in enumerate(queue):
            if item.__class__ is not Work or item.key == "":
                return None
            key = item.key
            if key is not None:
                if key in running or key in earlier:
                    earlier.add(key)
                    continue
            del queue[i]
            return self._hand_out(item)
        return None

    def _hand_out(self, item: Item) -> Item:
        if item.__class__ is Work:
            self.open.append(item)  # type: ignore[arg-type]
            self._running += 1
        elif item.__class__ is CloseAfter:
            self.queue.clear()
        return item

    def reply(self, msg: ClientMessage, frame: Frame) -> bool:
        """A reply to `msg` (an ACK, a NACK, the events a SUB recovered):
        True when it may be written now (every message before it has its
        replies out, or `msg` is not one handed out), False when the
        session holds it until then (see :meth:`done`)."""
        opened = self.open
        if not opened or opened[0].msg is msg:
            return True
        for work in opened:
            if work.msg is msg:
                if work.replies is None:
                    work.replies = [frame]
                else:
                    work.replies.append(frame)
                return False
        return True

    def done(self, work: Work) -> list[Frame] | tuple[()]:
        """`work` is handled (replied to, or failed): the replies that may be
        written now, in order (its own held ones and those of later work that
        finished before it, up to the first still running)."""
        if work.finished:
            return ()
        work.finished = True
        self._running -= 1
        opened = self.open
        if not opened or opened[0] is not work:
            return ()  # an earlier message has replies to send first
        opened.popleft()
        if not opened:
            return ()  # the common case: it was the only one
        out: list[Frame] = []
        while opened and opened[0].finished:
            held = opened.popleft().replies
            if held:
                out += held
        if opened:  # the new oldest is running: what it said so far goes now, the rest as it comes
            head = opened[0]
            if head.replies:
                out += head.replies
                head.replies = None
        return out

    def clear(self) -> None:
        """Forget what is queued and held (the connection is ending)."""
        self.queue.clear()
        self.open.clear()
        self._running = 0

    # --- deciding ---------------------------------------------------------------------------

    def admit(self, msg: ClientMessage, draining: bool, inflight: int,
              channels: Channels | None = None, waiting: int = 0) -> tuple[int, str] | int | None:
        """Whether `msg` may go to the broker: a refusal ``(code, text)`` to
        NACK, else None, or for a CALL its timeout in milliseconds.
        ``draining``: the server is shutting down; ``inflight``: this
        connection's calls waiting for their RES; ``channels``: what the
        server's channels offer (history, join/leave notices), for a SUB;
        ``waiting``: the calls of every connection waiting for their RES."""
        t = msg.type
        if t >= EXTENSION_MIN:
            return None  # its handler decides
        identity = self.identity
        if identity is not None and t != UNSB:
            refusal = identity.check(_KIND[t], msg.uri if t == CALL else msg.channel)
            if refusal is not None:
                self._reject("unauthorized" if refusal[0] == 401 else "forbidden")
                return refusal
        cfg = self.config
        if t == CALL:
            if draining:
                self._reject("draining")
                return 503, "server shutting down"
            cap = cfg.max_inflight_calls
            if cap and inflight >= cap:
                self._reject("inflight_limit")
                return 429, f"too many calls in flight (max {cap})"
            cap = cfg.max_waiting_calls
            if cap and waiting >= cap:  # beyond what the callees serve in time: refused now, not timed out later
                self._reject("overloaded")
                return 503, f"server overloaded: {cap} calls waiting for their results"
            ms = call_timeout_ms(msg.timeout_ns, cfg.call_timeout_ms)
            if ms <= 0:
                return 500, f"invalid call timeout: {msg.timeout_ns} ns"
            return ms
        if t == SUB:
            key = (msg.pattern, msg.channel)
            cap = cfg.max_subscriptions
            if cap and key not in self._subs and len(self._subs) >= cap:
                self._reject("subscription_limit")
                return 500, f"too many subscriptions (max {cap})"
            if msg.since is not None:
                if msg.pattern:
                    return 400, "since (recovery) needs a channel, not a pattern"
                if channels is None or not channels.has_history(msg.channel):
                    return 400, f"channel {msg.channel!r} keeps no history to recover from"
            if msg.join_leave and (msg.pattern or channels is None or not channels.sends_join_leave(msg.channel)):
                return 400, f"channel {msg.channel!r} sends no join/leave notices"
        return None

    # --- replies ----------------------------------------------------------------------------

    def ack(self, msg: ClientMessage) -> Frame:
        """The ACK of a message the broker took (CALL: queued; PUB: published;
        SUB/UNSB: done)."""
        t = msg.type
        if t == CALL:
            self.stats.calls += 1
            return ACK, msg.uuid, _build_ack(msg.uuid, CALL, msg.uri)
        if t == PUB:
            self.stats.publishes += 1
        elif t == SUB:
            self._subs.add((msg.pattern, msg.channel))
        elif t == UNSB:
            self._subs.discard((msg.pattern, msg.channel))
        return ACK, msg.uuid, _build_ack(msg.uuid, t, msg.channel)

    def nack(self, msg: ClientMessage, code: int, message: str) -> Frame:
        """The NACK refusing `msg`."""
        target = msg.uri if msg.type == CALL else msg.channel
        self.stats.nacks += 1
        return NACK, msg.uuid, _build_nack(msg.uuid, msg.type, target or "", code, message)

    def subscribed(self, msg: ClientMessage, joined: Any) -> list[Frame]:
        """The replies to a SUB the subscriptions took: its ACK, with the
        channel's position (and whether the recovery asked for worked) when
        the channel keeps history, then the events recovered."""
        self._subs.add((msg.pattern, msg.channel))
        if joined is None:
            return [(ACK, msg.uuid, _build_ack(msg.uuid, SUB, msg.channel))]
        stats = self.stats
        if joined.recovered is not None:
            outcome = "recovered" if joined.recovered else "not_recovered"
            stats.recoveries[outcome] = stats.recoveries.get(outcome, 0) + 1
        frames = [(ACK, msg.uuid, _build_sub_ack(msg.uuid, msg.channel, joined.offset, joined.epoch,
                                                 joined.recovered))]
        for ev in joined.events:
            stats.events += 1
            frames.append((EVNT, ev.msg_uuid, _build_evnt(ev.msg_uuid, ev.channel, None, ev.args, ev.offset,
                                                          ev.epoch)))
        return frames

    def subscribed_by_server(self, channel: str) -> bool | None:
        """A subscription the server makes without a SUB (juggler.serversubs): counted
        against ``max_subscriptions`` as a SUB's. None: there is one already; False:
        over the limit (counted as a refusal)."""
        key = (False, channel)
        if key in self._subs:
            return None
        cap = self.config.max_subscriptions
        if cap and len(self._subs) >= cap:
            self._reject("subscription_limit")
            return False
        self._subs.add(key)
        return True

    def unsubscribed(self, channel: str, pattern: bool) -> None:
        """A subscription ended from the server's side."""
        self._subs.discard((bool(pattern), channel))

    # --- what goes out, and the end ---------------------------------------------------------

    def frame_fits(self, frame: bytes) -> bool:
        """Whether an outgoing frame is within ``write_limit``; when not, the
        connection is to close with 1009 (the reason is set)."""
        limit = self.config.write_limit
        if limit and len(frame) > limit:
            self.set_reason("too_big")
            return False
        return True

    def set_reason(self, reason: str) -> None:
        """Why the connection ends; the first reason given stays."""
        if self.close_reason is None:
            self.close_reason = reason

    def closing(self, code: int) -> None:
        """The server closes with `code`: the reason it means, unless one was given."""
        self.set_reason(_CLOSE_REASONS.get(code) or f"close_{code}")
