"""The Redis broker against a real redis-server: exact keys, scripts, TTLs,
capacity, batching, requeue, shared pub-sub with reference counting."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from juggler.broker.base import BrokerError, CalleeBroker, CallerBroker, CapacityExceeded, Event, PubSubBroker, Result
from juggler.broker.redis import (
    POP_CHECK_SCRIPT,
    PUSH_SCRIPT,
    RedisBroker,
    RedisBrokerConfig,
    call_key,
    call_ttl_key,
    group_by_slot,
    key_slot,
    result_key,
    result_ttl_key,
)
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)

UPSTREAM_PUSH_SHA = "b0cdecc8e595fb86f90aa79d69ba149d92d94b0b"
UPSTREAM_POP_SHA = "f17b6ff7e39434a85d2df60188240da5d1e4d65b"
U1 = "d11bff91-58fb-4e20-87ca-8c221fccbb49"
U2 = "982ea198-679c-4ab2-a0a5-6f9626821755"
CONN = "46d0ff32-efe4-409c-a7eb-2e94fde9ae32"


@pytest.fixture
async def r(redis_url: str) -> AsyncIterator[aredis.Redis]:
    client = aredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def broker(redis_url: str) -> AsyncIterator[RedisBroker]:
    b = RedisBroker(RedisBrokerConfig(url=redis_url, block_timeout=0.5))
    await b.start()
    yield b
    await b.aclose()


def test_scripts_are_upstreams_byte_for_byte() -> None:
    assert PUSH_SCRIPT.sha.decode() == UPSTREAM_PUSH_SHA
    assert POP_CHECK_SCRIPT.sha.decode() == UPSTREAM_POP_SHA
    assert hashlib.sha1(PUSH_SCRIPT.body).hexdigest() == UPSTREAM_PUSH_SHA


def test_keys_and_slots() -> None:
    assert call_key("test.echo") == "juggler:calls:{test.echo}"
    assert call_ttl_key("test.echo", U1) == f"juggler:calls:timeout:{{test.echo}}:{U1}"
    assert result_key(CONN) == f"juggler:results:{{{CONN}}}"
    assert result_ttl_key(CONN, U1) == f"juggler:results:timeout:{{{CONN}}}:{U1}"
    # CLUSTER KEYSLOT values
    assert key_slot("foo") == 12182
    assert key_slot("123456789") == 12739
    assert key_slot(call_key("a")) == key_slot(call_ttl_key("a", U1)) == key_slot("a")
    assert key_slot(result_key(CONN)) == key_slot(result_ttl_key(CONN, U2))
    groups = group_by_slot(["test.echo", "test.reverse", "test.delay", "{x}a", "{x}b"])
    assert sorted(u for g in groups.values() for u in g) == sorted(["test.echo", "test.reverse", "test.delay", "{x}a", "{x}b"])
    assert any(set(g) >= {"{x}a", "{x}b"} for g in groups.values())


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        RedisBrokerConfig(call_cap=-1)
    with pytest.raises(ValueError):
        RedisBrokerConfig(url="http://nope")
    with pytest.raises(ValueError):
        RedisBrokerConfig(block_timeout=0)


async def test_implements_the_interfaces(broker: RedisBroker) -> None:
    assert isinstance(broker, CallerBroker)
    assert isinstance(broker, CalleeBroker)
    assert isinstance(broker, PubSubBroker)


async def test_call_layout_is_upstreams(redis_url: str, r: aredis.Redis) -> None:
    async with RedisBroker(url=redis_url, conn_uuid=CONN) as b:
        await b.call(U1, "test.echo", b'"hello"', 5000)
        await b.call(U2, "capture.nosuch", None, 300)
    items = await r.lrange("juggler:calls:{test.echo}", 0, -1)
    assert items == [
        ('{"conn_uuid":"%s","msg_uuid":"%s","uri":"test.echo","args":"hello"}' % (CONN, U1)).encode()
    ]
    assert await r.get(f"juggler:calls:timeout:{{test.echo}}:{U1}") == b"5000"
    assert 0 < await r.pttl(f"juggler:calls:timeout:{{test.echo}}:{U1}") <= 5000
    # no args: the key is left out (upstream's omitempty)
    (item,) = await r.lrange("juggler:calls:{capture.nosuch}", 0, -1)
    assert json.loads(item) == {"conn_uuid": CONN, "msg_uuid": U2, "uri": "capture.nosuch"}
    # the scripts are cached under upstream's SHA1s
    assert await r.script_exists(UPSTREAM_PUSH_SHA, UPSTREAM_POP_SHA) == [True, True]


async def test_invalid_timeout_is_a_broker_error(broker: RedisBroker, r: aredis.Redis) -> None:
    with pytest.raises(BrokerError):
        await broker.call(U1, "test.echo", b'"x"', 0)
    with pytest.raises(BrokerError):
        await broker.call(U1, "test.echo", b'"x"', -1)
    assert await r.llen(call_key("test.echo")) == 0


async def test_call_capacity(redis_url: str, r: aredis.Redis) -> None:
    async with RedisBroker(url=redis_url, call_cap=2) as b:
        await b.call(U1, "cap.uri", b"1", 5000)
        await b.call(U2, "cap.uri", b"2", 5000)
        with pytest.raises(CapacityExceeded, match="list capacity exceeded"):
            await b.call("11111111-1111-4111-8111-111111111111", "cap.uri", b"3", 5000)
        assert b.stats.call_failures == 1
    items = await r.lrange(call_key("cap.uri"), 0, -1)
    assert [json.loads(i)["args"] for i in items] == [2, 1]  # the refused one was trimmed


async def test_script_reloaded_after_flush(broker: RedisBroker, r: aredis.Redis) -> None:
    await r.script_flush()
    await broker.call(U1, "test.echo", b'"again"', 5000)  # NOSCRIPT -> EVAL, as redigo
    assert await r.llen(call_key("test.echo")) == 1


async def upstream_push(r: aredis.Redis, ttl_key: str, list_key: str, ttl_ms: int, payload: str) -> None:
    """What the Go server/callee does (MONITOR capture): the push script via EVAL."""
    await r.eval(PUSH_SCRIPT.body.decode(), 2, ttl_key, list_key, ttl_ms, payload, 0)


async def test_results_are_routed_and_expired_ones_dropped(redis_url: str, r: aredis.Redis) -> None:
    got: list[Result] = []
    done = asyncio.Event()
    async with RedisBroker(url=redis_url, conn_uuid=CONN, block_timeout=0.3) as b:
        b.on_result(lambda res: (got.append(res), done.set() if len(got) == 2 else None))
        # as the Go callee stores results
        for u, args in ((U1, '"hello"'), (U2, '{"error":{"message":"boom"}}')):
            payload = '{"conn_uuid":"%s","msg_uuid":"%s","uri":"test.echo","args":%s}' % (CONN, u, args)
            await upstream_push(r, result_ttl_key(CONN, u), result_key(CONN), 4997, payload)
        # a result whose TTL key is gone: popped and dropped
        stale = "33333333-3333-4333-8333-333333333333"
        await r.lpush(result_key(CONN), '{"conn_uuid":"%s","msg_uuid":"%s","uri":"x","args":1}' % (CONN, stale))
        async with asyncio.timeout(5):
            await done.wait()
        await wait_until(lambda: b.stats.expired_results == 1)
    assert {(x.msg_uuid, x.args) for x in got} == {(U1, b'"hello"'), (U2, b'{"error":{"message":"boom"}}')}
    assert await r.exists(result_ttl_key(CONN, U1), result_ttl_key(CONN, U2), result_key(CONN)) == 0


async def test_results_listener_batches(redis_url: str, r: aredis.Redis) -> None:
    n = 300
    got: list[str] = []
    done = asyncio.Event()
    async with RedisBroker(url=redis_url, conn_uuid=CONN, block_timeout=0.3, result_batch=64) as b:
        pipe = r.pipeline(transaction=False)
        ids = [f"00000000-0000-4000-8000-{i:012d}" for i in range(n)]
        for u in ids:
            pipe.set(result_ttl_key(CONN, u), 5000, px=5000)
            pipe.lpush(result_key(CONN), '{"conn_uuid":"%s","msg_uuid":"%s","uri":"u","args":null}' % (CONN, u))
        await pipe.execute()

        def on(res: Result) -> None:
            got.append(res.msg_uuid)
            if len(got) == n:
                done.set()

        b.on_result(on)
        async with asyncio.timeout(10):
            await done.wait()
    assert sorted(got) == sorted(ids)


async def test_calls_stream_pop_check_and_ttl(redis_url: str, r: aredis.Redis) -> None:
    async with RedisBroker(url=redis_url, block_timeout=0.3) as b:
        payload = '{"conn_uuid":"%s","msg_uuid":"%s","uri":"test.echo","args":"hi"}' % (CONN, U1)
        await upstream_push(r, call_ttl_key("test.echo", U1), call_key("test.echo"), 5000, payload)
        # an expired call: entry without TTL key (as upstream leaves them)
        await r.lpush(call_key("test.echo"), '{"conn_uuid":"%s","msg_uuid":"%s","uri":"test.echo","args":"old"}' % (CONN, U2))
        await r.rpush(call_key("test.echo"), '{"conn_uuid":"%s","msg_uuid":"%s","uri":"test.echo","args":"old"}' % (CONN, U2))
        stream = b.calls(["test.reverse", "test.echo"])
        call = await asyncio.wait_for(stream.__anext__(), 5)
        await stream.aclose()
        assert (call.conn_uuid, call.msg_uuid, call.uri, call.args) == (CONN, U1, "test.echo", b'"hi"')
        assert 4000 < call.ttl_ms <= 5000
        assert b.stats.expired_calls >= 1
        assert await r.exists(call_ttl_key("test.echo", U1)) == 0
        # the result goes to the caller's list with the remaining TTL
        await b.send_result(Result(conn_uuid=CONN, msg_uuid=U1, uri="test.echo", args=b'"hi"'), 1234)
    assert await r.lrange(result_key(CONN), 0, -1) == [
        ('{"conn_uuid":"%s","msg_uuid":"%s","uri":"test.echo","args":"hi"}' % (CONN, U1)).encode()
    ]
    assert await r.get(result_ttl_key(CONN, U1)) == b"1234"


async def test_closing_a_stream_requeues_unconsumed_calls(redis_url: str, r: aredis.Redis) -> None:
    ids = [f"00000000-0000-4000-8000-{i:012d}" for i in range(5)]
    async with RedisBroker(url=redis_url, block_timeout=0.3, call_batch=10) as caller:
        for u in ids:
            await caller.call(u, "rq.uri", b'"x"', 10_000)
    async with RedisBroker(url=redis_url, block_timeout=0.3, call_batch=10) as b:
        stream = b.calls(["rq.uri"])
        first = await asyncio.wait_for(stream.__anext__(), 5)
        assert first.msg_uuid == ids[0]  # FIFO
        await stream.aclose()
    # the 4 others are back, in order, with live TTL keys
    left = [json.loads(x)["msg_uuid"] for x in await r.lrange(call_key("rq.uri"), 0, -1)]
    assert left[::-1] == ids[1:]
    for u in ids[1:]:
        assert 0 < await r.pttl(call_ttl_key("rq.uri", u)) <= 10_000
    assert await r.exists(call_ttl_key("rq.uri", ids[0])) == 0


async def test_cancelled_blocking_pop_loses_no_call(redis_url: str, r: aredis.Redis) -> None:
    async with RedisBroker(url=redis_url, block_timeout=5.0) as b:
        stream = b.calls(["cancel.uri"])
        task = asyncio.create_task(stream.__anext__())
        await wait_until(lambda: _blocked(r))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # a call pushed now may be popped by the orphaned BLMPOP: it must come back
        async with RedisBroker(url=redis_url) as caller:
            await caller.call(U1, "cancel.uri", b"1", 10_000)
        await wait_until(lambda: _llen_is(r, call_key("cancel.uri"), 1))
        assert await r.exists(call_ttl_key("cancel.uri", U1)) == 1


async def _blocked(r: aredis.Redis) -> bool:
    info = await r.info("clients")
    return int(info["blocked_clients"]) >= 1


async def _llen_is(r: aredis.Redis, key: str, n: int) -> bool:
    return await r.llen(key) == n


# --- pub-sub -------------------------------------------------------------------------


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
    await wait_until(lambda: _numsub_is(r, "news.a", 0))
    await broker.unsubscribe_all("A")
    await wait_until(lambda: _numpat_is(r, 0))
    await wait_until(lambda: broker.stats.redis_subscriptions == 0)


async def _numsub_is(r: aredis.Redis, ch: str, n: int) -> bool:
    return await r.pubsub_numsub(ch) == [(ch.encode(), n)]


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
    await wait_until(lambda: _numsub_is(r, "resub", 1))
    await broker.publish("resub", U1, b"1")
    await wait_until(lambda: len(got) == 1)


async def test_calls_of_one_loop_turn_are_pushed_together(redis_url: str, r: aredis.Redis) -> None:
    ids = [f"00000000-0000-4000-8000-{i:012d}" for i in range(5)]
    async with RedisBroker(url=redis_url, call_cap=3, conn_uuid=CONN) as b:
        await r.config_resetstat()
        outcomes = await asyncio.gather(
            *(b.call(u, "many.uri", b'"%d"' % i, 5000) for i, u in enumerate(ids)), return_exceptions=True
        )
        stats = await r.info("commandstats")
    assert outcomes[:3] == [None, None, None]
    assert all(isinstance(o, CapacityExceeded) for o in outcomes[3:])
    assert stats["cmdstat_evalsha"]["calls"] == 1  # one script run for the five
    items = [json.loads(x) for x in await r.lrange(call_key("many.uri"), 0, -1)]
    assert [(x["msg_uuid"], x["args"]) for x in items[::-1]] == [(ids[i], str(i)) for i in range(3)]
    for i, u in enumerate(ids):
        assert await r.get(call_ttl_key("many.uri", u)) == b"5000"  # as upstream: the TTL key stays even when refused


async def test_send_results_batches_per_caller(redis_url: str, r: aredis.Redis) -> None:
    other = "55e1ed51-23af-49a4-bbfd-1e9eac477f0f"
    async with RedisBroker(url=redis_url) as b:
        out = await b.send_results([
            (Result(conn_uuid=CONN, msg_uuid=U1, uri="u", args=b"1"), 3000),
            (Result(conn_uuid=other, msg_uuid=U2, uri="u", args=None), 2000),
            (Result(conn_uuid=CONN, msg_uuid=U2, uri="u", args=b'"x"'), 1000),
        ])
    assert out == [None, None, None]
    assert [json.loads(x)["msg_uuid"] for x in await r.lrange(result_key(CONN), 0, -1)] == [U2, U1]
    assert json.loads((await r.lrange(result_key(other), 0, -1))[0]) == {"conn_uuid": other, "msg_uuid": U2, "uri": "u"}
    assert await r.get(result_ttl_key(CONN, U1)) == b"3000"
    assert await r.get(result_ttl_key(other, U2)) == b"2000"


async def test_recovers_after_a_redis_restart() -> None:
    from tests.netutil import free_port, start_redis

    port = free_port()
    server = start_redis(port=port)
    dirs = []
    url = f"redis://127.0.0.1:{port}/0"
    got_results: list[Result] = []
    got_events: list[Event] = []
    b = RedisBroker(RedisBrokerConfig(url=url, block_timeout=0.3, conn_uuid=CONN, connect_timeout=1.0))
    try:
        b.on_result(got_results.append)
        await b.start()
        await b.subscribe("S", "restart.ch", False, got_events.append)
        server.stop()
        dirs.append(server.dir)
        with pytest.raises(BrokerError):
            await b.call(U1, "x", b"1", 1000)  # refused while Redis is down: the server NACKs
        server = start_redis(port=port)
        r = aredis.Redis.from_url(url)
        try:
            async def call_ok() -> bool:
                try:
                    await b.call(U1, "x", b"1", 1000)
                    return True
                except BrokerError:
                    return False

            await wait_until(call_ok, timeout=15)
            # the pub-sub connection came back and re-subscribed by itself
            await wait_until(lambda: _numsub_is(r, "restart.ch", 1), timeout=15)
            await r.publish("restart.ch", json.dumps({"msg_uuid": U2, "args": 1}))
            await wait_until(lambda: len(got_events) == 1)
            # and so did the results listener
            payload = '{"conn_uuid":"%s","msg_uuid":"%s","uri":"x","args":2}' % (CONN, U2)
            await upstream_push(r, result_ttl_key(CONN, U2), result_key(CONN), 5000, payload)
            await wait_until(lambda: len(got_results) == 1, timeout=15)
        finally:
            await r.aclose()
    finally:
        await b.aclose()
        server.stop()
        import shutil

        for d in [*dirs, server.dir]:
            shutil.rmtree(d, ignore_errors=True)


async def test_brpop_fallback_for_redis_before_7(redis_url: str) -> None:
    """Redis 6.2 has no BLMPOP: BRPOP + RPOP count, same results."""
    got: list[Result] = []
    done = asyncio.Event()
    async with RedisBroker(url=redis_url, conn_uuid=CONN, block_timeout=0.3) as caller, \
            RedisBroker(url=redis_url, block_timeout=0.3, call_batch=4) as callee:
        caller._has_blmpop = False
        callee._has_blmpop = False

        def on(res: Result) -> None:
            got.append(res)
            if len(got) == 6:
                done.set()

        caller.on_result(on)
        ids = [f"00000000-0000-4000-8000-{i:012d}" for i in range(6)]
        for u in ids:
            await caller.call(u, "fb.uri", b'"x"', 5000)
        stream = callee.calls(["fb.uri"])
        seen = []
        async with asyncio.timeout(5):
            while len(seen) < 6:
                call = await stream.__anext__()
                seen.append(call.msg_uuid)
                await callee.send_result(Result(conn_uuid=call.conn_uuid, msg_uuid=call.msg_uuid, uri=call.uri,
                                                args=b'"ok"'), call.ttl_ms)
        await stream.aclose()
        assert seen == ids  # FIFO through the batches
        async with asyncio.timeout(5):
            await done.wait()
    assert sorted(r.msg_uuid for r in got) == ids


async def test_a_busy_uri_does_not_starve_the_others(redis_url: str, r: aredis.Redis) -> None:
    async with RedisBroker(url=redis_url, block_timeout=0.3, call_batch=5) as b:
        for i in range(50):
            await b.call(f"00000000-0000-4000-8000-{i:012d}", "busy.uri", b"1", 10_000)
        await b.call(U1, "quiet.uri", b"2", 10_000)
        stream = b.calls(["busy.uri", "quiet.uri"])
        seen = []
        async with asyncio.timeout(5):
            while U1 not in seen:
                seen.append((await stream.__anext__()).msg_uuid)
        await stream.aclose()
        assert len(seen) <= 15  # served within a few batches, not after the 50 busy ones


async def test_a_joining_subscriber_gets_only_later_messages(broker: RedisBroker, r: aredis.Redis) -> None:
    """Redis semantics survive the shared connection: a message already on its
    way when B subscribes reaches A (subscribed before) but not B."""
    a: list[Event] = []
    b: list[Event] = []
    await broker.subscribe("A", "join.ch", False, a.append)
    transport = broker._pubsub._transport  # type: ignore[union-attr]
    transport.pause_reading()  # the broker has not read M1 when B subscribes
    await r.publish("join.ch", json.dumps({"msg_uuid": U1, "args": "M1"}))
    joining = asyncio.create_task(broker.subscribe("B", "join.ch", False, b.append))
    await wait_until(lambda: broker._pings, what="B's PING written behind M1")
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
    await wait_until(lambda: (sub := broker._subs.get((False, "flip.ch"))) and sub.state == "subscribing",
                     interval=0, what="SUBSCRIBE sent")
    await broker.unsubscribe("A", "flip.ch", False)
    t2 = asyncio.create_task(broker.subscribe("B", "flip.ch", False, got.append))
    await asyncio.wait_for(asyncio.gather(t1, t2), 5)
    await wait_until(lambda: _numsub_is(r, "flip.ch", 1))
    await broker.publish("flip.ch", U1, b"1")
    await wait_until(lambda: len(got) == 1)
    await broker.unsubscribe("B", "flip.ch", False)
    await wait_until(lambda: _numsub_is(r, "flip.ch", 0))


async def test_pubsub_health_ping_detects_a_dead_connection(redis_url: str, r: aredis.Redis) -> None:
    got: list[Event] = []
    async with RedisBroker(url=redis_url, pubsub_health_interval=0.2) as b:
        await b.subscribe("S", "health.ch", False, got.append)
        first = b._pubsub
        assert first is not None
        first._transport.pause_reading()  # type: ignore[union-attr]  # a silent, half-dead peer
        await wait_until(lambda: b._pubsub is not first and b._pubsub is not None
                                       and not b._pubsub.closed and b.stats.redis_subscriptions == 1)
        await b.publish("health.ch", U1, b"1")
        await wait_until(lambda: len(got) == 1)
