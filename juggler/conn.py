"""One websocket connection of the juggler server.

A thin asyncio ``Protocol``. The opening handshake goes through websockets'
sans-I/O ``ServerProtocol`` (HTTP parsing, validation, the 101 response);
after it, frames are read and written by this connection directly (RFC
6455: masked client frames, unmasked server frames, ping/pong, the closing
handshake), because the generic parser costs more per message than
everything else the server does. Client frames are parsed by the sans-I/O
Rust reader ``rustext.WsFrameReader`` (buffering, ``read_limit``,
unmasking, reassembly, protocol checks); this module acts on its events. Frames out are coalesced per event-loop turn into one
``transport.write``. No task per connection while idle: a worker task exists
only while messages are queued.

Contract:

- Messages from one connection are processed one at a time, in order (ACKs
  come back in request order); RES and EVNT are written as they come.
- Bad input (binary frame, invalid JSON, unknown/server-only/forbidden type,
  missing payload, bad uuid) closes this connection only, without a NACK and
  without a close frame, after the replies to the messages before it.
- An oversized message (``read_limit``) closes with 1009; an outgoing
  message over ``write_limit`` closes the connection; a reader that lets
  ``max_write_buffer`` bytes pile up, or blocks writes for ``write_timeout``,
  is dropped; one silent for ``read_timeout`` is dropped.
- An exception in a handler (middleware included) is logged, counted
  (``recovered``) and closes this connection with 1011; the server goes on.
- More than ``max_pending`` queued messages pause reading (backpressure).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import rustext
from websockets.http11 import Request
from websockets.server import ServerProtocol

from juggler.broker.base import Event
from juggler.http import http_response
from juggler.limits import TokenBucket
from juggler.protocol import (
    ALL_CLIENT_TYPES,
    SUBPROTOCOL,
    ClientMessage,
    JugglerDecodeError,
    Outgoing,
    allowed_mask,
    call_timeout_ms,
)

if TYPE_CHECKING:
    from juggler.server import Server

__all__ = ["Conn", "ConnState", "Handler", "Middleware"]

log = logging.getLogger("juggler.conn")
# websockets' own per-connection lines ("connection open", …): quiet unless asked
_ws_log = logging.getLogger("juggler.conn.ws")

CALL, PUB, SUB, UNSB = rustext.CALL, rustext.PUB, rustext.SUB, rustext.UNSB
NACK, ACK, RES, EVNT = rustext.NACK, rustext.ACK, rustext.RES, rustext.EVNT

_parse = rustext.parse_client_message
_build_ack = rustext.build_ack
_build_nack = rustext.build_nack
_build_res = rustext.build_res
_build_evnt = rustext.build_evnt
_WS_PING, _WS_CLOSE, _WS_BINARY = rustext.WS_PING, rustext.WS_CLOSE, rustext.WS_BINARY


class ConnState(enum.Enum):
    """Passed to the server's ``on_conn_state`` callback."""

    ACCEPTING = "accepting"  # handshake request received; raise to refuse (403)
    CONNECTED = "connected"  # juggler.0 negotiated, messages flow
    CLOSED = "closed"  # gone (called once, also for refused handshakes)


Message = ClientMessage | Outgoing
Handler = Callable[["Conn", Message], Awaitable[None]]
Middleware = Callable[["Conn", Message, Handler], Awaitable[None]]

_BAD = object()  # inbox marker: bad input after the queued messages
_KIND = {CALL: "call", PUB: "pub", SUB: "sub"}


class _Refused:
    """Inbox entry: a message refused on arrival (rate limit), NACKed in order."""

    __slots__ = ("code", "msg", "text")

    def __init__(self, msg: ClientMessage, code: int, text: str) -> None:
        self.msg = msg
        self.code = code
        self.text = text


def _close_frame(code: int, reason: str = "") -> bytes:
    body = code.to_bytes(2, "big") + reason.encode()[:123]
    return bytes((0x88, len(body))) + body


def _ws_header(n: int) -> bytes:
    if n < 126:
        return bytes((0x81, n))
    if n < 65536:
        return b"\x81\x7e" + n.to_bytes(2, "big")
    return b"\x81\x7f" + n.to_bytes(8, "big")


def _allowed_messages(request: Request) -> str | None:
    """The Juggler-Allowed-Messages header, else the ``juggler-allowed-messages``
    query parameter (browsers cannot send handshake headers)."""
    header = request.headers.get("Juggler-Allowed-Messages")
    if header is not None or "?" not in request.path:
        return header
    values = parse_qs(request.path.split("?", 1)[1]).get("juggler-allowed-messages")
    return values[-1] if values else None


class Conn(asyncio.Protocol):
    """One client connection (see module doc). Created by :class:`Server`."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.config = server.config
        self.stats = server.stats
        self.broker = server.broker
        self.pubsub = server.pubsub
        self.loop = asyncio.get_running_loop()
        self.id = rustext.new_uuid()
        self.state = ConnState.ACCEPTING
        self.request: Request | None = None
        self.allowed = ALL_CLIENT_TYPES
        self.remote: Any = None
        self.transport: asyncio.Transport | None = None
        self._offered: list[str] = []
        cfg = self.config
        self.proto = ServerProtocol(
            # a plain function: websockets binds it to the protocol object
            select_subprotocol=lambda _proto, offered: self._select_subprotocol(offered),
            max_size=cfg.read_limit or None,
            logger=_ws_log,
        )
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._inbox: deque[Any] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._subs: set[tuple[bool, str]] = set()  # (pattern, channel) subscribed
        # frames after the handshake: buffering, read_limit, unmasking, reassembly
        self._reader = rustext.WsFrameReader(cfg.read_limit)
        self._sniff: bytearray | None = bytearray()  # start of the request, until its method is known
        self._head = False  # a HEAD request (plain HTTP, see juggler.static_files)
        self._fast = False  # handshake done: frames are parsed here, not by websockets
        self._head_tail = b""  # last bytes of the request head seen, to find its end across reads
        self._open = False  # data frames may be written
        self._close_sent = False
        self._doomed = False  # bad input seen: ignore the rest
        self._ignore_text = False  # closing for the rate limit: ignore further messages
        self._closed = False
        self._paused = False
        self._last_read = self.loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._closed_fut: asyncio.Future[None] = self.loop.create_future()
        self._slow = cfg.slow_threshold
        self._chained = bool(server.middleware)
        #: who this connection is (juggler.auth.Identity), when the server has auth
        self.identity: Any = None
        #: why it closed (a short token: logs and juggler_connections_closed_total{reason})
        self.close_reason: str | None = None
        #: CALLs ACKed and waiting for their RES
        self.inflight = 0
        self.messages_in = 0
        self.opened_at = self.loop.time()
        self._bucket: TokenBucket | None = None
        if cfg.rate_limit:
            self._bucket = TokenBucket(cfg.rate_limit, cfg.rate_burst or max(1.0, cfg.rate_limit), self.opened_at)

    def __repr__(self) -> str:
        return f"<Conn {self.id} {self.remote} {self.state.value}>"

    @property
    def closed(self) -> bool:
        return self._closed

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed_fut)

    # asyncio.Protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.remote = transport.get_extra_info("peername")
        self._timer = self.loop.call_later(self.config.handshake_timeout, self._handshake_timed_out)
        self.server._conn_made(self)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._last_read = self.loop.time()
        if self._fast:
            self._frames_in(data)
            if self._out:
                self._flush()
            return
        proto = self.proto
        if self._sniff is not None:
            data = self._sniff_method(data)
            if not data:
                return
        # websockets sees the request head only: bytes after it (frames a client
        # sent without waiting for the 101) are this connection's to parse, even
        # when a frame is split between this read and the next.
        seen = self._head_tail + data
        end = seen.find(b"\r\n\r\n")
        if end < 0:
            self._head_tail = seen[-3:]
            proto.receive_data(data)
            rest = b""
        else:
            cut = end + 4 - len(self._head_tail)
            proto.receive_data(data[:cut])
            rest = data[cut:]
        for ev in proto.events_received():
            if self._closed or self._doomed:
                break
            if ev.__class__ is Request:
                self._on_request(ev)  # type: ignore[arg-type]
        if rest and self._fast:
            self._frames_in(rest)
        self._flush()

    def eof_received(self) -> bool:
        if self._fast:
            return False
        self.proto.receive_eof()
        self.proto.events_received()
        self._flush()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        for t in (self._timer, self._write_timer):
            if t is not None:
                t.cancel()
        self._timer = self._write_timer = None
        self._out.clear()
        was_connected = self.state is ConnState.CONNECTED
        self.state = ConnState.CLOSED
        self.server._conn_lost(self, was_connected)
        if not self._closed_fut.done():
            self._closed_fut.set_result(None)

    def pause_writing(self) -> None:
        wt = self.config.write_timeout
        if wt and self._write_timer is None:
            self._write_timer = self.loop.call_later(wt, self._write_timed_out)

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    # handshake ------------------------------------------------------------------

    def _select_subprotocol(self, offered: Any) -> str | None:
        self._offered = list(offered)
        return SUBPROTOCOL if SUBPROTOCOL in self._offered else None

    def _sniff_method(self, data: bytes) -> bytes:
        """A HEAD is handed to websockets as a GET (older versions parse GET only)
        and answered without its body."""
        buf = self._sniff
        assert buf is not None
        buf += data
        if len(buf) < 5 and b"HEAD ".startswith(bytes(buf)):
            return b""
        self._sniff = None
        if buf.startswith(b"HEAD "):
            self._head = True
            return b"GET " + bytes(buf[5:])
        return bytes(buf)

    def _on_request(self, request: Request) -> None:
        self.request = request
        proto = self.proto
        path = request.path.split("?", 1)[0]
        if path != self.config.path or self._head:
            # plain HTTP: one response, then close. /healthz first, then the static
            # site (the browser client, the demo page), else 404.
            self.close_reason = "http"
            response = http_response(self, request)
            if response is None:
                site = self.server.http
                response = (site.respond(request, head=self._head) if site is not None
                            else proto.reject(404, "Not Found\n"))
            self._refuse(response)
            return
        server = self.server
        if server.draining:
            self._refuse_for("draining", 503, "Service Unavailable: shutting down\n")
            return
        cap = self.config.max_connections
        if cap and server.stats.connections_active >= cap:
            self._refuse_for("max_connections", 503, "Service Unavailable: too many connections\n")
            return
        if server.auth is not None:
            from juggler.auth import AuthError

            try:
                self.identity = server.auth.authenticate(request)
            except AuthError as exc:
                log.debug("connection %s refused: %s", self.remote, exc)
                reason = "origin" if exc.status == 403 else "unauthenticated"
                text = "Forbidden\n" if exc.status == 403 else "Unauthorized\n"
                self._refuse_for(reason, exc.status, text)
                return
        try:
            self.allowed = allowed_mask(_allowed_messages(request))
        except ValueError as exc:
            self._refuse(proto.reject(400, f"Invalid Juggler-Allowed-Messages header: {exc}\n"))
            return
        try:
            self.server._conn_state(self, ConnState.ACCEPTING)
        except Exception as exc:
            log.info("connection %s refused by on_conn_state: %s", self.remote, exc)
            self._refuse(proto.reject(403, "Forbidden\n"))
            return
        response = proto.accept(request)
        proto.send_response(response)
        if response.status_code != 101:
            self._flush()
            self._close_transport()
            return
        if proto.subprotocol is None and (self._offered or not self.config.allow_empty_subprotocol):
            # upstream upgrades, then drops the connection at once (no close frame)
            log.debug("connection %s: no juggler.0 subprotocol (offered %s)", self.remote, self._offered)
            self._flush()
            self._close_transport()
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.state = ConnState.CONNECTED
        self._fast = self._open = True
        self.server._conn_connected(self)
        if self.config.read_timeout:
            self._timer = self.loop.call_later(self.config.read_timeout, self._read_timed_out)

    def _refuse_for(self, reason: str, status: int, text: str) -> None:
        self.server.reject(reason)
        self.close_reason = reason
        self._refuse(self.proto.reject(status, text))

    def _refuse(self, response: Any) -> None:
        self.proto.send_response(response)
        self._flush()
        self._close_transport()

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self.state is ConnState.ACCEPTING and not self._closed:
            log.info("connection %s: handshake timed out", self.remote)
            self._set_reason("handshake_timeout")
            self._abort()

    def _read_timed_out(self) -> None:
        self._timer = None
        if self._closed:
            return
        rt = self.config.read_timeout
        idle = self.loop.time() - self._last_read
        if idle >= rt:
            log.info("connection %s: read timeout (%.1fs without data)", self.remote, idle)
            self._set_reason("read_timeout")
            self.close(1000, "read timeout")
        else:
            self._timer = self.loop.call_later(rt - idle, self._read_timed_out)

    def _write_timed_out(self) -> None:
        self._write_timer = None
        if not self._closed:
            log.info("connection %s: write timeout", self.remote)
            self.server.reject("write_timeout")
            self._set_reason("write_timeout")
            self._abort()

    # incoming -------------------------------------------------------------------

    def _frames_in(self, data: bytes) -> None:
        """Client frames (RFC 6455 §5) in `data`: parsed by the Rust reader
        (``rustext.WsFrameReader``: buffering, limits, unmasking, reassembly),
        its events dispatched here."""
        if self._doomed:
            return
        for ev in self._reader.feed(data):
            if ev.__class__ is bytes:
                self._on_text(ev)
            else:
                self._control(ev)
            if self._doomed or self._closed:
                return

    def _control(self, ev: tuple[Any, ...]) -> None:
        kind = ev[0]
        if kind == _WS_PING:
            if self._open:
                payload = ev[1]
                self._out.append(bytes((0x8A, len(payload))) + payload)
        elif kind == _WS_CLOSE:
            payload = ev[1]
            self._set_reason("peer_close")
            if not self._close_sent:  # echo the peer's code, then drop TCP (server side)
                self._open = False
                self._close_sent = True
                self._out.append(bytes((0x88, min(len(payload), 2))) + payload[:2])
            self._flush()
            self._close_transport()
        elif kind == _WS_BINARY:
            self._bad_input("binary frame")
        else:  # WS_FAIL: (kind, code, reason)
            self._fail(ev[1], ev[2])

    def _set_reason(self, reason: str) -> None:
        if self.close_reason is None:
            self.close_reason = reason

    def _fail(self, code: int, reason: str) -> None:
        """Fail the connection: close frame with `code`, then drop TCP."""
        self._set_reason("too_big" if code == 1009 else "protocol_error")
        self._doomed = True
        self.stats.protocol_errors += 1
        log.info("connection %s: closing (%d %s)", self.remote, code, reason)
        if self._open:
            self._open = False
            self._close_sent = True
            self._out.append(_close_frame(code, reason))
        self._flush()
        self._close_transport()

    def _on_text(self, data: bytes) -> None:
        if self.state is not ConnState.CONNECTED or self._ignore_text:
            return
        try:
            msg = _parse(data, self.allowed)
        except JugglerDecodeError as exc:
            self._bad_input(str(exc))
            return
        self.stats.read[msg.type] += 1
        self.messages_in += 1
        inbox = self._inbox
        now = self.loop.time()
        bucket = self._bucket
        if bucket is not None and not bucket.take(now):
            self.server.reject("rate_limited")
            if self.config.rate_limit_action == "close":
                # ignore further messages, but keep reading control frames:
                # the client's answer to our close frame ends the connection
                self._ignore_text = True
                self._set_reason("rate_limited")
                log.info("connection %s: closing (rate limit exceeded)", self.remote)
                if self._worker is None:
                    self.close(1008, "rate limit exceeded")
                else:
                    inbox.append(_BAD)
                return
            inbox.append(_Refused(msg, 429, "rate limit exceeded"))
        else:
            inbox.append((msg, now))
        if self._worker is None:
            self._worker = self.loop.create_task(self._work())
        if len(inbox) >= self.config.max_pending and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _bad_input(self, why: str) -> None:
        self._set_reason("bad_input")
        self._doomed = True
        self.stats.protocol_errors += 1
        log.info("connection %s: closing on bad input: %s", self.remote, why)
        if self._worker is None:
            self._flush()
            self._close_transport()
        else:
            self._inbox.append(_BAD)

    async def _work(self) -> None:
        inbox = self._inbox
        chain_in = self.server._chain_in
        chain_out = self.server._chain_out
        try:
            while inbox and not self._closed:
                item = inbox.popleft()
                if self._paused and len(inbox) <= self.config.max_pending // 2 and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                if item is _BAD:
                    inbox.clear()
                    if self.close_reason == "rate_limited":
                        self.close(1008, "rate limit exceeded")
                        return
                    self._flush()
                    self._close_transport()
                    return
                if item.__class__ is _Refused:
                    self.nack(item.msg, item.code, item.text)
                    continue
                try:
                    if item.__class__ is Outgoing:
                        await chain_out(self, item)
                        continue
                    msg, t0 = item
                    if chain_in is None:
                        await self.process(msg)
                    else:
                        await chain_in(self, msg)
                except Exception:
                    self.stats.recovered += 1
                    log.exception("connection %s: handler failed; closing it", self.remote)
                    inbox.clear()
                    self.close(1011, "internal error")
                    return
                if self._slow:
                    dt = self.loop.time() - t0
                    if dt >= self._slow:
                        self.stats.slow_messages += 1
                        log.warning(
                            "slow message: %s %s on %s took %.3fs", msg.type, msg.uuid, self.remote, dt
                        )
        finally:
            self._worker = None
            if inbox and not self._closed:  # raced with a close/return: restart
                self._worker = self.loop.create_task(self._work())

    async def process(self, msg: ClientMessage) -> None:
        """The final handler of incoming messages: broker work, then ACK/NACK."""
        t = msg.type
        if self.identity is not None and t != UNSB:
            refusal = self.identity.check(_KIND[t], msg.uri if t == CALL else msg.channel)
            if refusal is not None:
                self.server.reject("unauthorized" if refusal[0] == 401 else "forbidden")
                self.nack(msg, *refusal)
                return
        if t == CALL:
            uri = msg.uri
            if self.server.draining:
                self.server.reject("draining")
                self.nack(msg, 503, "server shutting down")
                return
            cap = self.config.max_inflight_calls
            if cap and self.inflight >= cap:
                self.server.reject("inflight_limit")
                self.nack(msg, 429, f"too many calls in flight (max {cap})")
                return
            ms = call_timeout_ms(msg.timeout_ns, self.config.call_timeout_ms)
            if ms <= 0:
                self.nack(msg, 500, f"invalid call timeout: {msg.timeout_ns} ns")
                return
            server = self.server
            other = server._pending.get(msg.uuid)
            if other is not None and other[0] is not self and not other[0].closed:
                # results route by msg_uuid: another connection's live call keeps it
                self.nack(msg, 500, "duplicate message uuid")
                return
            server._pending_add(msg.uuid, self, ms)
            try:
                await self.broker.call(msg.uuid, uri, msg.args, ms)
            except Exception as exc:
                server._pending_drop(msg.uuid)
                self.nack(msg, 500, str(exc) or type(exc).__name__)
                return
            self.stats.calls += 1
            self.send(ACK, msg.uuid, _build_ack(msg.uuid, CALL, uri))
        elif t == PUB:
            try:
                await self.pubsub.publish(msg.channel, msg.uuid, msg.args)
            except Exception as exc:
                self.nack(msg, 500, str(exc) or type(exc).__name__)
                return
            self.stats.publishes += 1
            self.send(ACK, msg.uuid, _build_ack(msg.uuid, PUB, msg.channel))
        elif t == SUB:
            key = (msg.pattern, msg.channel)
            cap = self.config.max_subscriptions
            if cap and key not in self._subs and len(self._subs) >= cap:
                self.server.reject("subscription_limit")
                self.nack(msg, 500, f"too many subscriptions (max {cap})")
                return
            try:
                await self.pubsub.subscribe(self, msg.channel, msg.pattern, self._on_event)
            except Exception as exc:
                self.nack(msg, 500, str(exc) or type(exc).__name__)
                return
            self._subs.add(key)
            self.send(ACK, msg.uuid, _build_ack(msg.uuid, SUB, msg.channel))
        elif t == UNSB:
            self._subs.discard((msg.pattern, msg.channel))
            try:
                await self.pubsub.unsubscribe(self, msg.channel, msg.pattern)
            except Exception as exc:
                self.nack(msg, 500, str(exc) or type(exc).__name__)
                return
            self.send(ACK, msg.uuid, _build_ack(msg.uuid, UNSB, msg.channel))

    # outgoing -------------------------------------------------------------------

    def nack(self, msg: ClientMessage, code: int, message: str) -> None:
        """Refuse `msg` with a NACK (middleware use it for 401/403 and the like)."""
        target = msg.uri if msg.type == CALL else msg.channel
        self.stats.nacks += 1
        self.send(NACK, msg.uuid, _build_nack(msg.uuid, msg.type, target or "", code, message))

    def send_res(self, for_uuid: str, uri: str, args: bytes | None) -> None:
        self.stats.results += 1
        self.send(RES, for_uuid, _build_res(for_uuid, uri, args))

    def _on_event(self, event: Event) -> None:
        if self._closed:
            return
        self.stats.events += 1
        self.send(EVNT, event.msg_uuid, _build_evnt(event.msg_uuid, event.channel, event.pattern, event.args))

    def send(self, msg_type: int, for_uuid: str, frame: bytes) -> None:
        """Queue one server frame (through the outgoing handler chain, if any)."""
        if self._chained:
            if self._closed:
                return
            if len(self._inbox) >= self.config.max_outbound:
                # the handler chain cannot keep up with what this client is sent
                log.warning("connection %s: %d messages queued; dropping the connection",
                            self.remote, len(self._inbox))
                self.server.reject("slow_consumer")
                self._set_reason("slow_consumer")
                self._abort()
                return
            self._inbox.append(Outgoing(msg_type, for_uuid, frame))
            if self._worker is None:
                self._worker = self.loop.create_task(self._work())
        else:
            self.write(msg_type, frame)

    async def write_outgoing(self, out: Outgoing) -> None:
        """The final handler of outgoing messages."""
        self.write(out.type, out.frame)

    def write(self, msg_type: int, frame: bytes) -> bool:
        """Write one text frame now (coalesced with the others of this loop turn)."""
        if not self._open:
            return False
        n = len(frame)
        limit = self.config.write_limit
        if limit and n > limit:
            log.warning("connection %s: a %d-byte message exceeds write_limit %d; closing", self.remote, n, limit)
            self._set_reason("too_big")
            self.close(1009, "message too big")
            return False
        out = self._out
        out.append(_ws_header(n))
        out.append(frame)
        self.stats.written[msg_type] += 1
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)
        return True

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self.transport
        if transport is None or self._closed or transport.is_closing():
            self._out.clear()
            self.proto.data_to_send()
            return
        chunks = self._out
        self._out = []
        eof = False
        for d in self.proto.data_to_send():
            if d:
                chunks.append(d)
            else:
                eof = True
        if chunks:
            transport.write(b"".join(chunks) if len(chunks) > 1 else chunks[0])
            if transport.get_write_buffer_size() > self.config.max_write_buffer:
                log.warning("connection %s: %d bytes unread; dropping the connection", self.remote,
                            transport.get_write_buffer_size())
                self.server.reject("slow_consumer")
                self._set_reason("slow_consumer")
                self._abort()
                return
        if eof:
            transport.close()

    # closing --------------------------------------------------------------------

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake; the TCP connection is dropped after
        ``close_timeout`` if the peer does not answer. Idempotent."""
        if self._closed:
            return
        self._set_reason({1000: "server_close", 1001: "shutdown", 1008: "policy", 1011: "internal_error"}.get(
            code, f"close_{code}"))
        if self._open:
            self._open = False
            self._close_sent = True
            self._out.append(_close_frame(code, reason))
            self._flush()
            self.loop.call_later(self.config.close_timeout or 1.0, self._abort)
        else:
            self._flush()
            self._close_transport()

    def _close_transport(self) -> None:
        self._open = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _abort(self) -> None:
        if self.transport is not None and not self._closed:
            self.transport.abort()
