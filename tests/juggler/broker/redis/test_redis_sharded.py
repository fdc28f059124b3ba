"""Sharded pub-sub (juggler/broker/redis/sharded.py) against a real redis-server
and a real Redis Cluster: delivery, isolation from classic pub-sub,
reconnects, one connection per node, a slot moving to another node."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aredis
from rediscluster import RedisCluster

from juggler.broker.base import BrokerError
from juggler.broker.cluster import key_slot
from juggler.broker.redis import RedisBroker, RedisBrokerConfig
from juggler.broker.redis.sharded import ShardedPubSub
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)


class Inbox:
    def __init__(self) -> None:
        self.got: list[tuple[str, bytes]] = []

    def __call__(self, channel: str, data: bytes) -> None:
        self.got.append((channel, data))


async def _shardnumsub(r: aredis.Redis, channel: str) -> int:
    reply = await r.execute_command("PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1])


async def test_sharded_messages_never_reach_classic_subscribers(broker: RedisBroker, r: aredis.Redis) -> None:
    inbox = Inbox()
    sharded = ShardedPubSub(broker.router, inbox)
    classic = r.pubsub()
    try:
        await classic.psubscribe("*")
        await classic.subscribe("notices:{a}")
        await sharded.subscribe("notices:{a}")
        assert sharded.subscribed("notices:{a}") and sharded.connections == 1
        await sharded.subscribe("notices:{a}")  # again: at once, still one subscription
        assert await _shardnumsub(r, "notices:{a}") == 1

        assert await sharded.publish("notices:{a}", b"hello") == 1
        await wait_until(lambda: inbox.got == [("notices:{a}", b"hello")])
        # a raw SPUBLISH reaches it too; a classic PUBLISH of the same name does not
        await r.execute_command("SPUBLISH", "notices:{a}", b"raw")
        await r.publish("notices:{a}", b"classic")
        await wait_until(lambda: len(inbox.got) == 2)
        assert inbox.got[1] == ("notices:{a}", b"raw")
        # the classic subscribers (pattern * included) saw only the classic
        # message; a sharded one would have come first (published first)
        seen: list[bytes] = []
        async with asyncio.timeout(5):
            while len(seen) < 2:
                m = await classic.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if m is not None:
                    seen.append(m["data"])
        assert seen == [b"classic", b"classic"]

        sharded.unsubscribe("notices:{a}")
        sharded.unsubscribe("never.wanted")  # a no-op
        await wait_until(lambda: _is(_shardnumsub(r, "notices:{a}"), 0))
        assert await sharded.publish("notices:{a}", b"late") == 0
        assert len(inbox.got) == 2
    finally:
        await classic.aclose()
        await sharded.aclose()
        await sharded.aclose()  # idempotent
    with pytest.raises(BrokerError):
        await sharded.subscribe("x")


async def _is(aw: object, value: object) -> bool:
    return await aw == value  # type: ignore[misc]


async def test_resubscribes_after_the_connection_is_killed(broker: RedisBroker, r: aredis.Redis) -> None:
    inbox = Inbox()
    sharded = ShardedPubSub(broker.router, inbox)
    try:
        await sharded.subscribe("n:{1}")
        await sharded.subscribe("n:{2}")
        killed = await r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        assert killed >= 1
        await wait_until(lambda: _is(_shardnumsub(r, "n:{1}"), 1) if sharded.subscribed("n:{1}") else False)
        await wait_until(lambda: sharded.subscribed("n:{2}"))
        await sharded.publish("n:{1}", b"one")
        await sharded.publish("n:{2}", b"two")
        await wait_until(lambda: sorted(inbox.got) == [("n:{1}", b"one"), ("n:{2}", b"two")])
    finally:
        await sharded.aclose()


async def test_a_silent_connection_is_replaced(broker: RedisBroker, r: aredis.Redis) -> None:
    """No answer to the health PING by the next one: the connection is dropped and the channel subscribed again."""
    inbox = Inbox()
    sharded = ShardedPubSub(broker.router, inbox, health_interval=0.1)
    try:
        await sharded.subscribe("quiet:{x}")
        link = next(iter(sharded._links.values()))
        first = link.conn
        assert first is not None
        await r.execute_command("CLIENT", "PAUSE", 600, "ALL")  # every client waits 0.6 s: no PONG in time
        await wait_until(lambda: link.conn is not None and link.conn is not first and sharded.subscribed("quiet:{x}"),
                         timeout=10)
        await sharded.publish("quiet:{x}", b"back")
        await wait_until(lambda: inbox.got == [("quiet:{x}", b"back")])
    finally:
        await sharded.aclose()


async def test_subscribe_waits_for_redis_then_gives_up(redis_url: str) -> None:
    """No Redis: SSUBSCRIBE gets no answer within command_timeout; the channel stays wanted."""
    from tests.netutil import free_port

    b = RedisBroker(RedisBrokerConfig(url=f"redis://127.0.0.1:{free_port()}/0", connect_timeout=0.2))
    sharded = ShardedPubSub(b.router, Inbox(), connect_timeout=0.2, command_timeout=0.5)
    try:
        with pytest.raises(BrokerError, match="no answer to SSUBSCRIBE"):
            await sharded.subscribe("nobody:{home}")
        assert sharded.channels == 1 and not sharded.subscribed("nobody:{home}")
    finally:
        await sharded.aclose()
        await b.aclose()


@pytest.mark.slow
async def test_cluster_one_connection_per_node_and_a_moving_slot(
    cluster_seeds: str, redis_cluster: RedisCluster
) -> None:
    broker = RedisBroker(RedisBrokerConfig(cluster=cluster_seeds))
    await broker.start()
    inbox = Inbox()
    sharded = ShardedPubSub(broker.router, inbox)
    # channels on every master
    names: dict[int, str] = {}
    i = 0
    while len(names) < 3:
        name = f"ch:{{{i}}}"
        names.setdefault(redis_cluster.slot_owner(key_slot(name)), name)
        i += 1
    try:
        await asyncio.gather(*(sharded.subscribe(n) for n in names.values()))
        assert sharded.connections == 3
        for n in names.values():
            await sharded.publish(n, n.encode())
        await wait_until(lambda: sorted(inbox.got) == sorted((n, n.encode()) for n in names.values()))

        # move one (empty) slot to another master: Redis drops the subscription
        # there (sunsubscribe), it is made again on the slot's new node
        name = next(iter(names.values()))
        slot = key_slot(name)
        src = redis_cluster.slot_owner(slot)
        dst = next(p for p in redis_cluster.masters() if p != src)
        dst_id = redis_cluster.command(dst, "CLUSTER", "MYID")
        src_id = redis_cluster.command(src, "CLUSTER", "MYID")
        try:
            for port in (dst, src, *[p for p in redis_cluster.masters() if p not in (src, dst)]):
                redis_cluster.command(port, "CLUSTER", "SETSLOT", str(slot), "NODE", dst_id)
            await wait_until(lambda: sharded.subscribed(name)
                             and sharded._chans[name].link is not None
                             and sharded._chans[name].link.address.port == dst, timeout=20)
            inbox.got.clear()
            await sharded.publish(name, b"moved")
            await wait_until(lambda: inbox.got == [(name, b"moved")])
        finally:
            for port in (src, dst, *[p for p in redis_cluster.masters() if p not in (src, dst)]):
                redis_cluster.command(port, "CLUSTER", "SETSLOT", str(slot), "NODE", src_id)
            redis_cluster.wait_ok()
    finally:
        await sharded.aclose()
        await broker.aclose()
