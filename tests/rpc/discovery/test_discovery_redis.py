"""Redis registry against a real redis-server: register, watch, TTL expiry of a
killed server, deregistration, file-cached fallback, XClient failover."""

from __future__ import annotations

import asyncio
import shutil

import pytest
import redis.asyncio as aioredis

from rpc.discovery import FileCache
from rpc.discovery.redis import RedisDiscovery, RedisRegistrar
from rpc.errors import RegistryUnavailable
from rpc.failmode import FailMode
from rpc.xclient import XClient, XClientOptions
from tests.netutil import free_port, start_redis

from tests.rpc.discovery.helpers import assert_killed_server_expires, node_servers, wait_servers

A, B = "tcp@127.0.0.1:7001", "tcp@127.0.0.1:7002"


async def test_register_watch_unregister(redis_url: str) -> None:
    reg = RedisRegistrar(redis_url, ttl=10)
    # a long refresh interval: changes must arrive through the watch (pub/sub)
    disc = RedisDiscovery(redis_url, "Arith", refresh_interval=60)
    await disc.start()
    try:
        assert disc.servers() == {}
        await reg.register("Arith", A, "weight=2")
        await reg.register("Arith", B)
        await reg.register("Other", A)
        servers = await wait_servers(disc, lambda s: len(s) == 2)
        assert servers == {A: "weight=2", B: ""}
        await reg.unregister("Arith", A)
        assert await wait_servers(disc, lambda s: A not in s) == {B: ""}
        await reg.aclose()  # deregisters everything on shutdown
        assert await wait_servers(disc, lambda s: not s) == {}
    finally:
        await disc.aclose()
        await reg.aclose()


async def test_heartbeat_keeps_entry_past_ttl(redis_url: str) -> None:
    reg = RedisRegistrar(redis_url, ttl=0.5)
    await reg.register("Arith", A)
    r = aioredis.Redis.from_url(redis_url)
    try:
        await asyncio.sleep(1.2)  # > 2 TTLs: only heartbeats keep it
        assert await r.get(f"/rpcx/Arith/{A}") == b""
        ttl = await r.pttl(f"/rpcx/Arith/{A}")
        assert 0 < ttl <= 500
    finally:
        await reg.aclose()
        assert await r.exists(f"/rpcx/Arith/{A}") == 0
        await r.aclose()


REGISTER_FOREVER = """
import asyncio, sys
from rpc.discovery.redis import RedisRegistrar
async def main():
    reg = RedisRegistrar(sys.argv[1], ttl=1.0)
    await reg.register("Arith", sys.argv[2])
    print("registered", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def test_killed_server_expires(redis_url: str) -> None:
    disc = RedisDiscovery(redis_url, "Arith", refresh_interval=0.2)
    await assert_killed_server_expires(disc, REGISTER_FOREVER, [redis_url, B], B, expiry=10)


async def test_cache_fallback_when_registry_unreachable(redis_url: str, tmp_path) -> None:
    cache = FileCache(tmp_path / "arith.json")
    reg = RedisRegistrar(redis_url, ttl=10)
    await reg.register("Arith", A, "weight=3")
    disc = RedisDiscovery(redis_url, "Arith", cache=cache)
    await disc.start()
    await disc.aclose()
    await reg.aclose()
    assert cache.load() == {A: "weight=3"}

    dead = f"redis://127.0.0.1:{free_port()}/0"
    fallback = RedisDiscovery(dead, "Arith", cache=cache, refresh_interval=0.1)
    await fallback.start()
    try:
        assert fallback.from_cache and fallback.servers() == {A: "weight=3"}
    finally:
        await fallback.aclose()
    with pytest.raises(RegistryUnavailable):
        await RedisDiscovery(dead, "Arith").start()


async def test_registry_outage_keeps_known_servers() -> None:
    server = start_redis()
    reg = RedisRegistrar(server.url, ttl=30)
    disc = RedisDiscovery(server.url, "Arith", refresh_interval=60)
    try:
        await reg.register("Arith", A)
        await disc.start()
        assert disc.servers() == {A: ""}
        await asyncio.to_thread(server.stop)  # the registry dies
        assert not await disc.refresh()
        assert disc.servers() == {A: ""} and disc.fetch_errors == 1
    finally:
        await disc.aclose()
        await reg.aclose()  # cannot unregister: logged, not raised
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


async def test_xclient_with_redis_registry_and_failover(redis_url: str) -> None:
    """The manual's scenario (docs/rpc/index.md): two servers in a Redis registry, a client with failover."""
    reg = RedisRegistrar(redis_url, ttl=10)
    async with node_servers(reg, (A, B)) as net:
        disc = RedisDiscovery(redis_url, "Node", refresh_interval=60)
        await disc.start()
        xc = XClient("Node", disc, net, options=XClientOptions(fail_mode=FailMode.FAILOVER, retries=2))
        try:
            await xc.start()
            await wait_servers(disc, lambda s: len(s) == 2)
            assert {await xc.call("Who", None) for _ in range(20)} == {"7001", "7002"}
            await net.remove(A)  # A dies without deregistering: failover hides it
            assert {await xc.call("Who", None) for _ in range(10)} == {"7002"}
            await reg.unregister("Node", A)  # and once deregistered the client drops it
            await wait_servers(disc, lambda s: A not in s)
            assert set(xc.servers) == {B}
        finally:
            await xc.aclose()
            await disc.aclose()
            await reg.aclose()


async def test_discovery_recovers_after_registry_restart() -> None:
    server = start_redis()
    port = server.port
    disc = RedisDiscovery(server.url, "Arith", refresh_interval=0.2)
    reg = None
    try:
        await disc.start()
        await asyncio.to_thread(server.stop)
        shutil.rmtree(server.dir, ignore_errors=True)
        assert not await disc.refresh()  # down: nothing changes
        server = await asyncio.to_thread(start_redis, None, port)  # back, empty
        reg = RedisRegistrar(server.url, ttl=10)
        await reg.register("Arith", A)
        assert await wait_servers(disc, lambda s: A in s, timeout=15) == {A: ""}
    finally:
        await disc.aclose()
        if reg is not None:
            await reg.aclose()
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)
