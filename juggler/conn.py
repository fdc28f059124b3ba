"""One websocket connection of the juggler server: the asyncio driver.

Two sans-I/O cores decide, this ``asyncio.Protocol`` does the I/O. The
websocket protocol (handshake, frames in and out, the closing handshake, its
states) is :class:`juggler.wsproto.WsServerProtocol`; the juggler.0 session
(message order, admission, NACK rules, limits, close reasons) is
:class:`juggler.session.Session`. The driver feeds them the bytes received,
runs the broker work the session admits (through the middleware), writes
what they have to send once per event-loop turn, and owns the timers. No
task per connection while idle: a worker task exists only while messages
are queued, and the keepalive (:mod:`juggler.keepalive`) is one timer,
re-armed when it fires, never on traffic.

A connection talks to its server only through the :class:`ConnContext` it
is given: the configuration, the counters, the brokers, the table of
pending calls, the middleware chains and a :class:`ConnListener` (the
server's side of the connection lifecycle).

Contract (the session's rules are in :mod:`juggler.session`):

- What the session hands out is handled in its turn; RES and EVNT are
  written as they come.
- An oversized message (``read_limit``) closes with 1009; a reader that lets
  ``max_write_buffer`` bytes pile up, or blocks writes for ``write_timeout``,
  is dropped; one sending no message for ``read_timeout`` is closed; a handshake not
  done within ``handshake_timeout`` is dropped.
- Every connection is pinged each ``ping_interval`` (and, if it asked, sent
  a KEEPALIVE message); one that sends nothing back within ``pong_timeout``
  of a ping is closed (1011, reason ``ping_timeout``) and dropped at once.
- An exception in a handler (middleware included) is logged, counted
  (``recovered``) and closes this connection with 1011; the server goes on.
- More than ``max_pending`` queued messages pause reading (backpressure).
- Plain HTTP on the websocket port is answered by the server's
  ``ConnContext.http`` (``/healthz``, the static site), else 404.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from websockets.http11 import Request

import rustext
from juggler.context import (
    ConnContext,
    ConnListener,
    ConnState,
    Handler,
    Middleware,
)
from juggler.extensions import KEEPALIVE as _KEEPALIVE
from juggler.handling import call_trace, handle
from juggler.keepalive import HEADER as _KEEPALIVE_HEADER
from juggler.keepalive import PING as _PING
from juggler.keepalive import QUERY as _KEEPALIVE_QUERY
from juggler.keepalive import READ_TIMEOUT, Keepalive, keepalive_frame, opted_in
from juggler.protocol import SUBPROTOCOL, ClientMessage, Outgoing, allowed_mask
from juggler.refresh import HEADER as _REFRESH_HEADER
from juggler.refresh import QUERY as _REFRESH_QUERY
from juggler.session import CloseAfter, Refused, Session
from juggler.wsproto import OPEN, WsServerProtocol

if TYPE_CHECKING:
    from juggler.auth import AuthError, Identity

__all__ = ["Conn", "ConnContext", "ConnListener", "ConnState", "Handler", "Middleware", "call_trace"]

log = logging.getLogger("juggler.conn")
# websockets' own per-connection lines ("connection open", …): quiet unless asked
_ws_log = logging.getLogger("juggler.conn.ws")

CALL, PUB, SUB, UNSB = rustext.CALL, rustext.PUB, rustext.SUB, rustext.UNSB
NACK, ACK, RES, EVNT = rustext.NACK, rustext.ACK, rustext.RES, rustext.EVNT

_build_res = rustext.build_res
_new_uuid = rustext.new_uuid
_WS_PING, _WS_CLOSE, _WS_BINARY = rustext.WS_PING, rustext.WS_CLOSE, rustext.WS_BINARY


_CLOSED = ConnState.CLOSED
_CONNECTED = ConnState.CONNECTED


def _handshake_option(request: Request, header: str, query: str) -> str | None:
    """A handshake option: its header (``Juggler-Allowed-Messages``), else its
    query parameter (``juggler-allowed-messages``): browsers cannot send
    handshake headers."""
    value = request.headers.get(header)
    if value is not None or "?" not in request.path:
        return value
    values = parse_qs(request.path.split("?", 1)[1]).get(query)
    return values[-1] if values else None


class Conn(asyncio.Protocol):
    """One client connection (see module doc). Created by :class:`juggler.server.Server`."""

    def __init__(self, context: ConnContext) -> None:
        self.context = context
        self.config = cfg = context.config
        self.stats = context.stats
        self.broker = context.broker
        self.pubsub = context.pubsub
        self._pending = context.pending
        self._listener = context.listener
        self.loop = asyncio.get_running_loop()
        self.id = rustext.new_uuid()
        self.state = ConnState.ACCEPTING
        self.opened_at = self.loop.time()
        #: the juggler.0 rules of this connection (sans-I/O)
        self.session = Session(cfg, context.stats, context.listener.reject, now=self.opened_at)
        self.session.extensions = context.extensions
        self.remote: Any = None
        self.transport: asyncio.Transport | None = None
        #: the websocket protocol (sans-I/O): handshake, frames, closing handshake
        self.ws = WsServerProtocol(
            subprotocol=SUBPROTOCOL,
            read_limit=cfg.read_limit,
            allow_empty_subprotocol=cfg.allow_empty_subprotocol,
            logger=_ws_log,
            deflate=context.deflate,
        )
        self._flush_scheduled = False
        #: this connection in the native fan-out (juggler.subscriptions), once connected
        self.hub_id: int | None = None
        self._held = False  # the fan-out hands our frames back: Python output is queued
        self._native = False  # the fan-out may write to this socket (it has joined a subscription)
        self._outbox: deque[Outgoing] = deque()  # outgoing messages waiting for the middleware
        self._workers = 0  # worker tasks running (see _work)
        self._outbox_busy = False  # a worker is taking the outbox through the middleware
        # flow control, orthogonal to the websocket state
        self._paused = False  # reading paused: too many messages queued
        self._last_read = self.loop.time()  # the last bytes received (pongs too): the keepalive's sign of life
        self._last_message = self._last_read  # the last message received: what read_timeout measures
        self._timer: asyncio.TimerHandle | None = None  # the handshake's, then the keepalive's
        #: when to ping and when the peer counts as gone (sans-I/O), once connected; None: nothing to time
        self.keepalive: Keepalive | None = None
        #: the client asked for KEEPALIVE messages at the handshake
        self.keepalive_messages = False
        self._write_timer: asyncio.TimerHandle | None = None
        self._closed_fut: asyncio.Future[None] = self.loop.create_future()
        self._slow = cfg.slow_threshold
        self._chained = context.chain_in is not None
        self._auth_task: asyncio.Task[None] | None = None  # a handshake waiting for keys
        #: bytes received while the server-side subscriptions are made (juggler.serversubs), else None
        self._early: bytes | None = None
        self._subscribing: asyncio.Task[None] | None = None  # the task making them
        #: CALLs ACKed and waiting for their RES (kept by the pending-call table)
        self.inflight = 0
        #: this connection's expiring tokens (juggler.refreshing.ConnExpiry), when the server times them
        self.expiry: Any = None
        #: the first bytes, until the fallback (context.fallback) says whether the request is its own
        self._sniffing: bytes | None = b"" if context.fallback is not None else None

    def __repr__(self) -> str:
        return f"<Conn {self.id} {self.remote} {self.state.value}>"

    @property
    def closed(self) -> bool:
        """True once the TCP connection is gone."""
        return self.state is _CLOSED

    @property
    def identity(self) -> Any:
        """Who this connection is (juggler.auth.Identity), when the server has auth."""
        return self.session.identity

    @identity.setter
    def identity(self, identity: Any) -> None:
        self.session.identity = identity

    @property
    def close_reason(self) -> str | None:
        """Why it closed (a short token: logs and juggler_connections_closed_total{reason})."""
        return self.session.close_reason

    @property
    def messages_in(self) -> int:
        """juggler.0 messages received."""
        return self.session.messages_in

    @property
    def request(self) -> Request | None:
        """The handshake request, once read."""
        return self.ws.request

    @property
    def queued(self) -> int:
        """Messages queued in this connection (incoming, and outgoing through middleware)."""
        return self.session.queued + len(self._outbox)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed_fut)

    # asyncio.Protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.remote = transport.get_extra_info("peername")
        self._timer = self.loop.call_later(self.config.handshake_timeout, self._handshake_timed_out)
        if not self._listener.conn_opened(self):
            self.abort()

    def data_received(self, data: bytes) -> None:
        if self.state is _CONNECTED:
            self._last_read = self.loop.time()
            self._frames_in(data)
            return
        if self.state is ConnState.CLOSED:
            return
        if self._sniffing is not None:  # an HTTP fallback request (juggler.fallback) is not ours
            data = self._sniffing + data
            taken = self.context.fallback.sniff(self, data)
            self._sniffing = data if taken is None else None
            if taken is not False:
                return
        self._last_read = self.loop.time()
        ws = self.ws
        for ev in ws.receive_data(data):
            if self.closed or not ws.reading:
                break
            self._on_request(ev)
        if self.state is ConnState.CONNECTED:
            self._frames_in(b"")  # frames sent with the request, before the 101
        self._flush()

    def eof_received(self) -> bool:
        if self.state is ConnState.ACCEPTING:
            self.ws.receive_eof()
            self._flush()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is ConnState.CLOSED:
            return
        if self._auth_task is not None:
            self._auth_task.cancel()
            self._auth_task = None
        for t in (self._timer, self._write_timer):
            if t is not None:
                t.cancel()
        self._timer = self._write_timer = None
        if self.expiry is not None:
            self.expiry.stop()
        self._detach()
        self.ws.discard_output()
        was_connected = self.state is ConnState.CONNECTED
        self.state = ConnState.CLOSED
        self._listener.conn_closed(self, was_connected)
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

    def _on_request(self, request: Request) -> None:
        ws = self.ws
        ctx = self.context
        listener = self._listener
        path = request.path.split("?", 1)[0]
        if path != self.config.path or ws.head:
            # plain HTTP: one response (the server's: /healthz, the static site), else 404; then close
            self._set_reason("http")
            response = ctx.http(request, head=ws.head) if ctx.http is not None else None
            self._refuse(response if response is not None else ws.reject(404, "Not Found\n"))
            return
        if listener.draining:
            self._refuse_for("draining", 503, "Service Unavailable: shutting down\n")
            return
        cap = self.config.max_connections
        if cap and self.stats.connections_active >= cap:
            self._refuse_for("max_connections", 503, "Service Unavailable: too many connections\n")
            return
        if ctx.auth is not None:
            from juggler.auth import AuthError, Identity

            try:
                identity = ctx.auth.authenticate(request)
            except AuthError as exc:
                self._refuse_auth(exc)
                return
            if not isinstance(identity, Identity):
                # a key to fetch first (a JWKS rotation): reading waits, frames sent
                # early stay buffered until the handshake is answered
                assert self.transport is not None
                self.transport.pause_reading()
                if ctx.proxies is not None and ctx.proxies.connecting:  # then the application decides
                    identity = ctx.proxies.connect(self, request, identity)
                self._auth_task = self.loop.create_task(self._authenticated_later(request, identity))
                return
            self.identity = identity
        if ctx.proxies is not None and ctx.proxies.connecting:
            # the application's backend decides (juggler.proxy): reading waits, as for a JWKS fetch
            assert self.transport is not None
            self.transport.pause_reading()
            self._auth_task = self.loop.create_task(
                self._authenticated_later(request, ctx.proxies.connect(self, request, self.identity)))
            return
        self._accept(request)

    async def _authenticated_later(self, request: Request, pending: Awaitable[Identity]) -> None:
        from juggler.auth import AuthError

        try:
            identity = await pending
        except AuthError as exc:
            if self.state is ConnState.ACCEPTING:
                self._refuse_auth(exc)
            return
        finally:
            self._auth_task = None
        if self.state is not ConnState.ACCEPTING:
            return  # gone meanwhile
        self.identity = identity
        assert self.transport is not None
        self.transport.resume_reading()
        self._accept(request)
        if self.state is ConnState.CONNECTED:
            self._frames_in(b"")
        self._flush()

    def _refuse_auth(self, exc: AuthError) -> None:
        log.debug("connection %s refused: %s", self.remote, exc)
        reason = "origin" if exc.status == 403 else "unauthenticated"
        text = "Forbidden\n" if exc.status == 403 else "Unauthorized\n"
        reason, text = getattr(exc, "refusal", (reason, text))  # a connect proxy's (juggler.proxy)
        self._refuse_for(reason, exc.status, text)

    def _accept(self, request: Request) -> None:
        ws = self.ws
        listener = self._listener
        try:
            self.session.allowed = allowed_mask(
                _handshake_option(request, "Juggler-Allowed-Messages", "juggler-allowed-messages"))
        except ValueError as exc:
            self._refuse(ws.reject(400, f"Invalid Juggler-Allowed-Messages header: {exc}\n"))
            return
        try:
            keepalive_messages = opted_in(_handshake_option(request, _KEEPALIVE_HEADER, _KEEPALIVE_QUERY))
        except ValueError as exc:
            self._refuse(ws.reject(400, f"Invalid {_KEEPALIVE_HEADER} header: {exc}\n"))
            return
        try:
            refresh_messages = opted_in(_handshake_option(request, _REFRESH_HEADER, _REFRESH_QUERY))
        except ValueError as exc:
            self._refuse(ws.reject(400, f"Invalid {_REFRESH_HEADER} header: {exc}\n"))
            return
        try:
            listener.conn_accepting(self)
        except Exception as exc:
            log.info("connection %s refused by on_conn_state: %s", self.remote, exc)
            self._refuse(ws.reject(403, "Forbidden\n"))
            return
        if not ws.accept(request):
            if ws.negotiated is None:
                log.debug("connection %s: no juggler.0 subprotocol (offered %s)", self.remote, ws.offered)
            self._flush()
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.state = ConnState.CONNECTED
        subs = self.context.subscriptions
        if subs is not None:
            self.hub_id = subs.add_conn(self, self._native_fd(), deflate=ws.compression is not None)
        listener.conn_connected(self)
        self._start_keepalive(keepalive_messages)
        if self.context.refresh is not None and self.state is ConnState.CONNECTED:
            self.expiry = self.context.refresh.attach(self, refresh_messages)
        channels = getattr(self.identity, "channels", None)
        if channels and subs is not None and self.state is ConnState.CONNECTED:
            self._subscribe_server_side(channels)

    def _native_fd(self) -> int:
        """The socket the fan-out may write EVNTs to directly, or -1 (TLS, outgoing middleware)."""
        transport = self.transport
        if transport is None or self.context.chain_out is not None:
            return -1
        if transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("ssl_object") is not None:
            return -1
        sock = transport.get_extra_info("socket")
        return sock.fileno() if sock is not None else -1

    def _detach(self) -> None:
        """Nothing more goes out natively (closing): the fan-out lets go of the socket."""
        if self.hub_id is not None and self.context.subscriptions is not None:
            self.context.subscriptions.detach(self.hub_id)

    def _refuse_for(self, reason: str, status: int, text: str) -> None:
        self._listener.reject(reason)
        self._set_reason(reason)
        self._refuse(self.ws.reject(status, text))

    def _refuse(self, response: Any) -> None:
        self.ws.send_response(response)
        self._flush()

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self.state is ConnState.ACCEPTING:
            log.info("connection %s: handshake timed out", self.remote)
            self._set_reason("handshake_timeout")
            self.abort()

    # server-side subscriptions (the rules: juggler.serversubs) ---------------------------

    def _subscribe_server_side(self, channels: tuple[str, ...]) -> None:
        """Subscribe to the identity's channels before reading the client's
        messages: the answer to its first one comes after they are in effect."""
        from juggler.serversubs import subscribe_at_connect

        self._early = b""
        if self.transport is not None:
            self.transport.pause_reading()
        self._subscribing = self.loop.create_task(subscribe_at_connect(self, channels))

    def server_subscribed(self) -> None:
        """The identity's subscriptions are made (or failed): read the client's messages."""
        early, self._early = self._early, None
        self._subscribing = None
        if early is None or self.closed:
            return
        if self.transport is not None and not self._paused:
            self.transport.resume_reading()
        self._frames_in(early)
        self._flush()

    # keepalive (the rules: juggler.keepalive) ---------------------------------------

    def _start_keepalive(self, messages: bool) -> None:
        """Connected: time pings and read_timeout; a client that asked gets its
        first KEEPALIVE now, with the 101 (it then knows the interval)."""
        cfg = self.config
        ka = Keepalive(ping_interval=cfg.ping_interval, pong_timeout=cfg.pong_timeout,
                       read_timeout=cfg.read_timeout, now=self.loop.time())
        if not ka.active or self.ws.state is not OPEN:
            return
        self.keepalive = ka
        self._last_message = self._last_read
        if messages and cfg.ping_interval:
            self.keepalive_messages = True
            self.ws.send_text(keepalive_frame(_new_uuid(), cfg.ping_interval))  # the caller flushes
            self._count_keepalive()
        self._keepalive_at(ka.next_tick(self._last_message))

    def _count_keepalive(self) -> None:
        self.stats.wrote(_KEEPALIVE)

    def _keepalive_at(self, when: float | None) -> None:
        self._timer = None if when is None else self.loop.call_at(when, self._keepalive_tick)

    def _keepalive_tick(self) -> None:
        """The keepalive timer: do what is due, then re-arm for what comes next.
        Traffic only moves ``_last_read`` and ``_last_message``; the timer is
        never re-armed for it."""
        self._timer = None
        ka = self.keepalive
        ws = self.ws
        if ka is None or self.closed or ws.state is not OPEN:
            return
        last_in = self._last_read
        due = ka.tick(self.loop.time(), last_in, self._last_message)
        if due == _PING:
            ws.send_ping()
            if self.keepalive_messages:
                ws.send_text(keepalive_frame(_new_uuid(), ka.interval))
                self._count_keepalive()
            self._flush()
        elif due is not None:
            self._timed_out(due)
            return
        self._keepalive_at(ka.next_tick(self._last_message))

    def _timed_out(self, reason: str) -> None:
        """Nothing came in time: ``read_timeout`` closes with 1000 (the closing
        handshake, as any close); an unanswered ping closes with 1011 and drops
        the TCP connection at once, since a peer that answers no ping will
        not answer the close frame either."""
        now = self.loop.time()
        self._set_reason(reason)
        if reason == READ_TIMEOUT:
            log.info("connection %s: read timeout (%.1fs without a message)", self.remote, now - self._last_message)
            self.close(1000, "read timeout")
            return
        log.info("connection %s: no answer to a ping within %.1fs (%.1fs without data); dropping it",
                 self.remote, self.config.pong_timeout, now - self._last_read)
        self.close(1011, "keepalive timeout")
        self.abort()

    def _write_timed_out(self) -> None:
        self._write_timer = None
        if not self.closed:
            log.info("connection %s: write timeout", self.remote)
            self._listener.reject("write_timeout")
            self._set_reason("write_timeout")
            self.abort()

    # incoming -------------------------------------------------------------------

    def _frames_in(self, data: bytes) -> None:
        """The events of the client frames in `data`, handled in order: what
        one message decides (closing, say) applies to the frames after it."""
        if self._early is not None:  # server-side subscriptions being made: read once they are
            self._early += data
            return
        ws = self.ws
        for ev in ws.receive_data(data):
            if ev.__class__ is bytes:
                self._on_text(ev)
            else:
                self._control(ev)
            if not ws.reading or self.state is _CLOSED:
                return

    def _control(self, ev: tuple[Any, ...]) -> None:
        kind = ev[0]
        if kind == _WS_PING:
            self.ws.receive_ping(ev[1])
            self._flush()
        elif kind == _WS_CLOSE:
            self._detach()
            self._set_reason("peer_close")
            self.ws.receive_close(ev[1])  # echo the peer's code, then drop TCP (server side)
            self._flush()
        elif kind == _WS_BINARY:
            self._end(self.session.receive_binary())
        else:  # WS_FAIL: (kind, code, reason)
            self._fail(ev[1], ev[2])

    def _set_reason(self, reason: str) -> None:
        self.session.set_reason(reason)

    def _fail(self, code: int, reason: str) -> None:
        """Fail the connection: close frame with `code`, then drop TCP."""
        self._set_reason("too_big" if code == 1009 else "protocol_error")
        self._detach()
        self.ws.stop_reading()
        self.stats.protocol_errors += 1
        log.info("connection %s: closing (%d %s)", self.remote, code, reason)
        self.ws.fail(code, reason)
        self._flush()

    def _on_text(self, data: bytes) -> None:
        session = self.session
        self._last_message = now = self.loop.time()
        if self.expiry is not None and self.expiry.private and b'"token"' in data:
            self.expiry.frame_in(data)  # a subscription token (the codec does not read it)
        end = session.receive_text(data, now)
        if end is not None:
            self._end(end)
            return
        queue = session.queue
        if queue:
            if self._workers == 0:  # the common case, without a call
                self._workers = 1
                self.loop.create_task(self._work())
            else:
                self._wake()
            if len(queue) >= self.config.max_pending and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()

    def _end(self, end: CloseAfter | None) -> None:
        """The session ends the connection: now, or (queued) after the replies before it."""
        if end is None:
            self._wake()  # queued behind the messages before it
            return
        if end.code is None:  # bad input: read no more
            self.ws.stop_reading()
            log.info("connection %s: closing on bad input: %s", self.remote, end.reason)
            if self.session.queued:
                self._wake()
            else:
                self._close_transport()
            return
        log.info("connection %s: closing (%s)", self.remote, end.reason)
        self.close(end.code, end.reason)

    def _wake(self) -> None:
        """Start a worker when something waits and every worker is busy (up to
        max_concurrent_messages): what the session lets run side by side does."""
        if self.state is _CLOSED:
            return
        session = self.session
        if self._workers == 0 or (
            self._workers <= session.running and session.queue
            and self._workers < self.config.max_concurrent_messages
        ):
            self._workers += 1
            self.loop.create_task(self._work())

    async def _work(self) -> None:
        """Take what the session hands out until it has nothing more for now:
        several of these run at once when messages may be handled side by side."""
        session = self.session
        outbox = self._outbox
        chain_in = self.context.chain_in
        chain_out = self.context.chain_out
        try:
            while self.state is not _CLOSED:
                if outbox and not self._outbox_busy:
                    # outgoing messages through the middleware: one worker at a time, in order
                    self._outbox_busy = True
                    try:
                        while outbox and self.state is not _CLOSED:
                            await chain_out(self, outbox.popleft())
                    except Exception:
                        self._handler_failed()
                        return
                    finally:
                        self._outbox_busy = False
                    continue
                item = session.next_item()
                if item is None:
                    return
                if self._paused and len(session.queue) <= self.config.max_pending // 2 and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                cls = item.__class__
                if cls is CloseAfter:
                    outbox.clear()
                    if item.code is None:
                        self._close_transport()
                    else:
                        self.close(item.code, item.reason)
                    return
                if cls is Refused:
                    self.nack(item.msg, item.code, item.text)
                    continue
                if session.queue:
                    self._wake()  # another may run beside this one
                msg = item.msg
                try:
                    if chain_in is None:
                        await self.process(msg)
                    else:
                        await chain_in(self, msg)
                except Exception:
                    self._handler_failed()
                    return
                held = session.done(item)
                if held:
                    for frame in held:
                        self.send(*frame)
                if self._slow:
                    dt = self.loop.time() - item.received_at
                    if dt >= self._slow:
                        self.stats.slow_messages += 1
                        log.warning(
                            "slow message: %s %s on %s took %.3fs", msg.type, msg.uuid, self.remote, dt
                        )
        finally:
            self._workers -= 1
            if self._workers == 0 and (session.queue or outbox) and self.state is not _CLOSED:  # raced: restart
                self._wake()

    def _handler_failed(self) -> None:
        """A handler (or middleware) raised: logged, counted, this connection closed with 1011."""
        self.stats.recovered += 1
        log.exception("connection %s: handler failed; closing it", self.remote)
        self.session.clear()
        self._outbox.clear()
        self.close(1011, "internal error")

    #: the final handler of incoming messages: what the session admits goes to the
    #: broker, the subscriptions or the application's proxies (juggler.handling)
    process = handle

    # outgoing -------------------------------------------------------------------

    def nack(self, msg: ClientMessage, code: int, message: str) -> None:
        """Refuse `msg` with a NACK (middleware use it for 401/403 and the like)."""
        self.reply(msg, self.session.nack(msg, code, message))

    def reply(self, msg: ClientMessage, frame: tuple[int, str, bytes]) -> None:
        """Send a reply to `msg` (its ACK, NACK, or the events a SUB recovered):
        now, or once the messages before it have their replies out."""
        opened = self.session.open
        if not opened or opened[0].msg is msg or self.session.reply(msg, frame):  # the first two: no call
            self.send(*frame)

    def send_res(self, for_uuid: str, uri: str, args: bytes | None) -> None:
        self.stats.results += 1
        self.send(RES, for_uuid, _build_res(for_uuid, uri, args))

    async def drop_subscription(self, channel: str, pattern: bool = False) -> bool:
        """End a subscription from the server side (the server API); False when there was none."""
        self.session.unsubscribed(channel, pattern)
        if self.expiry is not None:
            self.expiry.unsubscribed(channel, pattern)
        return await self.context.subscriptions.unsubscribe(self, channel, pattern)

    def send(self, msg_type: int, for_uuid: str, frame: bytes) -> None:
        """Queue one server frame (through the outgoing handler chain, if any)."""
        if self._chained:
            if self.closed:
                return
            if self.queued >= self.config.max_outbound:
                # the handler chain cannot keep up with what this client is sent
                log.warning("connection %s: %d messages queued; dropping the connection",
                            self.remote, self.queued)
                self._listener.reject("slow_consumer")
                self._set_reason("slow_consumer")
                self.abort()
                return
            self._outbox.append(Outgoing(msg_type, for_uuid, frame))
            self._wake()
        else:
            self.write(msg_type, frame)

    async def write_outgoing(self, out: Outgoing) -> None:
        """The final handler of outgoing messages."""
        self.write(out.type, out.frame)

    def write(self, msg_type: int, frame: bytes) -> bool:
        """Write one text frame now (coalesced with the others of this loop turn)."""
        ws = self.ws
        if ws.state is not OPEN:
            return False
        if self.config.write_limit and not self.session.frame_fits(frame):
            log.warning("connection %s: a %d-byte message exceeds write_limit %d; closing", self.remote,
                        len(frame), self.config.write_limit)
            self.close(1009, "message too big")
            return False
        ws.send_text(frame)
        try:
            self.stats.written[msg_type] += 1  # inline: the hot path
        except IndexError:  # an extension message (juggler.extensions)
            self.stats.wrote(msg_type)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)
            if self._native and not self._held and self.hub_id is not None:
                self._held = True  # the fan-out queues behind this frame
                self.context.subscriptions.hold(self.hub_id, True)
        return True

    def subscribing(self) -> None:
        """The fan-out is about to write to this connection: from now on it is
        held while Python output is queued, starting with what is queued now.
        (Until then no hold is needed, which spares a call per frame.)"""
        self._native = True
        transport = self.transport
        if not self._held and self.hub_id is not None and (
            self._flush_scheduled or (transport is not None and transport.get_write_buffer_size() > 0)
        ):
            self._held = True
            self.context.subscriptions.hold(self.hub_id, True)

    def write_rest(self, rest: bytes) -> None:
        """Bytes of native fan-out frames the kernel did not take: the transport
        queues them, and this connection stays held until they are out."""
        self._held = True
        transport = self.transport
        if transport is None or self.state is _CLOSED or transport.is_closing():
            return
        transport.write(rest)
        self._check_buffer(transport)

    def _check_buffer(self, transport: asyncio.Transport) -> bool:
        """Drop a reader that lets max_write_buffer bytes pile up; False if dropped."""
        if transport.get_write_buffer_size() > self.config.max_write_buffer:
            log.warning("connection %s: %d bytes unread; dropping the connection", self.remote,
                        transport.get_write_buffer_size())
            self._listener.reject("slow_consumer")
            self._set_reason("slow_consumer")
            self.abort()
            return False
        return True

    def _flush(self) -> None:
        """Write what the websocket protocol has to send, in one ``write``;
        close the transport when it says so."""
        self._flush_scheduled = False
        data = self.ws.data_to_send()
        transport = self.transport
        if transport is None or self.state is _CLOSED or transport.is_closing():
            return
        if data:
            eof = not data[-1]
            chunk = data[0] if len(data) == 1 else b"".join(data)
            if chunk:
                transport.write(chunk)
                if not self._check_buffer(transport):
                    return
            if eof:
                self._detach()
                transport.close()
                return
        if self._native and self.hub_id is not None:
            # the fan-out writes natively again once the transport has nothing queued
            held = transport.get_write_buffer_size() > 0
            if held != self._held:
                self._held = held
                self.context.subscriptions.hold(self.hub_id, held)

    # closing --------------------------------------------------------------------

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake; the TCP connection is dropped after
        ``close_timeout`` if the peer does not answer. Idempotent."""
        if self.closed:
            return
        self.session.closing(code)
        self._detach()
        if self.ws.send_close(code, reason):
            self._flush()
            self.loop.call_later(self.config.close_timeout or 1.0, self.abort)
        else:
            self._close_transport()

    def _close_transport(self) -> None:
        """Write what is queued, then close the TCP connection (no close frame)."""
        self._detach()
        self.ws.send_eof()
        self._flush()

    def abort(self) -> None:
        """Drop the TCP connection now, without a closing handshake or what is queued."""
        if self.transport is not None and not self.closed:
            self._detach()
            self.transport.abort()
