"""The reconnecting Python client against real servers over a real Redis: it
comes back by itself after its server goes away and recovers, on channels
with history, what was published meanwhile (each event once, in order)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from juggler.broker.redis import RedisBroker, RedisBrokerConfig
from juggler.channels import ChannelOptions, ChannelRules
from juggler.client import connect
from juggler.config import ServerConfig
from juggler.errors import ConnectionClosed
from juggler.reconnecting import reconnecting
from juggler.server import Server

pytestmark = pytest.mark.timeout(60)

RULES = ChannelRules([ChannelOptions(match="h.*", history_size=1000, history_ttl=60)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start(redis_url: str, port: int = 0) -> tuple[Server, RedisBroker]:
    broker = RedisBroker(RedisBrokerConfig(url=redis_url))
    await broker.start()
    server = Server(broker, ServerConfig(port=port), channels=RULES)
    await server.start()
    return server, broker


async def test_reconnects_and_recovers(redis_url: str) -> None:
    port = free_port()
    near, near_broker = await start(redis_url, port)
    far, far_broker = await start(redis_url)
    states: list[str] = []
    try:
        async with connect(far.url) as pub, reconnecting(near.url, on_state=states.append) as client:
            await client.sub("h.rc")
            await client.sub("plain.rc")  # no history: re-subscribed, nothing to recover
            for i in range(3):
                await pub.pub("h.rc", i)
            assert [(await client.next_event(5)).args for _ in range(3)] == [0, 1, 2]
            near.abort()  # the server goes away: connections dropped
            await near_broker.aclose()
            for i in range(3, 6):
                await pub.pub("h.rc", i)
            near, near_broker = await start(redis_url, port)  # back on the same address
            # recovered: what was published while away, each once, in order
            assert [(await client.next_event(10)).args for _ in range(3)] == [3, 4, 5]
            await pub.pub("h.rc", 6)
            await pub.pub("plain.rc", "p")
            live = [(await client.next_event(10)).args for _ in range(2)]
            assert live == [6, "p"]
            assert "reconnecting" in states and states[-1] == "open"
            assert client.reconnects == 1
            with pytest.raises(TimeoutError):  # nothing twice
                await client.next_event(0.3)
    finally:
        near.abort()
        far.abort()
        await near_broker.aclose()
        await far_broker.aclose()


async def test_first_connection_failure_and_close(redis_url: str) -> None:
    with pytest.raises(ConnectionClosed):
        await reconnecting(f"ws://127.0.0.1:{free_port()}/ws")
    server, broker = await start(redis_url)
    try:
        client = await reconnecting(server.url)
        await client.sub("h.x")
        assert await asyncio.wait_for(client.pub("h.x", 1), 5)
        assert (await client.next_event(5)).offset == 1
        await client.aclose()
        await client.aclose()
        with pytest.raises(ConnectionClosed):
            await client.next_event(1)
        with pytest.raises(ConnectionClosed):
            await client.pub("h.x", 2)
    finally:
        await server.aclose()
        await broker.aclose()
