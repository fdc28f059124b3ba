"""The Redis broker against a real redis-server: the broker as a whole
(broker.py): the interfaces, recovery after a Redis restart."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aredis
from redis_helpers import CONN, U1, U2, numsub_is, upstream_push

from juggler.broker.base import (
    BrokerError,
    CalleeBroker,
    CallerBroker,
    Event,
    PubSubBroker,
    Result,
)
from juggler.broker.redis import (
    RedisBroker,
    RedisBrokerConfig,
    result_key,
    result_ttl_key,
)
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)


async def test_implements_the_interfaces(broker: RedisBroker) -> None:
    assert isinstance(broker, CallerBroker)
    assert isinstance(broker, CalleeBroker)
    assert isinstance(broker, PubSubBroker)


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
            await wait_until(lambda: numsub_is(r, "restart.ch", 1), timeout=15)
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
