"""TransportPool: one creation per key, health, reconnect with backoff, peer crash."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from rpc.transport import (
    ConnectionConfig,
    ConnectionLost,
    Health,
    InProcNetwork,
    PoolConfig,
    ServerConfig,
    TransportClosed,
    TransportPool,
    TransportServer,
    Unavailable,
)
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)

FAST = PoolConfig(backoff_initial=0.01, backoff_max=0.05, connect_timeout=2, down_after=2)


def echo(conn: Any, msg: Any) -> bytes:
    return msg.payload


async def test_one_creation_per_key_under_concurrency(endpoint: str, inproc: InProcNetwork, no_leaks: None) -> None:
    async with TransportServer(endpoint, echo, inproc=inproc) as srv, TransportPool(inproc=inproc) as pool:
        conns = await asyncio.gather(*(pool.get(srv.endpoint) for _ in range(50)))
        assert len({id(c) for c in conns}) == 1
        assert pool.connects == 1
        assert pool.health(srv.endpoint) is Health.WORKING
        assert len(srv.connections) == 1


async def test_unreachable_is_unavailable_then_down(inproc: InProcNetwork, no_leaks: None) -> None:
    async with TransportPool(inproc=inproc, config=FAST) as pool:
        with pytest.raises(Unavailable):
            await pool.get("inproc://nobody")
        assert pool.health("inproc://nobody") in (Health.RECOVERING, Health.DOWN)
        await wait_until(lambda: pool.health("inproc://nobody") is Health.DOWN, what="health DOWN")
        with pytest.raises(Unavailable):  # fails fast while down
            await pool.get("inproc://nobody")
        # the pool keeps retrying: once a server appears it recovers
        async with TransportServer("inproc://nobody", echo, inproc=inproc):
            conn = await pool.wait_working("inproc://nobody", 10)
            assert (await conn.request(b"up")).payload == b"up"
    with pytest.raises(TransportClosed):
        await pool.get("inproc://nobody")


async def test_reconnect_after_server_restart(inproc: InProcNetwork, no_leaks: None) -> None:
    async with TransportPool(inproc=inproc, config=FAST) as pool:
        srv = TransportServer("inproc://r", echo, inproc=inproc)
        await srv.start()
        first = await pool.get("inproc://r")
        await srv.aclose()
        await first.wait_closed()
        assert pool.health("inproc://r") in (Health.RECOVERING, Health.DOWN)
        srv2 = TransportServer("inproc://r", echo, inproc=inproc)
        await srv2.start()
        second = await pool.wait_working("inproc://r", 10)
        assert second is not first
        assert (await pool.request("inproc://r", b"again")).payload == b"again"
        await srv2.aclose()


def test_backoff_is_exponential_with_bounded_jitter() -> None:
    pool = TransportPool(config=PoolConfig(backoff_initial=0.1, backoff_factor=2, backoff_max=1, jitter=0.2), rng=random.Random(7))
    for attempt, base in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        d = pool.backoff(attempt)
        assert base * 0.8 <= d <= base * 1.2
    with pytest.raises(ValueError):
        PoolConfig(jitter=1.5)


async def test_peer_crash_fails_in_flight_at_once(peer_process: Any, no_leaks: None) -> None:
    """A server process killed mid-stream: every request in flight fails with
    ConnectionLost right away (their 60 s deadlines are far away), then the
    pool reconnects to a restarted server on the same port."""
    peer = peer_process("tcp://127.0.0.1:0", "hang")
    async with TransportPool(config=FAST) as pool:
        conn = await pool.get(peer.endpoint)
        tasks = [asyncio.ensure_future(conn.request(b"x" * 1000, timeout=60)) for _ in range(20)]
        for _ in range(20):  # the peer's handler has every request
            assert await peer.read_line() == "request"
        assert conn.in_flight == 20
        peer.kill()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        assert all(isinstance(r, ConnectionLost) for r in results), results
        with pytest.raises((ConnectionLost, Unavailable)):
            await conn.request(b"dead")
        # restart on the same port: the pool reconnects by itself
        again = peer_process(peer.endpoint, "echo")
        conn2 = await pool.wait_working(again.endpoint, 20)
        assert (await conn2.request(b"back")).payload == b"back"
        again.kill()


async def test_heartbeat_detects_silent_peer(inproc: InProcNetwork, no_leaks: None) -> None:
    """A peer that stops reading (but keeps the connection open) is found by
    the pool's heartbeat: the connection is closed, its in-flight requests
    fail with ConnectionLost before their deadline, and the pool reconnects."""
    server_conns: list[Any] = []

    async def never(conn: Any, msg: Any) -> None:
        await asyncio.sleep(30)

    cfg = PoolConfig(heartbeat_interval=0.02, heartbeat_timeout=0.05, backoff_initial=0.01, backoff_max=0.05)
    scfg = ServerConfig(connection=ConnectionConfig(drain_timeout=0.01))
    async with TransportServer("inproc://hb", never, inproc=inproc, on_connection=server_conns.append, config=scfg) as srv:
        async with TransportPool(inproc=inproc, config=cfg) as pool:
            conn = await pool.get(srv.endpoint)
            answered = 0
            heartbeat = conn.heartbeat

            async def counted(*args: Any, **kwargs: Any) -> Any:
                nonlocal answered
                reply = await heartbeat(*args, **kwargs)
                answered += 1
                return reply

            conn.heartbeat = counted  # type: ignore[method-assign]
            await wait_until(lambda: answered >= 5, what="5 heartbeats answered")
            assert conn.is_open  # answered heartbeats keep the connection
            inflight = asyncio.ensure_future(conn.request(b"", timeout=30))
            await wait_until(lambda: conn.in_flight == 1)
            server_conns[0].transport.pause_reading()  # the peer goes silent
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(inflight, 10)
            again = await pool.wait_working(srv.endpoint, 10)
            assert again is not conn
