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
answered by ``http`` (a :class:`juggler.static_files.StaticSite`: the browser
client and the demo page), else 404; it never becomes a websocket connection.

Lifecycle: ``start()`` listens; ``aclose()`` stops accepting, sends every
connection a 1001 close, waits up to ``close_timeout`` for them, drops the
rest. The broker is the caller's: the server never closes it.
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
    ) -> None:
        self.broker = broker
        self.pubsub = pubsub if pubsub is not None else broker
        self.config = config or ServerConfig()
        self.middleware = tuple(middleware)
        self.on_conn_state = on_conn_state
        self.stats = stats or ServerStats()
        #: answers plain HTTP requests to other paths than the websocket one (else 404)
        self.http = http
        self.conns: set[Conn] = set()
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
        self._server.close()
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
        try:
            self._conn_state(conn, ConnState.CONNECTED)
        except Exception:
            self.stats.recovered += 1
            log.exception("on_conn_state(CONNECTED) failed; closing %s", conn.remote)
            conn.close(1011, "internal error")

    def _conn_lost(self, conn: Conn, was_connected: bool) -> None:
        self.conns.discard(conn)
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
        self._pending[msg_uuid] = (conn, conn.loop.time() + timeout_ms / 1000.0)

    def _on_result(self, result: Result) -> None:
        entry = self._pending.pop(result.msg_uuid, None)
        if entry is None or entry[0].closed:
            # a late result, or its caller has gone
            self.stats.expired_results += 1
            return
        entry[0].send_res(result.msg_uuid, result.uri, result.args)

    def _sweep(self) -> None:
        """Forget calls whose timeout has passed (their results can no longer come)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        pending = self._pending
        if pending:
            stale = [u for u, (c, deadline) in pending.items() if deadline + 1.0 < now or c.closed]
            for u in stale:
                del pending[u]
        self._sweeper = loop.call_later(1.0, self._sweep)

    @property
    def pending_calls(self) -> int:
        return len(self._pending)


def _log_task_error(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("cleanup failed: %s", task.exception())
