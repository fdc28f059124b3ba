"""The Redis broker against a real redis-server: the results listener
(results.py): routing, expiry, batches."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aredis
from redis_helpers import CONN, U1, U2, upstream_push

from juggler.broker.base import Result
from juggler.broker.redis import (
    RedisBroker,
    result_key,
    result_ttl_key,
)
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)


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
