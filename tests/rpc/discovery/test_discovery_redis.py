"""Redis registry against a real redis-server, in both layouts (Go rpcx's
libkv one, the default, and the earlier juggler one): register, watch, TTL
expiry of a killed server, deregistration, file-cached fallback, XClient
failover; then the libkv layout's own behaviour (raw keys, an edit made in
Redis kept, keyspace notifications turned on or missed)."""

from __future__ import annotations

import asyncio
import logging
import shutil

import pytest
import redis.asyncio as aioredis

from rpc.discovery import FileCache
from rpc.discovery.libkv import KVPair, decode_pair, encode_pair
from rpc.discovery.redis import RedisDiscovery, RedisRegistrar
from rpc.errors import RegistryUnavailable
from rpc.failmode import FailMode
from rpc.xclient import XClient, XClientOptions
from tests.netutil import free_port, start_redis

from tests.rpc.discovery.helpers import assert_killed_server_expires, node_servers, wait_servers

A, B = "tcp@127.0.0.1:7001", "tcp@127.0.0.1:7002"


@pytest.fixture(params=["libkv", "juggler"])
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def server_key(layout: str, service: str, address: str, base: str = "/rpcx") -> str:
    """The Redis key of one registered server in ``layout``."""
    return f"/{base}/{service}/{address}" if layout == "libkv" else f"{base}/{service}/{address}"


async def test_register_watch_unregister(redis_url: str, layout: str) -> None:
    reg = RedisRegistrar(redis_url, ttl=10, layout=layout)
    # a long refresh interval: changes must arrive through the watch (pub/sub)
    disc = RedisDiscovery(redis_url, "Arith", refresh_interval=60, layout=layout)
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


async def test_heartbeat_keeps_entry_past_ttl(redis_url: str, layout: str) -> None:
    reg = RedisRegistrar(redis_url, ttl=0.5, layout=layout)
    await reg.register("Arith", A)
    r = aioredis.Redis.from_url(redis_url)
    key = server_key(layout, "Arith", A)
    try:
        await asyncio.sleep(1.2)  # > 2 TTLs: only heartbeats keep it
        assert await r.exists(key) == 1
        ttl = await r.pttl(key)
        assert 0 < ttl <= 500
    finally:
        await reg.aclose()
        assert await r.exists(key) == 0
        await r.aclose()


REGISTER_FOREVER = """
import asyncio, sys
from rpc.discovery.redis import RedisRegistrar
async def main():
    reg = RedisRegistrar(sys.argv[1], ttl=1.0, layout=sys.argv[3])
    await reg.register("Arith", sys.argv[2])
    print("registered", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def test_killed_server_expires(redis_url: str, layout: str) -> None:
    # a long refresh interval: the expiry must arrive through the watch (keyspace notifications in libkv)
    disc = RedisDiscovery(redis_url, "Arith", refresh_interval=0.2 if layout == "juggler" else 60, layout=layout)
    await assert_killed_server_expires(disc, REGISTER_FOREVER, [redis_url, B, layout], B, expiry=10)


async def test_cache_fallback_when_registry_unreachable(redis_url: str, tmp_path, layout: str) -> None:
    cache = FileCache(tmp_path / "arith.json")
    reg = RedisRegistrar(redis_url, ttl=10, layout=layout)
    await reg.register("Arith", A, "weight=3")
    disc = RedisDiscovery(redis_url, "Arith", cache=cache, layout=layout)
    await disc.start()
    await disc.aclose()
    await reg.aclose()
    assert cache.load() == {A: "weight=3"}

    dead = f"redis://127.0.0.1:{free_port()}/0"
    fallback = RedisDiscovery(dead, "Arith", cache=cache, refresh_interval=0.1, layout=layout)
    await fallback.start()
    try:
        assert fallback.from_cache and fallback.servers() == {A: "weight=3"}
    finally:
        await fallback.aclose()
    with pytest.raises(RegistryUnavailable):
        await RedisDiscovery(dead, "Arith", layout=layout).start()


async def test_registry_outage_keeps_known_servers(layout: str) -> None:
    server = start_redis()
    reg = RedisRegistrar(server.url, ttl=30, layout=layout)
    disc = RedisDiscovery(server.url, "Arith", refresh_interval=60, layout=layout)
    try:
        await reg.register("Arith", A)
        await disc.start()
        assert disc.servers() == {A: ""}
        await asyncio.to_thread(server.stop)  # the registry dies
        assert not await disc.refresh()
        # (the watch, losing its connection too, may have asked for a fetch that failed as well)
        assert disc.servers() == {A: ""} and disc.fetch_errors >= 1
    finally:
        await disc.aclose()
        await reg.aclose()  # cannot unregister: logged, not raised
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


async def test_xclient_with_redis_registry_and_failover(redis_url: str, layout: str) -> None:
    """The manual's scenario (docs/rpc/index.md): two servers in a Redis registry, a client with failover."""
    reg = RedisRegistrar(redis_url, ttl=10, layout=layout)
    async with node_servers(reg, (A, B)) as net:
        disc = RedisDiscovery(redis_url, "Node", refresh_interval=60, layout=layout)
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


async def test_discovery_recovers_after_registry_restart(layout: str) -> None:
    server = start_redis()
    port = server.port
    disc = RedisDiscovery(server.url, "Arith", refresh_interval=0.2, layout=layout)
    reg = None
    try:
        await disc.start()
        await asyncio.to_thread(server.stop)
        shutil.rmtree(server.dir, ignore_errors=True)
        assert not await disc.refresh()  # down: nothing changes
        server = await asyncio.to_thread(start_redis, None, port)  # back, empty
        reg = RedisRegistrar(server.url, ttl=10, layout=layout)
        await reg.register("Arith", A)
        assert await wait_servers(disc, lambda s: A in s, timeout=15) == {A: ""}
    finally:
        await disc.aclose()
        if reg is not None:
            await reg.aclose()
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


# -- the libkv layout --------------------------------------------------------

NOW_NS = 1_764_000_000_762_640_776  # a clock for LastIndex: 762640776


async def test_libkv_keys_and_values_are_go_rpcx_ones(redis_url: str) -> None:
    """What RedisRegisterPlugin{BasePath: "/rpcx_test"} writes for RegisterName("Arith", …, "group=canary"),
    byte for byte (tests/rpc/interop checks it against the Go plugin itself)."""
    reg = RedisRegistrar(redis_url, base="/rpcx_test", ttl=10, now_ns=lambda: NOW_NS)
    r = aioredis.Redis.from_url(redis_url)
    try:
        await reg.register("Arith", A, "group=canary")
        assert sorted(await r.keys("*")) == [b"//rpcx_test", b"//rpcx_test/Arith", f"//rpcx_test/Arith/{A}".encode()]
        assert await r.get("//rpcx_test") == b'{"Key":"/rpcx_test","Value":"cnBjeF9wYXRo","LastIndex":762640776}'
        assert await r.get("//rpcx_test/Arith") == b'{"Key":"/rpcx_test/Arith","Value":"QXJpdGg=","LastIndex":762640776}'
        assert await r.get(f"//rpcx_test/Arith/{A}") == (
            b'{"Key":"/rpcx_test/Arith/tcp@127.0.0.1:7001","Value":"Z3JvdXA9Y2FuYXJ5","LastIndex":762640776}')
        assert await r.pttl("//rpcx_test") == -1 and await r.pttl("//rpcx_test/Arith") == -1
        assert 9000 < await r.pttl(f"//rpcx_test/Arith/{A}") <= 10000
        await reg.aclose()
        # deregistered; the directories stay (a Go discovery cannot start without one)
        assert sorted(await r.keys("*")) == [b"//rpcx_test", b"//rpcx_test/Arith"]
    finally:
        await reg.aclose()
        await r.aclose()


async def test_libkv_heartbeat_keeps_an_edit_and_recreates_a_lost_entry(redis_url: str) -> None:
    """As Go's plugin, the heartbeat keeps the value found in Redis (an operator's
    state=inactive) and re-creates an entry that vanished."""
    reg = RedisRegistrar(redis_url, ttl=0.6)
    disc = RedisDiscovery(redis_url, "Arith", refresh_interval=60)
    r = aioredis.Redis.from_url(redis_url)
    key = f"//rpcx/Arith/{A}"
    try:
        await reg.register("Arith", A, "weight=1")
        await disc.start()
        assert disc.servers() == {A: "weight=1"}
        edited = KVPair(key=f"/rpcx/Arith/{A}", value=b"weight=1&state=inactive", last_index=1)
        await r.set(key, encode_pair(edited), keepttl=True)
        await wait_servers(disc, lambda s: s == {A: "weight=1&state=inactive"})
        await asyncio.sleep(1.4)  # > 2 TTLs: the heartbeat renewed the edited entry
        assert decode_pair(await r.get(key)) == edited and disc.servers() == {A: "weight=1&state=inactive"}
        await r.delete(key)
        await wait_servers(disc, lambda s: s == {A: "weight=1"}, timeout=3)  # re-created by the next beat
    finally:
        await disc.aclose()
        await reg.aclose()
        await r.aclose()


async def test_libkv_watch_turns_keyspace_notifications_on(redis_url: str) -> None:
    r = aioredis.Redis.from_url(redis_url)
    reg = RedisRegistrar(redis_url, ttl=10)
    disc = RedisDiscovery(redis_url, "Arith", refresh_interval=60)  # only the watch can tell
    try:
        await r.config_set("notify-keyspace-events", "")
        await disc.start()
        await reg.register("Arith", A)
        assert await wait_servers(disc, lambda s: A in s, timeout=2) == {A: ""}
        flags = set((await r.config_get("notify-keyspace-events"))["notify-keyspace-events"])
        assert "K" in flags and ("A" in flags or {"g", "$", "x"} <= flags), flags
        await reg.unregister("Arith", A)
        assert await wait_servers(disc, lambda s: not s, timeout=2) == {}
    finally:
        await disc.aclose()
        await reg.aclose()
        await r.aclose()


async def test_libkv_without_keyspace_notifications_refreshes(caplog: pytest.LogCaptureFixture) -> None:
    """A Redis where CONFIG is refused and notifications are off: changes are
    seen at the periodic refresh, and the log says why."""
    server = start_redis(["--rename-command", "CONFIG", ""])
    reg = RedisRegistrar(server.url, ttl=10)
    disc = RedisDiscovery(server.url, "Arith", refresh_interval=0.3)
    try:
        with caplog.at_level(logging.WARNING, logger="rpc.discovery.redis"):
            await disc.start()
            await reg.register("Arith", A)
            assert await wait_servers(disc, lambda s: A in s) == {A: ""}
        assert "keyspace notifications are off and cannot be turned on" in caplog.text
    finally:
        await disc.aclose()
        await reg.aclose()
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


async def test_libkv_lists_only_its_service_under_a_literal_base(redis_url: str) -> None:
    """Glob characters in the base are literal; a sibling service whose name
    starts with this one's, a value that is no libkv pair, and other bases are not servers."""
    base = "/r[p]c*"
    reg = RedisRegistrar(redis_url, base=base, ttl=10)
    other = RedisRegistrar(redis_url, base="/rpc", ttl=10)
    disc = RedisDiscovery(redis_url, "Arith", base=base, refresh_interval=60)
    r = aioredis.Redis.from_url(redis_url)
    try:
        await reg.register("Arith", A)
        await reg.register("Arith", "unix@/tmp/arith.sock", "weight=2")
        await reg.register("Arith2", B)
        await other.register("Arith", B)
        await r.set(f"/{base}/Arith/tcp@127.0.0.1:7003", b"not a pair")
        await disc.start()
        assert disc.servers() == {A: "", "unix@/tmp/arith.sock": "weight=2"}
    finally:
        await disc.aclose()
        await reg.aclose()
        await other.aclose()
        await r.aclose()


def test_an_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown Redis registry layout 'etcd' \\(expected libkv or juggler\\)"):
        RedisRegistrar("redis://127.0.0.1:6379/0", layout="etcd")  # type: ignore[arg-type]
