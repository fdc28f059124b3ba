"""rpcx's side channel: raw bytes beside the rpcx connection, behind a token.

rpcx v1.9.1 moves payloads larger than one message (file transfer, streams)
over a separate TCP listener. An rpcx call (``_filetransfer.TransferFile``,
``_filetransfer.DownloadFile``, ``_streamservice.Stream``) answers a reply
``{Token, Addr}``: 32 random bytes and that listener's ``host:port``. The
client dials ``Addr``, writes the 32 token bytes, and from then on the
connection is plain bytes in both directions; the end is a TCP close (a
half-close, ``FIN``, from the sender). Nothing else is framed: no length,
no acknowledgement, no error message. This module holds what the file
transfer (``rpc.filetransfer``) and the stream service (``rpc.streams``)
share:

- ``TokenStore``: tokens issued, single use, expiring, bounded (no I/O; the
  clock is injected);
- ``SideListener``: the listener that reads a token and hands the connection
  to the handler the token was issued for, with the server's lifecycle
  (``start`` / ``stop_accepting`` / ``close_connections``);
- ``ByteStream``: a connection as chunks in, chunks out, with backpressure;
- ``connect``: the client side (dial, send the token);
- the reply's wire form, per serialize type (Go's msgpack uses the field
  names ``Token``/``Addr``, Go's JSON the tags ``token``/``addr`` with the
  token in base64).

Errors travel the only way the protocol allows: our listener answers a bad
or expired token, and a failed handler, with a TCP reset (Go's server closes
quietly), so that a client sees an error rather than a clean, short end.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import secrets
import socket
import struct
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self

from rustext.net import join_hostport, parse_hostport

from rpc.errors import RpcError
from rpc.message import SerializeType

log = logging.getLogger("rpc.sidechannel")

#: bytes of a token, as rpcx's server makes them (``crypto/rand``, 32 bytes)
TOKEN_SIZE = 32
#: bytes read or written at once
CHUNK = 256 << 10


class TransferError(RpcError, ConnectionError):
    """A file transfer or stream failed after the rpcx call answered."""


class TransferTruncated(TransferError, EOFError):
    """The connection ended before the announced number of bytes came."""


# -- tokens -------------------------------------------------------------------------------


class TokenStore:
    """Tokens issued and not yet used, each for one connection.

    ``take`` removes the token: a second use is refused, as in rpcx. A token
    older than ``ttl`` seconds is refused (rpcx keeps them until evicted);
    past ``capacity`` pending tokens the oldest is dropped (rpcx's LRU of
    ``waitNum``). ``now`` is the clock (seconds; injected by tests)."""

    def __init__(self, *, ttl: float = 60.0, capacity: int = 10_000,
                 now: Callable[[], float] = time.monotonic) -> None:
        if ttl <= 0:
            raise ValueError("token ttl must be > 0")
        if capacity < 1:
            raise ValueError("token capacity must be >= 1")
        self.ttl = ttl
        self.capacity = capacity
        self._now = now
        self._tokens: OrderedDict[bytes, tuple[float, Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tokens)

    def issue(self, value: Any) -> bytes:
        """A new random token for ``value``."""
        self._expire()
        token = secrets.token_bytes(TOKEN_SIZE)
        self._tokens[token] = (self._now() + self.ttl, value)
        while len(self._tokens) > self.capacity:
            self._tokens.popitem(last=False)
        return token

    def take(self, token: bytes) -> Any | None:
        """The value of ``token`` (then forgotten), or None when unknown,
        expired or already taken."""
        self._expire()
        entry = self._tokens.pop(bytes(token), None)
        return None if entry is None else entry[1]

    def _expire(self) -> None:
        now = self._now()
        while self._tokens:
            token, (expires, _) = next(iter(self._tokens.items()))
            if expires > now:
                break
            del self._tokens[token]


# -- the reply on the wire --------------------------------------------------------------


def encode_reply(token: bytes, addr: str, serialize_type: int) -> dict[str, Any]:
    """``share.FileTransferReply`` / ``StreamServiceReply`` as Go's codec of
    ``serialize_type`` spells it."""
    if serialize_type == SerializeType.MSGPACK:
        return {"Token": token, "Addr": addr}
    if serialize_type == SerializeType.JSON:
        return {"token": base64.b64encode(token).decode(), "addr": addr}
    raise RpcError("file transfer and streams speak JSON or msgpack (as rpcx's share types do)")


def decode_reply(reply: Any) -> tuple[bytes, str]:
    """(token, addr) from a decoded reply, whichever codec made it."""
    if not isinstance(reply, dict):
        raise TransferError(f"the server's reply is not a token and address: {reply!r}")
    token = reply.get("Token", reply.get("token"))
    addr = reply.get("Addr", reply.get("addr"))
    if isinstance(token, str):
        try:
            token = base64.b64decode(token, validate=True)
        except (binascii.Error, ValueError):
            token = None
    if not isinstance(token, bytes) or not token or not isinstance(addr, str) or not addr:
        raise TransferError(f"the server's reply has no usable token and address: {reply!r}")
    return token, addr


def args_field(args: Any, go_name: str, json_name: str, default: Any) -> Any:
    """A field of Go's share args sent as msgpack (``FileName``) or JSON (``file_name``)."""
    if not isinstance(args, dict):
        return default
    value = args.get(go_name, args.get(json_name))
    return default if value is None else value


def meta_of(args: Any) -> dict[str, str]:
    meta = args_field(args, "Meta", "meta", {})
    if not isinstance(meta, dict):
        raise RpcError("meta must be a map of strings")
    return {str(k): str(v) for k, v in meta.items()}


# -- a connection as chunks ----------------------------------------------------------------


class ByteStream:
    """One side-channel connection: chunks in (``read``, ``async for``) and
    out (``write``, which waits while the peer is slow: memory stays
    bounded). ``write_eof`` half-closes (the end of what we send); ``aclose``
    closes; ``abort`` resets (the peer sees an error, not an end)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, client: bool = False) -> None:
        self.reader = reader
        self.writer = writer
        self.client = client  # our end dialed: errors name what the server may have refused
        #: bytes read / written so far
        self.received = 0
        self.sent = 0

    @property
    def peer(self) -> str:
        addr = self.writer.get_extra_info("peername")
        return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr or "")

    async def read(self, n: int = CHUNK) -> bytes:
        """Up to ``n`` bytes; ``b""`` at the end (the peer's half-close).
        A reset raises ``TransferError``."""
        try:
            data = await self.reader.read(n)
        except ConnectionError as exc:
            raise self._broken(exc) from exc
        self.received += len(data)
        return data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while data := await self.read():
            yield data

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data``; returns once the send buffer is below its high-water mark."""
        try:
            self.writer.write(data)
            await self.writer.drain()
        except ConnectionError as exc:
            raise self._broken(exc) from exc
        self.sent += len(data)

    async def write_eof(self) -> None:
        """Half-close: the peer reads the end; reading goes on."""
        try:
            await self.writer.drain()
            if self.writer.can_write_eof():
                self.writer.write_eof()
        except ConnectionError as exc:
            raise self._broken(exc) from exc

    def _broken(self, exc: BaseException) -> TransferError:
        text = (f"the {'server' if self.client else 'client'} reset the connection after {self.sent} bytes "
                f"sent and {self.received} received ({exc or type(exc).__name__})")
        if self.client:
            text += ("; a server resets a transfer whose token is unknown, expired or already used, "
                     "whose handler failed, or whose size did not match")
        return TransferError(text)

    def abort(self) -> None:
        """Reset the connection (RST): the peer gets an error, not an end."""
        reset(self.writer)

    async def aclose(self) -> None:
        """Close (the peer reads the end). Idempotent."""
        if self.writer.is_closing():
            return
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            await self.aclose()
        else:
            self.abort()


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), so the peer gets an error."""
    if writer.transport.is_closing():
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


# -- the server side -------------------------------------------------------------------------


@dataclass(kw_only=True)
class SideChannelConfig:
    """Bounds of a side listener (rpcx has none of these: its tokens live
    until evicted and its accept loop waits for each token in turn)."""

    #: seconds a token stays valid after the rpcx call issued it
    token_ttl: float = 60.0
    #: tokens issued and not yet used; past it the oldest is dropped (rpcx's ``waitNum``)
    max_pending: int = 10_000
    #: seconds a new connection has to send its token
    token_timeout: float = 10.0
    #: connections at once; more are reset
    max_connections: int = 1_000
    #: seconds ``close_connections`` waits for running transfers before it resets them
    drain_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("token_ttl", "token_timeout", "drain_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.max_pending < 1 or self.max_connections < 1:
            raise ValueError("max_pending and max_connections must be >= 1")


#: runs a connection whose token was issued for ``value``
Serve = Callable[[Any, ByteStream], Awaitable[None]]


def split_hostport(value: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``, ``tcp@host:port``) → (host, port)."""
    value = value.partition("@")[2] if "@" in value else value
    return parse_hostport(value)


_UNSPECIFIED = ("", "0.0.0.0", "::")


class SideListener:
    """The TCP listener of a file transfer or stream service.

    ``issue(value, local_host)`` makes a token for ``value`` and returns it
    with the address to put in the reply: ``advertise`` when given, else the
    bound address, whose host is replaced, when it is a wildcard
    (``0.0.0.0``), by ``local_host`` (the address the client reached the
    rpcx server at). A connection then sends the token within
    ``token_timeout`` and ``serve(value, stream)`` runs; when it returns the
    connection is closed, when it raises it is reset.

    Lifecycle (``rpc.server.Listener``, driven by ``Server.shutdown``):
    ``start`` binds (idempotent), ``stop_accepting`` closes the port,
    ``close_connections`` waits up to ``drain_timeout`` for running
    transfers, then resets those left.
    """

    def __init__(self, listen: str, serve: Serve, *, advertise: str | None = None,
                 config: SideChannelConfig | None = None, name: str = "side channel",
                 now: Callable[[], float] = time.monotonic) -> None:
        self.host, self.port = split_hostport(listen)
        if advertise is not None:
            split_hostport(advertise)
        self.advertise = advertise
        self.config = config or SideChannelConfig()
        self.name = name
        self.tokens = TokenStore(ttl=self.config.token_ttl, capacity=self.config.max_pending, now=now)
        self._serve = serve
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._closing = False

    @property
    def started(self) -> bool:
        return self._server is not None

    @property
    def address(self) -> str:
        """The bound ``host:port`` (the asked port until started)."""
        return join_hostport(self.host, self.port)

    @property
    def active(self) -> int:
        """Connections being served now."""
        return len(self._tasks)

    async def start(self) -> str:
        """Bind and listen; returns the bound ``host:port``. Idempotent."""
        if self._server is None:
            from rustext.net import listen_error

            try:
                self._server = await asyncio.start_server(self._accept, self.host or None, self.port,
                                                          limit=CHUNK, reuse_address=True)
            except OSError as exc:
                raise listen_error(self.host, self.port, exc) from exc
            self.port = self._server.sockets[0].getsockname()[1]
            log.info("%s listening on %s", self.name, self.address)
        return self.address

    def issue(self, value: Any, local_host: str = "") -> tuple[bytes, str]:
        """(token, address for the reply); see the class docstring."""
        if self._server is None or self._closing:
            raise RpcError(f"the {self.name} listener is not running")
        token = self.tokens.issue(value)
        if self.advertise:
            return token, self.advertise
        host = self.host
        if host in _UNSPECIFIED and local_host:
            host = local_host
        return token, join_hostport(host or "127.0.0.1", self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing or len(self._tasks) >= self.config.max_connections:
            reset(writer)
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        stream = ByteStream(reader, writer)
        try:
            await self._run(stream)
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)

    async def _run(self, stream: ByteStream) -> None:
        writer = stream.writer
        try:
            async with asyncio.timeout(self.config.token_timeout):
                token = await stream.reader.readexactly(TOKEN_SIZE)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.info("%s: no token from %s (%s); closed", self.name, stream.peer, type(exc).__name__)
            reset(writer)
            return
        value = self.tokens.take(token)
        if value is None:
            log.info("%s: unknown, expired or used token from %s; reset", self.name, stream.peer)
            reset(writer)
            return
        try:
            await self._serve(value, stream)
        except asyncio.CancelledError:
            reset(writer)
            raise
        except Exception as exc:
            if isinstance(exc, TransferError):
                log.info("%s from %s failed: %s", self.name, stream.peer, exc)
            else:
                log.exception("%s handler failed (connection from %s)", self.name, stream.peer)
            reset(writer)
            return
        await stream.aclose()

    # -- rpc.server.Listener -------------------------------------------------------------------
    async def stop_accepting(self) -> None:
        """Close the port (connections already in go on). Idempotent."""
        self._closing = True
        if self._server is not None:
            self._server.close()  # the port closes now; wait_closed (which waits for connections) comes last

    async def close_connections(self) -> None:
        """Wait up to ``drain_timeout`` for running transfers, then reset
        the rest. Idempotent."""
        await self.stop_accepting()
        tasks = list(self._tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.config.drain_timeout)
            if pending:
                log.warning("%s: resetting %d transfer(s) still running after %.1fs",
                            self.name, len(pending), self.config.drain_timeout)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def aclose(self) -> None:
        await self.close_connections()


# -- the client side ---------------------------------------------------------------------------

#: calls ``method`` of the service with ``args``; returns the decoded reply
Call = Callable[[str, Any], Awaitable[Any]]


def check_codec(serialize_type: int) -> None:
    """Go's share types travel as JSON or msgpack only."""
    if serialize_type not in (SerializeType.JSON, SerializeType.MSGPACK):
        raise RpcError("file transfer and streams need the JSON or msgpack serialize type (rpcx's share types)")



def dial_address(addr: str, server_address: str | None) -> tuple[str, int]:
    """Where to dial the ``Addr`` of a reply: as given, except that a
    missing or wildcard host means the rpcx server's host (Go dials the
    local machine there, which is the same when the server is local)."""
    host, port = split_hostport(addr)
    if host in _UNSPECIFIED:
        host = "127.0.0.1"
        if server_address:
            try:
                shost, _ = split_hostport(server_address)
            except ValueError:
                shost = ""
            if shost and shost not in _UNSPECIFIED:
                host = shost
    return host, port


async def connect(token: bytes, addr: str, server_address: str | None = None, *,
                  connect_timeout: float = 10.0) -> ByteStream:
    """Dial the side listener at ``addr`` and send ``token``."""
    host, port = dial_address(addr, server_address)
    try:
        async with asyncio.timeout(connect_timeout):
            reader, writer = await asyncio.open_connection(host, port, limit=CHUNK)
    except (OSError, TimeoutError) as exc:
        raise TransferError(f"cannot connect to the transfer listener {join_hostport(host, port)}: "
                            f"{exc or 'timed out'}") from exc
    stream = ByteStream(reader, writer, client=True)
    await stream.write(token)
    stream.sent = 0
    return stream


async def await_close(stream: ByteStream, timeout: float | None) -> None:
    """After our half-close: wait until the server closes, which is how it
    says it is done. A reset means it failed (or refused the token)."""
    try:
        async with asyncio.timeout(timeout):
            while await stream.reader.read(CHUNK):
                pass
    except TimeoutError:
        raise TransferError(f"the server did not end the transfer within {timeout}s of the last byte") from None
    except ConnectionError as exc:
        raise stream._broken(exc) from exc


__all__ = [
    "CHUNK",
    "TOKEN_SIZE",
    "ByteStream",
    "SideChannelConfig",
    "SideListener",
    "TokenStore",
    "TransferError",
    "TransferTruncated",
    "connect",
    "decode_reply",
    "encode_reply",
]
