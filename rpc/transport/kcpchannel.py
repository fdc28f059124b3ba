"""KCP channel: rpcx's byte protocol over KCP sessions on UDP, as Go rpcx's ``kcp`` build tag.

The driver of the sans-I/O parts (``kcp``: the ARQ; ``kcpwire``: crypt,
checksum, FEC framing): an asyncio ``DatagramProtocol`` feeds datagrams in,
a timer calls the session's ``update`` when its ``check`` says, and each
session is adapted to an ``asyncio.Transport`` so the same ``Connection``
code runs over it. A client has its own UDP socket; a listener shares one
and tells sessions apart by the peer's address (as kcp-go does).

KCP has no handshake and no FIN, hence:

- ``connect`` returns at once; a server that is not there is found by the
  first call's deadline (or at once, when the kernel reports the port
  unreachable).
- A listener opens a session on data (a PUSH) from an unknown address;
  anything else from it is dropped. A PUSH numbered 0 starts a conversation;
  a later one resumes a conversation this listener forgot (dropped idle, or
  before a restart) where the peer is, which works because an idle peer has
  nothing unacknowledged. A new conversation from a known address replaces
  the old one (a client that restarted), as kcp-go does.
- ``close()`` waits until the peer has acknowledged what was written (at most
  ``LINGER`` s), then forgets the session without telling the peer.
- A session that receives nothing for ``idle_timeout`` seconds is dropped
  (a client's session only once it has sent something: the pool's fresh
  connection waiting for its first call stays), and so is one whose segments
  went unacknowledged ``dead_link`` times (a killed peer). A killed peer is usually noticed sooner by call deadlines and the
  pool's heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from dataclasses import dataclass, field, replace
from typing import Any

from rpc.transport.channelapi import Channel, Listener, ProtocolFactory
from rpc.transport.endpoint import Endpoint
from rpc.transport.errors import KcpPacketError
from rpc.transport.kcp import CMD_PUSH, KcpSession, KcpSettings
from rpc.transport.kcpwire import KcpCrypt, PacketCodec, first_segment
from rustext.net import listen_error

log = logging.getLogger("rpc.transport.kcp")

#: seconds a closed session waits for the peer to acknowledge what was written
LINGER = 2.0
#: bytes asked for a listener's UDP buffers (every session shares its socket)
UDP_BUFFER = 4 << 20


@dataclass(kw_only=True, frozen=True, slots=True)
class KcpOptions:
    """What both ends of a KCP channel must agree on (the block crypt, the
    shards) and how our side behaves. rpcx's defaults: AES with the key both
    sides derive from one passphrase, 10 data and 3 parity shards."""

    #: the block crypt both ends share: ``KcpCrypt.from_passphrase("rpcx-key")`` as rpcx's examples,
    #: ``KcpCrypt(key=...)`` for a raw AES key, ``KcpCrypt(cipher="none")`` for kcp-go's none crypt
    crypt: KcpCrypt
    #: FEC data shards of kcp-go's packet layer, as the peer's (Go rpcx hard-codes 10)
    data_shards: int = 10
    #: FEC parity shards, as the peer's (Go rpcx: 3; none are sent); 0 for either: no FEC header
    parity_shards: int = 3
    #: how our side behaves (windows, intervals, stream mode); need not match the peer's
    settings: KcpSettings = field(default_factory=KcpSettings)
    #: seconds without any datagram from the peer after which a session is dropped
    idle_timeout: float = 300.0

    def __post_init__(self) -> None:
        PacketCodec(self.crypt, self.data_shards, self.parity_shards)  # validates the shards
        if self.idle_timeout <= 0:
            raise ValueError("KCP idle_timeout must be > 0 seconds")


class KcpTransport(asyncio.Transport):
    """One KCP session as an ``asyncio.Transport``.

    Writes are queued in the session and sent at the end of the loop turn.
    The write buffer is what is queued or in flight unacknowledged (counted
    in segments of MSS bytes): above the high-water mark the protocol is
    paused until acknowledgements bring it down to the low-water mark.
    ``pause_reading`` stops taking data from the session, whose receive
    window then closes and stops the peer.
    """

    HIGH = 1 << 20

    def __init__(self, loop: asyncio.AbstractEventLoop, udp: asyncio.DatagramTransport, peer: Any, conv: int,
                 options: KcpOptions, protocol: asyncio.Protocol, *, own_socket: bool,
                 on_gone: Any = None) -> None:
        super().__init__()
        self._loop = loop
        self._udp = udp
        self.peer = peer
        self._codec = PacketCodec(options.crypt, options.data_shards, options.parity_shards)
        self._t0 = loop.time()
        # acknowledgements "at once" leave at the end of this loop turn rather than inside input():
        # a reply written in the same turn then carries them (one datagram, not two)
        self._ack_soon = options.settings.ack_nodelay
        settings = replace(options.settings, ack_nodelay=False)
        self.session = KcpSession(conv, settings, reserved=self._codec.overhead, now=self._now())
        self._protocol = protocol
        self._own_socket = own_socket
        self._on_gone = on_gone
        self._idle_timeout = options.idle_timeout
        self._last_heard = loop.time()
        self._reading = True
        self._closing = False
        self.lost = False
        self._high = self.HIGH
        self._low = self.HIGH // 4
        self._writing_paused = False
        self._flush_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._idle_handle = loop.call_later(self._idle_timeout, self._check_idle)
        self._linger: asyncio.TimerHandle | None = None
        self._closed = loop.create_future()

    def _now(self) -> int:
        return int((self._loop.time() - self._t0) * 1000) & 0xFFFFFFFF

    # --- datagrams in and out
    def datagram(self, segments: bytes) -> None:
        """The KCP payload of a datagram from the peer (already decoded)."""
        if self.lost:
            return
        self._last_heard = self._loop.time()
        self.session.input(segments, self._now())
        self._deliver()
        if self._ack_soon and self.session._acks and self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush_writes)
        self._after_io()

    def _deliver(self) -> None:
        if self._reading and self.session.readable() and not self.lost:
            data = self.session.recv()
            if data:
                self._protocol.data_received(data)

    def _transmit(self) -> None:
        if self.lost:
            return
        for payload in self.session.take_output():
            try:
                self._udp.sendto(self._codec.encode(payload), None if self._own_socket else self.peer)
            except OSError as exc:  # pragma: no cover - the kernel refused a datagram: KCP resends it
                log.debug("KCP datagram to %s not sent: %s", self.peer, exc)

    def _after_io(self) -> None:
        """Send what the session produced, check the dead link and the write
        backlog, and set the timer for the session's next ``update``."""
        self._transmit()
        if self.lost:
            return
        if self.session.dead:
            self._lose(ConnectionResetError(f"the KCP peer {self.peer} stopped acknowledging"))
            return
        if self._writing_paused and self.get_write_buffer_size() <= self._low:
            self._writing_paused = False
            self._protocol.resume_writing()
        if self._closing and self.session.waiting() == 0:
            self._lose(None)
            return
        s = self.session
        if not (s.snd_buf or s.snd_queue or s._acks or s._probe or s.readable()):
            return  # nothing to retransmit or acknowledge: no timer until the next datagram or write
        if self._timer is not None and self._timer_at <= self._loop.time() + s.settings.interval / 1000:
            return  # due within an interval already, before any new segment's RTO (30 ms at least)
        now = self._now()
        due = self._loop.time() + ((s.check(now) - now) & 0xFFFFFFFF) / 1000
        if self._timer is None or due < self._timer_at - 0.0005:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = due
            self._timer = self._loop.call_at(due, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.lost:
            return
        self.session.update(self._now())
        self._deliver()
        self._after_io()

    def _check_idle(self) -> None:
        if self.lost:
            return
        silent = self._loop.time() - self._last_heard
        if self._own_socket and self.session.snd_nxt == 0 and not self.session.snd_queue:
            silent = 0.0  # a client that never sent: nothing to time out yet
            self._last_heard = self._loop.time()
        if silent >= self._idle_timeout:
            self._lose(TimeoutError(f"no datagram from the KCP peer {self.peer} for {self._idle_timeout:g} s"))
        else:
            self._idle_handle = self._loop.call_later(self._idle_timeout - silent, self._check_idle)

    # --- write side
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self.lost or not data:
            return
        self.session.send(data)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush_writes)
        if not self._writing_paused and self.get_write_buffer_size() > self._high:
            self._writing_paused = True
            self._protocol.pause_writing()

    def _flush_writes(self) -> None:
        """Like kcp-go's ``Write``: what was written this loop turn leaves now,
        not at the next interval, with the acknowledgements due."""
        self._flush_handle = None
        if not self.lost:
            self.session.flush(self._now())
            self._after_io()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        """Bytes queued or unacknowledged, counted in whole segments."""
        return self.session.waiting() * self.session.mss

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = high if high is not None else self.HIGH
        self._low = low if low is not None else self._high // 4

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (self._low, self._high)

    # --- read side
    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if self._reading or self.lost:
            return
        self._reading = True
        self._deliver()
        self.session.flush(self._now())  # the window opened: tell the peer
        self._after_io()

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    # --- lifecycle
    def is_closing(self) -> bool:
        return self._closing or self.lost

    def close(self) -> None:
        """Stop writing; the session is forgotten once the peer has acknowledged
        everything written (or after ``LINGER`` s). Idempotent."""
        if self._closing or self.lost:
            return
        self._closing = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self.session.flush(self._now())
        self._linger = self._loop.call_later(LINGER, self._lose, None)
        self._after_io()

    def abort(self) -> None:
        self._closing = True
        self._lose(None)

    async def wait_closed(self) -> None:
        """Until the session is forgotten (and a client's UDP socket closed)."""
        await asyncio.shield(self._closed)

    def _lose(self, exc: BaseException | None) -> None:
        if self.lost:
            return
        self.lost = True
        self._closing = True
        for handle in (self._timer, self._linger, self._idle_handle, self._flush_handle):
            if handle is not None:
                handle.cancel()
        self._timer = self._linger = self._flush_handle = None
        if self._own_socket:
            self._udp.close()
        if self._on_gone is not None:
            self._on_gone(self)
        try:
            self._protocol.connection_lost(exc)  # type: ignore[arg-type]
        finally:
            if not self._closed.done():
                self._closed.set_result(None)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self.peer
        if name == "sockname":
            return self._udp.get_extra_info("sockname", default)
        if name == "kcp_conv":
            return self.session.conv
        return default  # no 'socket': a UDP socket (shared by a listener's sessions) is no TCP socket

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]


class _ClientSocket(asyncio.DatagramProtocol):
    """A client's own connected UDP socket, carrying its one session."""

    def __init__(self) -> None:
        self.transport: KcpTransport | None = None
        self.codec: PacketCodec | None = None

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if self.transport is None or self.codec is None:
            return
        try:
            segments = self.codec.decode(data)
            if segments is not None:
                self.transport.datagram(segments)
        except KcpPacketError as exc:
            log.debug("dropped a datagram from %s: %s", addr, exc)

    def error_received(self, exc: Exception) -> None:
        # a connected socket hears ICMP port unreachable: nobody listens there
        if self.transport is not None and isinstance(exc, ConnectionRefusedError):
            self.transport._lose(ConnectionRefusedError(f"nothing listens on KCP {self.transport.peer}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.transport._lose(exc)


class KcpListener(Listener, asyncio.DatagramProtocol):
    """A listening UDP socket demultiplexing sessions by the peer's address.
    ``close()`` stops opening sessions; the socket stays open until those
    already open are gone."""

    def __init__(self, endpoint: Endpoint, options: KcpOptions, factory: ProtocolFactory) -> None:
        self.endpoint = endpoint
        self.options = options
        self._factory = factory
        self._codec = PacketCodec(options.crypt, options.data_shards, options.parity_shards)
        self.sessions: dict[Any, KcpTransport] = {}
        self._udp: asyncio.DatagramTransport | None = None
        self._accepting = True
        self._closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._udp = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            segments = self._codec.decode(data)
            if segments is None:
                return
            session = self.sessions.get(addr)
            head = first_segment(segments)
            if session is not None and head is not None and head[0] != session.session.conv:
                if head[1] != CMD_PUSH or head[2] != 0:
                    return  # a stray datagram of an older conversation
                session._lose(ConnectionResetError(f"the KCP peer {addr} started a new conversation"))
                session = None
            if session is None:
                if head is None or head[1] != CMD_PUSH or not self._accepting:
                    return
                session = self._open(addr, head[0])
                if head[2] != 0:  # a conversation we forgot (idle, or restarted): resume it
                    session.session.resume(head[2], head[3])
                    log.debug("KCP conversation %d of %s resumed at segment %d", head[0], addr, head[2])
            session.datagram(segments)
        except KcpPacketError as exc:
            log.debug("dropped a datagram from %s: %s", addr, exc)

    def _open(self, addr: Any, conv: int) -> KcpTransport:
        assert self._udp is not None
        protocol = self._factory()
        transport = KcpTransport(asyncio.get_running_loop(), self._udp, addr, conv, self.options, protocol,
                                 own_socket=False, on_gone=self._gone)
        self.sessions[addr] = transport
        protocol.connection_made(transport)
        return transport

    def _gone(self, transport: KcpTransport) -> None:
        if self.sessions.get(transport.peer) is transport:
            del self.sessions[transport.peer]
        if not self._accepting and not self.sessions:
            self._shut()

    def error_received(self, exc: Exception) -> None:
        log.debug("KCP listener %s: %s", self.endpoint, exc)  # a peer's port unreachable: its session times out

    def connection_lost(self, exc: Exception | None) -> None:
        for session in list(self.sessions.values()):
            session._lose(exc)
        self._shut()

    def close(self) -> None:
        self._accepting = False
        if not self.sessions:
            self._shut()

    def _shut(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        if not self._closed.done():
            self._closed.set_result(None)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)


class KcpChannel(Channel):
    """rpcx over KCP; ``options`` carries the block crypt, which both ends
    must share (Go rpcx refuses to run KCP without one)."""

    def __init__(self, options: KcpOptions | None) -> None:
        self.options = options

    def _need_options(self, endpoint: Endpoint) -> KcpOptions:
        if not isinstance(self.options, KcpOptions):
            raise ValueError(f"{endpoint}: KCP needs its block crypt (a key, or the 'none' crypt) like Go rpcx")
        return self.options

    async def connect(self, endpoint: Endpoint, factory: ProtocolFactory) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
        options = self._need_options(endpoint)
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_DGRAM)
        family, _, _, _, addr = infos[0]
        udp, sock = await loop.create_datagram_endpoint(_ClientSocket, remote_addr=addr[:2], family=family)
        assert isinstance(sock, _ClientSocket)
        protocol = factory()
        conv = int.from_bytes(os.urandom(4), "little") or 1
        transport = KcpTransport(loop, udp, addr[:2], conv, options, protocol, own_socket=True)
        sock.codec, sock.transport = PacketCodec(options.crypt, options.data_shards, options.parity_shards), transport
        protocol.connection_made(transport)
        return transport, protocol

    async def listen(self, endpoint: Endpoint, factory: ProtocolFactory) -> Listener:
        options = self._need_options(endpoint)
        loop = asyncio.get_running_loop()
        listener = KcpListener(endpoint, options, factory)
        try:
            udp, _ = await loop.create_datagram_endpoint(lambda: listener, local_addr=(endpoint.host, endpoint.port))
        except OSError as exc:
            raise listen_error(endpoint.host, endpoint.port, exc) from exc
        sock = udp.get_extra_info("socket")
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, opt, UDP_BUFFER)
        listener.endpoint = Endpoint("kcp", host=endpoint.host, port=udp.get_extra_info("sockname")[1])
        return listener
