"""Channels: reliable byte streams behind one interface (TCP, Unix, in-process).

A channel knows how to ``connect`` to an endpoint and ``listen`` on one, each
time driving an ``asyncio.Protocol`` made by a factory, so the same connection
code runs over any of them. The in-process channel needs an ``InProcNetwork``
(the "address space" of in-process listeners), passed in explicitly: there is
no global registry.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from typing import Any

from rpc.transport.channelapi import Channel, Listener, ProtocolFactory
from rpc.transport.endpoint import Endpoint
from rustext.net import listen_error


class _ServerListener(Listener):
    def __init__(self, server: asyncio.AbstractServer, endpoint: Endpoint, unlink: str | None = None) -> None:
        self._server = server
        self.endpoint = endpoint
        self._unlink = unlink

    def close(self) -> None:
        self._server.close()
        if self._unlink is not None:
            try:
                os.unlink(self._unlink)
            except FileNotFoundError:
                pass
            self._unlink = None

    async def wait_closed(self) -> None:
        await self._server.wait_closed()


def tune_socket(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY (requests are whole messages written once per loop turn,
    so Nagle would only add latency) and SO_KEEPALIVE (dead peers are found
    eventually even without the pool's heartbeats)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


#: seconds a TLS handshake may take before the connection is dropped
TLS_HANDSHAKE_TIMEOUT = 10.0


class TcpChannel(Channel):
    """TCP, with TLS when given an ``ssl`` context: a client context verifies
    the server against the endpoint's host name (or IP address), a server
    context serves its certificate."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.ssl = tls

    async def connect(self, endpoint: Endpoint, factory: ProtocolFactory) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
        loop = asyncio.get_running_loop()
        if self.ssl is None:
            transport, protocol = await loop.create_connection(factory, endpoint.host, endpoint.port)
        else:
            transport, protocol = await loop.create_connection(
                factory, endpoint.host, endpoint.port, ssl=self.ssl,
                server_hostname=endpoint.host if self.ssl.check_hostname else "",
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT)
        tune_socket(transport)
        return transport, protocol

    async def listen(self, endpoint: Endpoint, factory: ProtocolFactory) -> Listener:
        loop = asyncio.get_running_loop()
        tls: dict[str, object] = {} if self.ssl is None else {
            "ssl": self.ssl, "ssl_handshake_timeout": TLS_HANDSHAKE_TIMEOUT}
        try:
            server = await loop.create_server(factory, endpoint.host, endpoint.port, reuse_address=True, backlog=1024,
                                              **tls)  # type: ignore[arg-type]
        except OSError as exc:
            raise listen_error(endpoint.host, endpoint.port, exc) from exc
        port = server.sockets[0].getsockname()[1]
        return _ServerListener(server, Endpoint("tcp", host=endpoint.host, port=port))


class UnixChannel(Channel):
    async def connect(self, endpoint: Endpoint, factory: ProtocolFactory) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
        loop = asyncio.get_running_loop()
        return await loop.create_unix_connection(factory, endpoint.path)

    async def listen(self, endpoint: Endpoint, factory: ProtocolFactory) -> Listener:
        loop = asyncio.get_running_loop()
        try:
            os.unlink(endpoint.path)  # a stale socket file from a dead process
        except FileNotFoundError:
            pass
        try:
            server = await loop.create_unix_server(factory, endpoint.path, backlog=1024)
        except OSError as exc:
            raise listen_error("unix", endpoint.path, exc) from exc
        return _ServerListener(server, endpoint, unlink=endpoint.path)


# --- in-process -------------------------------------------------------------


class InProcNetwork:
    """The namespace of in-process listeners (one per test, embedding app, …)."""

    def __init__(self) -> None:
        self._listeners: dict[str, _InProcListener] = {}

    def channel(self) -> InProcChannel:
        return InProcChannel(self)


class _InProcTransport(asyncio.Transport):
    """One end of an in-memory duplex pipe. Writes reach the peer's protocol on
    a later loop turn (like a socket); the peer pausing its reading makes our
    protocol's ``pause_writing`` fire past the high-water mark."""

    HIGH = 1 << 20
    LOW = 1 << 18

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol, extra: dict[str, Any]) -> None:
        super().__init__(extra)
        self._loop = loop
        self._protocol = protocol
        self.peer: _InProcTransport | None = None
        self._inbox: list[bytes] = []
        self._inbox_bytes = 0
        self._scheduled = False
        self._reading = True
        self._closing = False
        self._lost = False
        self._peer_eof = False
        self._writer_paused = False  # our protocol was told pause_writing

    # --- write side
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self.peer is None:
            return
        self.peer._deliver(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.peer._inbox_bytes if self.peer is not None else 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.HIGH = high if high is not None else 1 << 20
        self.LOW = low if low is not None else self.HIGH // 4

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (self.LOW, self.HIGH)

    # --- read side
    def _deliver(self, data: bytes) -> None:
        if self._lost:
            return
        self._inbox.append(data)
        self._inbox_bytes += len(data)
        writer = self.peer
        if writer is not None and not writer._writer_paused and self._inbox_bytes > writer.HIGH:
            writer._writer_paused = True
            writer._protocol.pause_writing()
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled and self._reading and (self._inbox or self._peer_eof):
            self._scheduled = True
            self._loop.call_soon(self._pump)

    def _pump(self) -> None:
        self._scheduled = False
        if self._lost:
            return
        if self._reading and self._inbox:
            data = self._inbox[0] if len(self._inbox) == 1 else b"".join(self._inbox)
            self._inbox.clear()
            self._inbox_bytes = 0
            writer = self.peer
            if writer is not None and writer._writer_paused:
                writer._writer_paused = False
                writer._protocol.resume_writing()
            self._protocol.data_received(data)
        if self._peer_eof and not self._inbox and not self._lost:
            self._lose()

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            self._schedule()

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    # --- lifecycle
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Close after a loop turn; data already written still reaches the peer,
        which then sees EOF once it has read it (socket semantics: a peer whose
        reading is paused notices when it resumes)."""
        if self._closing:
            return
        self._closing = True
        self._loop.call_soon(self._lose)

    def abort(self) -> None:
        self._inbox.clear()
        self._inbox_bytes = 0
        self.close()

    def _on_peer_closed(self) -> None:
        self._peer_eof = True
        self._schedule()

    def _lose(self) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        self._inbox.clear()
        self._inbox_bytes = 0
        if self.peer is not None:
            self.peer._on_peer_closed()
        self._protocol.connection_lost(None)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]


class _InProcListener(Listener):
    def __init__(self, network: InProcNetwork, endpoint: Endpoint, factory: ProtocolFactory) -> None:
        self._network = network
        self.endpoint = endpoint
        self.factory = factory
        self._closed = asyncio.get_running_loop().create_future()

    def close(self) -> None:
        if self._network._listeners.get(self.endpoint.path) is self:
            del self._network._listeners[self.endpoint.path]
        if not self._closed.done():
            self._closed.set_result(None)

    async def wait_closed(self) -> None:
        await self._closed


class InProcChannel(Channel):
    def __init__(self, network: InProcNetwork) -> None:
        self._network = network

    async def connect(self, endpoint: Endpoint, factory: ProtocolFactory) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
        listener = self._network._listeners.get(endpoint.path)
        if listener is None:
            raise ConnectionRefusedError(f"no in-process listener at {endpoint}")
        loop = asyncio.get_running_loop()
        client_proto = factory()
        server_proto = listener.factory()
        extra_c = {"peername": str(endpoint), "sockname": "inproc-client"}
        extra_s = {"peername": "inproc-client", "sockname": str(endpoint)}
        ct = _InProcTransport(loop, client_proto, extra_c)
        st = _InProcTransport(loop, server_proto, extra_s)
        ct.peer, st.peer = st, ct
        server_proto.connection_made(st)
        client_proto.connection_made(ct)
        await asyncio.sleep(0)  # like a socket connect: one loop turn
        return ct, client_proto

    async def listen(self, endpoint: Endpoint, factory: ProtocolFactory) -> Listener:
        if endpoint.path in self._network._listeners:
            raise OSError(f"in-process address {endpoint} already in use")
        listener = _InProcListener(self._network, endpoint, factory)
        self._network._listeners[endpoint.path] = listener
        return listener


def channel_for(endpoint: Endpoint, inproc: InProcNetwork | None = None, tls: Any = None) -> Channel:
    """The channel that serves ``endpoint`` (``inproc`` needs its network;
    ``tls`` is an ``ssl`` context for TCP endpoints; for QUIC endpoints a
    ``rustext.tls.ServerTls`` to listen, a ``ClientTls`` or client context to
    connect; for KCP endpoints the ``KcpOptions`` with its block crypt)."""
    if endpoint.kind == "tcp":
        return TcpChannel(tls)
    if endpoint.kind == "quic":
        from rpc.transport.quic import QuicChannel

        return QuicChannel(tls)
    if endpoint.kind == "kcp":
        from rpc.transport.kcpchannel import KcpChannel

        return KcpChannel(tls)
    if tls is not None:
        raise ValueError(f"{endpoint}: TLS is for TCP and QUIC endpoints only")
    if endpoint.kind == "unix":
        return UnixChannel()
    if inproc is None:
        raise ValueError(f"{endpoint}: an InProcNetwork is needed for inproc endpoints")
    return inproc.channel()
