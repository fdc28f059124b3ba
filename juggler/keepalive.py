"""Keepalive, sans-I/O: when the server pings a connection, when a
connection counts as dead, and when a client counts its server as dead.

No socket, task or clock: times are passed in (``loop.time()`` in the
drivers, plain numbers in tests), and the times of the last bytes and the
last message received are kept by the driver (one store each), so nothing
here runs per message.

**Server side** (:class:`Keepalive`, driven by :class:`juggler.conn.Conn`):

- Every ``ping_interval`` seconds the connection is sent a websocket ping,
  and, if it opted in at the handshake, a KEEPALIVE message (below).
- Anything received counts as life: a pong, a message, any frame. A ping
  after which nothing is received within ``pong_timeout`` means the peer is
  gone: the connection is closed (reason ``ping_timeout``). A silent peer is
  thus closed within ``ping_interval + pong_timeout`` of the last bytes it
  sent. The deadline runs from the ping, not from the last bytes received:
  a server paused for a while (a stopped process, a migrated VM) pings first
  when it comes back rather than dropping every client at once.
- ``read_timeout`` (0 = off): no message received for that long closes
  the connection (reason ``read_timeout``): an idle client, however well it
  answers pings. Control frames (pings, pongs) do not count, as with the
  original server, whose read deadline only a message moves.

**The KEEPALIVE extension** (type 256, see ``docs/protocols/juggler.md``):
browsers cannot see websocket pings, so a client that asks for it (the
``Juggler-Keepalive: 1`` handshake header or the ``juggler-keepalive=1``
query parameter) is also sent ``{"meta": {"type": 256, "uuid": …},
"payload": {"interval_ms": N}}`` once when it connects and with every ping.
Clients that did not ask (the original Go client, its tools) never get it.
The client sends nothing back; the websocket pong its library sends to the
ping is its side of the keepalive.

**Client side** (:class:`ServerWatch`): once a KEEPALIVE said the
interval, a client that receives nothing from its server for the interval
plus a grace counts the connection as dead. Before the first KEEPALIVE (a
server without the extension, or with pings off) it waits for ever, as
before.
"""

from __future__ import annotations

import math
from typing import Any

from juggler.extensions import KEEPALIVE

__all__ = [
    "HEADER",
    "KEEPALIVE",
    "PING",
    "PING_TIMEOUT",
    "QUERY",
    "READ_TIMEOUT",
    "Keepalive",
    "ServerWatch",
    "keepalive_frame",
    "keepalive_interval",
    "opted_in",
]

#: the handshake header a client asks for KEEPALIVE messages with
HEADER = "Juggler-Keepalive"
#: the query parameter of the websocket URL that asks for them (browsers cannot send headers)
QUERY = "juggler-keepalive"

#: what :meth:`Keepalive.tick` asks for: send a ping (and a KEEPALIVE if opted in)
PING = "ping"
#: the connection is dead: a ping got nothing back within pong_timeout
PING_TIMEOUT = "ping_timeout"
#: the connection is idle: nothing received for read_timeout
READ_TIMEOUT = "read_timeout"

_INF = math.inf


def opted_in(value: str | None) -> bool:
    """Whether a ``Juggler-Keepalive`` header (or query parameter) value asks
    for KEEPALIVE messages: ``1`` yes; ``0``, empty or absent no (surrounding
    spaces ignored); ValueError for anything else."""
    if value is None:
        return False
    v = value.strip()
    if not v:
        return False
    if v == "1":
        return True
    if v == "0":
        return False
    raise ValueError(f"expected 1 or 0, got {value[:40]!r}")


def keepalive_frame(msg_uuid: str, interval: float) -> bytes:
    """The KEEPALIVE message telling a client the ping interval (seconds), as a server frame."""
    return b'{"meta":{"type":256,"uuid":"%s"},"payload":{"interval_ms":%d}}\n' % (
        msg_uuid.encode(), max(1, round(interval * 1000)))


def keepalive_interval(payload: Any) -> float | None:
    """The interval (seconds) a KEEPALIVE's decoded payload announces, or
    None when it announces none a client can use (not a positive integer
    ``interval_ms``): such a message is ignored."""
    if not isinstance(payload, dict):
        return None
    ms = payload.get("interval_ms")
    if type(ms) is not int or ms <= 0:  # bool is an int: not a number of milliseconds
        return None
    return ms / 1000


class Keepalive:
    """The server's keepalive rules for one connection (see the module doc).

    The driver calls :meth:`tick` at :meth:`next_tick` (or later) with the
    time, the time of the last bytes received and that of the last message,
    does what it returns, and asks :meth:`next_tick` again. A timer that
    fires late is harmless: what is due is done then.
    """

    __slots__ = ("awaiting", "interval", "next_ping", "pong_timeout", "read_timeout")

    def __init__(self, *, ping_interval: float, pong_timeout: float, read_timeout: float = 0.0,
                 now: float) -> None:
        if ping_interval < 0 or read_timeout < 0:
            raise ValueError("ping_interval and read_timeout must be >= 0")
        if ping_interval and pong_timeout <= 0:
            raise ValueError("pong_timeout must be > 0")
        self.interval = ping_interval
        self.pong_timeout = pong_timeout
        self.read_timeout = read_timeout
        #: when the next ping is due (inf: pings off)
        self.next_ping = now + ping_interval if ping_interval else _INF
        #: when the oldest ping not answered yet (nothing received since) went out, or None
        self.awaiting: float | None = None

    @property
    def active(self) -> bool:
        """Whether there is anything to time at all (pings or read_timeout on)."""
        return bool(self.interval or self.read_timeout)

    def tick(self, now: float, last_in: float, last_message: float) -> str | None:
        """What is due at `now`, given `last_in`, the time of the last bytes
        received (any frame), and `last_message`, that of the last message:
        :data:`PING` (send one), :data:`READ_TIMEOUT` or :data:`PING_TIMEOUT`
        (close the connection), or None (nothing yet)."""
        # each deadline computed as next_tick computes it: a timer set for it finds it due
        rt = self.read_timeout
        if rt and now >= last_message + rt:
            return READ_TIMEOUT
        awaiting = self.awaiting
        if awaiting is not None:
            if last_in >= awaiting:
                self.awaiting = None  # answered (or any traffic since the ping)
            elif now >= awaiting + self.pong_timeout:
                return PING_TIMEOUT
        if now >= self.next_ping:
            self.next_ping = now + self.interval
            if self.awaiting is None:
                self.awaiting = now
            return PING
        return None

    def next_tick(self, last_message: float) -> float | None:
        """When :meth:`tick` has something to do next, given the time of the
        last message, or None (nothing to time)."""
        t = self.next_ping
        if self.awaiting is not None:
            t = min(t, self.awaiting + self.pong_timeout)
        if self.read_timeout:
            t = min(t, last_message + self.read_timeout)
        return None if t == _INF else t


class ServerWatch:
    """A client's rule for a dead server (see the module doc): armed by the
    first KEEPALIVE, dead after ``interval + grace`` without anything received."""

    __slots__ = ("grace", "interval")

    def __init__(self, grace: float) -> None:
        if not grace > 0:
            raise ValueError("the keepalive grace must be > 0")
        self.grace = grace
        #: the interval the server announced (seconds), None before its first KEEPALIVE
        self.interval: float | None = None

    @property
    def limit(self) -> float | None:
        """How long the client waits for anything from the server, or None (for ever)."""
        return None if self.interval is None else self.interval + self.grace

    def announced(self, payload: Any) -> bool:
        """A KEEPALIVE came with this (decoded) payload: True when it announced
        a usable interval (the watch is armed), False when it is ignored."""
        interval = keepalive_interval(payload)
        if interval is None:
            return False
        self.interval = interval
        return True

    def deadline(self, last_in: float) -> float | None:
        """When the server counts as dead unless something arrives first (None: never)."""
        limit = self.limit
        return None if limit is None else last_in + limit

    def dead(self, now: float, last_in: float) -> bool:
        """Whether nothing came for longer than the server's interval plus the grace."""
        deadline = self.deadline(last_in)
        return deadline is not None and now >= deadline
