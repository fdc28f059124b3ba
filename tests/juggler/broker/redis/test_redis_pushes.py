"""The Redis broker against a real redis-server: pushes, pipelined per loop
turn (pushes.py): upstream's call layout, capacity, NOSCRIPT, batching."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aredis
from redis_helpers import CONN, U1, U2, UPSTREAM_POP_SHA, UPSTREAM_PUSH_SHA

from juggler.broker.base import (
    BrokerError,
    CapacityExceeded,
    Result,
)
from juggler.broker.redis import (
    RedisBroker,
    call_key,
    call_ttl_key,
    result_key,
    result_ttl_key,
)

pytestmark = pytest.mark.timeout(60)


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
