"""The HTTP fallback transport: juggler.0 over SSE (down) and POST (up).

Where a proxy refuses websockets, a client can still reach the server on the
same port and under the same path (the wire: :mod:`juggler.sse` and
``docs/protocols/juggler.md``):

- ``GET <path>/sse`` opens a session: a ``text/event-stream`` whose first
  event (``event: session``) gives the session id, then one juggler.0 server
  message per event, each with an increasing ``id``.
- ``POST <path>/send?session=ID`` carries client messages, one per line;
  ``204`` once they are queued (their replies come on the stream).
- ``POST <path>/send?session=ID&close=1`` ends the session (its body is
  not read): the client leaves.
- ``GET <path>/sse?session=ID`` with ``Last-Event-ID`` reopens a dropped
  stream within ``fallback_grace`` seconds and replays what was missed (up
  to ``fallback_replay`` events; more missed: ``410`` and the session ends).

A session is a :class:`SessionConn`: a :class:`juggler.conn.Conn` whose
wire is not a websocket but the stream it is attached to, so the juggler.0
rules (:class:`juggler.session.Session`), the broker work
(``Conn.process``), the middleware, auth, limits, keepalive and counters
are those of a websocket connection. Each TCP connection of the fallback is
an :class:`HttpWire` (one request, one response); :class:`Fallback` routes
them, and takes them over from a ``Conn`` whose first request line is for
the fallback (:meth:`Fallback.sniff`).

Rules: a session is bound to the identity that opened it (a request of
another identity gets 403); its id is 192 random bits. Cross-origin
requests are answered for the origins ``allowed_origins`` allows (any,
without the option, as for the websocket handshake). One POST in flight
per session keeps its messages in order (the client's rule; the server
handles POSTs in the order they arrive).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import rustext
from juggler.conn import Conn, ConnContext, ConnState
from juggler.keepalive import HEADER as _KEEPALIVE_HEADER
from juggler.keepalive import QUERY as _KEEPALIVE_QUERY
from juggler.keepalive import READ_TIMEOUT, keepalive_frame, opted_in
from juggler.protocol import allowed_mask
from juggler.refresh import HEADER as _REFRESH_HEADER
from juggler.refresh import QUERY as _REFRESH_QUERY
from juggler.sse import (
    SESSION_ID,
    BadRequest,
    HttpRequest,
    RequestReader,
    comment,
    event,
    named_event,
    response_head,
    sniff,
)

if TYPE_CHECKING:
    from juggler.auth import Identity

__all__ = ["Fallback", "HttpWire", "SessionConn"]

log = logging.getLogger("juggler.fallback")

_CONNECTED = ConnState.CONNECTED
_CLOSED = ConnState.CLOSED
_new_uuid = rustext.new_uuid
_ALLOW_HEADERS = "Authorization, Content-Type, Last-Event-ID, Juggler-Allowed-Messages, Juggler-Keepalive"


def _new_session_id() -> str:
    return secrets.token_urlsafe(24)


class Fallback:
    """The fallback endpoints of one server: its sessions by id (see module doc).
    ``context()`` is the server's current :class:`ConnContext` (auth may change)."""

    def __init__(self, context: Callable[[], ConnContext]) -> None:
        self.context = context
        #: open sessions by id (a session leaves when it ends)
        self.sessions: dict[str, SessionConn] = {}
        #: the TCP connections of the fallback (requests being read or answered, streams)
        self.wires: set[HttpWire] = set()

    def abort(self) -> None:
        """Drop every fallback connection now (the server stops): a request
        still being read would otherwise hold the listener open."""
        for wire in list(self.wires):
            wire.abort()

    # taking a connection over ---------------------------------------------------------

    def sniff(self, conn: Conn, data: bytes) -> bool | None:
        """The first bytes of `conn`: True when they are a fallback request (the
        connection is then this module's), False when not, None while the
        request line is incomplete."""
        verdict = sniff(data, conn.config.path)
        if verdict:
            transport = conn.transport
            assert transport is not None
            wire = HttpWire(self, transport, conn.remote)
            conn.session.set_reason("http")
            transport.set_protocol(wire)
            conn.connection_lost(None)  # the Conn is done: timers, counters, the server's set
            wire.data_received(data)
        return verdict

    # requests --------------------------------------------------------------------------

    def handle(self, wire: HttpWire, req: HttpRequest) -> None:
        """Answer one request (or turn `wire` into a session's stream)."""
        ctx = self.context()
        cors: list[tuple[str, str]] = []
        try:
            cors = self._cors(ctx, req)
            path = req.path
            sse = path.endswith("/sse")
            if req.method == "OPTIONS":
                wire.respond(204, "", cors + [
                    ("Access-Control-Allow-Methods", "GET, POST"),
                    ("Access-Control-Allow-Headers", self._allow_headers(ctx)),
                    ("Access-Control-Max-Age", "600"),
                ])
                return
            want = "GET" if sse else "POST"
            if req.method != want:
                wire.respond(405, f"{path} takes {want}\n", cors + [("Allow", f"{want}, OPTIONS")])
                return
            sid = req.query("session")
            if sid is not None and not SESSION_ID.match(sid):
                raise BadRequest(400, "invalid session id")
            if sid is None and not sse:
                raise BadRequest(400, "missing session")
            identity = self._authenticate(ctx, req)
            if sid is None and ctx.proxies is not None and ctx.proxies.connecting:
                # a new session: the application's connect proxy decides, as for a handshake
                asker = _Asker(ctx, wire.remote)
                pending = ctx.proxies.connect(asker, req.request, identity)
                wire.task = asyncio.get_running_loop().create_task(
                    self._later(wire, req, cors, pending, client_id=asker.id))
                return
            if identity is not None and not _is_identity(identity):
                task = asyncio.get_running_loop().create_task(self._later(wire, req, cors, identity))
                wire.task = task
                return
            self._route(ctx, wire, req, cors, sid, identity)
        except BadRequest as exc:
            wire.respond(exc.status, exc.text + "\n", cors)

    async def _later(self, wire: HttpWire, req: HttpRequest, cors: list[tuple[str, str]],
                     pending: Awaitable[Identity], client_id: str | None = None) -> None:
        """A token that names a key not held yet, or a connect proxy asked: the
        request waits for the identity. `client_id`: the session's connection
        id the connect proxy was told."""
        from juggler.auth import AuthError

        try:
            identity = await pending
        except AuthError as exc:
            reason, text = "origin" if exc.status == 403 else "unauthenticated", (
                "Forbidden\n" if exc.status == 403 else "Unauthorized\n")
            reason, text = getattr(exc, "refusal", (reason, text))  # a connect proxy's (juggler.proxy)
            if client_id is not None:
                self.context().listener.reject(reason)
            wire.respond(exc.status, text, cors)
            return
        finally:
            wire.task = None
        if wire.closed:
            return
        try:
            self._route(self.context(), wire, req, cors, req.query("session"), identity, client_id)
        except BadRequest as exc:
            wire.respond(exc.status, exc.text + "\n", cors)

    def _route(self, ctx: ConnContext, wire: HttpWire, req: HttpRequest, cors: list[tuple[str, str]],
               sid: str | None, identity: Any, client_id: str | None = None) -> None:
        if sid is None:
            self._open(ctx, wire, req, cors, identity, client_id)
            return
        conn = self.sessions.get(sid)
        if conn is None or conn.closed:
            ctx.listener.reject("unknown_session")
            raise BadRequest(404, "unknown or expired session")
        if ctx.auth is not None and not _same_identity(conn.identity, identity):
            ctx.listener.reject("forbidden")
            raise BadRequest(403, "the session belongs to another identity")
        if req.path.endswith("/sse"):
            last = req.headers.get("Last-Event-ID") or req.query("last_event_id")
            try:
                last_id = int(last) if last else 0
            except ValueError:
                raise BadRequest(400, "invalid Last-Event-ID") from None
            if not conn.reattach(wire, last_id, cors):
                raise BadRequest(410, "events were missed and are gone: the session has ended")
            return
        if req.query("close") == "1":
            # the client leaves (back to a websocket, or closed): no grace to wait out
            conn.leave()
            wire.respond(204, "", cors)
            return
        status, text = conn.receive_body(req.body)
        extra = [("Retry-After", "1")] if status == 429 else []
        wire.respond(status, text, cors + extra)

    def _open(self, ctx: ConnContext, wire: HttpWire, req: HttpRequest, cors: list[tuple[str, str]],
              identity: Any, client_id: str | None = None) -> None:
        """A new session: the checks of a websocket handshake, then the stream."""
        listener = ctx.listener
        cfg = ctx.config
        if listener.draining:
            listener.reject("draining")
            raise BadRequest(503, "Service Unavailable: shutting down")
        if cfg.max_connections and ctx.stats.connections_active >= cfg.max_connections:
            listener.reject("max_connections")
            raise BadRequest(503, "Service Unavailable: too many connections")
        try:
            allowed = allowed_mask(_option(req, "Juggler-Allowed-Messages", "juggler-allowed-messages"))
        except ValueError as exc:
            raise BadRequest(400, f"Invalid Juggler-Allowed-Messages header: {exc}") from None
        try:
            messages = opted_in(_option(req, _KEEPALIVE_HEADER, _KEEPALIVE_QUERY))
        except ValueError as exc:
            raise BadRequest(400, f"Invalid {_KEEPALIVE_HEADER} header: {exc}") from None
        try:
            refresh_messages = opted_in(_option(req, _REFRESH_HEADER, _REFRESH_QUERY))
        except ValueError as exc:
            raise BadRequest(400, f"Invalid {_REFRESH_HEADER} header: {exc}") from None
        conn = SessionConn(ctx, self, _new_session_id())
        if client_id is not None:
            conn.id = client_id  # the id the connect proxy was told
        conn.remote = wire.remote
        conn.ws.request = req.request  # Conn.request: what middleware may read
        conn.identity = identity
        conn.session.allowed = allowed
        if not listener.conn_opened(conn):
            raise BadRequest(503, "Service Unavailable: shutting down")
        try:
            listener.conn_accepting(conn)
        except Exception as exc:
            log.info("fallback session %s refused by on_conn_state: %s", wire.remote, exc)
            conn.refused()
            raise BadRequest(403, "Forbidden") from None
        self.sessions[conn.sid] = conn
        conn.start(wire, messages, cors, refresh_messages)

    def _authenticate(self, ctx: ConnContext, req: HttpRequest) -> Any:
        if ctx.auth is None:
            return None
        from juggler.auth import AuthError

        try:
            return ctx.auth.authenticate(req.request)
        except AuthError as exc:
            ctx.listener.reject("origin" if exc.status == 403 else "unauthenticated")
            raise BadRequest(exc.status, "Forbidden" if exc.status == 403 else "Unauthorized") from None

    def _cors(self, ctx: ConnContext, req: HttpRequest) -> list[tuple[str, str]]:
        """The CORS headers of the answer: the request's origin, when allowed."""
        origin = req.headers.get("Origin")
        if origin is None:
            return []
        if ctx.auth is not None:
            from juggler.auth import AuthError

            try:
                ctx.auth.check_origin(req.request)
            except AuthError:
                ctx.listener.reject("origin")
                raise BadRequest(403, "Forbidden") from None
        return [("Access-Control-Allow-Origin", origin), ("Access-Control-Allow-Credentials", "true"),
                ("Vary", "Origin")]

    def _allow_headers(self, ctx: ConnContext) -> str:
        header = getattr(getattr(ctx.auth, "config", None), "header", None)
        if header and header.lower() not in _ALLOW_HEADERS.lower():
            return f"{_ALLOW_HEADERS}, {header}"
        return _ALLOW_HEADERS


def _is_identity(value: Any) -> bool:
    from juggler.auth import Identity

    return isinstance(value, Identity)


def _same_identity(a: Any, b: Any) -> bool:
    """Whether two identities are the same client: anonymous both, or the same subject."""
    if a is None or b is None:
        return a is b
    if a.anonymous or b.anonymous:
        return bool(a.anonymous and b.anonymous)
    return (a.claims or {}).get("sub") == (b.claims or {}).get("sub")


def _option(req: HttpRequest, header: str, query: str) -> str | None:
    """A handshake option: its header, else its query parameter (as for the websocket)."""
    value = req.headers.get(header)
    return value if value is not None else req.query(query)


class HttpWire(asyncio.Protocol):
    """One TCP connection of the fallback: one request, then its response; or,
    for a session's stream, the stream until it ends (see module doc)."""

    def __init__(self, fallback: Fallback, transport: asyncio.BaseTransport, remote: Any) -> None:
        self.fallback = fallback
        self.transport: Any = transport
        self.remote = remote
        cfg = fallback.context().config
        self.config = cfg
        self.loop = asyncio.get_running_loop()
        self._reader = RequestReader(cfg.fallback_max_body)
        self._timer: asyncio.TimerHandle | None = self.loop.call_later(cfg.handshake_timeout, self._timed_out)
        self._write_timer: asyncio.TimerHandle | None = None
        #: the session this connection is the stream of
        self.stream_of: SessionConn | None = None
        #: a request waiting for auth keys
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        fallback.wires.add(self)

    # asyncio.Protocol ---------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed or self._reader.done:
            return  # one request per connection; nothing is read on a stream
        try:
            req = self._reader.feed(data)
        except BadRequest as exc:
            log.debug("fallback request from %s refused: %s", self.remote, exc.text)
            self.respond(exc.status, exc.text + "\n", [])
            return
        if req is None:
            return
        self._cancel_timer()
        self.fallback.handle(self, req)

    def eof_received(self) -> bool:
        return False  # a half-closed client: the connection ends (a stream too)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.fallback.wires.discard(self)
        self._cancel_timer()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        if self.task is not None:
            self.task.cancel()
            self.task = None
        session = self.stream_of
        self.stream_of = None
        if session is not None:
            session.stream_lost(self)

    def pause_writing(self) -> None:
        wt = self.config.write_timeout
        if wt and self._write_timer is None:
            self._write_timer = self.loop.call_later(wt, self._write_timed_out)

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    # answering -----------------------------------------------------------------------

    def respond(self, status: int, text: str, headers: list[tuple[str, str]]) -> None:
        """One response, then the connection closes."""
        if self.closed:
            return
        self._cancel_timer()
        body = text.encode()
        head = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"), ("Connection", "close"), *headers]
        self.transport.write(response_head(status, head) + body)
        self.close()

    def start_stream(self, session: SessionConn, first: bytes, headers: list[tuple[str, str]]) -> None:
        """This connection becomes `session`'s event stream (a body until the connection closes)."""
        head = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-store"),
                ("X-Accel-Buffering", "no"), ("Connection", "close"), *headers]
        self.stream_of = session
        self.send(response_head(200, head) + first)

    def send(self, data: bytes) -> bool:
        """Write stream bytes; False (the session is dropped) for a reader that lets
        ``max_write_buffer`` bytes pile up."""
        transport = self.transport
        if self.closed or transport.is_closing():
            return False
        transport.write(data)
        if transport.get_write_buffer_size() > self.config.max_write_buffer:
            log.warning("fallback stream %s: %d bytes unread; dropping the session", self.remote,
                        transport.get_write_buffer_size())
            session = self.stream_of
            if session is not None:
                session.slow_consumer("slow_consumer")
            self.abort()
            return False
        return True

    def close(self) -> None:
        """Close after what is written (the end of a stream, or of a response)."""
        self.stream_of = None
        if not self.closed:
            self.closed = True
            self.transport.close()

    def abort(self) -> None:
        self.stream_of = None
        if not self.closed:
            self.closed = True
            self.transport.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if not self.closed:
            log.info("fallback request from %s: not complete within %.1fs", self.remote, self.config.handshake_timeout)
            self.abort()

    def _write_timed_out(self) -> None:
        self._write_timer = None
        session = self.stream_of
        if session is not None:
            session.slow_consumer("write_timeout")
        self.abort()


class SessionConn(Conn):
    """One fallback session: a :class:`Conn` whose wire is an event stream
    (see module doc). It outlives a dropped stream by ``fallback_grace``
    seconds, keeping its last ``fallback_replay`` events for a reopened one."""

    def __init__(self, context: ConnContext, fallback: Fallback, sid: str) -> None:
        super().__init__(context)
        #: the session id (the capability of its POSTs)
        self.sid = sid
        self._fallback = fallback
        self._stream: HttpWire | None = None
        self._next_id = 1
        self._replay: deque[tuple[int, bytes]] = deque()  # (event id, event bytes), oldest first
        self._replay_bytes = 0
        self._out: list[bytes] = []  # events of this loop turn, not written yet
        self._grace: asyncio.TimerHandle | None = None
        self._next_ping = 0.0
        self._ending = False
        self._early_lines: list[bytes] = []  # POSTed while the server-side subscriptions are made

    def __repr__(self) -> str:
        return f"<SessionConn {self.id} {self.remote} {self.state.value}>"

    # lifecycle ------------------------------------------------------------------------

    def start(self, wire: HttpWire, keepalive_messages: bool, cors: list[tuple[str, str]],
              refresh_messages: bool = False) -> None:
        """Connected: the stream opens with the session event; the server counts it as a
        connection; its token is timed and its server-side subscriptions made, as a websocket's."""
        self.state = _CONNECTED
        subs = self.context.subscriptions
        if subs is not None:
            self.hub_id = subs.add_conn(self, -1)  # written by Python: the stream is not a websocket
        self._stream = wire
        wire.start_stream(self, self._session_event(), cors)
        self._listener.conn_connected(self)
        if self.state is _CONNECTED and not self._ending:
            self._start_keepalive(keepalive_messages)
        if self.context.refresh is not None and self.state is _CONNECTED:
            self.expiry = self.context.refresh.attach(self, refresh_messages)
        channels = getattr(self.identity, "channels", None)
        if channels and subs is not None and self.state is _CONNECTED:
            self._subscribe_server_side(channels)  # POSTed messages wait for them (receive_body)

    def refused(self) -> None:
        """Refused before it started (on_conn_state raised): gone, never connected."""
        self.session.set_reason("refused")
        self._finish()

    def reattach(self, wire: HttpWire, last_id: int, cors: list[tuple[str, str]]) -> bool:
        """A reopened stream: the events after `last_id` are replayed; False
        (the session ends) when some of them are gone."""
        first = last_id + 1
        replay = self._replay
        if first > self._next_id or (first < self._next_id and (not replay or replay[0][0] > first)):
            self._set_reason("replay_gap")
            self.abort()
            return False
        old = self._stream
        self._stream = None
        if old is not None:
            old.close()  # a newer stream wins
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        self._flush()  # what this turn queued was meant for the old stream: it goes in the replay
        missed = b"".join(data for eid, data in replay if eid >= first)
        self._stream = wire
        wire.start_stream(self, self._session_event() + missed, cors)
        return True

    def stream_lost(self, wire: HttpWire) -> None:
        """The stream's connection is gone: the session waits ``fallback_grace`` s for another."""
        if wire is not self._stream or self.closed:
            return
        self._stream = None
        grace = self.config.fallback_grace
        if grace <= 0 or self._ending:
            self._set_reason("peer_gone")
            self._finish()
            return
        self._grace = self.loop.call_later(grace, self._grace_over)

    def _grace_over(self) -> None:
        self._grace = None
        if not self.closed and self._stream is None:
            log.info("fallback session %s: no stream within %.1fs; closing it", self.remote, self.config.fallback_grace)
            self._set_reason("peer_gone")
            self._finish()

    def leave(self) -> None:
        """The client ends the session (``close=1``): as a websocket client's close frame."""
        if not self.closed and not self._ending:
            self._set_reason("peer_close")
            self._finish()

    def slow_consumer(self, reason: str) -> None:
        """The stream's reader is too slow (``max_write_buffer``, ``write_timeout``): dropped."""
        self._listener.reject(reason)
        self._set_reason(reason)
        self._stream = None
        self._finish()

    def _session_event(self) -> bytes:
        cfg = self.config
        return named_event("session", json.dumps({
            "session": self.sid, "grace_ms": int(cfg.fallback_grace * 1000),
        }, separators=(",", ":")).encode())

    # what the client sends ----------------------------------------------------------

    def receive_body(self, body: bytes) -> tuple[int, str]:
        """The messages of one POST, a line each: (status, text) of its answer.
        Bad input ends the session as it would a websocket connection."""
        if self.closed or self._ending:
            return 404, "unknown or expired session\n"
        cfg = self.config
        lines = [line for line in body.split(b"\n") if line.strip()]
        if len(lines) > cfg.max_pending:
            # as a websocket reader pauses at max_pending queued messages, a POST holds no more
            return 413, f"more than max_pending ({cfg.max_pending}) messages in one POST\n"
        if self.session.queued + len(lines) > cfg.max_pending:
            self._listener.reject("backpressure")
            return 429, "too many messages queued: retry\n"
        limit = cfg.read_limit
        for line in lines:
            if limit and len(line) > limit:
                self._set_reason("too_big")
                self.stats.protocol_errors += 1
                self.close(1009, "message too big")
                return 413, f"a message over read_limit ({limit} bytes): the session is closed\n"
            self._last_read = self.loop.time()
            if self._early is not None:  # server-side subscriptions being made: read once they are
                self._early_lines.append(line)
                continue
            self._on_text(line)
            reason = self.session.close_reason
            if reason is not None:
                if reason == "rate_limited":
                    return 429, "rate limit exceeded: the session is closed\n"
                return 400, f"bad input ({reason}): the session is closed\n"
        return 204, ""

    def server_subscribed(self) -> None:
        """The identity's subscriptions are made (or failed): the messages POSTed meanwhile now."""
        lines, self._early_lines = self._early_lines, []
        self._early = None
        self._subscribing = None
        if self.closed:
            return
        for line in lines:
            self._on_text(line)
        self._flush()

    # outgoing --------------------------------------------------------------------------

    def write(self, msg_type: int, frame: bytes) -> bool:
        """One server message: the next event of the stream (and of the replay buffer)."""
        if self.state is not _CONNECTED or self._ending:
            return False
        if self.config.write_limit and not self.session.frame_fits(frame):
            log.warning("fallback session %s: a %d-byte message exceeds write_limit %d; closing", self.remote,
                        len(frame), self.config.write_limit)
            self.close(1009, "message too big")
            return False
        self._emit(frame)
        self.stats.wrote(msg_type)
        return True

    def _emit(self, frame: bytes) -> None:
        eid = self._next_id
        self._next_id = eid + 1
        data = event(eid, frame)
        replay = self._replay
        replay.append((eid, data))
        self._replay_bytes += len(data)
        cfg = self.config
        while len(replay) > cfg.fallback_replay or self._replay_bytes > cfg.max_write_buffer:
            self._replay_bytes -= len(replay.popleft()[1])
        if self._stream is not None:
            if not self._out:
                self.loop.call_soon(self._flush)
            self._out.append(data)

    def _flush(self) -> None:
        """Write this turn's events to the stream, in one write."""
        out = self._out
        if not out:
            return
        self._out = []
        stream = self._stream
        if stream is not None:
            stream.send(out[0] if len(out) == 1 else b"".join(out))

    def write_rest(self, rest: bytes) -> None:
        """Native fan-out bytes: never for a session (it is written by Python)."""

    # keepalive -------------------------------------------------------------------------

    def _start_keepalive(self, messages: bool) -> None:
        """Every ``ping_interval``: a comment line (proxies see traffic) and, if the
        client asked, a KEEPALIVE message; ``read_timeout`` as for a websocket.
        No pong timeout: a dead stream shows as its TCP connection's end."""
        cfg = self.config
        now = self.loop.time()
        self.keepalive_messages = bool(messages and cfg.ping_interval)
        if self.keepalive_messages:
            self._emit(keepalive_frame(_new_uuid(), cfg.ping_interval))
        self._next_ping = now + cfg.ping_interval
        self._arm()

    def _arm(self) -> None:
        cfg = self.config
        when = []
        if cfg.ping_interval:
            when.append(self._next_ping)
        if cfg.read_timeout:
            when.append(self._last_message + cfg.read_timeout)
        self._timer = self.loop.call_at(min(when), self._keepalive_tick) if when else None

    def _keepalive_tick(self) -> None:
        self._timer = None
        if self.closed or self._ending:
            return
        cfg = self.config
        now = self.loop.time()
        if cfg.read_timeout and now - self._last_message >= cfg.read_timeout:
            log.info("fallback session %s: read timeout", self.remote)
            self._set_reason(READ_TIMEOUT)
            self.close(1000, "read timeout")
            return
        if cfg.ping_interval and now >= self._next_ping:
            self._next_ping = now + cfg.ping_interval
            if self._stream is not None:
                self._flush()
                self._stream.send(comment())
            if self.keepalive_messages:
                self._emit(keepalive_frame(_new_uuid(), cfg.ping_interval))
        self._arm()

    # closing ---------------------------------------------------------------------------

    def close(self, code: int = 1000, reason: str = "") -> None:
        """A ``close`` event (the websocket's close code and reason), then the stream and the session end."""
        if self.closed or self._ending:
            return
        self.session.closing(code)
        self._end_with(code, reason)

    def _close_transport(self) -> None:
        """Bad input: the session ends (the client reads code 1006, as a websocket dropped without a close frame)."""
        if self.closed or self._ending:
            return
        self._end_with(1006, self.session.close_reason or "")

    def _end_with(self, code: int, reason: str) -> None:
        self._ending = True
        self._detach()
        if self._stream is not None:
            self._flush()
            self._stream.send(named_event("close", json.dumps({"code": code, "reason": reason},
                                                              separators=(",", ":")).encode()))
        # the handler tasks still running see the state CLOSED and stop
        self._finish()

    def abort(self) -> None:
        """End now, without a close event."""
        if not self.closed:
            self._finish()

    def _finish(self) -> None:
        """Gone: the stream closes, the server forgets the session (its subscriptions, its calls)."""
        if self.state is _CLOSED:
            return
        self._ending = True
        for t in (self._timer, self._grace):
            if t is not None:
                t.cancel()
        self._timer = self._grace = None
        stream = self._stream
        self._stream = None
        if stream is not None:
            self._flush_to(stream)
            stream.close()
        self._out = []
        self._replay.clear()
        self._replay_bytes = 0
        if self._fallback.sessions.get(self.sid) is self:
            del self._fallback.sessions[self.sid]
        self._detach()
        was_connected = self.state is _CONNECTED
        self.state = _CLOSED
        self._listener.conn_closed(self, was_connected)
        if not self._closed_fut.done():
            self._closed_fut.set_result(None)

    def _flush_to(self, stream: HttpWire) -> None:
        out = self._out
        self._out = []
        if out:
            stream.send(b"".join(out))


class _Asker:
    """What the connect proxy reads of a connection, for a session not made yet."""

    __slots__ = ("context", "id", "remote")

    def __init__(self, context: ConnContext, remote: Any) -> None:
        self.context = context
        self.remote = remote
        self.id = rustext.new_uuid()
