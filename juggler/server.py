"""The juggler server: websocket connections in front of a broker.

::

    broker = MemoryBroker()            # or RedisBroker(RedisBrokerConfig(url=...))
    await broker.start()
    async with Server(broker, ServerConfig(port=9000)) as server:
        await server.wait_closed()     # until aclose() (e.g. on SIGTERM)

Process-wide resources (not per connection): results come back through the
broker's ONE results sink and are routed here by ``msg_uuid`` to the
connection that made the call; events come through the broker's shared
pub-sub fan-out with reference-counted subscriptions.

Handler chain: ``middleware`` is a sequence of
``async def mw(conn, msg, next_handler)``. Each sees every incoming message
(a ``rustext.ClientMessage``) and every outgoing one (a
``juggler.protocol.Outgoing``); it may call ``await next_handler(conn, msg)``
to go on, or refuse an incoming message with ``conn.nack(msg, 403, "...")``.
An exception closes only that connection (counted in ``recovered``).

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
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from juggler.broker.base import Result
from juggler.config import ServerConfig
from juggler.conn import Conn, ConnState, Handler, Middleware
from juggler.metrics import ServerStats
from juggler.static_files import StaticSite

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


class Server:
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
    ) -> None:
        self.broker = broker
        self.pubsub = pubsub if pubsub is not None else broker
        self.config = config or ServerConfig()
        self.middleware = tuple(middleware)
        self.on_conn_state = on_conn_state
        self.stats = stats or ServerStats()
        #: answers plain HTTP requests to other paths than the websocket one (else 404)
        self.http = http
        self.auth = auth
        self.conns: set[Conn] = set()
        self.draining = False
        self._pending_changed: asyncio.Event | None = None
        self._chain_in: Handler | None = None
        self._chain_out: Handler | None = None
        if self.middleware:
            self._chain_in = _chain(self.middleware, Conn.process)  # type: ignore[arg-type]
            self._chain_out = _chain(self.middleware, Conn.write_outgoing)  # type: ignore[arg-type]
        # msg_uuid -> (conn, deadline): calls waiting for their result
        self._pending: dict[str, tuple[Conn, float]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._server: asyncio.AbstractServer | None = None
        self._closed: asyncio.Event | None = None
        self._closing = False

    # lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Listen (port 0 picks a free one, see :attr:`port`)."""
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()
        self._closed = asyncio.Event()
        self.broker.on_result(self._on_result)
        cfg = self.config
        self._server = await loop.create_server(
            lambda: Conn(self), cfg.host, cfg.port, reuse_address=True, backlog=1024
        )
        self._sweeper = loop.call_later(1.0, self._sweep)

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        host = self.config.host
        if ":" in host:
            host = f"[{host}]"
        return f"ws://{host}:{self.port}{self.config.path}"

    async def __aenter__(self) -> Server:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def wait_closed(self) -> None:
        """Wait until :meth:`aclose` has finished."""
        assert self._closed is not None, "not started"
        await self._closed.wait()

    async def aclose(self) -> None:
        """Stop accepting, close connections (1001) within ``close_timeout``. Idempotent."""
        if self._closing or self._server is None:
            if self._closed is not None:
                await self._closed.wait()
            return
        self._closing = True
        self.draining = True
        self._server.close()
        await self._drain_calls()
        if self._sweeper is not None:
            self._sweeper.cancel()
        conns = list(self.conns)
        for c in conns:
            c.close(1001, "server shutting down")
        if conns:
            waits = [asyncio.ensure_future(c.wait_closed()) for c in conns]
            _, pending = await asyncio.wait(waits, timeout=self.config.close_timeout)
            for c in conns:
                if not c.closed:
                    c._abort()
            for w in pending:
                w.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        await self._server.wait_closed()
        self._pending.clear()
        assert self._closed is not None
        self._closed.set()

    async def _drain_calls(self) -> None:
        """Let the calls in flight get their RES, for up to ``drain_timeout`` s."""
        timeout = self.config.drain_timeout
        if not timeout:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._pending_changed = asyncio.Event()
        n = self._live_pending()
        if n:
            log.info("draining: %d calls in flight (up to %.1fs)", n, timeout)
        while n and loop.time() < deadline:
            self._pending_changed.clear()
            try:
                await asyncio.wait_for(self._pending_changed.wait(), min(1.0, deadline - loop.time()))
            except TimeoutError:
                pass
            n = self._live_pending()
        if n:
            log.warning("drain deadline passed with %d calls in flight", n)

    def _live_pending(self) -> int:
        now = asyncio.get_running_loop().time()
        return sum(1 for c, deadline in self._pending.values() if not c.closed and deadline > now)

    def reject(self, reason: str) -> None:
        """Count one refusal (``juggler_rejections_total{reason}``)."""
        r = self.stats.rejections
        r[reason] = r.get(reason, 0) + 1

    # connections ----------------------------------------------------------------

    def _conn_made(self, conn: Conn) -> None:
        if self._closing:
            conn._abort()
            return
        self.conns.add(conn)

    def _conn_state(self, conn: Conn, state: ConnState) -> None:
        if self.on_conn_state is not None:
            self.on_conn_state(conn, state)

    def _conn_connected(self, conn: Conn) -> None:
        self.stats.connections_total += 1
        self.stats.connections_active += 1
        if self.config.log_connections and access_log.isEnabledFor(logging.INFO):
            ident = conn.identity.name if conn.identity is not None else "-"
            access_log.info("event=open conn=%s remote=%s identity=%s active=%d", conn.id,
                            _fmt_remote(conn.remote), ident, self.stats.connections_active)
        try:
            self._conn_state(conn, ConnState.CONNECTED)
        except Exception:
            self.stats.recovered += 1
            log.exception("on_conn_state(CONNECTED) failed; closing %s", conn.remote)
            conn.close(1011, "internal error")

    def _conn_lost(self, conn: Conn, was_connected: bool) -> None:
        self.conns.discard(conn)
        reason = conn.close_reason or ("peer_gone" if was_connected else "handshake_incomplete")
        closed = self.stats.closed
        closed[reason] = closed.get(reason, 0) + 1
        if self.config.log_connections and access_log.isEnabledFor(logging.INFO):
            if was_connected:
                access_log.info(
                    "event=close conn=%s remote=%s reason=%s duration=%.3f msgs_in=%d active=%d",
                    conn.id, _fmt_remote(conn.remote), reason, conn.loop.time() - conn.opened_at,
                    conn.messages_in, self.stats.connections_active - 1,
                )
            elif conn.close_reason is not None and conn.close_reason != "http":  # not every /healthz probe
                access_log.info("event=refused conn=%s remote=%s reason=%s", conn.id, _fmt_remote(conn.remote),
                                reason)
        if was_connected:
            self.stats.connections_active -= 1
            task = asyncio.get_running_loop().create_task(self._forget(conn))
            task.add_done_callback(_log_task_error)
        try:
            self._conn_state(conn, ConnState.CLOSED)
        except Exception:
            self.stats.recovered += 1
            log.exception("on_conn_state(CLOSED) failed")

    async def _forget(self, conn: Conn) -> None:
        await self.pubsub.unsubscribe_all(conn)

    # results routing ------------------------------------------------------------

    def _pending_add(self, msg_uuid: str, conn: Conn, timeout_ms: int) -> None:
        old = self._pending.get(msg_uuid)
        if old is not None:
            old[0].inflight -= 1
        self._pending[msg_uuid] = (conn, conn.loop.time() + timeout_ms / 1000.0)
        conn.inflight += 1

    def _pending_drop(self, msg_uuid: str) -> None:
        entry = self._pending.pop(msg_uuid, None)
        if entry is not None:
            entry[0].inflight -= 1

    def _on_result(self, result: Result) -> None:
        entry = self._pending.pop(result.msg_uuid, None)
        if self._pending_changed is not None:
            self._pending_changed.set()
        if entry is None:
            self.stats.expired_results += 1  # a late result
            return
        conn = entry[0]
        conn.inflight -= 1
        if conn.closed:
            self.stats.expired_results += 1  # its caller has gone
            return
        conn.send_res(result.msg_uuid, result.uri, result.args)

    def _sweep(self) -> None:
        """Forget calls whose timeout has passed (their results can no longer come)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        pending = self._pending
        if pending:
            stale = [u for u, (c, deadline) in pending.items() if deadline + 1.0 < now or c.closed]
            for u in stale:
                pending.pop(u)[0].inflight -= 1
            if stale and self._pending_changed is not None:
                self._pending_changed.set()
        self._sweeper = loop.call_later(1.0, self._sweep)

    @property
    def pending_calls(self) -> int:
        return len(self._pending)


def _fmt_remote(remote: Any) -> str:
    if isinstance(remote, tuple) and len(remote) >= 2:
        return f"{remote[0]}:{remote[1]}"
    return str(remote)


def _log_task_error(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("cleanup failed: %s", task.exception())
