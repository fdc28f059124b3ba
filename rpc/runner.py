"""rpc's composition root: a server process (:class:`RpcProcess`) around one
:class:`rpc.server.Server`: the rpcx listener (with the HTTP API on its
port), a separate HTTP gateway, the gRPC peer, the side listeners the
server's services attached (file transfer, streams), the metrics endpoint,
and the announcement in the registries; what ``juggler rpc serve`` runs.
A :class:`rustext.service.Service`::

    server = Server(registrars=[...]); register_example(server.registry, "arith")
    async with RpcProcess(server, RpcOptions(listen="127.0.0.1:8972")) as process:
        ...

Its :meth:`RpcProcess.drain` is rpcx's graceful shutdown
(:meth:`rpc.server.Server.shutdown`: unregister, stop accepting, drain, close).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from rustext.service import ServiceBase

from rpc.server import Server

__all__ = ["RpcOptions", "RpcProcess", "RpcStartError"]

log = logging.getLogger("rpc.serve")


class RpcStartError(Exception):
    """A start that failed for a reason the user can act on (a JWKS that
    cannot be fetched, a registry that cannot be reached)."""


@dataclass(kw_only=True)
class RpcOptions:
    """Where and how an :class:`RpcProcess` serves."""

    #: the rpcx listener: ``HOST:PORT``, ``tcp@HOST:PORT`` or ``unix@/path`` (None: none)
    listen: str | None = None
    #: answer HTTP (the gateway's API) on the rpcx port too
    http: bool = True
    #: the rpcx listener's transport options (rpc.transport.config.ServerConfig)
    transport: Any = None
    #: close connections idle this long (s)
    idle_timeout: float | None = None
    #: the ssl.SSLContext both listeners serve TLS with (None: clear)
    tls_context: Any = None
    #: the certificate files (rustext.tls.ServerTls) of ``tls_context``: a QUIC listener loads them itself
    tls_files: Any = None
    #: the block crypt, shards and tuning of a kcp@ listener (rpc.transport.kcpchannel.KcpOptions)
    kcp: Any = None
    #: a separate HTTP gateway at (host, port)
    gateway: tuple[str, int] | None = None
    #: the grpc.aio Hello.Say peer at (host, port)
    grpc: tuple[str, int] | None = None
    #: a Prometheus endpoint: (the MetricsPlugin whose registry it serves, host, port)
    metrics: tuple[Any, str, int] | None = None
    #: the address announced in the registries (None: the rpcx listener's)
    advertise: str | None = None
    #: seconds requests in flight get at shutdown
    drain_timeout: float = 10.0
    #: plugins with a lifecycle of their own (a JwtAuthPlugin's JWKS refresh): started first, closed last
    started_plugins: tuple[Any, ...] = ()


class RpcProcess(ServiceBase):
    """A started rpc server process (see the module doc)."""

    def __init__(self, server: Server, options: RpcOptions) -> None:
        self.server = server
        self.options = options
        self.listener: Any = None
        self.gateway: Any = None
        self.grpc_server: Any = None
        #: the gRPC peer's address once started (``host:port``)
        self.grpc_address: str | None = None
        self.metrics_httpd: Any = None
        #: whether the last drain finished every request in flight in time
        self.drained = True
        self._started_plugins: list[Any] = []

    def draining(self) -> str:
        """What a drain waits for, in words (empty: nothing in flight)."""
        n = self.server.in_flight
        if not n:
            return ""
        return f"draining {n} request{'s' if n != 1 else ''} for up to {self.options.drain_timeout:g} s"

    async def start(self) -> None:
        """Start every part; a part that fails stops those started. Raises
        ListenError (a busy port), RpcStartError, OSError."""
        o = self.options
        try:
            for plugin in o.started_plugins:
                from rustext.tokens import TokenError

                try:
                    await plugin.start()  # e.g. the JWKS, fetched before the first request
                except TokenError as exc:
                    raise RpcStartError(str(exc)) from exc
                self._started_plugins.append(plugin)
            if o.listen:
                from rpc.gateway import Gateway
                from rpc.rpcx_server import RpcxServer, endpoint_of

                kind = endpoint_of(o.listen).kind
                quic = kind == "quic"
                http = o.http and kind not in ("quic", "kcp")  # HTTP is answered on TCP ports only
                self.listener = RpcxServer(self.server, o.listen,
                                           gateway=Gateway(self.server.dispatcher) if http else None,
                                           config=o.transport, idle_timeout=o.idle_timeout,
                                           tls=o.tls_files if quic else o.tls_context, kcp=o.kcp)
                await self.listener.start()
            for side in self.server.attached:  # file transfer, streams: rpc.server.Server.attach
                await side.start()
            if o.gateway is not None:
                from rpc.gateway import Gateway, GatewayServer

                self.gateway = GatewayServer(Gateway(self.server.dispatcher), *o.gateway, ssl=o.tls_context,
                                             on_connect=self.listener.adopt if self.listener is not None else None)
                await self.gateway.start()
            if o.grpc is not None:
                from rpc.grpc_peer import start_grpc_server

                self.grpc_server, port = await start_grpc_server(*o.grpc)
                self.grpc_address = f"{o.grpc[0]}:{port}"
            if o.metrics is not None:
                from prometheus_client import start_http_server

                from rustext.net import listen_error

                plugin, host, port = o.metrics
                try:
                    self.metrics_httpd, _ = start_http_server(port, addr=host, registry=plugin.registry)
                except OSError as exc:
                    raise listen_error(host, port, exc) from exc
            advertise = o.advertise or (self.listener.address if self.listener is not None else None)
            if self.server.registrars and advertise:
                try:
                    await self.server.publish(advertise)
                except (OSError, ConnectionError) as exc:
                    raise RpcStartError(f"cannot register in the registry: {exc}") from exc
        except BaseException:
            await self.drain(0)
            raise

    # rpc.server.Listener: both listeners at once, for Server.shutdown

    async def stop_accepting(self) -> None:
        if self.listener is not None:
            await self.listener.stop_accepting()

    async def close_connections(self) -> None:
        if self.listener is not None:
            await self.listener.close_connections()
        if self.gateway is not None:
            await self.gateway.aclose(drain_timeout=1.0)

    async def drain(self, timeout: float | None = None) -> None:
        """rpcx's graceful shutdown (unregister, stop accepting, requests in
        flight get `timeout` s, None: ``drain_timeout``), then the gRPC peer,
        the metrics endpoint and the started plugins. Idempotent."""
        t = self.options.drain_timeout if timeout is None else timeout
        self.drained = await self.server.shutdown(self, timeout=t)
        if self.grpc_server is not None:
            await self.grpc_server.stop(grace=1.0)
            self.grpc_server = None
        if self.metrics_httpd is not None:
            self.metrics_httpd.shutdown()
            self.metrics_httpd.server_close()
            self.metrics_httpd = None
        plugins, self._started_plugins = self._started_plugins, []
        for plugin in plugins:
            await plugin.aclose()

    def abort(self) -> None:
        """Stop now: a drain under way stops waiting for requests in flight."""
        self.server.dispatcher.abort_drain()
