"""TransportServer: accept connections on one endpoint and serve requests.

Each accepted connection is a full-duplex ``Connection``: the handler answers
the peer's requests, and the server may push requests to the peer
(``server.connections`` / ``on_connection``). Bounds: ``max_connections``
(extra ones are closed at once), handlers per connection and per server.
``aclose()`` stops accepting, drains every connection up to a deadline, then
closes what is left; it is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rustext.tls import ServerTls

from rpc.transport.channels import InProcNetwork, Listener, channel_for, tune_socket
from rpc.transport.config import ServerConfig
from rpc.transport.connection import Connection, Handler, HandlerLimiter, expire
from rpc.transport.endpoint import Endpoint
from rpc.transport.errors import TransportClosed
from rpc.transport.registry import ProtocolRegistry, TransportProtocol
from rpc.transport.timer import DeadlineScheduler

if TYPE_CHECKING:
    from rpc.transport.kcpchannel import KcpOptions

log = logging.getLogger("rpc.transport.server")


class TransportServer:
    def __init__(
        self,
        endpoint: str | Endpoint,
        handler: Handler | None,
        *,
        protocol: str | TransportProtocol = "rpcx",
        registry: ProtocolRegistry | None = None,
        config: ServerConfig | None = None,
        inproc: InProcNetwork | None = None,
        on_connection: Callable[[Connection], None] | None = None,
        connection_factory: Callable[..., Connection] = Connection,
        tls: ServerTls | ssl.SSLContext | None = None,
        kcp: KcpOptions | None = None,
    ) -> None:
        self.endpoint = Endpoint.parse(endpoint)
        #: server TLS context (TCP endpoints); ``reload_tls()`` loads new files into it
        self._tls_files = tls if isinstance(tls, ServerTls) else None
        self.tls = tls.context() if isinstance(tls, ServerTls) else tls
        #: the block crypt and tuning of a KCP endpoint
        self.kcp = kcp
        self.protocol = (registry or ProtocolRegistry.default()).get(protocol)
        self.config = config or ServerConfig()
        self._handler = handler
        self._inproc = inproc
        self._on_connection = on_connection
        self._connection_factory = connection_factory
        self._limiter = HandlerLimiter(self.config.max_handlers)
        self._listener: Listener | None = None
        self._scheduler: DeadlineScheduler | None = None
        self.connections: set[Connection] = set()
        self._closing = False
        self._closed: asyncio.Future[None] | None = None

    async def start(self) -> Endpoint:
        """Listen; returns the bound endpoint (the real port for tcp port 0)."""
        if self._listener is not None:
            return self._listener.endpoint
        if self._closing:
            raise TransportClosed("server is closed")
        loop = asyncio.get_running_loop()
        self._scheduler = DeadlineScheduler(loop, expire)
        # QUIC loads the certificate files itself (its TLS is not Python's ssl)
        tls = self._tls_files if self.endpoint.kind == "quic" else self.kcp if self.endpoint.kind == "kcp" else self.tls
        channel = channel_for(self.endpoint, self._inproc, tls)
        self._listener = await channel.listen(self.endpoint, self._make_connection)
        self.endpoint = self._listener.endpoint
        log.info("transport server listening on %s (protocol %s)", self.endpoint, self.protocol.name)
        return self.endpoint

    def _make_connection(self) -> Connection:
        assert self._scheduler is not None
        conn = self._connection_factory(
            self.protocol,
            self.config.connection,
            self._scheduler,
            handler=self._handler,
            limiter=self._limiter,
            on_close=self._forget,
            name=f"{self.endpoint}<-peer",
        )
        # Registered once the channel hands it its transport.
        orig = conn.connection_made

        def made(transport: asyncio.BaseTransport) -> None:
            tune_socket(transport)
            orig(transport)
            conn.name = f"{self.endpoint}<-{transport.get_extra_info('peername')}"
            if self._closing or len(self.connections) >= self.config.max_connections:
                log.warning("refusing connection from %s: %s", transport.get_extra_info("peername"),
                            "server closing" if self._closing else "max_connections reached")
                conn.close()
                return
            self.connections.add(conn)
            if self._on_connection is not None:
                try:
                    self._on_connection(conn)
                except Exception:
                    log.exception("on_connection callback failed")

        conn.connection_made = made  # type: ignore[method-assign]
        return conn

    def adopt(self, transport: asyncio.BaseTransport) -> Connection:
        """Serve a connection accepted elsewhere (an HTTP ``CONNECT`` tunnel)
        as one of ours: same bounds, hooks and shutdown as an accepted one.
        The caller feeds any bytes it already read to ``data_received``."""
        conn = self._make_connection()
        transport.set_protocol(conn)  # type: ignore[attr-defined]
        conn.connection_made(transport)
        with contextlib.suppress(AttributeError, NotImplementedError, RuntimeError):
            transport.resume_reading()  # type: ignore[attr-defined]  # in case the last owner paused it
        return conn

    def _forget(self, conn: Connection, exc: BaseException | None) -> None:
        self.connections.discard(conn)

    def reload_tls(self) -> None:
        """Load the certificate files again (SIGHUP): new handshakes get the
        new certificate, established connections keep theirs. On a bad file
        the old certificate stays and ``TlsConfigError`` is raised."""
        if self._tls_files is None or self.tls is None:
            raise ValueError("this server was not given TLS certificate files")
        reload = getattr(self._listener, "reload", None)
        if self.endpoint.kind == "quic" and reload is not None:
            reload()
            return
        self._tls_files.reload(self.tls)

    async def __aenter__(self) -> TransportServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def stop_accepting(self) -> None:
        """Close the listener (idempotent): connections already accepted go on
        being served; new ones are refused. ``aclose()`` finishes the job."""
        self._closing = True
        if self._listener is not None:
            self._listener.close()

    async def aclose(self, timeout: float | None = None) -> None:
        """Stop accepting, drain connections up to ``timeout`` (default the
        connection config's ``drain_timeout``), close the rest. Idempotent."""
        if self._closed is not None:
            await asyncio.shield(self._closed)
            return
        self._closing = True
        self._closed = asyncio.get_running_loop().create_future()
        try:
            if self._listener is not None:
                self._listener.close()
            conns = list(self.connections)
            if conns:
                await asyncio.gather(*(c.aclose(timeout) for c in conns), return_exceptions=True)
            if self._listener is not None:
                try:
                    async with asyncio.timeout(5):
                        await self._listener.wait_closed()
                except TimeoutError:
                    log.warning("listener on %s did not close in time", self.endpoint)
            if self._scheduler is not None:
                self._scheduler.close()
        finally:
            self._closed.set_result(None)
