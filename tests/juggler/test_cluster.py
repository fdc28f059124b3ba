"""Juggler on a real Redis Cluster (3 masters + 3 replicas, `redis_cluster`),
several servers on one Redis, a separate pub-sub Redis, and a master failover.

The failover test runs last in this module: it SIGKILLs a master, waits for
its replica's promotion (an event polled from CLUSTER SLOTS, bounded), checks
that servers and callees recover, then restarts the killed node (it rejoins
as a replica) so the session's cluster stays whole.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from jugglerprocs import Proc, juggler, juggler_listening, juggler_server
from rediscluster import RedisCluster
from stacks import URIS, redis_stack

from juggler.broker.cluster import key_slot
from juggler.broker.redis import RedisBroker, RedisBrokerConfig, call_key, group_by_slot
from juggler.client import connect
from juggler.errors import CallError

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

async def test_uris_spread_over_slots_and_nodes(cluster_seeds: str, redis_cluster: RedisCluster) -> None:
    groups = group_by_slot(URIS)
    assert len(groups) > 1  # otherwise the test would not exercise several pops
    owners = {redis_cluster.slot_owner(key_slot(call_key(u))) for u in URIS}
    assert len(owners) > 1
    broker = RedisBroker(RedisBrokerConfig(cluster=cluster_seeds))
    await broker.start()
    try:
        assert sorted(map(sorted, broker.call_groups(URIS))) == sorted(map(sorted, groups.values()))
        with pytest.raises(ValueError):
            agen = broker.calls(URIS)
            await agen.__anext__()
    finally:
        await broker.aclose()


async def test_call_pub_sub_through_the_cluster(cluster_seeds: str) -> None:
    async with redis_stack(cluster=cluster_seeds) as server:
        async with connect(server.url) as c, connect(server.url) as d:
            for uri in URIS:
                if uri.startswith("test.delay"):
                    assert await c.call(uri, "5", timeout=10) == 5
            assert await c.call("test.echo", "hello", timeout=10) == "hello"
            assert await c.call("test.reverse", "abc", timeout=10) == "cba"
            results = await asyncio.gather(*(c.call("test.echo", str(i), timeout=10) for i in range(200)))
            assert results == [str(i) for i in range(200)]
            await d.sub("news.a")
            await d.sub("news.*", pattern=True)
            await c.pub("news.a", {"x": 1})
            got = [await asyncio.wait_for(d.next_event(), 5) for _ in range(2)]
            assert sorted((e.channel, e.pattern or "") for e in got) == [("news.a", ""), ("news.a", "news.*")]
            assert all(e.args == {"x": 1} for e in got)


async def test_separate_pubsub_redis(cluster_seeds: str, redis_url: str) -> None:
    import redis.asyncio as aioredis

    async with redis_stack(cluster=cluster_seeds, pubsub_url=redis_url) as server:
        async with connect(server.url) as c:
            assert await c.call("test.echo", "rpc", timeout=10) == "rpc"
            await c.sub("only.here")
            r = aioredis.Redis.from_url(redis_url)
            try:  # the subscription lives on the pub-sub Redis, not on the cluster
                assert (await r.pubsub_numsub("only.here"))[0][1] == 1
                await r.publish("only.here", b'{"msg_uuid":"9a1e6a8e-3c0f-4b1e-9d36-2f3f0a8b4c11","args":7}')
            finally:
                await r.aclose()
            ev = await asyncio.wait_for(c.next_event(), 5)
            assert ev.channel == "only.here" and ev.args == 7


async def test_moved_and_ask_are_followed(cluster_seeds: str, redis_cluster: RedisCluster) -> None:
    """A stale slot map (MOVED) and a slot being migrated (ASK) are followed."""
    async with redis_stack(cluster=cluster_seeds) as server:
        broker = server.broker
        router = broker.router
        async with connect(server.url) as c:
            assert await c.call("test.echo", "a", timeout=10) == "a"
            # MOVED: point test.echo's slot at a wrong primary in the server's map
            slot = key_slot(call_key("test.echo"))
            owner = router._slots[slot]
            other = next(a for a in router._primaries if a.port != owner.port)
            router._slots[slot] = other
            before = router.redirects
            assert await c.call("test.echo", "b", timeout=10) == "b"
            assert router.redirects > before and router._slots[slot].port == owner.port

            # ASK: a URI whose slot is migrating from its owner to another node
            uri = "ask.me"
            slot = key_slot(call_key(uri))
            src = redis_cluster.slot_owner(slot)
            dst = next(p for p in redis_cluster.masters() if p != src)
            src_id = redis_cluster.command(src, "CLUSTER", "MYID")
            dst_id = redis_cluster.command(dst, "CLUSTER", "MYID")
            redis_cluster.command(dst, "CLUSTER", "SETSLOT", str(slot), "IMPORTING", src_id)
            redis_cluster.command(src, "CLUSTER", "SETSLOT", str(slot), "MIGRATING", dst_id)
            try:
                # (a multi-key script gets TRYAGAIN while the slot migrates, and
                # is retried; a single-key command is redirected with ASK)
                before = router.redirects
                key = call_key(uri)
                assert await router.run(key, lambda conn: conn.execute("RPUSH", key, "x")) == 1
                assert router.redirects > before
                # the call list lives on the importing node now
                import redis as sync_redis

                r = sync_redis.Redis(host="127.0.0.1", port=dst)
                try:
                    r.execute_command("ASKING")
                    assert r.execute_command("LLEN", call_key(uri)) == 1
                finally:
                    r.close()
            finally:
                for port in (src, dst):
                    redis_cluster.command(port, "CLUSTER", "SETSLOT", str(slot), "STABLE")


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_two_server_processes_serve_one_application(
    backend: str, redis_url: str, cluster_seeds: str
) -> None:
    """A CALL through A is executed by a callee anywhere and its RES reaches
    the client on A; a PUB on A reaches subscribers on B (real processes)."""
    flag = ("--redis", redis_url) if backend == "redis" else ("--redis-cluster", cluster_seeds)
    callee = Proc(juggler("callee", *flag, "--workers", "20"))
    try:
        with contextlib.ExitStack() as stack_:
            a = stack_.enter_context(_server(flag))
            b = stack_.enter_context(_server(flag))
            async with connect(a) as ca, connect(b) as cb:
                await cb.sub("room.1")
                results = await asyncio.gather(*(ca.call("test.echo", str(i), timeout=15) for i in range(50)))
                assert results == [str(i) for i in range(50)]
                assert await cb.call("test.reverse", "xyz", timeout=15) == "zyx"
                await ca.pub("room.1", "from A")
                ev = await asyncio.wait_for(cb.next_event(), 10)
                assert ev.channel == "room.1" and ev.args == "from A"
    finally:
        assert callee.stop() == 0


def _server(flag: tuple[str, str]) -> Any:
    if flag[0] == "--redis":
        return juggler_server(flag[1])
    return _cluster_server(flag[1])


def _cluster_server(seeds: str) -> Any:
    return juggler_listening("server", "--redis-cluster", seeds, exits_clean=True)


@pytest.mark.timeout(150)
async def test_master_failover_is_survived(cluster_seeds: str, redis_cluster: RedisCluster) -> None:
    """SIGKILL the master serving test.echo's calls (and, with the results
    key, maybe more): calls in flight may expire but nothing hangs; once the
    replica is promoted every call succeeds, events flow again, and no
    connection is leaked."""
    async with redis_stack(cluster=cluster_seeds, cluster_retry_timeout=3.0) as server:
        broker = server.broker
        async with connect(server.url) as c, connect(server.url) as d:
            slot = key_slot(call_key("test.echo"))
            victim = redis_cluster.slot_owner(slot)
            # the pub-sub connection goes to the victim too: it must move
            router = broker.router
            ports = [a.port for a in router._primaries]
            router._pubsub_index = ports.index(victim) - 1
            await d.sub("after")
            assert broker._fanout.conn is not None and broker._fanout.conn.address.port == victim
            assert await c.call("test.echo", "before", timeout=10) == "before"
            killed = redis_cluster.kill(victim)

            async def during(i: int) -> str:
                try:
                    return str(await c.call("test.echo", str(i), timeout=2))
                except CallError as exc:  # expired or NACKed: allowed during the failover
                    return type(exc).__name__

            # calls made while the master is down finish one way or another, bounded
            outcomes = await asyncio.wait_for(asyncio.gather(*(during(i) for i in range(20))), 30)
            assert len(outcomes) == 20

            loop = asyncio.get_running_loop()
            new_master = await loop.run_in_executor(None, redis_cluster.wait_promoted, slot, victim, 30.0)
            assert new_master != victim

            # every call made after the promotion succeeds (on every slot), at once
            assert await c.call("test.echo", "first", timeout=10) == "first"
            results = await asyncio.gather(*(c.call("test.echo", str(i), timeout=10) for i in range(100)))
            assert results == [str(i) for i in range(100)]
            assert await c.call("test.reverse", "ab", timeout=10) == "ba"
            for i in range(4):
                assert await c.call(f"test.delay.{i}", "1", timeout=10) == 1

            # pub-sub: the subscription is back, re-subscribed on another node
            for _ in range(100):
                await c.pub("after", "x")
                try:
                    ev = await asyncio.wait_for(d.next_event(), 0.5)
                    break
                except TimeoutError:
                    continue
            else:
                raise AssertionError("no event after the failover")
            assert ev.channel == "after"
            assert broker._fanout.conn.address.port != victim

            # no leak: connections only to live primaries, a bounded number
            live = {n.port for n in redis_cluster.live()}
            pools = broker.router._pools
            assert {hp[1] for hp in pools} <= live
            assert broker.router.connections <= 3 * broker.config.pool_size
            assert all(not conn.closed for conn in broker._pops.connections)
            assert len(broker._pops.connections) <= 1
    # the session's cluster whole again: the killed node rejoins as a replica
    redis_cluster.restart(killed)
    redis_cluster.wait_ok(30)


@pytest.mark.timeout(150)
async def test_server_and_callee_processes_survive_a_failover(
    cluster_seeds: str, redis_cluster: RedisCluster
) -> None:
    """The same with `juggler server` and `juggler callee` processes: after
    the promotion every call succeeds, and both still stop cleanly (exit 0)."""
    # kill the master of a slot other than the one the first failover test used
    slot = key_slot(call_key("test.reverse"))
    victim = redis_cluster.slot_owner(slot)
    callee = Proc(juggler("callee", "--redis-cluster", cluster_seeds, "--workers", "20"))
    killed = None
    try:
        with _cluster_server(cluster_seeds) as url:
            async with connect(url) as c:
                assert await c.call("test.reverse", "ab", timeout=10) == "ba"
                killed = redis_cluster.kill(victim)
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, redis_cluster.wait_promoted, slot, victim, 30.0)
                results = await asyncio.gather(*(c.call("test.reverse", f"{i}x", timeout=10) for i in range(50)))
                assert results == [f"{i}x"[::-1] for i in range(50)]
                assert await c.call("test.echo", "e", timeout=10) == "e"
    finally:
        assert callee.stop() == 0, callee.output()
        if killed is not None:
            redis_cluster.restart(killed)
            redis_cluster.wait_ok(30)


async def test_nothing_hangs_when_the_cluster_is_unreachable() -> None:
    """Seeds that do not answer: start fails fast with a BrokerError."""
    from tests.netutil import free_port

    from juggler.broker.base import BrokerError

    broker = RedisBroker(RedisBrokerConfig(cluster=f"redis://127.0.0.1:{free_port()}", connect_timeout=1.0))
    with pytest.raises(BrokerError):
        await asyncio.wait_for(broker.start(), 15)
    await broker.aclose()

