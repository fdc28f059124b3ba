"""History and recovery through real servers: the in-memory broker, a real
Redis and a real Redis Cluster. A subscriber that comes back with ``since``
gets exactly what it missed, in order, then the live events; or an explicit
"not recovered"."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from juggler.broker.memory import MemoryBroker
from juggler.broker.redis import RedisBroker, RedisBrokerConfig
from juggler.channels import ChannelOptions, ChannelRules
from juggler.client import Client, connect
from juggler.config import ServerConfig
from juggler.errors import CallNacked
from juggler.server import Server

pytestmark = pytest.mark.timeout(60)

RULES = ChannelRules([
    ChannelOptions(match="short.*", history_size=2, history_ttl=60),
    ChannelOptions(match="h.*", history_size=100, history_ttl=60),
])


@contextlib.asynccontextmanager
async def serving(broker: Any, **kw: Any) -> AsyncIterator[Server]:
    await broker.start()
    server = Server(broker, ServerConfig(port=0), channels=RULES, **kw)
    try:
        await server.start()
        yield server
    finally:
        await server.aclose()
        await broker.aclose()


def brokers() -> list[str]:
    return ["memory", "redis"]


@contextlib.asynccontextmanager
async def stack(kind: str, request: pytest.FixtureRequest, **kw: Any) -> AsyncIterator[Server]:
    if kind == "memory":
        broker: Any = MemoryBroker()
    elif kind == "redis":
        broker = RedisBroker(RedisBrokerConfig(url=request.getfixturevalue("redis_url")))
    else:
        broker = RedisBroker(RedisBrokerConfig(cluster=request.getfixturevalue("cluster_seeds")))
    async with serving(broker, **kw) as server:
        yield server


async def take(client: Client, n: int) -> list[Any]:
    return [await client.next_event(timeout=10) for _ in range(n)]


@pytest.mark.parametrize("kind", ["memory", "redis", "cluster"])
async def test_recovery_after_a_reconnect(kind: str, request: pytest.FixtureRequest) -> None:
    async with stack(kind, request) as server, connect(server.url) as pub:
        async with connect(server.url) as a:
            ack = await a.sub("h.news")
            assert ack["offset"] == 0 and ack["epoch"]
            for i in range(3):
                await pub.pub("h.news", {"i": i})
            got = await take(a, 3)
            assert [e.offset for e in got] == [1, 2, 3]
            assert [e.args for e in got] == [{"i": 0}, {"i": 1}, {"i": 2}]
            position = a.positions["h.news"]
            assert position == (3, ack["epoch"])
        for i in range(3, 6):  # missed while away
            await pub.pub("h.news", {"i": i})
        async with connect(server.url) as b:
            ack = await b.sub("h.news", since=position)
            assert ack["recovered"] is True and ack["offset"] == 6
            await pub.pub("h.news", {"i": 6})
            got = await take(b, 4)
            assert [e.args["i"] for e in got] == [3, 4, 5, 6]
            assert [e.offset for e in got] == [4, 5, 6, 7]
            # nothing missed: recovered, no events
        async with connect(server.url) as c:
            ack = await c.sub("h.news", since=(7, position[1]))
            assert ack["recovered"] is True
            with pytest.raises(TimeoutError):
                await c.next_event(timeout=0.3)
        assert server.stats.recoveries == {"recovered": 2}


@pytest.mark.parametrize("kind", brokers())
async def test_not_recovered(kind: str, request: pytest.FixtureRequest) -> None:
    async with stack(kind, request) as server, connect(server.url) as pub, connect(server.url) as a:
        ack = await a.sub("short.x")
        epoch = ack["epoch"]
        for i in range(4):
            await pub.pub("short.x", {"i": i})
        async with connect(server.url) as b:
            # history keeps 2: a client that saw offset 1 missed 2..4
            assert (await b.sub("short.x", since=(1, epoch)))["recovered"] is False
            # another epoch
            assert (await b.sub("short.x", since=(4, "other")))["recovered"] is False
            # a position the channel never reached
            assert (await b.sub("short.x", since=(99, epoch)))["recovered"] is False
            assert server.stats.recoveries == {"not_recovered": 3}
            # within what is kept
            ack = await b.sub("short.y", since=(0, ""))
            assert "recovered" not in ack and ack["offset"] == 0


@pytest.mark.parametrize("kind", brokers())
async def test_since_is_refused_where_it_cannot_apply(kind: str, request: pytest.FixtureRequest) -> None:
    async with stack(kind, request) as server, connect(server.url) as a:
        with pytest.raises(CallNacked) as e:
            await a.sub("h.*", pattern=True, since=(1, "e"))
        assert e.value.code == 400
        with pytest.raises(CallNacked) as e:
            await a.sub("plain", since=(1, "e"))
        assert e.value.code == 400 and "history" in e.value.message
        # channels without history: EVNTs as the original (no offset)
        await a.sub("plain")
        await a.pub("plain", 1)
        ev = await a.next_event(timeout=5)
        assert ev.offset is None and ev.args == 1
        assert "offset" not in (await a.sub("plain2"))


async def test_live_gap_is_filled_from_history(redis_url: str) -> None:
    """The server's pub-sub connection to Redis drops while events are published:
    the subscriber still gets every event once, in order (filled from history)."""
    import redis.asyncio as aioredis

    async with stack("redis", _Req(redis_url)) as server, connect(server.url) as pub, connect(server.url) as a:
        await a.sub("h.gap", since=(0, ""))
        admin = aioredis.from_url(redis_url)
        try:
            total = 60
            for i in range(total):
                await pub.pub("h.gap", {"i": i})
                if i in (10, 30):
                    await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            got = []
            while len(got) < total:
                ev = await a.next_event(timeout=15)
                assert ev.recovered is None, "a gap reported though history had it"
                got.append(ev.args["i"])
            assert got == list(range(total))
            # counted: filled from history (how many depends on what the kills caught in flight)
            assert server.stats.history_gaps.get("lost", 0) == 0
        finally:
            await admin.aclose()


async def test_history_api_and_publish(redis_url: str) -> None:
    async with stack("redis", _Req(redis_url)) as server:
        first = await server.publish("h.api", b'{"n":1}')
        second = await server.publish("h.api", b'{"n":2}')
        assert (first.offset, second.offset) == (1, 2) and first.epoch == second.epoch
        page = await server.history("h.api", after=1)
        assert [(e.offset, e.args) for e in page.publications] == [(2, b'{"n":2}')]
        assert page.offset == 2 and page.epoch == first.epoch
        plain = await server.publish("plain", b"1")
        assert plain.offset is None


class _Req:
    """Just enough of pytest's request for `stack` outside a parametrized test."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url

    def getfixturevalue(self, name: str) -> str:
        assert name == "redis_url"
        return self.redis_url


async def test_recovery_across_a_server_restart(redis_url: str) -> None:
    """The server a client was connected to goes away; the client comes back to
    another one sharing Redis and recovers what was published meanwhile."""
    async with stack("redis", _Req(redis_url)) as other, connect(other.url) as pub:
        async with stack("redis", _Req(redis_url)) as first:
            async with connect(first.url) as a:
                await a.sub("h.restart")
                await pub.pub("h.restart", "x")
                await a.next_event(timeout=5)
                position = a.positions["h.restart"]
        for i in range(5):
            await pub.pub("h.restart", i)
        async with connect(other.url) as b:
            ack = await b.sub("h.restart", since=position)
            assert ack["recovered"] is True
            assert [e.args for e in await take(b, 5)] == [0, 1, 2, 3, 4]


async def test_a_go_style_payload_without_history_is_delivered(redis_url: str) -> None:
    """An original server publishes without offset on a history channel: its
    events still reach our subscribers (without a position)."""
    import redis.asyncio as aioredis

    async with stack("redis", _Req(redis_url)) as server, connect(server.url) as a:
        await a.sub("h.go")
        admin = aioredis.from_url(redis_url)
        try:
            await admin.publish("h.go", '{"msg_uuid":"6ba7b810-9dad-11d1-80b4-00c04fd430c8","args":5}')
        finally:
            await admin.aclose()
        ev = await a.next_event(timeout=5)
        assert ev.args == 5 and ev.offset is None


@pytest.mark.parametrize("channel", ["h.", "h.}x", "h.{a}b"])
async def test_odd_channel_names_keep_their_keys_together_on_a_cluster(channel: str, cluster_seeds: str) -> None:
    """Every key of a channel shares one slot, whatever braces its name holds."""
    from juggler.broker.cluster import hash_tagged, key_slot
    from juggler.broker.history import history_key, history_meta_key

    assert key_slot(history_key(channel)) == key_slot(history_meta_key(channel))
    for odd in ("", "}", "}x"):
        assert key_slot(hash_tagged("a:", odd)) == key_slot(hash_tagged("b:", odd))
        assert hash_tagged("a:", odd) != hash_tagged("a:", "!{!}" + odd)
    broker = RedisBroker(RedisBrokerConfig(cluster=cluster_seeds))
    await broker.start()
    try:
        opts = ChannelOptions(match="*", history_size=5)
        for odd in (channel, "}" + channel, ""):
            offset, epoch = await broker.publish_history(odd, "6ba7b810-9dad-11d1-80b4-00c04fd430c8", b"1", opts)
            page = await broker.read_history(odd, 0, 0, opts)
            assert page.offset == offset == 1 and page.epoch == epoch and len(page.publications) == 1
    finally:
        await broker.aclose()
