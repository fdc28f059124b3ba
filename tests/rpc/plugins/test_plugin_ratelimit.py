"""Token buckets with a controlled clock; connection and request rate limits."""

from __future__ import annotations

import pytest

from rpc.examples import Arith
from rpc.message import META_ERROR, Message
from rpc.plugins import ConnRateLimitPlugin, PluginContainer, ReqRateLimitPlugin, TokenBucket
from rpc.service import Peer, ServiceDispatcher


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_burst_then_rate() -> None:
    clock = Clock()
    b = TokenBucket(rate=10, burst=3, clock=clock)
    assert [b.try_take() for _ in range(4)] == [True, True, True, False]
    clock.t += 0.05  # half a token
    assert not b.try_take()
    clock.t += 0.05
    assert b.try_take() and not b.try_take()
    clock.t += 100  # refill is capped at burst
    assert sum(b.try_take() for _ in range(10)) == 3
    with pytest.raises(ValueError):
        TokenBucket(0)


async def test_conn_rate_limit_refuses_connections() -> None:
    clock = Clock()
    plugin = ConnRateLimitPlugin(rate=2, burst=2, clock=clock)
    d = ServiceDispatcher(plugins=PluginContainer([plugin]))
    d.registry.register(Arith(), "Arith")
    results = [await d.session(Peer(address=f"c{i}")).accept() for i in range(3)]
    assert results == [True, True, False] and plugin.refused == 1
    clock.t += 0.5
    assert await d.session(Peer()).accept()
    await d.aclose()


def call(seq: int) -> Message:
    return Message(service_path="Arith", service_method="Add", seq=seq, payload=b'{"A":1,"B":2}')


async def test_request_rate_limit_answers_error() -> None:
    clock = Clock()
    plugin = ReqRateLimitPlugin(rate=5, burst=2, clock=clock)
    d = ServiceDispatcher(plugins=PluginContainer([plugin]))
    d.registry.register(Arith(), "Arith")
    outs = [(await d.dispatch(call(i))).reply for i in range(3)]
    assert [o.is_error for o in outs] == [False, False, True]
    assert outs[2].metadata[META_ERROR] == "request rate limit exceeded" and not outs[2].payload
    hb = (await d.dispatch(Message(heartbeat=True))).reply  # heartbeats are not limited
    assert hb is not None and not hb.is_error
    clock.t += 0.2
    assert not (await d.dispatch(call(9))).reply.is_error
    await d.aclose()


async def test_request_rate_limit_per_connection() -> None:
    clock = Clock()
    plugin = ReqRateLimitPlugin(rate=1, burst=1, per_connection=True, clock=clock)
    d = ServiceDispatcher(plugins=PluginContainer([plugin]))
    d.registry.register(Arith(), "Arith")
    p1, p2 = Peer(), Peer()
    assert not (await d.dispatch(call(1), p1)).reply.is_error
    assert (await d.dispatch(call(2), p1)).reply.is_error
    assert not (await d.dispatch(call(3), p2)).reply.is_error  # its own bucket
    await d.session(p1).close()
    assert p1.conn_id not in plugin._buckets
    await d.aclose()
