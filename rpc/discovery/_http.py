"""JSON over HTTP for etcd's v3 JSON gateway, on aiohttp (the suite's
control-plane HTTP library).

Only what the registry needs: ``POST`` a JSON body and read a JSON response,
or read a streamed response as a sequence of JSON objects (a watch). These
are control-plane calls, a few per second at most: each gets a session of
its own. Every read is bounded in size, and in time except a watch's stream.
"""

from __future__ import annotations

import codecs
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

MAX_BODY = 16 * 1024 * 1024


class HTTPError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status
        self.body = body


def _url(host: str, port: int, path: str, https: bool = False) -> str:
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{'https' if https else 'http'}://{authority}{path}"


async def _read_bounded(resp: aiohttp.ClientResponse) -> bytes:
    out = bytearray()
    async for chunk in resp.content.iter_any():
        out += chunk
        if len(out) > MAX_BODY:
            raise HTTPError(resp.status, b"body too large")
    return bytes(out)


async def post_json(host: str, port: int, path: str, body: dict[str, Any], *, timeout: float = 5.0,
                    ssl: ssl.SSLContext | None = None) -> dict[str, Any]:
    """POST ``body`` as JSON and return the decoded JSON response (HTTPError
    if not 2xx); with an ``ssl`` client context, over HTTPS."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        async with session.post(_url(host, port, path, ssl is not None), json=body, ssl=ssl or True) as resp:
            data = await _read_bounded(resp)
            if not 200 <= resp.status < 300:
                raise HTTPError(resp.status, data)
    return json.loads(data) if data.strip() else {}


async def stream_json(
    host: str, port: int, path: str, body: dict[str, Any], *, timeout: float = 5.0,
    ssl: ssl.SSLContext | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """POST ``body`` and yield each JSON object of a streamed response. The
    stream has no read deadline (it is a watch); connecting and the response
    head have ``timeout``."""
    limits = aiohttp.ClientTimeout(total=None, connect=timeout, sock_connect=timeout)
    async with aiohttp.ClientSession(timeout=limits) as session:
        async with session.post(_url(host, port, path, ssl is not None), json=body, timeout=limits,
                                ssl=ssl or True) as resp:
            if not 200 <= resp.status < 300:
                raise HTTPError(resp.status, await _read_bounded(resp))
            decoder = json.JSONDecoder()
            text = codecs.getincrementaldecoder("utf-8")()  # a chunk may end inside a character
            buf = ""
            async for chunk in resp.content.iter_any():
                buf += text.decode(chunk)
                while True:
                    stripped = buf.lstrip()
                    if not stripped:
                        buf = ""
                        break
                    try:
                        obj, end = decoder.raw_decode(stripped)
                    except ValueError:
                        if len(stripped) > MAX_BODY:
                            raise HTTPError(resp.status, b"stream object too large") from None
                        buf = stripped
                        break
                    buf = stripped[end:]
                    yield obj
