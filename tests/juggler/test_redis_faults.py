"""juggler under Redis faults, injected for real: a fault proxy between a
component and a real redis-server (a reply lost after Redis ran the
command, replies held back, every connection accepted and dropped), and a
real Redis at ``maxclients``. What must hold:

- a connection that is dropped as soon as it opens is retried at a growing
  interval, with a few warning lines, not in a loop;
- nothing popped from Redis is dropped because a pop check's reply was lost;
- a NACK means "not done": where the outcome is unknown the NACK says 504;
- a slow Redis does not make a connection's messages wait for each other
  where the protocol does not order them, and ACKs keep request order;
- every ACKed call is answered: by its RES, or an error RES once its
  timeout passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import pytest
import redis.asyncio as aioredis

from juggler.broker.redis import RedisBroker, RedisBrokerConfig, call_key, call_ttl_key
from juggler.broker.redis.keys import POP_CHECK_SCRIPT, PUSH_SCRIPT
from juggler.client import ACK, NACK, RES, connect
from juggler.config import ServerConfig
from juggler.errors import CallNacked
from juggler.server import Server
from tests.faultproxy import FaultProxy
from tests.juggler.stacks import redis_stack
from tests.netutil import start_redis, wait_until

pytestmark = pytest.mark.timeout(90)


def stack(server_url: str, callee_url: str, **server_kw: Any) -> contextlib.AbstractAsyncContextManager[Server]:
    """A server on `server_url`'s Redis and test callees on `callee_url`'s
    (the same Redis, one of them through a fault proxy)."""
    return redis_stack(url=server_url, command_timeout=2.0, block_timeout=0.5, callee_kw={"url": callee_url},
                       server_kw=server_kw, workers=20)


def proxied(redis_url: str, proxy: FaultProxy) -> str:
    db = redis_url.rsplit("/", 1)[1]
    return f"redis://127.0.0.1:{proxy.port}/{db}"


async def test_a_redis_that_drops_every_connection_is_not_hammered(caplog: pytest.LogCaptureFixture) -> None:
    """Redis at maxclients accepts and drops each connection: the pub-sub
    connection retries at a growing interval (a few attempts in 3 s, not
    thousands) and says so in a few lines."""
    redis = start_redis(["--maxclients", "1"])
    holder = aioredis.Redis(port=redis.port)
    try:
        await holder.ping()  # the one client Redis takes: every other is refused from now on
        before = int((await holder.info("stats"))["rejected_connections"])
        broker = RedisBroker(RedisBrokerConfig(url=redis.url, connect_timeout=1.0))
        caplog.set_level(logging.WARNING, logger="juggler.broker.redis")
        try:
            subscribing = asyncio.ensure_future(broker.subscribe(object(), "news", False, lambda ev: None))
            await asyncio.sleep(3.0)  # the window observed: a rate is measured over time
            subscribing.cancel()
            with contextlib.suppress(BaseException):
                await subscribing
            attempts = int((await holder.info("stats"))["rejected_connections"]) - before
        finally:
            await broker.aclose()
        # 50 ms doubling to 2 s: about 6 attempts in 3 s (the storm was ~2,000 a second)
        assert 2 <= attempts <= 15, attempts
        lines = [r for r in caplog.records if "pub-sub connection" in r.getMessage()]
        assert 1 <= len(lines) <= 3, [r.getMessage() for r in lines]
    finally:
        await holder.aclose()
        redis.stop()


async def test_results_whose_pop_check_reply_is_lost_are_delivered(redis_url: str) -> None:
    """The server's results listener loses the reply of a pop check that
    Redis ran (the TTL keys are gone): the results are still delivered."""
    async with FaultProxy(int(redis_url.split(":")[2].split("/")[0])) as proxy:
        async with stack(proxied(redis_url, proxy), redis_url) as server, connect(server.url) as c:
            assert await c.call("test.echo", "warm", timeout=10) == "warm"
            proxy.cut_reply_to(POP_CHECK_SCRIPT.sha)  # the next check of one result
            assert await c.call("test.echo", "after the cut", timeout=10) == "after the cut"
            assert proxy.cut_done.is_set()
            assert server.broker.stats.checks_unknown >= 1
            assert await c.call("test.reverse", "ok", timeout=10) == "ko"  # reconnected


async def test_calls_whose_pop_check_reply_is_lost_are_run(redis_url: str) -> None:
    """A callee loses the reply of the pop check of calls it popped (Redis
    ran it: their TTL keys are gone): it asks again, and runs them."""
    async with FaultProxy(int(redis_url.split(":")[2].split("/")[0])) as proxy:
        async with stack(redis_url, proxied(redis_url, proxy)) as server, connect(server.url) as c:
            assert await c.call("test.echo", "warm", timeout=10) == "warm"
            # one call: its batch is that call alone (a check of several would pipeline the next
            # blocking pop behind it, whose reply the cut would lose too: see the docs' fault table)
            proxy.cut_reply_to(POP_CHECK_SCRIPT.sha)
            assert await c.call("test.echo", "after the cut", timeout=10) == "after the cut"
            assert proxy.cut_done.is_set()
            results = await asyncio.gather(*(c.call("test.echo", f"n{i}", timeout=10) for i in range(5)))
            assert results == [f"n{i}" for i in range(5)]  # the stream reconnected


async def test_a_call_whose_push_reply_is_lost_is_nacked_504_and_still_answered(redis_url: str) -> None:
    """The server loses the reply of the push that queued a call (Redis ran
    it): NACK 504 "outcome unknown", not 500; and since the call was
    queued, its RES still comes."""
    async with FaultProxy(int(redis_url.split(":")[2].split("/")[0])) as proxy:
        async with stack(proxied(redis_url, proxy), redis_url) as server:
            seen: list[dict[str, Any]] = []
            async with connect(server.url, on_message=lambda m, _raw: seen.append(m)) as c:
                assert await c.call("test.echo", "warm", timeout=10) == "warm"
                proxy.cut_reply_to(PUSH_SCRIPT.sha)
                with pytest.raises(CallNacked) as nacked:
                    await c.call("test.echo", "queued anyway", timeout=10)
                assert nacked.value.code == 504
                assert "outcome unknown" in str(nacked.value)
                call_uuid = next(m["payload"]["for"] for m in seen if m["meta"]["type"] == NACK)
                await wait_until(lambda: any(m["meta"]["type"] == RES and m["payload"]["for"] == call_uuid
                                             for m in seen), timeout=10, what="the RES of the NACKed call")
                res = next(m for m in seen if m["meta"]["type"] == RES and m["payload"]["for"] == call_uuid)
                assert res["payload"]["args"] == "queued anyway"


async def test_a_pub_whose_reply_is_lost_is_nacked_504(redis_url: str) -> None:
    async with FaultProxy(int(redis_url.split(":")[2].split("/")[0])) as proxy:
        async with stack(proxied(redis_url, proxy), redis_url) as server:
            async with connect(server.url) as sub, connect(server.url) as pub:
                await sub.sub("news")
                proxy.cut_reply_to(b"PUBLISH")
                with pytest.raises(CallNacked) as nacked:
                    await pub.pub("news", {"n": 1})
                assert nacked.value.code == 504
                ev = await sub.next_event(timeout=10)  # it was published: 504 said it may have been
                assert ev.args == {"n": 1}


async def test_a_slow_redis_does_not_serialize_a_connections_messages(redis_url: str) -> None:
    """Redis' replies held back: a connection's PUBs to different channels
    and its CALLs all reach Redis without waiting for each other; two PUBs to
    one channel stay in order; the ACKs come in request order."""
    async with FaultProxy(int(redis_url.split(":")[2].split("/")[0])) as proxy:
        async with stack(proxied(redis_url, proxy), redis_url) as server:
            frames: list[dict[str, Any]] = []
            async with connect(server.url, on_message=lambda m, _raw: frames.append(m)) as c:
                assert await c.call("test.echo", "warm", timeout=10) == "warm"
                proxy.watch(b"PUBLISH", PUSH_SCRIPT.sha)
                proxy.hold_replies()
                sent = [
                    asyncio.ensure_future(c.pub("a", 1)),
                    asyncio.ensure_future(c.pub("b", 2)),
                    asyncio.ensure_future(c.call("test.echo", "x", timeout=20)),
                    asyncio.ensure_future(c.pub("a", 3)),  # waits for the first PUB to "a"
                ]
                await proxy.wait_seen(b"PUBLISH", 2)
                await proxy.wait_seen(PUSH_SCRIPT.sha, 1)
                assert proxy.seen(b"PUBLISH") == 2  # not the second one to "a" yet
                proxy.release_replies()
                await asyncio.gather(*sent[:2], sent[3])
                assert await sent[2] == "x"
                assert proxy.seen(b"PUBLISH") == 3
            acks = [m for m in frames if m["meta"]["type"] == ACK]
            order = [m["payload"].get("channel") or m["payload"].get("uri") for m in acks[1:]]
            assert order == ["a", "b", "test.echo", "a"]  # request order


async def test_every_acked_call_is_answered(redis_url: str) -> None:
    """A call ACKed (queued) that no callee answers in time gets an error RES
    about a second after its timeout; a late result is not sent after it."""
    broker = RedisBroker(RedisBrokerConfig(url=redis_url))
    await broker.start()
    server = Server(broker, ServerConfig(port=0))
    await server.start()
    try:
        seen: list[dict[str, Any]] = []
        async with connect(server.url, on_message=lambda m, _raw: seen.append(m)) as c:
            msg_uuid = "6f1d6b0e-2f1c-4a9f-8f7e-0c8b5a1e2d3c"
            fut = asyncio.ensure_future(c.call("nobody.home", "x", timeout=0.3, msg_uuid=msg_uuid))
            await wait_until(lambda: any(m["meta"]["type"] == RES for m in seen), timeout=10,
                             what="the error RES of a call nobody answered")
            res = next(m for m in seen if m["meta"]["type"] == RES)
            assert res["payload"]["for"] == msg_uuid and res["payload"]["uri"] == "nobody.home"
            assert res["payload"]["args"] == {"error": {"message": "call timed out: no result within 300 ms"}}
            assert server.stats.calls_timed_out == 1
            with contextlib.suppress(Exception):
                await fut
    finally:
        await server.aclose()
        await broker.aclose()


async def test_the_original_silence_when_asked(redis_url: str) -> None:
    broker = RedisBroker(RedisBrokerConfig(url=redis_url))
    await broker.start()
    server = Server(broker, ServerConfig(port=0, answer_expired_calls=False))
    await server.start()
    try:
        async with connect(server.url) as c:
            with contextlib.suppress(Exception):
                await c.call("nobody.home", "x", timeout=0.2)
            await wait_until(lambda: len(server._pending) == 0, timeout=10, what="the call forgotten")
            assert server.stats.calls_timed_out == 0
    finally:
        await server.aclose()
        await broker.aclose()


def test_error_res_is_json() -> None:
    from juggler.server import _timed_out

    assert json.loads(_timed_out(5000)) == {"error": {"message": "call timed out: no result within 5000 ms"}}


async def test_calls_of_a_closed_stream_whose_check_reply_is_lost_are_put_back(redis_url: str) -> None:
    """A callee's stream closes while the pop check of calls it popped is in
    flight, and the check's reply is lost (Redis ran it: the TTL key is
    gone): the call is not dropped, it goes back to its list with a deadline."""
    port = int(redis_url.split(":")[2].split("/")[0])
    direct = aioredis.Redis(port=port)
    uri = "t.putback"
    async with FaultProxy(port) as proxy, \
            RedisBroker(RedisBrokerConfig(url=redis_url)) as caller, \
            RedisBroker(RedisBrokerConfig(url=proxied(redis_url, proxy), block_timeout=5.0)) as callee:
        got: list[Any] = []

        async def consume() -> None:
            async for call in callee.calls([uri]):
                got.append(call)

        proxy.watch(b"BLMPOP", POP_CHECK_SCRIPT.sha)
        consumer = asyncio.ensure_future(consume())
        try:
            await proxy.wait_seen(b"BLMPOP", 1)
            proxy.hold_replies()  # the pop's reply, then the check's, are held
            msg_uuid = "0b0c4a36-5d1e-4f7a-9a55-3c1f2b6d7e80"
            await caller.call(msg_uuid, uri, b'"x"', 30_000)
            await wait_until(lambda: proxy.held_bytes() > 0, timeout=10, what="the pop's reply held")
            proxy.release_replies()  # the pop's reply goes through; the check's will be held
            proxy.hold_replies()
            await proxy.wait_seen(POP_CHECK_SCRIPT.sha, 1)
            consumer.cancel()  # the stream closes with the check in flight
            proxy.reset_all()  # and the check's reply is lost
            proxy.release_replies()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(consumer, 10)
            assert got == []

            async def back() -> bool:
                return await direct.llen(call_key(uri)) == 1 and await direct.pttl(call_ttl_key(uri, msg_uuid)) > 0

            await wait_until(back, timeout=10, interval=0.05, what="the popped call back in its list")
        finally:
            consumer.cancel()
            await direct.aclose()


async def test_calls_put_back_while_redis_is_unreachable_are_not_dropped(redis_url: str) -> None:
    """A callee's stream closes holding calls it popped, while Redis cannot be
    reached: putting them back is tried again until Redis is back."""
    port = int(redis_url.split(":")[2].split("/")[0])
    direct = aioredis.Redis(port=port)
    uri = "t.putback.later"
    ids = [f"00000000-0000-4000-8000-{i:012d}" for i in range(5)]
    async with FaultProxy(port) as proxy, RedisBroker(RedisBrokerConfig(url=redis_url)) as caller, \
            RedisBroker(RedisBrokerConfig(url=proxied(redis_url, proxy), block_timeout=0.3, call_batch=10,
                                          connect_timeout=0.5)) as callee:
        try:
            for u in ids:
                await caller.call(u, uri, b'"x"', 30_000)
            stream = callee.calls([uri])
            first = await asyncio.wait_for(stream.__anext__(), 5)
            assert first.msg_uuid == ids[0]
            await proxy.unreachable(True)
            closing = asyncio.ensure_future(stream.aclose())  # puts the 4 others back: refused for now
            await asyncio.sleep(0.5)  # the window of the fault
            assert not closing.done()
            await proxy.unreachable(False)
            await asyncio.wait_for(closing, 15)
            left = [json.loads(x)["msg_uuid"] for x in await direct.lrange(call_key(uri), 0, -1)]
            assert left[::-1] == ids[1:]
            assert all([await direct.pttl(call_ttl_key(uri, u)) > 0 for u in ids[1:]])
        finally:
            await direct.aclose()


async def test_the_error_res_says_when_redis_was_lost(redis_url: str) -> None:
    """A call ACKed, then the server's connections to Redis reset: the error
    RES at its timeout says Redis was lost meanwhile (its result may have been)."""
    async with FaultProxy(int(redis_url.split(":")[2].split("/")[0])) as proxy:
        broker = RedisBroker(RedisBrokerConfig(url=proxied(redis_url, proxy), block_timeout=0.5))
        await broker.start()
        server = Server(broker, ServerConfig(port=0))
        await server.start()
        try:
            seen: list[dict[str, Any]] = []
            async with connect(server.url, on_message=lambda m, _raw: seen.append(m)) as c:
                # 3 s: time enough, on a busy machine, for the server to see the reset before the timeout
                calling = asyncio.ensure_future(c.call("nobody.home", "x", timeout=3.0))
                await wait_until(lambda: any(m["meta"]["type"] == ACK for m in seen), timeout=10, what="the ACK")
                proxy.reset_all()
                await wait_until(lambda: any(m["meta"]["type"] == RES for m in seen), timeout=10,
                                 what="the error RES")
                res = next(m for m in seen if m["meta"]["type"] == RES)
                assert res["payload"]["args"] == {"error": {"message": "call timed out: no result within 3000 ms; "
                                                            "the connection to Redis was lost meanwhile"}}
                with contextlib.suppress(Exception):
                    await calling
        finally:
            await server.aclose()
            await broker.aclose()


async def test_pubs_to_different_channels_overlap_through_latency(redis_url: str) -> None:
    """200 ms added each way between the server and Redis: a connection's PUBs
    to eight channels all reach Redis before the first of them is answered
    (one at a time, a publisher got 2.5 PUBs a second)."""
    async with FaultProxy(int(redis_url.split(":")[2].split("/")[0])) as proxy:
        async with stack(proxied(redis_url, proxy), redis_url) as server:
            frames: list[tuple[int, dict[str, Any]]] = []
            def note(m: dict[str, Any], _raw: str) -> None:
                frames.append((proxy.seen(b"PUBLISH"), m))  # how many had reached Redis when it came

            async with connect(server.url, on_message=note) as c:
                await c.pub("warm", 0)
                proxy.watch(b"PUBLISH")
                proxy.latency(0.2, 0.2)
                await asyncio.gather(*(c.pub(f"ch{i}", i, timeout=10) for i in range(8)))
                proxy.latency(0.0, 0.0)
            acks = [seen for seen, m in frames[1:] if m["meta"]["type"] == ACK]
            assert len(acks) == 8
            assert acks[0] == 8, f"only {acks[0]} PUBLISH sent when the first ACK came"
