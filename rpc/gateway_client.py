"""A ``ServerCaller`` over rpcx's HTTP gateway (ours or a Go rpcx server's).

``HTTPCaller`` sends a request ``Message`` as ``POST /<ServicePath>`` with
the ``X-RPCX-*`` headers and turns the HTTP response back into a response
``Message`` (``X-RPCX-MessageStatusType: Error`` → status error with
``__rpcx_error__``). It keeps up to ``pool`` keep-alive connections per
address (HTTP/1.1 carries one request at a time per connection).

Addresses: ``http://host:port``, ``tcp@host:port`` or ``host:port``.
Errors: ``TransportError`` when the request could not be carried (connect,
write, connection lost), ``CallTimeout`` on timeout. A connection on which a
request timed out or failed is closed, never reused (its state is unknown).
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import parse_qsl, quote, urlencode

from rpc.errors import CallTimeout, TransportError, TransportErrorKind
from rpc.gateway import (
    X_ERROR,
    X_MESSAGE_ID,
    X_META,
    X_ONEWAY,
    X_SERIALIZE,
    X_SERVICE_METHOD,
    X_SERVICE_PATH,
    X_STATUS,
)
from rpc.message import META_AUTH, META_ERROR, Message, MessageStatus, MessageType

MAX_RESPONSE = 64 * 1024 * 1024


def split_address(address: str) -> tuple[str, int]:
    """``http://h:p`` / ``tcp@h:p`` / ``h:p`` → (host, port)."""
    addr = address
    if "://" in addr:
        addr = addr.split("://", 1)[1].rstrip("/")
    if "@" in addr:
        addr = addr.split("@", 1)[1]
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address must be host:port, got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class _StaleConnection(Exception):
    """A reused keep-alive connection was already closed by the server."""


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class HTTPCaller:
    def __init__(self, *, pool: int = 4, connect_timeout: float = 5.0) -> None:
        if pool < 1:
            raise ValueError("pool must be >= 1")
        self.pool = pool
        self.connect_timeout = connect_timeout
        self._idle: dict[str, list[_Conn]] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._closed = False

    async def __call__(self, address: str, request: Message, timeout: float | None) -> Message | None:
        if self._closed:
            raise TransportError("caller is closed", TransportErrorKind.CLOSED)
        slots = self._slots.get(address)
        if slots is None:
            slots = self._slots[address] = asyncio.Semaphore(self.pool)
        try:
            async with asyncio.timeout(timeout):
                async with slots:
                    return await self._exchange(address, request)
        except TimeoutError:
            raise CallTimeout(f"no response from {address} in {timeout}s") from None

    async def _connect(self, address: str) -> _Conn:
        host, port = split_address(address)
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError) as exc:
            raise TransportError(f"cannot connect to {address}: {exc}", TransportErrorKind.CONNECT) from exc
        return _Conn(reader, writer)

    async def _exchange(self, address: str, request: Message) -> Message | None:
        idle = self._idle.setdefault(address, [])
        while idle:
            # a kept-alive connection the server closed meanwhile fails before any
            # byte of a response: then (and only then) try again on a new one
            conn = idle.pop()
            try:
                return await self._on(conn, address, request, idle)
            except _StaleConnection:
                continue
        return await self._on(await self._connect(address), address, request, idle, fresh=True)

    async def _on(self, conn: _Conn, address: str, request: Message, idle: list[_Conn], fresh: bool = False) -> Message | None:
        ok = False
        try:
            conn.writer.write(self._encode(address, request))
            try:
                await conn.writer.drain()
            except OSError as exc:
                if not fresh:
                    raise _StaleConnection() from exc
                raise TransportError(f"write to {address} failed: {exc}", TransportErrorKind.WRITE) from exc
            res, reusable = await self._read(address, conn, request, fresh)
            ok = reusable
            return None if request.oneway else res
        finally:
            if ok and not self._closed:
                idle.append(conn)
            else:
                conn.close()  # cancelled, timed out or failed: state unknown, never reused

    @staticmethod
    def _encode(address: str, request: Message) -> bytes:
        metadata = dict(request.metadata)
        auth = metadata.pop(META_AUTH, None)
        host, port = split_address(address)
        headers = [
            f"POST /{quote(request.service_path)} HTTP/1.1",
            f"Host: {host}:{port}",
            f"{X_SERVICE_PATH}: {request.service_path}",
            f"{X_SERVICE_METHOD}: {request.service_method}",
            f"{X_SERIALIZE}: {int(request.serialize_type)}",
            f"{X_MESSAGE_ID}: {request.seq}",
            f"Content-Length: {len(request.payload)}",
        ]
        if metadata:
            headers.append(f"{X_META}: {urlencode(metadata)}")
        if auth is not None:
            headers.append(f"Authorization: {auth}")
        if request.oneway:
            headers.append(f"{X_ONEWAY}: true")
        for line in headers:
            if any(c in line for c in "\r\n\x00"):
                raise ValueError("header values must not contain line breaks")
        return ("\r\n".join(headers) + "\r\n\r\n").encode("utf-8") + request.payload

    async def _read(self, address: str, conn: _Conn, request: Message, fresh: bool) -> tuple[Message, bool]:
        try:
            head = await conn.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as exc:
            if not fresh and isinstance(exc, asyncio.IncompleteReadError) and not exc.partial:
                raise _StaleConnection() from exc
            raise TransportError(f"connection to {address} lost: {exc}", TransportErrorKind.CLOSED) from exc
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise TransportError(f"{address} is not an HTTP gateway", TransportErrorKind.PROTOCOL)
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            if k:
                headers.setdefault(k.strip().lower(), v.strip())
        raw_length = headers.get("content-length", "0") or "0"
        length = int(raw_length) if raw_length.isdigit() else -1
        if not 0 <= length <= MAX_RESPONSE or "transfer-encoding" in headers:
            raise TransportError(f"{address}: unsupported or oversized response", TransportErrorKind.PROTOCOL)
        try:
            body = await conn.reader.readexactly(length)
        except (asyncio.IncompleteReadError, OSError) as exc:
            raise TransportError(f"connection to {address} lost: {exc}", TransportErrorKind.CLOSED) from exc
        res = request.reply(body, dict(parse_qsl(headers.get(X_META.lower(), ""), keep_blank_values=True)))
        res.message_type = MessageType.RESPONSE
        if headers.get(X_STATUS.lower()) == "Error" or status >= 400:
            res.status = MessageStatus.ERROR
            res.payload = b""
            res.metadata[META_ERROR] = headers.get(X_ERROR.lower()) or f"HTTP {status}"
        return res, headers.get("connection", "").lower() != "close"

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for c in conns:
                c.close()
                with contextlib.suppress(Exception):
                    await c.writer.wait_closed()
