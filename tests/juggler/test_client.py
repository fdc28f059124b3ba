"""The asyncio client against a real server (`juggler up`, a subprocess)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from jugglerprocs import juggler_up

from tests.netutil import free_port, wait_until
from juggler.client import ACK, CALL, RES, ClientEvent, connect, encode_message
from juggler.errors import CallExpired, CallNacked, ConnectionClosed

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with juggler_up() as u:
        yield u


def test_encode_message() -> None:
    assert encode_message(CALL, "u", {"uri": "a", "timeout": 5}, "[1]") == (
        '{"meta":{"type":1,"uuid":"u"},"payload":{"uri":"a","timeout":5,"args":[1]}}'
    )
    assert encode_message(2, "u", {}, "null") == '{"meta":{"type":2,"uuid":"u"},"payload":{"args":null}}'
    assert json.loads(encode_message(3, "u", {"channel": "é", "pattern": True}))["payload"]["channel"] == "é"


async def test_calls(url: str) -> None:
    async with connect(url) as c:
        assert c.subprotocol == "juggler.0"
        assert await c.call("test.echo", "hello", timeout=5) == "hello"
        assert await c.call("test.reverse", "héllo 🎉", timeout=5) == "🎉 olléh"
        assert await c.call("test.delay", "20", timeout=5) == 20
        assert await c.call("test.echo", raw_args='"a<b"', timeout=5) == "a<b"
        err = await c.call("test.delay", "abc", timeout=5)  # a callee error is a result
        assert set(err) == {"error"} and err["error"]["message"]
        results = await asyncio.gather(*(c.call("test.echo", f"m{i}", timeout=5) for i in range(50)))
        assert results == [f"m{i}" for i in range(50)]


async def test_local_expiry_and_late_results(url: str) -> None:
    seen: list[int] = []
    async with connect(url, on_message=lambda msg, raw: seen.append(msg["meta"]["type"])) as c:
        with pytest.raises(CallExpired):
            await c.call("test.delay", "1000", timeout=0.1)
        # a RES nobody waits for (sent raw, so no pending entry) is ignored and counted
        u = await c.send(CALL, {"uri": "test.echo", "timeout": 5_000_000_000}, raw_args='"x"')
        await wait_until(lambda: c.late_results >= 1, what="the late result counted")
        assert u
        assert await c.call("test.echo", "still fine", timeout=5) == "still fine"
    assert RES in seen and ACK in seen


async def test_nack(url: str) -> None:
    async with connect(url) as c:
        with pytest.raises(CallNacked) as info:
            await c._acked(CALL, {"uri": "test.echo", "timeout": -1_000_000}, '"x"', 5)
        assert info.value.code == 500 and info.value.message
        with pytest.raises(ValueError):
            await c.call("test.echo", "x", timeout=0)


async def test_pubsub(url: str) -> None:
    async with connect(url) as sub, connect(url) as pub:
        await sub.sub("cl.news.a")
        await sub.sub("cl.news.*", pattern=True)
        await sub.sub("cl.news.a")  # twice counts once
        pid = await pub.pub("cl.news.a", {"x": 1})
        evs = [await sub.next_event(5), await sub.next_event(5)]
        assert sorted((e.pattern or "") for e in evs) == ["", "cl.news.*"]
        assert all(e == ClientEvent("cl.news.a", e.pattern, pid, {"x": 1}) for e in evs)
        pid2 = await pub.pub("cl.news.b")  # no args -> null
        ev = await sub.next_event(5)
        assert (ev.channel, ev.pattern, ev.for_uuid, ev.args) == ("cl.news.b", "cl.news.*", pid2, None)
        await sub.unsb("cl.news.a")
        await sub.unsb("cl.news.*", pattern=True)
        await sub.unsb("cl.never")  # not subscribed: still ACKed
        await pub.pub("cl.news.a", 1)
        # a marker on a fresh subscription proves nothing else was queued before it
        await sub.sub("cl.marker")
        mid = await pub.pub("cl.marker", "m")
        ev = await sub.next_event(5)
        assert ev.for_uuid == mid


async def test_events_iterator_ends_when_closed(url: str) -> None:
    c = await connect(url)
    await c.sub("cl.iter")
    got: list[Any] = []

    async def consume() -> None:
        async for ev in c.events():
            got.append(ev)

    task = asyncio.create_task(consume())
    async with connect(url) as p:
        await p.pub("cl.iter", 7)
    await wait_until(lambda: got, what="the event")
    await c.aclose()
    await c.aclose()  # idempotent
    await asyncio.wait_for(task, 5)
    assert [e.args for e in got] == [7]
    with pytest.raises(ConnectionClosed):
        await c.call("test.echo", "x", timeout=1)


async def test_forbidden_type_closes_the_connection(url: str) -> None:
    async with connect(url, allowed_messages=["call", "pub"]) as c:
        assert await c.call("test.echo", "ok", timeout=5) == "ok"
        with pytest.raises(ConnectionClosed):
            await c.sub("cl.forbidden")
        assert c.closed


async def test_connect_failures(url: str) -> None:
    with pytest.raises(ConnectionClosed):
        await connect(f"ws://127.0.0.1:{free_port()}/ws", open_timeout=5)
    # offering only another subprotocol: the server upgrades then drops us
    c = await connect(url, subprotocols=["juggler.1"])
    assert c.subprotocol is None
    await asyncio.wait_for(c.wait_closed(), 5)
    assert c.closed
    await c.aclose()


