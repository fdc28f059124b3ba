"""QUIC channel: rpcx's byte protocol on one bidirectional QUIC stream (aioquic).

This is what Go rpcx does with its ``quic`` build tag (``smallnest/quick``):
a client opens ONE bidirectional stream per QUIC connection and the ordinary
rpcx bytes flow on it; the server accepts the first stream the client opens.
TLS is QUIC's own (1.3); the ALPN is ``rpcx``. The stream is adapted to an
``asyncio.Transport`` so the same ``Connection`` code runs over it.

Closing: ``close()`` sends the stream's FIN, then closes the QUIC connection
once everything written is acknowledged (or after ``LINGER`` seconds), so no
reply is cut off. A peer that disappears without a word (killed) is noticed
by the calls' deadlines and the pool's heartbeats, or by QUIC's idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from typing import Any

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer, serve
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicErrorCode

from rpc.transport.channelapi import Channel, Listener, ProtocolFactory
from rpc.transport.endpoint import Endpoint
from rustext.net import listen_error
from rustext.tls import ClientTls, ServerTls, TlsConfigError

log = logging.getLogger("rpc.transport.quic")

#: the ALPN protocol Go rpcx offers and expects when its TLS config names none
ALPN = "rpcx"
#: seconds a closed stream waits for its data to be acknowledged before the connection is closed anyway
LINGER = 2.0
#: seconds a QUIC connection may stay silent before it is dropped (quic-go's default is 30)
IDLE_TIMEOUT = 30.0
#: seconds the QUIC handshake may take
HANDSHAKE_TIMEOUT = 10.0
#: bytes asked for the listener's UDP buffers (the kernel caps it at net.core.rmem_max / wmem_max):
#: every connection shares one socket, and a full receive buffer drops datagrams (quic-go asks for 7 MiB)
UDP_BUFFER = 4 << 20


def client_configuration(tls: ClientTls | ssl.SSLContext | None) -> QuicConfiguration:
    """A client configuration: verified against the system's trust store when
    given nothing (like our TLS over TCP), or as ``tls`` says (its CA, its
    ``insecure``, its client certificate). An ``ssl.SSLContext`` gives its
    verification mode and loaded CA certificates (not a client certificate)."""
    conf = QuicConfiguration(is_client=True, alpn_protocols=[ALPN], idle_timeout=IDLE_TIMEOUT)
    if isinstance(tls, ssl.SSLContext):
        conf.verify_mode = tls.verify_mode
        cas = tls.get_ca_certs(binary_form=True)
        if cas:
            conf.cadata = "".join(ssl.DER_cert_to_PEM_cert(der) for der in cas).encode()
        return conf
    tls = tls or ClientTls()
    if tls.insecure:
        conf.verify_mode = ssl.CERT_NONE
    else:
        conf.verify_mode = ssl.CERT_REQUIRED
        if tls.ca:
            tls.context()  # the same one-line errors as TLS over TCP for a bad file
            conf.load_verify_locations(cafile=tls.ca)
    if tls.cert and tls.key:
        conf.load_cert_chain(tls.cert, tls.key)
    return conf


def server_configuration(tls: ServerTls) -> QuicConfiguration:
    """A server configuration with the certificate files of ``tls`` loaded
    (raises ``TlsConfigError`` naming a bad file). Client certificates
    cannot be required: aioquic's server never asks for one, and accepting
    ``client_ca`` without enforcing it would let anyone in."""
    if tls.client_ca:
        raise TlsConfigError("mutual TLS (a client CA) is not available over QUIC: serve it over TCP")
    tls.context()  # checks the files with the same messages as TLS over TCP
    conf = QuicConfiguration(is_client=False, alpn_protocols=[ALPN], idle_timeout=IDLE_TIMEOUT)
    _load_server_files(conf, tls)
    return conf


def _load_server_files(conf: QuicConfiguration, tls: ServerTls) -> None:
    try:
        conf.load_cert_chain(tls.cert, tls.key)
    except (OSError, ValueError) as exc:
        raise TlsConfigError(f"cannot load {tls.cert} / {tls.key} for QUIC: {exc}") from exc


class QuicStreamTransport(asyncio.Transport):
    """One bidirectional QUIC stream as an ``asyncio.Transport``.

    Writes are queued in the QUIC connection and sent on the next loop turn
    (one batch of datagrams per turn). The protocol's ``pause_writing`` is
    called when more than the high-water mark is written but not yet
    acknowledged, ``resume_writing`` when it is down to the low-water mark.
    ``pause_reading`` holds received data here until ``resume_reading``;
    QUIC's flow control is aioquic's.
    """

    HIGH = 1 << 20

    def __init__(self, conn: _QuicConnection, stream_id: int, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._conn = conn
        self.stream_id = stream_id
        self._protocol = protocol
        self._closing = False
        self._eof_sent = False
        self._reading = True
        self._held: list[bytes] = []
        self._held_eof = False
        self._high = self.HIGH
        self._low = self.HIGH // 4
        self._writing_paused = False

    # --- write side
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self._eof_sent or not data:
            return
        self._conn._quic.send_stream_data(self.stream_id, bytes(data))
        self._conn._transmit_soon()
        if not self._writing_paused and self.get_write_buffer_size() > self._high:
            self._writing_paused = True
            self._protocol.pause_writing()

    def _check_resume(self) -> None:
        """After acknowledgements: let writers go on once the backlog is down to the low-water mark."""
        if self._writing_paused and self.get_write_buffer_size() <= self._low:
            self._writing_paused = False
            if not self._conn.lost:
                self._protocol.resume_writing()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self._eof_sent or self._conn.terminated:
            return
        self._eof_sent = True
        self._conn._quic.send_stream_data(self.stream_id, b"", end_stream=True)
        self._conn._transmit_soon()

    def get_write_buffer_size(self) -> int:
        """Bytes written and not yet acknowledged by the peer (read from
        aioquic's stream sender: it has no public call for it)."""
        stream = getattr(self._conn._quic, "_streams", {}).get(self.stream_id)
        sender = getattr(stream, "sender", None)
        start, stop = getattr(sender, "_buffer_start", 0), getattr(sender, "_buffer_stop", 0)
        return max(0, stop - start)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = high if high is not None else self.HIGH
        self._low = low if low is not None else self._high // 4

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (self._low, self._high)

    # --- read side
    def _feed(self, data: bytes, end: bool) -> None:
        if self._reading and not self._held:
            if data:
                self._protocol.data_received(data)
            if end:
                self._eof()
            return
        if data:
            self._held.append(data)
        self._held_eof = self._held_eof or end

    def _eof(self) -> None:
        if self._conn.lost:
            return
        keep_open = self._protocol.eof_received()
        if not keep_open:
            self.close()

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if self._reading:
            return
        self._reading = True
        held, self._held = self._held, []
        if held:
            self._protocol.data_received(b"".join(held))
        if self._held_eof and self._reading and not self._held:
            self._held_eof = False
            self._eof()

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    # --- lifecycle
    def is_closing(self) -> bool:
        return self._closing or self._conn.lost

    def close(self) -> None:
        """Send FIN; the QUIC connection closes once the peer has everything
        (or after ``LINGER`` s). Idempotent."""
        if self._closing:
            return
        self._closing = True
        self.write_eof()
        self._conn._finish_after_flush()

    def abort(self) -> None:
        self._closing = True
        self._conn.abort()

    async def wait_closed(self) -> None:
        """Until the QUIC connection is closed (after ``close()``, that is once
        the peer has everything or ``LINGER`` has passed) and, for a client,
        its UDP socket with it."""
        await self._conn.wait_closed()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self._conn.peer
        if name == "sockname":
            udp = self._conn._transport
            return udp.get_extra_info("sockname") if udp is not None else default
        if name == "quic_stream_id":
            return self.stream_id
        return default  # no 'socket': the UDP socket is shared and is no TCP socket

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]


class _QuicConnection(QuicConnectionProtocol):
    """One QUIC connection carrying one stream, handed to ``factory``'s protocol.

    A client opens its stream once the handshake is done; a server takes the
    first bidirectional stream the client opens and ignores any other.
    """

    def __init__(self, quic: QuicConnection, stream_handler: Any = None, *, factory: ProtocolFactory,
                 on_gone: Any = None, peer: Any = None) -> None:
        super().__init__(quic)
        self._factory = factory
        self._on_gone = on_gone
        self.peer = peer
        self.stream: QuicStreamTransport | None = None
        self.lost = False
        self.terminated = False
        self._linger: asyncio.TimerHandle | None = None
        self._finishing = False
        self._is_client = quic.configuration.is_client
        #: set at the end of the handshake (aioquic's wait_connected misses a handshake that
        #: completes before it is awaited, which wait_for's task start allows)
        self.handshake: asyncio.Future[None] = self._loop.create_future()

    def open_stream(self) -> QuicStreamTransport:
        """Client: the stream (rpcx's ``OpenStreamSync``); the peer sees it with our first write."""
        sid = self._quic.get_next_available_stream_id()
        return self._attach(sid)

    def _attach(self, stream_id: int) -> QuicStreamTransport:
        protocol = self._factory()
        self.stream = QuicStreamTransport(self, stream_id, protocol)
        protocol.connection_made(self.stream)
        return self.stream

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        if self.peer is None:
            self.peer = addr[:2]
        super().datagram_received(data, addr)

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.HandshakeCompleted):
            if not self.handshake.done():
                self.handshake.set_result(None)
        elif isinstance(event, events.StreamDataReceived):
            if self.stream is None and not self._is_client and event.stream_id % 4 == 0 and not self.lost:
                self._attach(event.stream_id)
            if self.stream is not None and event.stream_id == self.stream.stream_id:
                self.stream._feed(event.data, event.end_stream)
            # data on any other stream is ignored: rpcx uses one stream per connection
        elif isinstance(event, events.StreamReset):
            if self.stream is not None and event.stream_id == self.stream.stream_id:
                self._lose(ConnectionResetError("the peer reset the QUIC stream"))
        elif isinstance(event, events.ConnectionTerminated):
            if not self.handshake.done():
                self.handshake.set_exception(ConnectionError(f"QUIC handshake refused: {event.reason_phrase}"))
                self.handshake.exception()  # retrieved: nobody may be waiting any more
            self.terminated = True
            exc = None if event.error_code == QuicErrorCode.NO_ERROR else ConnectionResetError(
                f"QUIC connection closed by the peer: error {event.error_code:#x} {event.reason_phrase}".rstrip())
            self._lose(exc)

    def transmit(self) -> None:
        super().transmit()
        if self.stream is not None and self.stream._writing_paused:
            self.stream._check_resume()
        if self._finishing and not self.terminated and self._flushed():
            self._close_quic()

    def _flushed(self) -> bool:
        """Whether the peer has everything we wrote (our FIN aside: the
        CONNECTION_CLOSE that follows says the same). aioquic has no public
        call for it: read the stream's sender, or wait out LINGER."""
        if self.stream is None:
            return True
        stream = getattr(self._quic, "_streams", {}).get(self.stream.stream_id)
        if stream is None:
            return True  # finished both ways and discarded
        sender = stream.sender
        if getattr(sender, "is_finished", False):
            return True
        start, stop = getattr(sender, "_buffer_start", None), getattr(sender, "_buffer_stop", 0)
        return start is not None and start == stop

    def _finish_after_flush(self) -> None:
        if self._finishing:
            return
        self._finishing = True
        if self._flushed():
            self._close_quic()
            return
        self._linger = self._loop.call_later(LINGER, self._close_quic)
        self._transmit_soon()

    def _close_quic(self, error_code: int = QuicErrorCode.NO_ERROR) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if not self.terminated:
            self.terminated = True
            self._quic.close(error_code=error_code)
            if self._transport is not None:
                super().transmit()
        self._lose(None)

    def abort(self) -> None:
        self._close_quic(QuicErrorCode.INTERNAL_ERROR)

    def connection_lost(self, exc: Exception | None) -> None:
        """The UDP socket is gone (a client's own, or the listener's)."""
        self.terminated = True
        self._lose(exc)

    def _lose(self, exc: BaseException | None) -> None:
        if self.lost:
            return
        self.lost = True
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self.stream is not None:
            self.stream._closing = True
            self.stream._protocol.connection_lost(exc)  # type: ignore[arg-type]
        if self._is_client:
            # the UDP socket is this connection's own; a server's connection keeps
            # its timer so that aioquic finishes closing and the listener forgets it
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._transport is not None:
                self._transport.close()
        if self._on_gone is not None:
            self._on_gone(self)
        self._closed.set()


class QuicListener(Listener):
    """A QUIC server socket. ``close()`` stops accepting new connections; the
    UDP socket stays open until those already accepted are gone."""

    def __init__(self, endpoint: Endpoint, tls: ServerTls, configuration: QuicConfiguration) -> None:
        self.endpoint = endpoint
        self._tls = tls
        self.configuration = configuration
        self.server: QuicServer | None = None
        self.connections: set[_QuicConnection] = set()
        self._accepting = True
        self._closed = asyncio.get_running_loop().create_future()

    def make(self, factory: ProtocolFactory) -> Any:
        def create(quic: QuicConnection, stream_handler: Any = None) -> _QuicConnection:
            conn = _QuicConnection(quic, factory=factory, on_gone=self._gone)
            if self._accepting:
                self.connections.add(conn)
            else:
                quic.close(error_code=QuicErrorCode.CONNECTION_REFUSED, reason_phrase="server closing")
            return conn
        return create

    def _gone(self, conn: _QuicConnection) -> None:
        self.connections.discard(conn)
        if not self._accepting and not self.connections:
            self._shut()

    def reload(self) -> None:
        """Read the certificate files again: new handshakes get the new
        certificate, established connections keep theirs."""
        server_configuration(self._tls)  # check first: a half-loaded configuration must never serve
        _load_server_files(self.configuration, self._tls)

    def close(self) -> None:
        self._accepting = False
        for conn in list(self.connections):
            if conn.stream is None:  # a handshake, or a client that never wrote: nothing to drain
                conn._close_quic()
        if not self.connections:
            self._shut()

    def _shut(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if not self._closed.done():
            self._closed.set_result(None)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)


class QuicChannel(Channel):
    """rpcx over QUIC. A listener needs ``ServerTls`` (QUIC always encrypts);
    a client verifies servers as ``tls`` says (the system's trust store when
    ``None``; ``ClientTls(insecure=True)`` is what Go rpcx does by default)."""

    def __init__(self, tls: ServerTls | ClientTls | ssl.SSLContext | None = None) -> None:
        self.tls = tls

    async def connect(self, endpoint: Endpoint, factory: ProtocolFactory) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
        if isinstance(self.tls, ServerTls):
            raise ValueError("a QUIC client needs client TLS settings, not a server certificate")
        conf = client_configuration(self.tls)
        conf.server_name = endpoint.host
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_DGRAM)
        family, _, _, _, addr = infos[0]
        quic = QuicConnection(configuration=conf)
        # an unconnected socket: with a connected one uvloop stalls handshakes made side by side
        udp, conn = await loop.create_datagram_endpoint(
            lambda: _QuicConnection(quic, factory=factory, peer=addr[:2]),
            local_addr=("::" if family == socket.AF_INET6 else "0.0.0.0", 0), family=family)
        assert isinstance(conn, _QuicConnection)
        try:
            conn.connect(addr)
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):  # not wait_for: it can lose a cancel on 3.11
                await asyncio.shield(conn.handshake)
        except BaseException as exc:
            conn._close_quic(QuicErrorCode.NO_ERROR)
            udp.close()
            if isinstance(exc, (ConnectionError, TimeoutError)):
                why = "timed out" if isinstance(exc, TimeoutError) else str(exc)
                raise ConnectionRefusedError(f"QUIC handshake with {endpoint} failed: {why}") from exc
            raise
        stream = conn.open_stream()
        return stream, stream.get_protocol()  # type: ignore[return-value]

    async def listen(self, endpoint: Endpoint, factory: ProtocolFactory) -> Listener:
        if not isinstance(self.tls, ServerTls):
            raise ValueError(f"{endpoint}: a QUIC listener needs a certificate and its key (TLS is mandatory in QUIC)")
        conf = server_configuration(self.tls)
        listener = QuicListener(endpoint, self.tls, conf)
        try:
            listener.server = await serve(endpoint.host, endpoint.port, configuration=conf,
                                          create_protocol=listener.make(factory))
        except OSError as exc:
            raise listen_error(endpoint.host, endpoint.port, exc) from exc
        assert listener.server._transport is not None
        sock = listener.server._transport.get_extra_info("socket")
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, opt, UDP_BUFFER)
        port = listener.server._transport.get_extra_info("sockname")[1]
        listener.endpoint = Endpoint("quic", host=endpoint.host, port=port)
        return listener
