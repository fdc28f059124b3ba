"""The Redis broker against a real redis-server: blocking pops (pops.py): pop
checks and TTLs, requeues, cancellation, BRPOP fallback, fairness."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aredis
from redis_helpers import CONN, U1, U2, upstream_push

from juggler.broker.base import Result
from juggler.broker.redis import (
    RedisBroker,
    call_key,
    call_ttl_key,
    result_key,
    result_ttl_key,
)
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)


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
