"""The HTTP transport: each question is a JSON POST to the proxy's URL.

One ``aiohttp.ClientSession`` (one pool of keep-alive connections) per
endpoint, opened by :meth:`HttpTransport.start` and closed by
:meth:`HttpTransport.aclose`. A question is bounded by its timeout as a
whole (connect, send, answer); whatever goes wrong becomes a
:mod:`juggler.proxy.errors` error, never a hang.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from juggler.proxy.errors import ProxyBadAnswer, ProxyTimeout, ProxyUnavailable
from juggler.proxy.mapping import MAX_ANSWER, decode_answer

__all__ = ["HttpTransport"]

_HEADERS = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "juggler-proxy"}


class HttpTransport:
    """POSTs questions to one URL. Lifecycle: ``start()``, then ``aclose()`` (idempotent)."""

    def __init__(self, url: str, *, max_connections: int = 100) -> None:
        self.url = url
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.max_connections)
            # no session timeout: each question has its own (asyncio.timeout in ask)
            self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def ask(self, kind: str, question: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The backend's answer object; ProxyError (unavailable, timeout, bad answer) otherwise.
        Safe to cancel: the request's connection is released, not reused half-read."""
        session = self._session
        if session is None:
            raise ProxyUnavailable("proxy not started")
        body = json.dumps(question, separators=(",", ":"), ensure_ascii=False).encode()
        try:
            async with asyncio.timeout(timeout):
                async with session.post(self.url, data=body, headers=_HEADERS, allow_redirects=False) as resp:
                    status = resp.status
                    if status != 200:
                        raise ProxyBadAnswer(f"HTTP status {status}")
                    chunks: list[bytes] = []
                    size = 0
                    async for chunk in resp.content.iter_any():
                        size += len(chunk)
                        if size > MAX_ANSWER:  # checked before it is buffered whole
                            raise ProxyBadAnswer(f"answer over {MAX_ANSWER} bytes")
                        chunks.append(chunk)
        except TimeoutError:
            raise ProxyTimeout(f"no answer within {timeout:g} s") from None
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise ProxyUnavailable(str(exc) or type(exc).__name__) from None
        except aiohttp.ClientError as exc:
            raise ProxyBadAnswer(str(exc) or type(exc).__name__) from None
        return decode_answer(b"".join(chunks))
