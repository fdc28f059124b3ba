"""Presence stores (juggler/presence/store.py): in memory, on a real
redis-server and on a real Redis Cluster; the Redis layout and scripts."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aredis
from presence_helpers import make_broker

from juggler.broker.cluster import key_slot
from juggler.broker.memory import MemoryBroker
from juggler.broker.redis import RedisBroker, RedisBrokerConfig
from juggler.presence.store import (
    PRESENCE_ADD_SCRIPT,
    MemoryPresenceStore,
    PresenceStore,
    RedisPresenceStore,
    count_stats,
    presence_expire_key,
    presence_key,
)
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def store_of(broker: Any, clock: Clock | None = None) -> PresenceStore:
    if isinstance(broker, MemoryBroker):
        return MemoryPresenceStore(clock=clock or Clock())
    return RedisPresenceStore(broker.router)


def info(client: str, user: str | None = None, **more: Any) -> dict[str, Any]:
    return {"client": client, "user": user, **more}


async def test_add_members_remove_stats(backend_broker: Any) -> None:
    store = store_of(backend_broker)
    assert await store.members("room") == {}
    assert await store.stats("room") == {"clients": 0, "users": 0}
    await store.add("room", "c1", info("c1", "alice"), 30)
    await store.add("room", "c2", info("c2", "alice"), 30)
    await store.add("room", "c3", info("c3", "bob", conn_info={"name": "Bob"}), 30)
    await store.add("room", "c4", info("c4"), 30)  # no user (a server without auth)
    await store.add("other", "c1", info("c1", "alice"), 30)
    members = await store.members("room")
    assert members == {
        "c1": info("c1", "alice"), "c2": info("c2", "alice"),
        "c3": info("c3", "bob", conn_info={"name": "Bob"}), "c4": info("c4"),
    }
    # users are counted distinctly; a connection without a user is a client, not a user
    assert await store.stats("room") == {"clients": 4, "users": 2}
    await store.add("room", "c1", info("c1", "carol"), 30)  # adding again replaces
    assert (await store.members("room"))["c1"]["user"] == "carol"
    await store.remove("room", "c1")
    await store.remove("room", "c1")  # a no-op
    await store.remove("nowhere", "c1")
    assert sorted(await store.members("room")) == ["c2", "c3", "c4"]
    assert await store.members("other") == {"c1": info("c1", "alice")}
    assert await store.stats("room") == {"clients": 3, "users": 2}


async def test_many_entries_in_batches(backend_broker: Any) -> None:
    store = store_of(backend_broker)
    entries = {f"c{i}": info(f"c{i}", f"u{i % 7}") for i in range(1234)}
    await store.add_many("big", entries, 30)
    assert await store.members("big") == entries
    assert await store.stats("big") == {"clients": 1234, "users": 7}
    await store.remove_many("big", [f"c{i}" for i in range(1000)])
    assert sorted(await store.members("big")) == sorted(f"c{i}" for i in range(1000, 1234))


async def test_memory_entries_expire_unless_added_again() -> None:
    clock = Clock()
    store = MemoryPresenceStore(clock=clock)
    await store.add("room", "crashed", info("crashed"), 10)
    await store.add("room", "live", info("live"), 10)
    clock.now += 9
    await store.add("room", "live", info("live"), 10)  # its server refreshes it
    assert sorted(await store.members("room")) == ["crashed", "live"]
    clock.now += 1  # the crashed server's entry reaches its expiry
    assert sorted(await store.members("room")) == ["live"]
    clock.now += 8.9
    assert await store.stats("room") == {"clients": 1, "users": 0}
    clock.now += 0.1
    assert await store.members("room") == {}


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_redis_entries_expire_unless_added_again(backend: str, request: pytest.FixtureRequest) -> None:
    """A crashed server's entry (added once, short ttl) disappears; the entry
    of a server that keeps adding it stays (Redis's clock: real time)."""
    broker = await make_broker(backend, request)
    try:
        store = RedisPresenceStore(broker.router)
        await store.add("room", "crashed", info("crashed", "x"), 0.3)
        await store.add("room", "live", info("live", "y"), 30)

        async def crashed_gone() -> bool:
            await store.add("room", "live", info("live", "y"), 30)
            return "crashed" not in await store.members("room")

        await wait_until(crashed_gone, timeout=10, interval=0.05)
        assert await store.members("room") == {"live": info("live", "y")}
        assert await store.stats("room") == {"clients": 1, "users": 1}
    finally:
        await broker.aclose()


async def test_redis_layout_and_scripts(redis_url: str) -> None:
    broker = RedisBroker(RedisBrokerConfig(url=redis_url))
    await broker.start()
    r = aredis.Redis.from_url(redis_url)
    try:
        store = RedisPresenceStore(broker.router)
        await store.add("chat.{odd}", "c1", info("c1", "ann", conn_info=[1, "é"]), 20)
        h, z = presence_key("chat.{odd}"), presence_expire_key("chat.{odd}")
        assert (h, z) == ("juggler:presence:{chat.{odd}}", "juggler:presence:expire:{chat.{odd}}")
        assert key_slot(h) == key_slot(z)
        assert set(await r.keys("*")) == {h.encode(), z.encode()}
        assert await r.hgetall(h) == {b"c1": '{"client":"c1","user":"ann","conn_info":[1,"é"]}'.encode()}
        seconds, micros = await r.time()
        now_ms = seconds * 1000 + micros // 1000
        score = await r.zscore(z, "c1")
        assert now_ms + 19_000 <= score <= now_ms + 20_000
        assert 19_000 <= await r.pttl(h) <= 20_000 and 19_000 <= await r.pttl(z) <= 20_000

        # an entry whose score passed is dropped by the read, from both keys
        await r.zadd(z, {"old": now_ms - 1})
        await r.hset(h, "old", '{"client":"old","user":null}')
        await r.hset(h, "junk", "not json")  # not ours: ignored, not fatal
        await r.zadd(z, {"junk": now_ms + 60_000})
        assert sorted(await store.members("chat.{odd}")) == ["c1"]
        assert await r.hexists(h, "old") == 0 and await r.zscore(z, "old") is None
        await store.remove("chat.{odd}", "c1")
        assert await r.hexists(h, "c1") == 0 and await r.zscore(z, "c1") is None

        # the script on its own, as any other client could run it
        await r.eval(PRESENCE_ADD_SCRIPT.body.decode(), 2, h, z, 5000, "c9", '{"client":"c9","user":null}')
        assert "c9" in await store.members("chat.{odd}")
    finally:
        await r.aclose()
        await broker.aclose()


@pytest.mark.slow
async def test_cluster_keys_of_a_channel_share_a_node(cluster_seeds: str) -> None:
    from redis.asyncio.cluster import RedisCluster as AsyncCluster

    broker = RedisBroker(RedisBrokerConfig(cluster=cluster_seeds))
    await broker.start()
    rc = AsyncCluster.from_url(cluster_seeds.split(",")[0])
    try:
        store = RedisPresenceStore(broker.router)
        channels = [f"room.{i}" for i in range(20)]  # spread over the slots (and nodes)
        assert len({key_slot(presence_key(c)) for c in channels}) == 20
        for c in channels:
            await store.add(c, "me", info("me", c), 30)
        for c in channels:
            assert await store.members(c) == {"me": info("me", c)}
            assert await rc.hlen(presence_key(c)) == 1 and await rc.zcard(presence_expire_key(c)) == 1
    finally:
        await rc.aclose()
        await broker.aclose()


def test_count_stats() -> None:
    assert count_stats({}) == {"clients": 0, "users": 0}
    assert count_stats({"a": info("a", "u"), "b": info("b", "u"), "c": info("c")}) == {"clients": 3, "users": 1}
