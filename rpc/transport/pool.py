"""TransportPool: one multiplexed connection per endpoint, created on demand.

- ``get(endpoint)`` returns the working connection, creating it if needed;
  concurrent callers share one creation per endpoint.
- Health per endpoint: ``working`` (connected), ``recovering`` (lost or
  failed; reconnecting with exponential backoff and jitter), ``down`` (still
  failing after ``down_after`` attempts; callers fail fast with Unavailable
  while the pool keeps retrying at ``backoff_max``).
- When a connection dies, its in-flight requests fail at once with
  ConnectionLost (the connection does that) and the pool starts reconnecting.
- ``on_connect(endpoint, conn)`` (awaited before a new connection is used;
  raising refuses it) and ``on_disconnect(endpoint, conn)`` (when such a
  connection closes) let the owner watch connections (client plugins).
- ``aclose()`` drains and closes every connection and stops reconnecting.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from rustext.tls import ClientTls, describe_ssl_error

from rpc.transport.channels import InProcNetwork
from rpc.transport.config import PoolConfig
from rpc.transport.connection import Connection, Handler, connect, expire
from rpc.transport.endpoint import Endpoint
from rpc.transport.errors import RequestTimeout, TransportClosed, TransportLayerError, Unavailable
from rpc.transport.registry import ProtocolRegistry, TransportProtocol
from rpc.transport.timer import DeadlineScheduler

if TYPE_CHECKING:
    from rpc.transport.kcpchannel import KcpOptions

log = logging.getLogger("rpc.transport.pool")


class Health(enum.Enum):
    WORKING = "working"
    RECOVERING = "recovering"
    DOWN = "down"


class _Entry:
    def __init__(self) -> None:
        self.health = Health.RECOVERING
        self.conn: Connection | None = None
        self.connecting: asyncio.Future[Connection] | None = None
        self.failures = 0
        self.reconnect: asyncio.Task[None] | None = None
        self.heartbeat: asyncio.Task[None] | None = None
        self.last_error: BaseException | None = None
        self.working = asyncio.Event()


class TransportPool:
    def __init__(
        self,
        protocol: str | TransportProtocol = "rpcx",
        *,
        registry: ProtocolRegistry | None = None,
        config: PoolConfig | None = None,
        handler: Handler | None = None,
        inproc: InProcNetwork | None = None,
        rng: random.Random | None = None,
        tls: ClientTls | ssl.SSLContext | None = None,
        quic_tls: ClientTls | None = None,
        kcp: KcpOptions | None = None,
        on_connect: Callable[[Endpoint, Connection], Awaitable[None]] | None = None,
        on_disconnect: Callable[[Endpoint, Connection], None] | None = None,
    ) -> None:
        self.protocol = (registry or ProtocolRegistry.default()).get(protocol)
        self.config = config or PoolConfig()
        #: client TLS context of every connection (TCP endpoints), built once
        self.tls = tls.context() if isinstance(tls, ClientTls) else tls
        #: what QUIC endpoints verify with (their TLS is not ``ssl``'s): ``quic_tls``, or ``tls``
        self.quic_tls: ClientTls | ssl.SSLContext | None = quic_tls or (tls if isinstance(tls, ClientTls) else self.tls)
        #: the block crypt and tuning of KCP endpoints
        self.kcp = kcp
        self._handler = handler  # answers requests the servers push to us
        #: awaited with each new connection before it is used; raising refuses it
        #: (the connection is closed and the attempt fails)
        self.on_connect = on_connect
        #: called when a connection that ``on_connect`` let through closes
        self.on_disconnect = on_disconnect
        self._inproc = inproc
        self._rng = rng or random.Random()
        self._entries: dict[Endpoint, _Entry] = {}
        self._scheduler: DeadlineScheduler | None = None
        self._closed = False
        self.connects = 0  # connection attempts made (for observability and tests)

    def health(self, endpoint: str | Endpoint) -> Health | None:
        e = self._entries.get(Endpoint.parse(endpoint))
        return e.health if e is not None else None

    def endpoints(self) -> list[Endpoint]:
        return list(self._entries)

    async def wait_working(self, endpoint: str | Endpoint, timeout: float) -> Connection:
        """Wait until the endpoint is working again (e.g. after a reconnect)."""
        ep = Endpoint.parse(endpoint)
        entry = self._entries.get(ep)
        if entry is None:
            return await self.get(ep)
        async with asyncio.timeout(timeout):
            await entry.working.wait()
        return await self.get(ep)

    async def get(self, endpoint: str | Endpoint) -> Connection:
        """The working connection to ``endpoint`` (created on first use)."""
        if self._closed:
            raise TransportClosed("pool is closed")
        ep = Endpoint.parse(endpoint)
        entry = self._entries.get(ep)
        if entry is None:
            entry = self._entries[ep] = _Entry()
        conn = entry.conn
        if conn is not None and conn.is_open:
            return conn
        if entry.connecting is None:
            if entry.health is Health.DOWN or (entry.reconnect is not None and not entry.reconnect.done()):
                raise Unavailable(f"{ep} is {entry.health.value} (last error: {entry.last_error})")
            entry.connecting = asyncio.ensure_future(self._connect(ep, entry))
        try:
            return await asyncio.shield(entry.connecting)
        except ssl.SSLError as exc:
            raise Unavailable(f"cannot connect to {ep}: {describe_ssl_error(exc)}") from exc
        except (OSError, TimeoutError) as exc:
            what = str(exc) or type(exc).__name__
            if self.tls is not None and isinstance(exc, (ConnectionResetError, EOFError)):
                what = f"the server closed the connection during the TLS handshake ({what})"
            raise Unavailable(f"cannot connect to {ep}: {what}") from exc

    async def _connect(self, ep: Endpoint, entry: _Entry) -> Connection:
        """One attempt; on failure the reconnect loop takes over."""
        try:
            conn = await self._attempt(ep, entry)
        except BaseException as exc:
            entry.last_error = exc
            self._on_failure(ep, entry)
            raise
        finally:
            entry.connecting = None
        return conn

    async def _attempt(self, ep: Endpoint, entry: _Entry) -> Connection:
        if self._scheduler is None:
            self._scheduler = DeadlineScheduler(asyncio.get_running_loop(), expire)
        self.connects += 1
        async with asyncio.timeout(self.config.connect_timeout):
            conn = await connect(
                ep,
                self.protocol,
                self.config.connection,
                self._scheduler,
                handler=self._handler,
                inproc=self._inproc,
                on_close=lambda c, exc: self._lost(ep, c),
                tls=self.quic_tls if ep.kind == "quic" else self.kcp if ep.kind == "kcp" else self.tls,
            )
        if self._closed:
            conn.close()
            raise TransportClosed("pool is closed")
        if self.on_connect is not None:
            try:
                await self.on_connect(ep, conn)
            except BaseException as exc:
                conn.close()
                if isinstance(exc, Exception) and not isinstance(exc, (OSError, TransportLayerError)):
                    raise Unavailable(f"cannot connect to {ep}: {exc}") from exc
                raise
            if self._closed or not conn.is_open:
                conn.close()
                raise TransportClosed("pool is closed" if self._closed else f"connection to {ep} closed")
        entry.conn = conn
        entry.failures = 0
        entry.health = Health.WORKING
        entry.last_error = None
        entry.working.set()
        log.info("connected to %s", ep)
        if self.config.heartbeat_interval is not None:
            if entry.heartbeat is not None:
                entry.heartbeat.cancel()
            entry.heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(ep, conn))
        return conn

    async def _heartbeat(self, ep: Endpoint, conn: Connection) -> None:
        """Ping ``conn`` every ``heartbeat_interval``; close it when a ping goes
        unanswered (the close fails its requests and starts reconnecting)."""
        interval = self.config.heartbeat_interval
        assert interval is not None
        while conn.is_open and not self._closed:
            await asyncio.sleep(interval)
            if not conn.is_open or self._closed:
                return
            try:
                await conn.heartbeat(timeout=self.config.heartbeat_timeout)
            except RequestTimeout:
                log.warning("%s: heartbeat unanswered for %.3fs; closing the connection", ep, self.config.heartbeat_timeout)
                conn.close()
                return
            except TransportLayerError:
                return

    def _on_failure(self, ep: Endpoint, entry: _Entry) -> None:
        entry.failures += 1
        entry.health = Health.DOWN if entry.failures >= self.config.down_after else Health.RECOVERING
        entry.working.clear()
        if not self._closed and (entry.reconnect is None or entry.reconnect.done()):
            entry.reconnect = asyncio.get_running_loop().create_task(self._reconnect(ep, entry))

    def _lost(self, ep: Endpoint, conn: Connection) -> None:
        entry = self._entries.get(ep)
        if entry is None or entry.conn is not conn:
            return
        entry.conn = None
        if self.on_disconnect is not None:
            try:
                self.on_disconnect(ep, conn)
            except Exception:
                log.exception("on_disconnect failed")
        entry.working.clear()
        if self._closed:
            return
        log.warning("connection to %s lost; reconnecting", ep)
        entry.health = Health.RECOVERING
        if entry.reconnect is None or entry.reconnect.done():
            entry.reconnect = asyncio.get_running_loop().create_task(self._reconnect(ep, entry))

    def backoff(self, attempt: int) -> float:
        """Delay before reconnect attempt ``attempt`` (1-based), with jitter."""
        return self.config.backoff.delay(attempt, self._rng)

    async def _reconnect(self, ep: Endpoint, entry: _Entry) -> None:
        attempt = 0
        while not self._closed:
            attempt += 1
            await asyncio.sleep(self.backoff(attempt))
            if self._closed or (entry.conn is not None and entry.conn.is_open):
                return
            try:
                await self._attempt(ep, entry)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                entry.last_error = exc
                entry.failures += 1
                if entry.failures >= self.config.down_after and entry.health is not Health.DOWN:
                    log.warning("%s is down after %d failed attempts: %s", ep, entry.failures, exc)
                    entry.health = Health.DOWN

    async def request(self, endpoint: str | Endpoint, payload: bytes = b"", **kw: Any) -> Any:
        """``get(endpoint)`` then ``request`` on it."""
        conn = await self.get(endpoint)
        return await conn.request(payload, **kw)

    async def aclose(self, timeout: float | None = None) -> None:
        """Drain and close every connection, stop reconnecting (idempotent)."""
        if self._closed:
            return
        self._closed = True
        tasks = [t for e in self._entries.values() for t in (e.reconnect, e.heartbeat) if t is not None]
        for t in tasks:
            t.cancel()
        connecting = [e.connecting for e in self._entries.values() if e.connecting is not None]
        await asyncio.gather(*tasks, *connecting, return_exceptions=True)
        conns = [e.conn for e in self._entries.values() if e.conn is not None]
        await asyncio.gather(*(c.aclose(timeout) for c in conns), return_exceptions=True)
        if self._scheduler is not None:
            self._scheduler.close()

    async def __aenter__(self) -> TransportPool:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


__all__ = ["Health", "TransportPool"]
