"""The tunnel timeout of upgraded connections, with a real WebSocket
backend (the ``websockets`` package) behind the balancer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

import rustext
from balancer.config import from_dict

pytestmark = [pytest.mark.timeout(30)]


async def echo(ws: ServerConnection) -> None:
    async for message in ws:
        await ws.send(message)


@pytest.fixture
async def ws_backend() -> AsyncIterator[str]:
    async with serve(echo, "127.0.0.1", 0, ping_interval=None) as server:
        host, port = server.sockets[0].getsockname()[:2]
        yield f"{host}:{port}"


def balancer(backend: str, **timeouts: Any) -> rustext.Balancer:
    lb = rustext.Balancer(from_dict({"listen": "127.0.0.1:0", "workers": 1, "backends": [backend],
                                     "timeouts": timeouts}))
    lb.start()
    return lb


async def closed_after(ws: Any, limit: float) -> float:
    """Seconds until the balancer closes the tunnel (bounded by ``limit``)."""
    started = time.monotonic()
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(ws.recv(), limit)
    return time.monotonic() - started


async def test_a_tunnel_outlives_the_client_timeout_until_the_tunnel_timeout(ws_backend: str) -> None:
    lb = balancer(ws_backend, idle=0.3, response=0.3, tunnel=1.2)
    try:
        async with connect(f"ws://127.0.0.1:{lb.address[1]}/", ping_interval=None) as ws:
            await ws.send("one")
            assert await ws.recv() == "one"
            # idle for well past the client and backend timeouts: still open
            await asyncio.sleep(0.8)
            await ws.send("two")
            assert await ws.recv() == "two"
            # then idle past the tunnel timeout: closed by the balancer
            took = await closed_after(ws, 5.0)
            assert 1.1 <= took < 4.0
    finally:
        lb.close()


async def test_without_a_tunnel_timeout_the_client_and_backend_timeouts_apply(ws_backend: str) -> None:
    lb = balancer(ws_backend, idle=5.0, response=0.4)
    try:
        async with connect(f"ws://127.0.0.1:{lb.address[1]}/", ping_interval=None) as ws:
            await ws.send("one")
            assert await ws.recv() == "one"
            took = await closed_after(ws, 4.0)
            assert 0.3 <= took < 3.0
    finally:
        lb.close()


async def test_tunnel_zero_means_none(ws_backend: str) -> None:
    lb = balancer(ws_backend, idle=0.2, response=0.2, tunnel=0)
    try:
        async with connect(f"ws://127.0.0.1:{lb.address[1]}/", ping_interval=None) as ws:
            await asyncio.sleep(0.7)  # several client timeouts of silence
            await ws.send("still")
            assert await ws.recv() == "still"
    finally:
        lb.close()


def test_tunnel_is_per_pool_and_checked() -> None:
    cfg = from_dict({"listen": "127.0.0.1:0", "default_backend": "ws", "timeouts": {"tunnel": 3600},
                     "backends": {"ws": {"servers": ["127.0.0.1:1"], "timeouts": {"tunnel": 60}},
                                  "web": {"servers": ["127.0.0.1:2"]}}})
    pools = {p.name: p.config for p in cfg.backend_pools()}  # as the data plane reads them
    assert pools["ws"].timeouts.tunnel_effective == 60 and pools["web"].timeouts.tunnel_effective == 3600
    with pytest.raises(Exception, match="tunnel"):
        from_dict({"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], "timeouts": {"tunnel": -1}})
