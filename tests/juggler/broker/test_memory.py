"""The in-memory broker: Redis semantics in one process, with a controlled clock."""

from __future__ import annotations

import asyncio

import pytest

import rustext
from juggler.broker.base import (
    BrokerError,
    CalleeBroker,
    CallerBroker,
    CapacityExceeded,
    Event,
    NoCallee,
    PubSubBroker,
    Result,
)
from juggler.broker.memory import MemoryBroker, MemoryBrokerConfig
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def uid() -> str:
    return rustext.new_uuid()


async def next_call(it, timeout: float = 2.0):  # type: ignore[no-untyped-def]
    return await asyncio.wait_for(it.__anext__(), timeout)


def test_implements_the_interfaces() -> None:
    b = MemoryBroker()
    assert isinstance(b, CallerBroker) and isinstance(b, CalleeBroker) and isinstance(b, PubSubBroker)
    with pytest.raises(ValueError):
        MemoryBrokerConfig(call_cap=-1)


async def test_calls_fifo_with_ttl_and_pop_time_expiry() -> None:
    clock = Clock()
    b = MemoryBroker(clock=clock, refuse_unserved=False)
    ids = [uid() for _ in range(3)]
    await b.call(ids[0], "u", b'"a"', 1000)
    await b.call(ids[1], "u", None, 100)
    await b.call(ids[2], "u", b' { "k" : 1 } ', 5000)
    clock.now += 0.5  # the second call has expired by the time it is popped
    it = b.calls(["u"]).__aiter__()
    c0 = await next_call(it)
    assert (c0.msg_uuid, c0.args, c0.ttl_ms, c0.conn_uuid, c0.uri) == (ids[0], b'"a"', 500, b.conn_uuid, "u")
    c2 = await next_call(it)
    assert c2.msg_uuid == ids[2] and c2.args == b'{"k":1}' and c2.ttl_ms == 4500
    assert b.stats.expired_calls == 1 and b.stats.calls_popped == 2
    await it.aclose()


async def test_blocking_pop_wakes_on_push_and_checks_uris_in_order() -> None:
    b = MemoryBroker(refuse_unserved=False)
    it = b.calls(["a", "b"]).__aiter__()
    waiter = asyncio.ensure_future(next_call(it))
    await asyncio.sleep(0)  # one loop turn: the pop runs until it waits (in-process, no I/O)
    assert not waiter.done()
    m = uid()
    await b.call(m, "b", b"1", 1000)
    assert (await waiter).msg_uuid == m
    await b.call(uid(), "b", b"1", 1000)
    first = uid()
    await b.call(first, "a", b"1", 1000)
    assert (await next_call(it)).msg_uuid == first  # like BRPOP: keys in order
    await it.aclose()


async def test_capacity_and_invalid_input() -> None:
    b = MemoryBroker(call_cap=2, refuse_unserved=False)
    await b.call(uid(), "u", None, 1000)
    await b.call(uid(), "u", None, 1000)
    with pytest.raises(CapacityExceeded, match="list capacity exceeded"):
        await b.call(uid(), "u", None, 1000)
    assert b.queued_calls("u") == 2
    with pytest.raises(BrokerError):
        await b.call(uid(), "v", None, -1)
    with pytest.raises(BrokerError):
        await b.call(uid(), "v", b"{bad", 1000)
    assert b.stats.call_failures == 3


async def test_calls_to_uris_no_callee_serves_are_refused() -> None:
    b = MemoryBroker()
    with pytest.raises(NoCallee, match="no callee serves nobody.home") as info:
        await b.call(uid(), "nobody.home", None, 1000)
    assert info.value.code == 404 and b.stats.call_failures == 1
    it = b.calls(["served"]).__aiter__()
    waiter = asyncio.ensure_future(it.__anext__())
    await wait_until(lambda: b.serves("served"), what="the callee registered")
    m = uid()
    await b.call(m, "served", None, 1000)
    assert (await asyncio.wait_for(waiter, 5)).msg_uuid == m
    await it.aclose()
    assert not b.serves("served")


async def test_results_routed_to_the_sink_and_expired_ones_dropped() -> None:
    clock = Clock()
    b = MemoryBroker(clock=clock)
    got: list[Result] = []
    b.on_result(got.append)
    m1, m2 = uid(), uid()
    await b.send_result(Result(conn_uuid=b.conn_uuid, msg_uuid=m1, uri="u", args=b"[1, 2]"), 100)
    await b.send_result(Result(conn_uuid=b.conn_uuid, msg_uuid=m2, uri="u", args=b"2"), 10)
    clock.now += 0.05  # the second result's TTL runs out before the sink pops it
    await wait_until(lambda: b.stats.expired_results + b.stats.results_received == 2, what="both results handled")
    assert [r.msg_uuid for r in got] == [m1] and got[0].args == b"[1,2]"
    assert b.stats.expired_results == 1 and b.stats.results_received == 1
    await b.send_result(Result(conn_uuid=b.conn_uuid, msg_uuid=uid(), uri="u", args=b"1"), 0)  # no time left
    with pytest.raises(BrokerError):
        await b.send_result(Result(conn_uuid=b.conn_uuid, msg_uuid=uid(), uri="u", args=b"nope"), 100)
    assert len(got) == 1


async def test_pubsub_refcounts_patterns_and_double_delivery() -> None:
    b = MemoryBroker()
    s1, s2 = object(), object()
    got1: list[Event] = []
    got2: list[Event] = []
    await b.subscribe(s1, "news.a", False, got1.append)
    await b.subscribe(s1, "news.a", False, got1.append)  # twice counts once
    await b.subscribe(s1, "news.*", True, got1.append)
    await b.subscribe(s2, "news.a", False, got2.append)
    assert b.stats.redis_subscriptions == 2  # one channel + one pattern, like Redis
    m = uid()
    await b.publish("news.a", m, b' {"x" : 1}')
    assert sorted((e.pattern or "") for e in got1) == ["", "news.*"]
    assert all(e.msg_uuid == m and e.args == b'{"x":1}' and e.channel == "news.a" for e in got1 + got2)
    assert len(got2) == 1
    await b.unsubscribe(s1, "news.a", False)  # one UNSB removes it
    await b.unsubscribe(s1, "never", False)  # not subscribed: no-op
    got1.clear()
    got2.clear()
    await b.publish("news.a", uid(), None)
    assert [e.pattern for e in got1] == ["news.*"] and got1[0].args is None and len(got2) == 1
    await b.unsubscribe_all(s1)
    await b.unsubscribe_all(s2)
    assert b.stats.redis_subscriptions == 0
    assert b.publish_now("news.a", uid(), None) == 0


async def test_aclose_ends_call_streams() -> None:
    b = MemoryBroker()
    it = b.calls(["u"]).__aiter__()
    waiter = asyncio.ensure_future(it.__anext__())
    await asyncio.sleep(0)  # one loop turn: the pop runs until it waits (in-process, no I/O)
    await b.aclose()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiter, 2)
    with pytest.raises(BrokerError):
        await b.call(uid(), "u", None, 1000)
    await b.aclose()  # idempotent
