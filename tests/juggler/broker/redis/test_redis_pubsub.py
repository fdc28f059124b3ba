"""The Redis broker against a real redis-server: the shared pub-sub connection
(pubsub.py): reference counting, fan-out, patterns, reconnects, barriers,
health."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aredis
from redis_helpers import U1, U2, numsub_is

from juggler.broker.base import Event
from juggler.broker.redis import RedisBroker
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)


async def test_pubsub_refcounting_and_fanout(broker: RedisBroker, r: aredis.Redis) -> None:
    a: list[Event] = []
    b: list[Event] = []
    await broker.subscribe("A", "news.a", False, a.append)
    await broker.subscribe("A", "news.a", False, a.append)  # twice counts once
    await broker.subscribe("B", "news.a", False, b.append)
    await broker.subscribe("A", "news.*", True, a.append)
    assert await r.pubsub_numsub("news.a") == [(b"news.a", 1)]  # one Redis subscription for both
    assert await r.pubsub_numpat() == 1

    await broker.publish("news.a", U1, b'{"x":1}')
    await wait_until(lambda: len(a) == 2 and len(b) == 1)
    assert sorted((e.channel, e.pattern or "", e.msg_uuid, e.args) for e in a) == sorted(
        [("news.a", "", U1, b'{"x":1}'), ("news.a", "news.*", U1, b'{"x":1}')]
    )
    # no args -> None; a raw Redis PUBLISH of the payload shape reaches subscribers
    await r.publish("news.a", json.dumps({"msg_uuid": U2, "args": {"from": "redis"}}))
    await broker.publish("news.b", U1, None)
    await wait_until(lambda: len(b) == 2 and len(a) == 5)
    assert b[1].msg_uuid == U2 and json.loads(b[1].args) == {"from": "redis"}
    assert [e for e in a if e.channel == "news.b"][0].args is None

    await broker.unsubscribe("A", "news.a", False)  # one UNSB removes it for A
    assert await r.pubsub_numsub("news.a") == [(b"news.a", 1)]  # B still there
    await broker.unsubscribe("A", "never.subscribed", False)  # a no-op
    await broker.unsubscribe_all("B")
    await wait_until(lambda: numsub_is(r, "news.a", 0))
    await broker.unsubscribe_all("A")
    await wait_until(lambda: _numpat_is(r, 0))
    await wait_until(lambda: broker.stats.redis_subscriptions == 0)


async def _numpat_is(r: aredis.Redis, n: int) -> bool:
    return await r.pubsub_numpat() == n


async def test_pubsub_glob_patterns(broker: RedisBroker) -> None:
    got: list[Event] = []
    await broker.subscribe("S", "h?llo.[ab]", True, got.append)
    for ch in ("hello.a", "hallo.b", "hllo.a", "hello.c"):
        await broker.publish(ch, U1, b"1")
    await broker.publish("end", U1, b"1")
    await wait_until(lambda: len(got) == 2)
    assert sorted(e.channel for e in got) == ["hallo.b", "hello.a"]


async def test_one_pubsub_connection_for_many_subscribers(redis_url: str, r: aredis.Redis) -> None:
    async with RedisBroker(url=redis_url, block_timeout=0.3) as b:
        b.on_result(lambda res: None)
        for i in range(200):
            await b.subscribe(f"sub{i}", f"ch.{i % 7}", False, lambda e: None)
        await b.call(U1, "x", b"1", 1000)
        clients = await r.client_list()
        # this test's redis-py client + the broker: results listener, pub-sub, pool
        assert len(clients) <= 1 + 4, clients
        assert sum(int(c["sub"]) for c in clients) == 7


async def test_pubsub_survives_a_killed_connection(broker: RedisBroker, r: aredis.Redis) -> None:
    got: list[Event] = []
    await broker.subscribe("S", "resub", False, got.append)
    await r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    await wait_until(lambda: numsub_is(r, "resub", 1))
    await broker.publish("resub", U1, b"1")
    await wait_until(lambda: len(got) == 1)


async def test_a_joining_subscriber_gets_only_later_messages(broker: RedisBroker, r: aredis.Redis) -> None:
    """Redis semantics survive the shared connection: a message already on its
    way when B subscribes reaches A (subscribed before) but not B."""
    a: list[Event] = []
    b: list[Event] = []
    await broker.subscribe("A", "join.ch", False, a.append)
    transport = broker._fanout.conn._transport  # type: ignore[union-attr]
    transport.pause_reading()  # the broker has not read M1 when B subscribes
    await r.publish("join.ch", json.dumps({"msg_uuid": U1, "args": "M1"}))
    joining = asyncio.create_task(broker.subscribe("B", "join.ch", False, b.append))
    await wait_until(lambda: broker._fanout._pings, what="B's PING written behind M1")
    assert not joining.done()
    transport.resume_reading()
    await asyncio.wait_for(joining, 5)
    await r.publish("join.ch", json.dumps({"msg_uuid": U2, "args": "M2"}))
    await wait_until(lambda: len(a) == 2 and len(b) == 1)
    assert [e.msg_uuid for e in a] == [U1, U2]
    assert [e.msg_uuid for e in b] == [U2]


async def test_subscribe_unsubscribe_subscribe_in_flight(broker: RedisBroker, r: aredis.Redis) -> None:
    """SUB, UNSB, SUB before Redis answered: the channel ends up subscribed once."""
    got: list[Event] = []
    t1 = asyncio.create_task(broker.subscribe("A", "flip.ch", False, got.append))
    # every loop turn: SUBSCRIBE is written but Redis has not answered yet
    await wait_until(lambda: (sub := broker._fanout._subs.get((False, "flip.ch"))) and sub.state == "subscribing",
                     interval=0, what="SUBSCRIBE sent")
    await broker.unsubscribe("A", "flip.ch", False)
    t2 = asyncio.create_task(broker.subscribe("B", "flip.ch", False, got.append))
    await asyncio.wait_for(asyncio.gather(t1, t2), 5)
    await wait_until(lambda: numsub_is(r, "flip.ch", 1))
    await broker.publish("flip.ch", U1, b"1")
    await wait_until(lambda: len(got) == 1)
    await broker.unsubscribe("B", "flip.ch", False)
    await wait_until(lambda: numsub_is(r, "flip.ch", 0))


async def test_pubsub_health_ping_detects_a_dead_connection(redis_url: str, r: aredis.Redis) -> None:
    got: list[Event] = []
    async with RedisBroker(url=redis_url, pubsub_health_interval=0.2) as b:
        await b.subscribe("S", "health.ch", False, got.append)
        first = b._fanout.conn
        assert first is not None
        first._transport.pause_reading()  # type: ignore[union-attr]  # a silent, half-dead peer
        await wait_until(lambda: b._fanout.conn is not first and b._fanout.conn is not None
                                       and not b._fanout.conn.closed and b.stats.redis_subscriptions == 1)
        await b.publish("health.ch", U1, b"1")
        await wait_until(lambda: len(got) == 1)


async def test_barrier_runs_between_earlier_and_later_messages(broker: RedisBroker, r: aredis.Redis) -> None:
    """A barrier's callback runs after every message published before it was
    asked for and before any published after: where the server joins a
    connection to a channel it already subscribes (Redis's own semantics)."""
    seen: list[str] = []
    await broker.subscribe("S", "bar", False, lambda ev: seen.append(ev.msg_uuid))
    for _ in range(3):
        await broker.publish("bar", U1, b"1")  # acknowledged: on its way to the pub-sub connection
        await broker.barrier(lambda: seen.append("barrier"))
        await broker.publish("bar", U2, b"2")
    await wait_until(lambda: len(seen) == 9)
    assert seen == [U1, "barrier", U2] * 3
