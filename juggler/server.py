"""The juggler server: websocket connections in front of a broker.

::

    broker = MemoryBroker()            # or RedisBroker(RedisBrokerConfig(url=...))
    await broker.start()
    async with Server(broker, ServerConfig(port=9000)) as server:
        await server.wait_closed()     # until aclose() (e.g. on SIGTERM)

Process-wide resources (not per connection): results come back through the
broker's ONE results sink and are routed here by ``msg_uuid`` to the
connection that made the call (:class:`juggler.pending.PendingCalls`, which
forgets calls whose timeout has passed); events come through the broker's
shared pub-sub fan-out with reference-counted subscriptions. Each connection
is handed :attr:`Server.conn_context` (a :class:`juggler.conn.ConnContext`):
the configuration, counters, brokers, pending-call table, middleware chains
and the server's side of the connection lifecycle; it knows nothing else of
the server.

Handler chain: ``middleware`` is a sequence of
``async def mw(conn, msg, next_handler)``. Each sees every incoming message
(a ``rustext.ClientMessage``) and every outgoing one (a
``juggler.protocol.Outgoing``); it may call ``await next_handler(conn, msg)``
to go on, or refuse an incoming message with ``conn.nack(msg, 403, "...")``.
An exception closes only that connection (counted in ``recovered``).
KEEPALIVE messages (:mod:`juggler.keepalive`) are connection machinery, as
websocket pings are: they do not go through the chain.

Plain HTTP: a request for another path than ``config.path`` (or a HEAD) is
answered by ``/healthz`` (``juggler.http``), then by ``http`` (a
:class:`juggler.static_files.StaticSite`: the browser client and the demo
page), else 404; it never becomes a websocket connection.

Lifecycle: ``start()`` listens; ``aclose()`` drains: it stops accepting
(``/healthz`` answers 503 from then on), NACKs new CALLs with 503, lets the
calls in flight get their RES for up to ``drain_timeout`` s, then sends
every connection a 1001 close, waits up to ``close_timeout`` for them and
drops the rest. The broker is the caller's: the server never closes it.

``auth`` (a :class:`juggler.auth.Auth`) authenticates each handshake and
authorizes each CALL/PUB/SUB (NACK 401/403); the limits of
:class:`ServerConfig` (connections, message rate, calls in flight,
subscriptions, slow consumers) are enforced by each connection and counted
by reason in ``stats.rejections``. One log line (logger ``juggler.access``,
``key=value`` fields) is written per connection opened, refused and closed,
with the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import rustext
from rustext.net import listen_error
from rustext.service import ServiceBase

from juggler.broker.base import Result
from juggler.http import http_response
from juggler.config import ServerConfig
from juggler.conn import Conn, ConnContext, ConnState, Handler, Middleware
from juggler.extensions import ExtensionHandler
from juggler.fallback import Fallback
from juggler.deflate import deflate_of
from juggler.metrics import ServerStats
from juggler.pending import PendingCalls
from juggler.debugvars import debug_vars_response
from juggler.static_files import StaticSite
from juggler.channels import ChannelRules
from juggler.client_requests import install as install_client_requests
from juggler.recovery import PublishResult, Recovery
from juggler.subscriptions import Subscriptions

__all__ = ["Conn", "ConnState", "Middleware", "Server"]

log = logging.getLogger("juggler.server")
access_log = logging.getLogger("juggler.access")

ConnStateCallback = Callable[[Conn, ConnState], None]


async def _call_middleware(mw: Middleware, nxt: Handler, conn: Conn, msg: Any) -> None:
    await mw(conn, msg, nxt)


def _chain(middleware: Sequence[Middleware], final: Handler) -> Handler:
    handler = final
    for mw in reversed(middleware):
        handler = functools.partial(_call_middleware, mw, handler)
    return handler


class Server(ServiceBase):
    """A juggler.0 websocket server over a caller + pub-sub broker (see module doc)."""

    def __init__(
        self,
        broker: Any,
        config: ServerConfig | None = None,
        *,
        pubsub: Any = None,
        middleware: Sequence[Middleware] = (),
        on_conn_state: ConnStateCallback | None = None,
        stats: ServerStats | None = None,
        http: StaticSite | None = None,
        auth: Any = None,
        native_fanout: bool | None = None,
        channels: ChannelRules | None = None,
        presence: Any = None,
        proxies: Any = None,
    ) -> None:
        self.broker = broker
        self.pubsub = pubsub if pubsub is not None else broker
        self.config = config or ServerConfig()
        self.middleware = tuple(middleware)
        self.on_conn_state = on_conn_state
        self.stats = stats or ServerStats()
        self._http = http
        self._auth = auth
        self.conns: set[Conn] = set()
        self.draining = False
        self._pending_changed: asyncio.Event | None = None
        self._ssl: ssl.SSLContext | None = None
        self._aborted = asyncio.Event()
        chain_in: Handler | None = None
        chain_out: Handler | None = None
        if self.middleware:
            chain_in = _chain(self.middleware, Conn.process)  # type: ignore[arg-type]
            chain_out = _chain(self.middleware, Conn.write_outgoing)  # type: ignore[arg-type]
        # calls waiting for their result, routed by msg_uuid (expiring on their own timer)
        self._pending: PendingCalls[Conn] = PendingCalls()
        if self.config.answer_expired_calls:
            self._pending.on_expire = self._call_expired
        #: permessage-deflate: the policy and the one compressor of this server (None: off)
        self.deflate = deflate_of(self.config)
        #: who subscribes to what on this server, and the native fan-out of events
        self.subscriptions = Subscriptions(self.pubsub, self.stats,
                                           native=self.config.native_fanout if native_fanout is None else native_fanout,
                                           write_limit=self.config.write_limit, deflate=self.deflate)
        #: per-channel options (history, presence)
        self.channels = channels or ChannelRules()
        #: history and recovery of the channels that keep history
        self.recovery = Recovery(self.subscriptions, self.pubsub, self.channels)
        if any(rule.history for rule in self.channels.rules):
            self.subscriptions.recovery = self.recovery
        #: who is subscribed where (juggler.presence.Presence; the caller starts and closes it)
        self.presence = presence
        self.subscriptions.presence = presence
        #: the extension requests (types 256 and above) this server answers, by type: a handler
        #: registered here makes connections accept that type (juggler.extensions)
        self.extensions: dict[int, ExtensionHandler] = {}
        install_client_requests(self)  # HISTORY/PRESENCE, where a [[channels]] rule allows them
        #: the HTTP fallback transport (SSE down, POST up), unless ``fallback = false``
        self.fallback = Fallback(lambda: self.conn_context) if self.config.fallback else None
        #: what each connection is handed: all it knows of this server
        self.conn_context = ConnContext(
            config=self.config, stats=self.stats, broker=self.broker, pubsub=self.pubsub,
            pending=self._pending, listener=_Listener(self), chain_in=chain_in, chain_out=chain_out,
            http=self._answer_http, auth=auth, subscriptions=self.subscriptions, extensions=self.extensions,
            proxies=proxies,  # the application's backend (juggler.proxy.ProxySet; the caller starts it)
            fallback=self.fallback,
            deflate=self.deflate,
        )
        self._server: asyncio.AbstractServer | None = None
        self._closed: asyncio.Event | None = None
        self._closing = False

    @property
    def http(self) -> StaticSite | None:
        """Answers plain HTTP requests to other paths than the websocket one (else 404)."""
        return self._http

    @http.setter
    def http(self, site: StaticSite | None) -> None:
        self._http = site

    def _answer_http(self, request: Any, *, head: bool) -> Any:
        """The response to a plain HTTP request on the websocket port: /healthz,
        then the static site; None (404) for anything else."""
        response = http_response(request, draining=self.draining)
        if response is None and self.config.debug_vars:
            response = debug_vars_response(request, self.stats, head=head)
        if response is None and self._http is not None:
            response = self._http.respond(request, head=head)
        return response

    @property
    def auth(self) -> Any:
        """Authenticates each handshake and authorizes each CALL/PUB/SUB (a :class:`juggler.auth.Auth`)."""
        return self._auth

    @auth.setter
    def auth(self, auth: Any) -> None:
        self._auth = auth
        self.conn_context = dataclasses.replace(self.conn_context, auth=auth)

    # lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Listen (port 0 picks a free one, see :attr:`port`)."""
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()
        self._closed = asyncio.Event()
        self.broker.on_result(self._on_result)
        cfg = self.config
        tls = cfg.tls()
        self._ssl = tls.context(alpn=["http/1.1"]) if tls is not None else None
        try:
            self._server = await loop.create_server(
                lambda: Conn(self.conn_context), cfg.host, cfg.port, reuse_address=True, backlog=4096,
                ssl=self._ssl, ssl_handshake_timeout=cfg.handshake_timeout if self._ssl else None,
            )
        except OSError as exc:
            raise listen_error(cfg.host, cfg.port, exc) from exc

    def reload_tls(self) -> bool:
        """Read the certificate files again (SIGHUP): new connections get the
        new certificate, open ones keep theirs. False without TLS; raises
        ``rustext.tls.TlsConfigError`` (the current certificate stays in
        service) when the files are not usable."""
        tls = self.config.tls()
        if tls is None or self._ssl is None:
            return False
        tls.reload(self._ssl)
        return True

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        host = self.config.host
        if ":" in host:
            host = f"[{host}]"
        scheme = "wss" if self.config.tls_cert else "ws"
        return f"{scheme}://{host}:{self.port}{self.config.path}"

    async def wait_closed(self) -> None:
        """Wait until :meth:`aclose` has finished."""
        assert self._closed is not None, "not started"
        await self._closed.wait()

    async def drain(self, timeout: float | None = None) -> None:
        """Stop accepting, let calls in flight finish (for `timeout` s, None:
        ``drain_timeout``), close connections (1001) within
        ``close_timeout``. Idempotent; :meth:`abort` cuts it short."""
        if self._server is None:  # never listening: nothing to close
            if self._closed is not None:
                self._closed.set()
            return
        if self._closing:
            if self._closed is not None:
                await self._closed.wait()
            return
        self._closing = True
        self.draining = True
        self._server.close()
        await self._drain_calls(self.config.drain_timeout if timeout is None else timeout)
        conns = list(self.conns)
        for c in conns:
            c.close(1001, "server shutting down")
        if self.fallback is not None:
            self.fallback.abort()  # fallback requests still being read (sessions are in conns)
        if conns:
            waits = [asyncio.ensure_future(c.wait_closed()) for c in conns]
            await self._until(asyncio.gather(*waits), self.config.close_timeout)
            for c in conns:
                if not c.closed:
                    c.abort()
            for w in waits:
                w.cancel()
            await asyncio.wait(waits, timeout=1.0)
        await self._server.wait_closed()
        self._pending.clear()
        for mw in self.middleware:  # e.g. CallTracing ends the spans of calls never answered
            close = getattr(mw, "close", None)
            if callable(close):
                close()
        assert self._closed is not None
        self._closed.set()

    def abort(self) -> None:
        """Stop now (a second Ctrl-C): a drain in progress ends at once and
        every connection is dropped without its closing handshake."""
        self._aborted.set()
        self.draining = True
        if self._server is not None:
            self._server.close()
        for c in list(self.conns):
            c.abort()
        if self.fallback is not None:
            self.fallback.abort()

    async def _until(self, aw: Any, timeout: float) -> None:
        """Wait for `aw` for up to `timeout` s, or until :meth:`abort`."""
        task = asyncio.ensure_future(aw)
        aborted = asyncio.ensure_future(self._aborted.wait())
        try:
            await asyncio.wait([task, aborted], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, aborted):
                t.cancel()
            await asyncio.gather(task, aborted, return_exceptions=True)

    def calls_in_flight(self) -> int:
        """Calls whose caller is connected and whose result may still come."""
        return self._live_pending()

    async def _drain_calls(self, timeout: float) -> None:
        """Let the calls in flight get their RES, for up to `timeout` s."""
        if not timeout:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._pending_changed = asyncio.Event()
        self._pending.on_change = self._pending_changed.set
        n = self._live_pending()
        if n:
            log.info("draining: %d calls in flight (up to %.1fs)", n, timeout)
        while n and loop.time() < deadline and not self._aborted.is_set():
            self._pending_changed.clear()
            await self._until(self._pending_changed.wait(), min(1.0, deadline - loop.time()))
            n = self._live_pending()
        if n and not self._aborted.is_set():
            log.warning("drain deadline passed with %d calls in flight", n)

    def _live_pending(self) -> int:
        return self._pending.live(asyncio.get_running_loop().time())

    def reject(self, reason: str) -> None:
        """Count one refusal (``juggler_rejections_total{reason}``)."""
        r = self.stats.rejections
        r[reason] = r.get(reason, 0) + 1

    # results routing ------------------------------------------------------------

    def _on_result(self, result: Result) -> None:
        conn = self._pending.pop(result.msg_uuid)
        if conn is None:
            self.stats.expired_results += 1  # a late result
            return
        if conn.closed:
            self.stats.expired_results += 1  # its caller has gone
            return
        conn.send_res(result.msg_uuid, result.uri, result.args)

    def _call_expired(self, conn: Conn, msg_uuid: str, uri: str, timeout_ms: int) -> None:
        """A call's timeout passed without a result: its caller gets an error
        RES, so no acknowledged call is left without an answer. (A client of
        the original ignores it: its own timer has expired the call.)"""
        if conn.closed:
            return
        self.stats.calls_timed_out += 1
        lost_since = getattr(self.broker, "lost_since", None)
        # the window the call lived in (its timeout, and the grace after it)
        since = asyncio.get_running_loop().time() - timeout_ms / 1000 - self._pending.grace
        lost = lost_since is not None and lost_since(since)
        conn.send_res(msg_uuid, uri, _timed_out(timeout_ms, lost))

    async def publish(self, channel: str, args: bytes | None, msg_uuid: str | None = None) -> PublishResult:
        """Publish to `channel` as a PUB would (with history where the channel keeps it):
        the server API's publish. `args` is raw JSON."""
        return await self.subscriptions.publish(channel, msg_uuid or rustext.new_uuid(), args)

    async def history(self, channel: str, *, after: int = 0, limit: int = 0) -> Any:
        """The channel's publications after offset `after` (a juggler.broker.history.HistoryPage)."""
        return await self.recovery.history(channel, after=after, limit=limit)

    @property
    def pending_calls(self) -> int:
        """Calls ACKed and waiting for their result."""
        return len(self._pending)


class _Listener:
    """The server's side of each connection's lifecycle (a ``ConnListener``):
    the set of connections, the counters, the access log, ``on_conn_state``."""

    __slots__ = ("server",)

    def __init__(self, server: Server) -> None:
        self.server = server

    @property
    def draining(self) -> bool:
        return self.server.draining

    def reject(self, reason: str) -> None:
        self.server.reject(reason)

    def conn_opened(self, conn: Conn) -> bool:
        server = self.server
        if server._closing:
            return False
        server.conns.add(conn)
        return True

    def conn_accepting(self, conn: Conn) -> None:
        cb = self.server.on_conn_state
        if cb is not None:
            cb(conn, ConnState.ACCEPTING)

    def conn_connected(self, conn: Conn) -> None:
        server = self.server
        stats = server.stats
        stats.connections_total += 1
        stats.connections_active += 1
        if server.config.log_connections and access_log.isEnabledFor(logging.INFO):
            ident = conn.identity.name if conn.identity is not None else "-"
            access_log.info("event=open conn=%s remote=%s identity=%s active=%d", conn.id,
                            _fmt_remote(conn.remote), ident, stats.connections_active)
        if not self._notify(conn, ConnState.CONNECTED):
            conn.close(1011, "internal error")

    def conn_closed(self, conn: Conn, was_connected: bool) -> None:
        server = self.server
        stats = server.stats
        server.conns.discard(conn)
        reason = conn.close_reason or ("peer_gone" if was_connected else "handshake_incomplete")
        closed = stats.closed
        closed[reason] = closed.get(reason, 0) + 1
        if server.config.log_connections and access_log.isEnabledFor(logging.INFO):
            if was_connected:
                access_log.info(
                    "event=close conn=%s remote=%s reason=%s duration=%.3f msgs_in=%d active=%d",
                    conn.id, _fmt_remote(conn.remote), reason, conn.loop.time() - conn.opened_at,
                    conn.messages_in, stats.connections_active - 1,
                )
            elif conn.close_reason is not None and conn.close_reason != "http":  # not every /healthz probe
                access_log.info("event=refused conn=%s remote=%s reason=%s", conn.id, _fmt_remote(conn.remote),
                                reason)
        if was_connected:
            stats.connections_active -= 1
            task = asyncio.get_running_loop().create_task(server.subscriptions.drop(conn))
            task.add_done_callback(_log_task_error)
        self._notify(conn, ConnState.CLOSED)

    def _notify(self, conn: Conn, state: ConnState) -> bool:
        """``on_conn_state(conn, state)``; False (logged, counted) if it raised."""
        server = self.server
        cb = server.on_conn_state
        if cb is None:
            return True
        try:
            cb(conn, state)
        except Exception:
            server.stats.recovered += 1
            log.exception("on_conn_state(%s) failed on %s", state.name, conn.remote)
            return False
        return True


def _timed_out(timeout_ms: int, broker_lost: bool = False) -> bytes:
    """The args of the error RES of a call that got no result in time (a callee
    error's shape); it says when the server lost Redis meanwhile (the result may
    have been lost with it, or the callee could not store it)."""
    if broker_lost:
        return (b'{"error":{"message":"call timed out: no result within %d ms; the connection to Redis '
                b'was lost meanwhile"}}' % timeout_ms)
    return b'{"error":{"message":"call timed out: no result within %d ms"}}' % timeout_ms


def _fmt_remote(remote: Any) -> str:
    if isinstance(remote, tuple) and len(remote) >= 2:
        return f"{remote[0]}:{remote[1]}"
    return str(remote)


def _log_task_error(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("cleanup failed: %s", task.exception())
