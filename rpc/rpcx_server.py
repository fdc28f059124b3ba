"""The rpcx network server: ``rpc.server.Server``'s services over ``rpc.transport``.

``RpcxServer`` listens on a TCP or unix endpoint with the transport's
``TransportServer`` (rpcx wire, rustext codec) and serves each connection
with one ``ServerSession`` (plugins' connection hooks, auth, deadlines)::

    server = Server(registrars=[RedisRegistrar(url)])
    server.register(Arith())
    rpcx = RpcxServer(server, "tcp://0.0.0.0:8972", gateway=Gateway(server.dispatcher))
    await rpcx.start()
    await server.publish(rpcx.address)          # "tcp@0.0.0.0:8972"
    ...
    await server.shutdown(rpcx, timeout=10)     # unregister, stop accepting, drain, close

Per connection (``RpcxServerConnection``), in rpcx's order:

- accept: ``on_conn_accept`` hooks (False closes the connection at once,
  and its ``on_conn_close`` hooks do not run; while async hooks run, reading
  is paused); a connection the transport refuses (``max_connections``,
  closing) runs no hook;
- each read buffer: ``pre_read`` hooks once, then every request it holds is
  decoded in one Rust call;
- heartbeat: ``on_heartbeat`` hooks, then the frame is echoed as a response;
- a request whose whole path is synchronous (a ``@fast`` handler, plain
  hooks: ``ServiceDispatcher.dispatch_now``) is served inline, and the replies
  of one read buffer are encoded in one Rust call and written together;
  anything else runs in a task through ``ServerSession.handle``;
- a reply with metadata is encoded with it; a failed ``__AUTH`` check writes
  the error (two-way calls) and closes the connection;
- ``post_write`` hooks after the reply is queued; ``on_conn_close`` when the
  connection ends.

Server push: ``ctx.push(...)`` in a handler (or ``peer.send(message)``)
sends a oneway request to that client; ``RpcxServer.connections`` lists the
live ones.

HTTP on the same port: with ``gateway=`` a connection whose first byte is
a letter (an HTTP method's) is handed to the HTTP gateway (``X-RPCX-*`` headers,
JSON-RPC 2.0) instead (TCP endpoints). A ``CONNECT /_rpcx_`` there (Go's
``http@host:port`` network) is answered as Go answers it and the connection
comes back as rpcx (``adopt``).

Shutdown (``rpc.server.Listener``): ``stop_accepting()`` closes the listener
(accepted connections are still served: a request arriving then is refused
with "server is shutting down", which ``rpc.rpcx_client`` treats as
retryable since it never ran); ``close_connections()`` drains and closes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rpc.message import Message, MessageStatus, from_wire
from rpc.service import Outcome, Peer, ServerSession, ServiceDispatcher
from rpc.transport.config import ServerConfig
from rpc.transport.connection import Connection
from rpc.transport.endpoint import Endpoint
from rpc.transport.server import TransportServer

log = logging.getLogger("rpc.rpcx_server")

RPCX_MAGIC = 0x08
_META_ERROR = "__rpcx_error__"


def _hooks_sync(hooks: tuple[tuple[Any, bool], ...]) -> bool:
    return not any(is_async for _, is_async in hooks)


def _peer_text(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr or "")


class RpcxServerConnection(Connection):
    """One served connection: the transport's ``Connection`` with the request
    path replaced by the service layer's (see the module docstring)."""

    def __init__(self, *args: Any, dispatcher: ServiceDispatcher, rpcx: RpcxServer | None = None, **kwargs: Any) -> None:
        kwargs["handler"] = _unused_handler  # non-None: the base class then routes requests to _run
        super().__init__(*args, **kwargs)
        self._dispatcher = dispatcher
        self._plugins = dispatcher.plugins
        self._rpcx = rpcx
        self.peer = Peer(send=self._push)
        self.session: ServerSession = dispatcher.session(self.peer)
        self._accepted = False  # on_conn_accept said yes: on_conn_close will run
        self._sniffing = rpcx is not None and rpcx.gateway is not None
        self._http_writer: Any = None  # see RpcxServer.adopt
        self.last_read = self._loop.time()

    # --- accept / close --------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.peer.address = _peer_text(transport.get_extra_info("peername"))
        self.peer.local_address = _peer_text(transport.get_extra_info("sockname"))

    def start_session(self) -> None:
        """Run the ``on_conn_accept`` hooks (called once the server registered us)."""
        hooks = self._plugins._on_conn_accept
        if not hooks:
            self._accepted = True
            return
        if _hooks_sync(hooks):
            if not self._plugins.all_true_now("on_conn_accept", self.peer):
                log.info("connection from %s refused by a plugin", self.peer.address)
                self.close()
                return
            self._accepted = True
            return
        if self.transport is not None:
            self.transport.pause_reading()
        self._spawn(self._accept())

    async def _accept(self) -> None:
        ok = await self.session.accept()
        if self._lost:
            return
        if not ok:
            log.info("connection from %s refused by a plugin", self.peer.address)
            self.close()
            return
        self._accepted = True
        if self.transport is not None and not self._reading_paused:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        was_lost = self._lost
        super().connection_lost(exc)
        if not was_lost and self._accepted and not self.session.closed:
            hooks = self._plugins._on_conn_close
            if not hooks:
                self.session.closed = True
            elif _hooks_sync(hooks):
                self.session.closed = True
                self._plugins.run_logged_now("on_conn_close", self.peer)
            else:
                self._spawn(self.session.close())

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- reading ---------------------------------------------------------------------
    def data_received(self, data: bytes | memoryview) -> None:
        self.last_read = self._loop.time()
        if self._sniffing:
            self._sniffing = False
            # an HTTP request starts with its method's letters; anything else that is not rpcx (a
            # TLS ClientHello, 0x16) goes to the rpcx decoder, which refuses it at once, where the
            # HTTP parser would wait for a line end that never comes
            if (len(data) and data[0] != RPCX_MAGIC and chr(data[0]).isascii() and chr(data[0]).isalpha()
                    and self._rpcx is not None and self.transport is not None):
                self._rpcx._to_gateway(self, bytes(data))
                return
        if self._lost or self._bad:
            return
        hooks = self._plugins._pre_read
        if hooks:
            if _hooks_sync(hooks):
                try:
                    self._plugins.run_now("pre_read", self.peer)
                except Exception as exc:
                    log.info("closing connection from %s: pre_read: %s", self.peer.address, exc)
                    self.close()
                    return
            else:
                self._spawn(self._pre_read_async())
        super().data_received(data)

    async def _pre_read_async(self) -> None:
        try:
            await self.session.before_read()
        except Exception as exc:
            log.info("closing connection from %s: pre_read: %s", self.peer.address, exc)
            self.close()

    def _on_request(self, msg: Any) -> tuple[Any, Any, str | None] | None:
        if msg.heartbeat:
            hooks = self._plugins._on_heartbeat
            if hooks:
                if _hooks_sync(hooks):
                    self._plugins.run_logged_now("on_heartbeat", self.peer, from_wire(msg))
                else:
                    self._spawn(self._plugins.run_logged("on_heartbeat", self.peer, from_wire(msg)))
            return None if msg.oneway else (msg, msg.payload, None)
        return _base_on_request(self, msg)  # not super(): no proxy object per request

    # --- the request path --------------------------------------------------------------
    def _run(self, raw: Any) -> tuple[Any, Any, str | None] | None:
        """Serve one request (a handler slot is held). Returns the reply to
        batch with the read buffer's others, or None (written otherwise)."""
        self._active += 1
        msg = from_wire(raw)
        try:
            outcome = self._dispatcher.dispatch_now(msg, self.peer)
        except Exception as exc:  # dispatch_now turns errors into replies; this is a bug guard
            log.exception("dispatch failed")
            outcome = Outcome(None if msg.oneway else msg.error_reply(f"{type(exc).__name__}: {exc}"))
        if outcome is None:
            self._spawn(self._serve(raw, msg))
            return None
        self._release()
        return self._deliver(raw, msg, outcome, batch=True)

    async def _serve(self, raw: Any, msg: Message) -> None:
        try:
            outcome = await self.session.handle(msg)
        except asyncio.CancelledError:
            self._release()
            raise
        except Exception as exc:
            log.exception("dispatch failed")
            outcome = Outcome(None if msg.oneway else msg.error_reply(f"{type(exc).__name__}: {exc}"))
        self._release()
        if self._lost:
            return
        r = self._deliver(raw, msg, outcome, batch=False)
        if r is not None:
            self._send_replies([r])

    def _deliver(self, raw: Any, msg: Message, outcome: Outcome, *, batch: bool) -> tuple[Any, Any, str | None] | None:
        res = outcome.reply
        result: tuple[Any, Any, str | None] | None = None
        if res is not None and not self._lost:
            md = res.metadata
            if res.status == MessageStatus.ERROR:
                text = md.get(_META_ERROR, "")
                if len(md) == 1:
                    result = (raw, None, text)
                else:
                    extra = [(k, v) for k, v in md.items() if k != _META_ERROR]
                    self._send(raw.encode_reply(None, error=text, metadata=extra))
            elif md:
                self._send(raw.encode_reply(res.payload, metadata=md))
            else:
                result = (raw, res.payload, None)
            if self._plugins._post_write:
                self._written(msg, res)
        if outcome.close and not self._closing:
            # Failed auth: run nothing more from this peer (later requests are
            # answered "connection is closing"), let the replies already made
            # for this read buffer go out, then close.
            log.info("closing connection from %s: auth failed", self.peer.address)
            self._closing = True
            self._loop.call_soon(self.close)
        return result

    def _written(self, msg: Message, res: Message) -> None:
        hooks = self._plugins._post_write
        if _hooks_sync(hooks):
            self._plugins.run_logged_now("post_write", self.peer, msg, res, None)
        else:
            self._spawn(self.session.written(msg, res))

    # --- server push -------------------------------------------------------------------
    async def _push(self, msg: Message) -> None:
        """``Peer.send``: a oneway request to this client (bidirectional mode)."""
        await self.notify(
            msg.payload,
            service_path=msg.service_path,
            service_method=msg.service_method,
            metadata=list(msg.metadata.items()) if msg.metadata else None,
            serialize_type=int(msg.serialize_type),
            compress_type=int(msg.compress_type),
        )


_base_on_request = Connection._on_request


def _unused_handler(conn: Connection, msg: Any) -> None:  # pragma: no cover - never called
    raise AssertionError("RpcxServerConnection serves requests itself")


def address_of(endpoint: Endpoint) -> str:
    """The rpcx address of an endpoint: ``tcp@host:port`` / ``quic@host:port`` / ``kcp@host:port`` /
    ``unix@/path``."""
    if endpoint.kind in ("tcp", "quic", "kcp"):
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        return f"{endpoint.kind}@{host}:{endpoint.port}"
    return f"{endpoint.kind}@{endpoint.path}"


def endpoint_of(address: str) -> Endpoint:
    """``host:port``, ``tcp@host:port``, ``quic@host:port``, ``kcp@host:port``, ``unix@/path``,
    or a transport endpoint (``tcp://``, ``quic://``, ``kcp://``, ``unix://``) → Endpoint."""
    if "://" in address:
        return Endpoint.parse(address)
    scheme, at, rest = address.partition("@")
    if not at:
        scheme, rest = "tcp", address
    if scheme in ("tcp", "tcp4", "tcp6"):
        return Endpoint.parse(f"tcp://{rest}")
    if scheme in ("quic", "kcp"):
        return Endpoint.parse(f"{scheme}://{rest}")
    if scheme == "unix":
        return Endpoint.parse(f"unix://{rest}")
    raise ValueError(f"unsupported rpcx address {address!r} (host:port, tcp@host:port, quic@host:port, kcp@host:port, "
                     "unix@/path)")


class RpcxServer:
    """The rpcx listener of a ``Server`` (or of a bare ``ServiceDispatcher``).

    ``config`` bounds connections and handlers (``rpc.transport.ServerConfig``;
    ``config.connection.drain_timeout`` is the per-connection drain at close).
    ``gateway`` (an ``rpc.gateway.Gateway``) serves HTTP on the same port.
    ``idle_timeout`` (seconds): a connection that sends nothing for that
    long (clients keep it with heartbeats) and has no call running is closed.
    ``tls`` (an ``rustext.tls.ServerTls`` or a server ``ssl.SSLContext``)
    serves rpcx and HTTP over TLS on the port; ``reload_tls()`` picks up new
    certificate files without touching established connections.
    ``kcp`` (an ``rpc.transport.kcpchannel.KcpOptions``) is what a
    ``kcp@host:port`` endpoint needs: its block crypt, shards and tuning.
    """

    def __init__(
        self,
        server: Any,
        endpoint: str | Endpoint,
        *,
        config: ServerConfig | None = None,
        gateway: Any = None,
        idle_timeout: float | None = None,
        tls: Any = None,
        kcp: Any = None,
    ) -> None:
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError("idle_timeout must be > 0 or None")
        self.idle_timeout = idle_timeout
        self._reaper: asyncio.Task[None] | None = None
        self.dispatcher: ServiceDispatcher = server if isinstance(server, ServiceDispatcher) else server.dispatcher
        self.gateway = gateway
        self._gateway_server: Any = None
        self._gateway_tasks: set[asyncio.Task[Any]] = set()
        self._transport = TransportServer(
            endpoint_of(endpoint) if isinstance(endpoint, str) else endpoint,
            None,
            protocol="rpcx",
            config=config,
            on_connection=self._on_connection,
            connection_factory=self._make,
            tls=tls,
            kcp=kcp,
        )

    def _make(self, *args: Any, **kwargs: Any) -> RpcxServerConnection:
        return RpcxServerConnection(*args, dispatcher=self.dispatcher, rpcx=self, **kwargs)

    @staticmethod
    def _on_connection(conn: Connection) -> None:
        assert isinstance(conn, RpcxServerConnection)
        conn.start_session()

    @property
    def endpoint(self) -> Endpoint:
        return self._transport.endpoint

    @property
    def address(self) -> str:
        """What to publish in a registry: ``tcp@host:port`` or ``unix@/path``."""
        return address_of(self._transport.endpoint)

    @property
    def tls(self) -> bool:
        """Whether the port speaks TLS."""
        return self._transport.tls is not None

    def reload_tls(self) -> None:
        """Load the certificate files again (see ``TransportServer.reload_tls``)."""
        self._transport.reload_tls()

    @property
    def connections(self) -> list[RpcxServerConnection]:
        return [c for c in self._transport.connections if isinstance(c, RpcxServerConnection)]

    async def start(self) -> Endpoint:
        ep = await self._transport.start()
        if self.gateway is not None:
            from rpc.gateway import GatewayServer

            self._gateway_server = GatewayServer(self.gateway, on_connect=self.adopt)
        if self.idle_timeout is not None and self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap(self.idle_timeout))
        return ep

    async def _reap(self, idle: float) -> None:
        """Close connections that sent nothing (not even a heartbeat) for
        ``idle`` seconds and have no call running: rpcx's read timeout,
        which drops dead or silent clients."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(idle / 4)
            now = loop.time()
            for conn in self.connections:
                if now - conn.last_read > idle and not conn.handlers_running and not conn.in_flight:
                    log.info("closing connection from %s: idle for %.1fs", conn.peer.address, now - conn.last_read)
                    conn.close()

    # -- HTTP on the same port ------------------------------------------------------------
    def _to_gateway(self, conn: RpcxServerConnection, first: bytes) -> None:
        """Hand a connection that is not rpcx to the HTTP gateway: its
        transport gets a stream protocol, ``first`` is what was read."""
        transport = conn.transport
        assert transport is not None and self._gateway_server is not None
        self._transport.connections.discard(conn)
        conn._lost = True  # the rpcx side is done with it, quietly
        conn.session.closed = True
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**16, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        gw = self._gateway_server
        task = loop.create_task(gw.serve_connection(reader, writer, first))
        gw._conns[task] = False  # the gateway marks it busy while a request runs
        self._gateway_tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._gateway_tasks.discard(t)
            gw._conns.pop(t, None)

        task.add_done_callback(done)

    def adopt(self, writer: asyncio.StreamWriter, initial: bytes = b"") -> None:
        """Serve rpcx on a connection an HTTP gateway accepted with
        ``CONNECT /_rpcx_`` (this port's or a ``GatewayServer``'s
        ``on_connect``): it joins this listener's connections (bounds,
        plugins' hooks, shutdown); ``initial`` is what was read past the
        request."""
        conn = self._transport.adopt(writer.transport)
        assert isinstance(conn, RpcxServerConnection)
        conn._sniffing = False
        conn._http_writer = writer  # a StreamWriter closes its transport when collected
        if initial and not conn._lost:
            conn.data_received(initial)

    # -- rpc.server.Listener -------------------------------------------------------------
    async def stop_accepting(self) -> None:
        self._transport.stop_accepting()
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.cancel()
            await asyncio.gather(reaper, return_exceptions=True)

    async def close_connections(self) -> None:
        await self._transport.aclose()
        gw = self._gateway_server
        if gw is not None:
            gw._closing = True
            for t, busy in list(gw._conns.items()):
                if not busy:
                    t.cancel()  # idle keep-alive HTTP connection: nothing to drain
        tasks = list(self._gateway_tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self._transport.config.connection.drain_timeout)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop accepting and close every connection (drained). Idempotent."""
        await self.stop_accepting()
        await self.close_connections()

    async def __aenter__(self) -> RpcxServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = ["RpcxServer", "RpcxServerConnection", "address_of", "endpoint_of"]
