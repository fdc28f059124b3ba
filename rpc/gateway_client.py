"""A ``ServerCaller`` over rpcx's HTTP gateway (ours or a Go rpcx server's).

``HTTPCaller`` sends a request ``Message`` as ``POST /<ServicePath>`` with
the ``X-RPCX-*`` headers and turns the HTTP response back into a response
``Message`` (``X-RPCX-MessageStatusType: Error`` → status error with
``__rpcx_error__``). It keeps up to ``pool`` keep-alive connections per
address (HTTP/1.1 carries one request at a time per connection). The HTTP
client is aiohttp, the suite's control-plane HTTP library.

Addresses: ``http://host:port``, ``tcp@host:port`` or ``host:port``.
Errors: ``TransportError`` when the request could not be carried (connect,
write, connection lost), ``CallTimeout`` on timeout. A connection on which a
request timed out or failed is closed, never reused (its state is unknown).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import aiohttp
from rustext.tls import describe_ssl_error

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


class HTTPCaller:
    """See the module doc. One aiohttp session (its connection pool: up to
    ``pool`` keep-alive connections per address) per caller; ``aclose()``."""

    def __init__(self, *, pool: int = 4, connect_timeout: float = 5.0, tls: Any = None) -> None:
        if pool < 1:
            raise ValueError("pool must be >= 1")
        self.pool = pool
        #: how ``https://`` gateways are verified (``rustext.tls.ClientTls``); default: the system's trust store
        self._ssl: Any = tls.context() if tls is not None else True
        self.connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=self.pool, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("Accept-Encoding", "User-Agent"),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
            )
        return self._session

    async def __call__(self, address: str, request: Message, timeout: float | None) -> Message | None:
        if self._closed:
            raise TransportError("caller is closed", TransportErrorKind.CLOSED)
        host, port = split_address(address)
        https = address.startswith("https://")
        url = f"{'https' if https else 'http'}://{host}:{port}/{quote(request.service_path)}"
        headers = self._headers(request)
        try:
            async with asyncio.timeout(timeout):
                async with self._client().post(url, data=request.payload, headers=headers,
                                               ssl=self._ssl) as resp:
                    body = await resp.content.read(MAX_RESPONSE + 1)
                    if len(body) > MAX_RESPONSE:
                        raise TransportError(f"{address}: oversized response", TransportErrorKind.PROTOCOL)
                    res = self._reply(request, resp.status, resp.headers, body)
        except TimeoutError:
            raise CallTimeout(f"no response from {address} in {timeout}s") from None
        except aiohttp.ClientConnectorCertificateError as exc:
            raise TransportError(f"cannot connect to {address}: {describe_ssl_error(exc.certificate_error)}",
                                 TransportErrorKind.CONNECT) from exc
        except aiohttp.ClientConnectorError as exc:
            raise TransportError(f"cannot connect to {address}: {exc.os_error or exc}", TransportErrorKind.CONNECT) from exc
        except (aiohttp.ClientResponseError, aiohttp.ClientPayloadError) as exc:
            raise TransportError(f"{address} is not an HTTP gateway: {exc}", TransportErrorKind.PROTOCOL) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise TransportError(f"connection to {address} lost: {exc}", TransportErrorKind.CLOSED) from exc
        return None if request.oneway else res

    @staticmethod
    def _headers(request: Message) -> dict[str, str]:
        metadata = dict(request.metadata)
        auth = metadata.pop(META_AUTH, None)
        headers = {
            X_SERVICE_PATH: request.service_path,
            X_SERVICE_METHOD: request.service_method,
            X_SERIALIZE: str(int(request.serialize_type)),
            X_MESSAGE_ID: str(request.seq),
        }
        if metadata:
            headers[X_META] = urlencode(metadata)
        if auth is not None:
            headers["Authorization"] = auth
        if request.oneway:
            headers[X_ONEWAY] = "true"
        for value in headers.values():
            if any(c in value for c in "\r\n\x00"):
                raise ValueError("header values must not contain line breaks")
        return headers

    @staticmethod
    def _reply(request: Message, status: int, headers: Any, body: bytes) -> Message:
        res = request.reply(body, dict(parse_qsl(headers.get(X_META, ""), keep_blank_values=True)))
        res.message_type = MessageType.RESPONSE
        if headers.get(X_STATUS) == "Error" or status >= 400:
            res.status = MessageStatus.ERROR
            res.payload = b""
            res.metadata[META_ERROR] = headers.get(X_ERROR) or f"HTTP {status}"
        return res

    async def aclose(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()
