"""The native fan-out under pressure, through real servers and sockets: slow
consumers (short writes handed to Python, a reader that stops being dropped),
unsubscribes while events are being delivered, TLS and middleware
connections beside native ones, and 10,000 subscribers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from jugglerprocs import juggler_up
from websockets.asyncio.client import connect as ws_connect

from juggler.broker.memory import MemoryBroker
from juggler.client import connect
from juggler.config import ServerConfig
from juggler.fanout import FanoutConfig, run_fanout
from juggler.server import Server

pytestmark = pytest.mark.timeout(120)

SUB_FRAME = '{"meta":{"type":3,"uuid":"%s"},"payload":{"channel":"%s","pattern":false}}'


async def serve(**cfg: Any) -> tuple[Server, MemoryBroker]:
    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0, **cfg))
    await server.start()
    return server, broker


async def raw_subscriber(url: str, channel: str, **kw: Any) -> Any:
    import uuid

    ws = await ws_connect(url, subprotocols=["juggler.0"], compression=None, **kw)  # type: ignore[list-item]
    await ws.send(SUB_FRAME % (uuid.uuid4(), channel))
    ack = json.loads(await ws.recv())
    assert ack["meta"]["type"] == 8
    return ws


async def test_a_slow_reader_gets_everything_in_order() -> None:
    """The kernel takes only part of what the hub writes: the rest goes through
    the connection's transport, which keeps later frames behind it."""
    server, broker = await serve()
    payload = "x" * 16_000
    try:
        slow = await raw_subscriber(server.url, "big", max_queue=1)  # reads only when asked
        async with connect(server.url) as fast, connect(server.url) as pub:
            await fast.sub("big")
            n = 200  # ~3 MB: far more than the kernel's socket buffers
            for i in range(n):
                await pub.pub("big", {"i": i, "p": payload})
            assert [(await fast.next_event(10)).args["i"] for _ in range(n)] == list(range(n))
            got = [json.loads(await asyncio.wait_for(slow.recv(), 10))["payload"]["args"]["i"] for _ in range(n)]
            assert got == list(range(n))
            # caught up: written natively again
            await pub.pub("big", {"i": n, "p": ""})
            assert json.loads(await asyncio.wait_for(slow.recv(), 10))["payload"]["args"]["i"] == n
        await slow.close()
        assert server.stats.rejections.get("slow_consumer", 0) == 0
    finally:
        await server.aclose()
        await broker.aclose()


async def test_a_reader_that_stops_is_dropped() -> None:
    server, broker = await serve(max_write_buffer=256 << 10)
    try:
        stopped = await raw_subscriber(server.url, "big", max_queue=1)  # never reads again
        async with connect(server.url) as fast, connect(server.url) as pub:
            await fast.sub("big")
            n = 1000  # 16 MB: more than the kernel buffers on both sides can hold
            for i in range(n):
                await pub.pub("big", {"i": i, "p": "x" * 16_000})
            assert [(await fast.next_event(10)).args["i"] for _ in range(n)] == list(range(n))
            # every event was written or queued for it by now: it was dropped on the way
            assert server.stats.rejections.get("slow_consumer", 0) == 1
            assert server.stats.closed.get("slow_consumer", 0) == 1
        stopped.transport.abort()  # it never reads its end of the connection
    finally:
        await server.aclose()
        await broker.aclose()


async def test_unsubscribes_during_delivery() -> None:
    server, broker = await serve()
    try:
        clients = [await connect(server.url).__aenter__() for _ in range(20)]
        pub = await connect(server.url).__aenter__()
        for c in clients:
            await c.sub("burst")
        n = 200

        async def publish() -> None:
            for i in range(n):
                await pub.pub("burst", i)

        task = asyncio.get_running_loop().create_task(publish())
        await asyncio.sleep(0)
        leaving = clients[::2]
        await asyncio.gather(*(c.unsb("burst") for c in leaving))
        await task
        for c in clients[1::2]:  # stayed: everything, in order
            assert [(await c.next_event(10)).args for _ in range(n)] == list(range(n))
        for c in leaving:  # left: a prefix, in order, nothing after
            got = []
            while True:
                try:
                    got.append((await c.next_event(0.3)).args)
                except TimeoutError:
                    break
            assert got == list(range(len(got)))
        for c in [*clients, pub]:
            await c.aclose()
        assert server.subscriptions.channels() == {}
    finally:
        await server.aclose()
        await broker.aclose()


async def test_a_connection_joining_in_the_turn_of_an_event_does_not_get_it() -> None:
    """An event queued for the hub in this loop turn belongs to the subscribers
    it was queued for: a connection that joins (its SUB taking effect at the
    broker's barrier) before the turn's batch is written must not get it, as
    with Redis's own semantics (no event published before a SUBSCRIBE took
    effect)."""
    from juggler.broker.base import Event

    server, broker = await serve()
    try:
        async with connect(server.url) as a, connect(server.url) as b:
            await a.sub("ch")
            subs = server.subscriptions
            conn_b = next(conn for conn in server.conns if not subs.of(conn))
            sub = subs._subs[(False, "ch")]
            subs.deliver(sub, Event("ch", None, "11111111-1111-1111-1111-111111111111", b"1"))
            subs._join(conn_b, sub)  # as the barrier does, in the same turn
            subs.deliver(sub, Event("ch", None, "22222222-2222-2222-2222-222222222222", b"2"))
            assert (await a.next_event(5)).args == 1
            assert (await a.next_event(5)).args == 2
            assert (await b.next_event(5)).args == 2  # only what came after its join
    finally:
        await server.aclose()
        await broker.aclose()


async def test_tls_and_middleware_connections_get_events_through_python(pki: Any) -> None:
    """Connections the hub cannot write (TLS; a server with outgoing middleware)
    get the same events, in order."""
    seen: list[int] = []

    async def count(conn: Any, msg: Any, nxt: Any) -> None:
        if getattr(msg, "type", None) == 10:
            seen.append(1)
        await nxt(conn, msg)

    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0), middleware=[count])
    await server.start()
    try:
        async with connect(server.url) as a, connect(server.url) as pub:
            await a.sub("mw")
            for i in range(50):
                await pub.pub("mw", i)
            assert [(await a.next_event(5)).args for _ in range(50)] == list(range(50))
        assert len(seen) == 50
    finally:
        await server.aclose()
        await broker.aclose()
    leaf = pki.leaf()
    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0, tls_cert=str(leaf.cert), tls_key=str(leaf.key)))
    await server.start()
    try:
        from rustext.tls import ClientTls

        tls = ClientTls(ca=str(pki.ca))
        async with connect(server.url, tls=tls) as a, connect(server.url, tls=tls) as pub:
            await a.sub("tls")
            for i in range(50):
                await pub.pub("tls", i)
            assert [(await a.next_event(5)).args for _ in range(50)] == list(range(50))
    finally:
        await server.aclose()
        await broker.aclose()


def test_ten_thousand_subscribers() -> None:
    """10,000 websocket subscribers of one channel (the load tool in two
    processes, the server in its own): every event reaches every one, once, in order."""
    with juggler_up() as url:
        report = run_fanout(FanoutConfig(url=url, subscribers=10_000, rate=5, duration=2.0, payload_bytes=20,
                                         procs=2, settle=5.0, open_timeout=60.0))
    assert not report.error_messages, report.error_messages[:3]
    assert report.published >= 10
    assert report.expected == report.published * 10_000
    assert report.delivered == report.expected and report.lost == 0
    assert report.duplicates == 0 and report.out_of_order == 0
