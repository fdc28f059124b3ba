"""HTTP gateway: rpcx's ``X-RPCX-*`` HTTP API and JSON-RPC 2.0 onto the dispatcher.

Three layers, each usable on its own:

- ``Gateway.handle(HTTPRequest) -> HTTPResponse``: the mapping (sans-I/O).
  * rpcx HTTP gateway: ``POST /<ServicePath>`` (or header
    ``X-RPCX-ServicePath``), headers ``X-RPCX-ServiceMethod``,
    ``X-RPCX-SerializeType`` (required, the number), ``X-RPCX-MessageID``,
    ``X-RPCX-Meta`` (URL-encoded metadata), ``X-RPCX-Oneway``,
    ``X-RPCX-Heartbeat``, ``Authorization`` (→ ``__AUTH``); the body is the
    payload. The response echoes ``X-RPCX-MessageID``/``ServicePath``/
    ``ServiceMethod``/``SerializeType``, carries ``X-RPCX-Meta`` and the
    payload as body; on error ``X-RPCX-MessageStatusType: Error`` and
    ``X-RPCX-ErrorMessage``, with status 400 (malformed request), 401 (auth)
    or 500 (the service's error), as rpcx does for the last two.
  * JSON-RPC 2.0 (header ``X-JSONRPC-2.0: true``, as rpcx routes it):
    ``method`` is ``"Service.Method"``, ``params`` the JSON payload; a request
    without ``id`` is a notification (oneway, answered 204); batches are
    supported. Service errors use code -32603 (rpcx's choice).
- ``HTTPParser``: a sans-I/O HTTP/1.1 request parser (``feed(bytes)`` →
  complete requests), with size limits; keep-alive; bodies by
  Content-Length only (a chunked request body is refused with 411); only a
  ``CONNECT`` may end its lines in a bare LF (Go's rpcx client does). A ``CONNECT`` request ends
  HTTP on the connection: what follows it is left in the parser (``rest()``).
- ``GatewayServer``: an asyncio server on its own port driving both. When the
  transport serves rpcx and HTTP on one port, it sniffs the first byte (rpcx
  frames start with 0x08) and hands HTTP connections to
  ``GatewayServer.serve_connection``.
- rpcx's ``http`` network: a Go client dialing ``http@host:port`` sends
  ``CONNECT /_rpcx_ HTTP/1.0`` and then speaks rpcx on the connection. With
  ``on_connect`` (the rpcx listener's ``RpcxServer.adopt``), the gateway
  answers ``HTTP/1.0 200 Connected to rpcx`` exactly as Go's server does and
  hands the connection over; a ``CONNECT`` anywhere else, or with no
  ``on_connect``, is answered 405 and the connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

from rustext.net import listen_error

from rpc.message import META_AUTH, META_ERROR, Message, MessageType, SerializeType
from rpc.service import Peer, ServiceDispatcher

log = logging.getLogger("rpc.gateway")

X_VERSION = "X-RPCX-Version"
X_MESSAGE_TYPE = "X-RPCX-MesssageType"  # sic: rpcx's spelling
X_HEARTBEAT = "X-RPCX-Heartbeat"
X_ONEWAY = "X-RPCX-Oneway"
X_STATUS = "X-RPCX-MessageStatusType"
X_SERIALIZE = "X-RPCX-SerializeType"
X_MESSAGE_ID = "X-RPCX-MessageID"
X_SERVICE_PATH = "X-RPCX-ServicePath"
X_SERVICE_METHOD = "X-RPCX-ServiceMethod"
X_META = "X-RPCX-Meta"
X_ERROR = "X-RPCX-ErrorMessage"
X_JSONRPC = "X-JSONRPC-2.0"

#: where rpcx's ``http`` network CONNECTs (Go's ``share.DefaultRPCPath``)
RPCX_PATH = "/_rpcx_"
#: Go's answer to that CONNECT, byte for byte (``server.ServeHTTP``)
RPCX_CONNECTED = b"HTTP/1.0 200 Connected to rpcx\n\n"

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_LINE_END = re.compile(r"\r?\n")

# JSON-RPC 2.0 error codes
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603


class Headers:
    """Case-insensitive header lookup (first value wins)."""

    def __init__(self, items: list[tuple[str, str]] | dict[str, str] | None = None) -> None:
        self._d: dict[str, str] = {}
        pairs = items.items() if isinstance(items, dict) else (items or [])
        for k, v in pairs:
            self._d.setdefault(k.lower(), v)

    def get(self, name: str, default: str = "") -> str:
        return self._d.get(name.lower(), default)

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._d


@dataclass
class HTTPRequest:
    method: str
    path: str
    headers: Headers
    body: bytes = b""
    version: str = "HTTP/1.1"

    @property
    def keep_alive(self) -> bool:
        conn = self.headers.get("connection").lower()
        if self.version == "HTTP/1.0":
            return conn == "keep-alive"
        return conn != "close"


@dataclass
class HTTPResponse:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def to_bytes(self, keep_alive: bool = True) -> bytes:
        reason = HTTPStatus(self.status).phrase if self.status in HTTPStatus._value2member_map_ else ""
        lines = [f"HTTP/1.1 {self.status} {reason}"]
        for k, v in self.headers:
            if "\r" in k or "\n" in k or "\r" in v or "\n" in v:
                raise ValueError("header injection")
            lines.append(f"{k}: {v}")
        lines.append(f"Content-Length: {len(self.body)}")
        if not keep_alive:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


class HTTPParseError(ValueError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HTTPParser:
    """Sans-I/O HTTP/1.1 request parser: ``feed(data)`` returns the requests
    completed by ``data``; raises HTTPParseError (with the status to answer)
    on malformed or oversized input."""

    def __init__(self, *, max_header: int = 16 * 1024, max_body: int = 4 * 1024 * 1024) -> None:
        self.max_header = max_header
        self.max_body = max_body
        self._buf = bytearray()
        self._pending: HTTPRequest | None = None
        self._need = 0
        self._tunnel = False  # a CONNECT was parsed: the rest is not HTTP

    @property
    def partial(self) -> bool:
        """Part of a request is buffered (a request has begun but not completed)."""
        return bool(self._buf) or self._pending is not None

    def rest(self) -> bytes:
        """The bytes buffered after the last request (after a ``CONNECT``:
        the first bytes of the tunnelled protocol); clears them."""
        out = bytes(self._buf)
        self._buf.clear()
        return out

    def feed(self, data: bytes) -> list[HTTPRequest]:
        self._buf += data
        out: list[HTTPRequest] = []
        while not self._tunnel:
            if self._pending is not None:
                if len(self._buf) < self._need:
                    break
                req = self._pending
                req.body = bytes(self._buf[: self._need])
                del self._buf[: self._need]
                self._pending = None
                out.append(req)
                continue
            m = _HEAD_END.search(self._buf)
            if m is None:
                if len(self._buf) > self.max_header:
                    raise HTTPParseError(431, "request header too large")
                break
            if m.start() > self.max_header:
                raise HTTPParseError(431, "request header too large")
            raw_head = bytes(self._buf[: m.start()])
            if not raw_head.startswith(b"CONNECT ") and (
                m.group() != b"\r\n\r\n" or b"\n" in raw_head.replace(b"\r\n", b"")
            ):
                # bare LF only where Go's rpcx client sends it (its CONNECT); anywhere
                # else a line ending a front proxy may read differently is refused
                raise HTTPParseError(400, "malformed line ending (bare LF)")
            head = raw_head.decode("latin-1")
            del self._buf[: m.end()]
            lines = _LINE_END.split(head)
            parts = lines[0].split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                raise HTTPParseError(400, "malformed request line")
            items: list[tuple[str, str]] = []
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep or not name or name != name.strip():
                    raise HTTPParseError(400, "malformed header")
                items.append((name, value.strip()))
            headers = Headers(items)
            if parts[0] == "CONNECT":
                self._tunnel = True
                out.append(HTTPRequest(parts[0], parts[1], headers, b"", parts[2]))
                break
            if "transfer-encoding" in headers:
                raise HTTPParseError(411, "chunked request bodies are not supported; send Content-Length")
            try:
                length = int(headers.get("content-length", "0") or "0")
            except ValueError:
                raise HTTPParseError(400, "bad Content-Length") from None
            if length < 0:
                raise HTTPParseError(400, "bad Content-Length")
            if length > self.max_body:
                raise HTTPParseError(413, "request body too large")
            self._pending = HTTPRequest(parts[0], parts[1], headers, b"", parts[2])
            self._need = length
        return out


class Gateway:
    """Maps HTTP requests onto ``dispatcher`` (see the module doc)."""

    def __init__(self, dispatcher: ServiceDispatcher) -> None:
        self.dispatcher = dispatcher

    async def handle(self, req: HTTPRequest, peer: Peer | None = None) -> HTTPResponse:
        if req.headers.get(X_JSONRPC).lower() == "true":
            return await self._jsonrpc(req, peer)
        if req.method not in ("POST", "GET", "PUT"):
            return HTTPResponse(405, [("Allow", "POST, GET, PUT")], b"method not allowed\n")
        return await self._rpcx(req, peer)

    # -- rpcx X-RPCX-* gateway ------------------------------------------------------

    async def _rpcx(self, req: HTTPRequest, peer: Peer | None) -> HTTPResponse:
        h = req.headers
        service = h.get(X_SERVICE_PATH) or unquote(req.path.split("?", 1)[0]).lstrip("/")
        method = h.get(X_SERVICE_METHOD)
        echo = [(X_VERSION, h.get(X_VERSION)), (X_MESSAGE_ID, h.get(X_MESSAGE_ID)),
                (X_SERVICE_PATH, service), (X_SERVICE_METHOD, method), (X_SERIALIZE, h.get(X_SERIALIZE))]

        def error(status: int, text: str) -> HTTPResponse:
            return HTTPResponse(status, [*echo, (X_STATUS, "Error"), (X_ERROR, _header_safe(text))])

        try:
            seq = int(h.get(X_MESSAGE_ID) or "0")
            if not 0 <= seq < 2**64:
                raise ValueError("message id out of range")
            raw_st = h.get(X_SERIALIZE)
            if not service:
                return error(400, "empty servicepath")
            if not method:
                return error(400, "empty servicemethod")
            if not raw_st:
                return error(400, "empty serialized type")
            st = SerializeType(int(raw_st))
            metadata = dict(parse_qsl(h.get(X_META), keep_blank_values=True))
        except ValueError as exc:
            return error(400, str(exc))
        auth = h.get("Authorization")
        if auth:
            metadata[META_AUTH] = auth
        msg = Message(
            message_type=MessageType.REQUEST,
            heartbeat=bool(h.get(X_HEARTBEAT)),
            oneway=bool(h.get(X_ONEWAY)),
            serialize_type=st,
            seq=seq,
            service_path=service,
            service_method=method,
            metadata=metadata,
            payload=req.body,
        )
        outcome = await self.dispatcher.dispatch(msg, peer)
        res = outcome.reply
        if res is None:
            if outcome.close:
                return error(401, "auth failed")
            return HTTPResponse(200, [*echo, (X_STATUS, "Normal")])
        if res.is_error:
            return error(401 if outcome.close else 500, res.metadata.get(META_ERROR, ""))
        meta = {k: v for k, v in res.metadata.items() if k != META_ERROR}
        return HTTPResponse(200, [*echo, (X_STATUS, "Normal"), (X_META, urlencode(meta))], res.payload)

    # -- JSON-RPC 2.0 -------------------------------------------------------------

    async def _jsonrpc(self, req: HTTPRequest, peer: Peer | None) -> HTTPResponse:
        try:
            body = json.loads(req.body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            return _json_response(_jsonrpc_error(None, PARSE_ERROR, f"parse error: {exc}"))
        extra = dict(parse_qsl(req.headers.get(X_META), keep_blank_values=True))
        auth = req.headers.get("Authorization")
        if auth:
            extra[META_AUTH] = auth
        if isinstance(body, list):
            if not body:
                return _json_response(_jsonrpc_error(None, INVALID_REQUEST, "empty batch"))
            results = [await self._jsonrpc_one(item, extra, peer) for item in body]
            replies = [r for r in results if r is not None]
            return _json_response(replies) if replies else HTTPResponse(204)
        reply = await self._jsonrpc_one(body, extra, peer)
        return _json_response(reply) if reply is not None else HTTPResponse(204)

    async def _jsonrpc_one(self, item: Any, extra: dict[str, str], peer: Peer | None) -> dict[str, Any] | None:
        if not isinstance(item, dict) or item.get("jsonrpc") != "2.0" or not isinstance(item.get("method"), str):
            rid = item.get("id") if isinstance(item, dict) else None
            return _jsonrpc_error(rid, INVALID_REQUEST, "invalid request")
        notification = "id" not in item
        rid = item.get("id")
        name: str = item["method"]
        dot = name.rfind(".")
        if dot <= 0:
            return None if notification else _jsonrpc_error(rid, METHOD_NOT_FOUND, "must contains servicepath and method")
        params = item.get("params")
        msg = Message(
            oneway=notification,
            serialize_type=SerializeType.JSON,
            service_path=name[:dot],
            service_method=name[dot + 1:],
            metadata=dict(extra),
            payload=b"null" if params is None else json.dumps(params, separators=(",", ":")).encode(),
        )
        outcome = await self.dispatcher.dispatch(msg, peer)
        if notification:
            return None
        res = outcome.reply
        if res is None or res.is_error:
            text = res.metadata.get(META_ERROR, "") if res is not None else "auth failed"
            code = METHOD_NOT_FOUND if text.startswith("rpcx: can't find") else INTERNAL_ERROR
            return _jsonrpc_error(rid, code, text)
        try:
            result = json.loads(res.payload) if res.payload else None
        except (ValueError, RecursionError):
            return _jsonrpc_error(rid, INTERNAL_ERROR, "handler reply is not JSON")
        return {"jsonrpc": "2.0", "id": rid, "result": result}


def _header_safe(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


def _jsonrpc_error(rid: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


def _json_response(obj: Any) -> HTTPResponse:
    return HTTPResponse(200, [("Content-Type", "application/json")], json.dumps(obj, separators=(",", ":")).encode())


class GatewayServer:
    """The gateway on its own TCP port (``start``/``aclose``; ``async with``).

    Each connection is served request by request (HTTP/1.1 keep-alive);
    ``idle_timeout`` closes idle connections, ``request_timeout`` bounds the
    time to receive one request once it has begun (slow senders get 408),
    ``max_connections`` bounds connections (extra ones get 503). Closing stops accepting, then closes
    idle connections and waits up to ``drain_timeout`` for requests in flight.
    """

    def __init__(
        self,
        gateway: Gateway,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        idle_timeout: float = 60.0,
        request_timeout: float = 30.0,
        max_connections: int = 1024,
        max_body: int = 4 * 1024 * 1024,
        ssl: Any = None,
        on_connect: Callable[[asyncio.StreamWriter, bytes], None] | None = None,
    ) -> None:
        self.gateway = gateway
        #: takes over a connection that sent ``CONNECT /_rpcx_`` (after the
        #: answer is written) with the bytes already read past the request:
        #: ``RpcxServer.adopt``; None refuses such requests with 405
        self.on_connect = on_connect
        #: a server ``ssl.SSLContext``: HTTPS
        self.ssl = ssl
        self.host = host
        self.port = port
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self.max_body = max_body
        self._server: asyncio.Server | None = None
        self._conns: dict[asyncio.Task[None], bool] = {}  # connection task -> busy with a request
        self._closing = False

    async def start(self) -> None:
        if self._server is not None:
            return
        try:
            self._server = await asyncio.start_server(self._on_conn, self.host, self.port, ssl=self.ssl,
                                                      ssl_handshake_timeout=10.0 if self.ssl is not None else None)
        except OSError as exc:
            raise listen_error(self.host, self.port, exc) from exc
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("rpc gateway listening on %s://%s:%d", "https" if self.ssl is not None else "http", self.host, self.port)

    async def _on_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._conns) >= self.max_connections:
            writer.write(HTTPResponse(503, body=b"too many connections\n").to_bytes(keep_alive=False))
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()
            return
        self._conns[task] = False
        try:
            await self.serve_connection(reader, writer)
        except asyncio.CancelledError:
            # aclose() cancels idle connections; ending normally keeps asyncio's
            # stream callback from reporting the cancellation as an error
            if not self._closing:
                raise
        finally:
            self._conns.pop(task, None)

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, initial: bytes = b"") -> None:
        """Serve HTTP on one connection until it closes (``initial``: bytes
        already read by a protocol sniffer)."""
        peername = writer.get_extra_info("peername")
        peer = Peer(address=f"{peername[0]}:{peername[1]}" if peername else "")
        parser = HTTPParser(max_body=self.max_body)
        data = initial
        task = asyncio.current_task()
        conns = self._conns
        begun: float | None = None
        handed_over = False
        try:
            while True:
                try:
                    requests = parser.feed(data)
                except HTTPParseError as exc:
                    writer.write(HTTPResponse(exc.status, body=f"{exc}\n".encode()).to_bytes(keep_alive=False))
                    await writer.drain()
                    return
                for req in requests:
                    if req.method == "CONNECT" and req.path == RPCX_PATH and self.on_connect is not None:
                        # No await from here to the handover: every byte read
                        # past the request is in the parser or the reader.
                        writer.write(RPCX_CONNECTED)
                        # StreamReader has no public way to take what it buffered
                        rest = parser.rest() + bytes(reader._buffer)
                        reader._buffer.clear()
                        self.on_connect(writer, rest)
                        handed_over = True
                        return
                    if task in conns:
                        conns[task] = True
                    try:
                        res = await self.gateway.handle(req, peer)
                    except Exception:
                        log.exception("gateway request failed")
                        res = HTTPResponse(500, body=b"internal error\n")
                    keep = req.keep_alive and req.method != "CONNECT"  # after CONNECT the bytes are not HTTP
                    writer.write(res.to_bytes(keep_alive=keep))
                    await writer.drain()
                    if not keep:
                        return
                if task in conns:
                    conns[task] = False
                if self._server is None and self._closing:
                    return
                loop = asyncio.get_running_loop()
                if parser.partial:
                    if begun is None:
                        begun = loop.time()
                    wait = begun + self.request_timeout - loop.time()
                else:
                    begun = None
                    wait = self.idle_timeout
                try:
                    async with asyncio.timeout(max(wait, 0)):
                        data = await reader.read(65536)
                except TimeoutError:
                    if parser.partial:
                        writer.write(HTTPResponse(408, body=b"request timeout\n").to_bytes(keep_alive=False))
                        with contextlib.suppress(OSError):
                            await writer.drain()
                    return
                if not data:
                    return
        except (ConnectionError, OSError):
            return
        finally:
            if not handed_over:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def aclose(self, drain_timeout: float = 5.0) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._closing = True
        server.close()
        for t, busy in list(self._conns.items()):
            if not busy:
                t.cancel()  # idle keep-alive connection: nothing to drain
        conns = list(self._conns)
        if conns:
            _, pending = await asyncio.wait(conns, timeout=drain_timeout)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> GatewayServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
