"""juggler/limits.py: the token bucket and every per-connection limit of the
server (connections, message rate, calls in flight, slow consumers)."""

from __future__ import annotations

import json

import pytest
from test_server import call, recv, stack, ws
from websockets.exceptions import ConnectionClosed, InvalidStatus

import rustext
from tests.netutil import wait_until
from juggler.client import ACK, NACK
from juggler.limits import TokenBucket

pytestmark = pytest.mark.timeout(60)


def test_token_bucket() -> None:
    b = TokenBucket(10, 2, now=0.0)
    assert b.take(0.0) and b.take(0.0) and not b.take(0.0)
    assert not b.take(0.05)
    assert b.take(0.1)
    assert b.take(10.0) and b.take(10.0) and not b.take(10.0)  # never more than the burst


async def test_max_connections_refuses_with_503() -> None:
    async with stack(max_connections=2, callees=False) as server:
        async with ws(server), ws(server):
            with pytest.raises(InvalidStatus) as info:
                async with ws(server):
                    pass
            assert info.value.response.status_code == 503
        assert server.stats.rejections == {"max_connections": 1}


async def test_rate_limit_nacks_429_in_order() -> None:
    async with stack(rate_limit=0.001, rate_burst=3, callees=False) as server, ws(server) as c:
        uids = []
        for i in range(6):
            uid = rustext.new_uuid()
            uids.append(uid)
            await c.send(rustext.build_pub(uid, "ch", str(i).encode()).decode())
        replies = [await recv(c) for _ in range(6)]
        assert [m["payload"]["for"] for m in replies] == uids
        assert [m["meta"]["type"] for m in replies] == [ACK] * 3 + [NACK] * 3
        assert {m["payload"]["code"] for m in replies[3:]} == {429}
        assert server.stats.rejections == {"rate_limited": 3}


async def test_rate_limit_close_action() -> None:
    async with stack(rate_limit=0.001, rate_burst=2, rate_limit_action="close", callees=False) as server:
        async with ws(server) as c:
            for _ in range(4):
                await c.send(rustext.build_pub(rustext.new_uuid(), "ch", b"1").decode())
            assert (await recv(c))["meta"]["type"] == ACK
            assert (await recv(c))["meta"]["type"] == ACK
            with pytest.raises(ConnectionClosed) as info:
                await recv(c)
            assert info.value.rcvd is not None and info.value.rcvd.code == 1008
        assert server.stats.closed.get("rate_limited") == 1


async def test_max_inflight_calls_nacks_429() -> None:
    async with stack(max_inflight_calls=2) as server, ws(server) as c:
        sent = [call("test.delay", "300") for _ in range(3)]
        for _, f in sent:
            await c.send(f)
        msgs = [await recv(c) for _ in range(3)]
        assert [m["meta"]["type"] for m in msgs] == [ACK, ACK, NACK]
        assert msgs[2]["payload"]["code"] == 429
        got = {(await recv(c))["payload"]["for"] for _ in range(2)}
        assert got == {sent[0][0], sent[1][0]}
        # answered: room again
        uid, f = call("test.echo", "again")
        await c.send(f)
        assert (await recv(c))["meta"]["type"] == ACK
        assert server.stats.rejections == {"inflight_limit": 1}


async def test_slow_consumer_is_dropped_and_counted() -> None:
    async with stack(max_write_buffer=64 * 1024, callees=False) as server:
        async with ws(server, max_queue=1) as lazy, ws(server) as pub:
            await lazy.send(rustext.build_sub(rustext.new_uuid(), "flood").decode())
            await recv(lazy)
            big = json.dumps("x" * 20_000).encode()
            for _ in range(1500):  # ~30 MB: more than the socket buffers hold
                await pub.send(rustext.build_pub(rustext.new_uuid(), "flood", big).decode())
            for _ in range(1500):
                await recv(pub)
            # the lazy one is gone, the publisher is not
            await wait_until(lambda: server.stats.connections_active == 1, what="the slow consumer dropped")
            assert server.stats.rejections.get("slow_consumer") == 1
            assert server.stats.closed.get("slow_consumer") == 1
