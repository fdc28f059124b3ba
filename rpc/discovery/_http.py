"""A minimal HTTP/1.1 JSON client on asyncio streams (for etcd's JSON gateway).

Only what the etcd v3 gateway needs: ``POST`` a JSON body, read a JSON
response (Content-Length or chunked), or read a chunked stream of JSON
objects. One connection per request (``Connection: close``): these are
control-plane calls, a few per second at most. Every read is bounded in
size and time.
"""

from __future__ import annotations

import asyncio
import codecs
import json
from collections.abc import AsyncIterator
from typing import Any

MAX_BODY = 16 * 1024 * 1024
MAX_LINE = 64 * 1024


class HTTPError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status
        self.body = body


async def _open(host: str, port: int, path: str, body: dict[str, Any], timeout: float):
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port, limit=MAX_LINE)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode()
    writer.write(head + data)
    try:
        async with asyncio.timeout(timeout):
            await writer.drain()
            status_line = await reader.readline()
            parts = status_line.decode("latin-1").split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
                raise HTTPError(0, status_line)
            status = int(parts[1])
            headers: dict[str, str] = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                k, _, v = line.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
    except BaseException:
        writer.close()
        raise
    return reader, writer, status, headers


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        size_line = await reader.readline()
        if not size_line:
            return
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size > MAX_BODY:
            raise HTTPError(0, b"chunk too large")
        if size == 0:
            return
        chunk = await reader.readexactly(size)
        await reader.readexactly(2)
        yield chunk


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = bytearray()
        async for chunk in _chunks(reader):
            out += chunk
            if len(out) > MAX_BODY:
                raise HTTPError(0, b"body too large")
        return bytes(out)
    if "content-length" in headers:
        n = int(headers["content-length"])
        if n > MAX_BODY:
            raise HTTPError(0, b"body too large")
        return await reader.readexactly(n)
    return await reader.read(MAX_BODY)


async def post_json(host: str, port: int, path: str, body: dict[str, Any], *, timeout: float = 5.0) -> dict[str, Any]:
    """POST ``body`` as JSON and return the decoded JSON response (HTTPError if not 2xx)."""
    reader, writer, status, headers = await _open(host, port, path, body, timeout)
    try:
        async with asyncio.timeout(timeout):
            data = await _body(reader, headers)
    finally:
        writer.close()
    if not 200 <= status < 300:
        raise HTTPError(status, data)
    return json.loads(data) if data.strip() else {}


async def stream_json(
    host: str, port: int, path: str, body: dict[str, Any], *, timeout: float = 5.0
) -> AsyncIterator[dict[str, Any]]:
    """POST ``body`` and yield each JSON object of a streamed (chunked) response.
    The stream has no read deadline (it is a watch); connect/headers have ``timeout``."""
    reader, writer, status, headers = await _open(host, port, path, body, timeout)
    try:
        if not 200 <= status < 300:
            async with asyncio.timeout(timeout):
                raise HTTPError(status, await _body(reader, headers))
        decoder = json.JSONDecoder()
        text = codecs.getincrementaldecoder("utf-8")()  # a chunk may end inside a character
        buf = ""
        source = _chunks(reader) if headers.get("transfer-encoding", "").lower() == "chunked" else _raw(reader)
        async for chunk in source:
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
                        raise HTTPError(0, b"stream object too large") from None
                    buf = stripped
                    break
                buf = stripped[end:]
                yield obj
    finally:
        writer.close()


async def _raw(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        data = await reader.read(65536)
        if not data:
            return
        yield data
