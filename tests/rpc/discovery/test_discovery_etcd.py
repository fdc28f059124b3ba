"""etcd v3 registry against a real etcd (Debian's etcd-server), through its
JSON gateway: lease + keepalive, watch, expiry of a killed server, lease
loss recovery, deregistration, cache fallback."""

from __future__ import annotations

import base64
import itertools
import os

import pytest

from rpc.discovery import FileCache
from rpc.discovery.etcd import EtcdDiscovery, EtcdHTTP, EtcdRegistrar, prefix_end
from rpc.errors import RegistryUnavailable
from tests.netutil import free_port
from tests.rpc.discovery.helpers import assert_killed_server_expires, node_servers, wait_servers

A, B = "tcp@127.0.0.1:7001", "tcp@127.0.0.1:7002"
_bases = itertools.count()


@pytest.fixture
def base() -> str:
    """A fresh key prefix per test (the etcd is shared by the session)."""
    return f"/rpcx-test-{os.getpid()}-{next(_bases)}"


def test_prefix_end() -> None:
    assert prefix_end(b"/rpcx/Arith/") == b"/rpcx/Arith0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff") == b"\x00"


async def test_register_watch_unregister(etcd_endpoint: str, base: str) -> None:
    reg = EtcdRegistrar(etcd_endpoint, base=base, ttl=10)
    disc = EtcdDiscovery(etcd_endpoint, "Arith", base=base, refresh_interval=60)  # changes come by watch
    await disc.start()
    try:
        await reg.register("Arith", A, "weight=2")
        await reg.register("Arith", B)
        await reg.register("Arithmetic", A)  # another service sharing the prefix's start
        assert await wait_servers(disc, lambda s: len(s) == 2) == {A: "weight=2", B: ""}
        await reg.unregister("Arith", A)
        assert await wait_servers(disc, lambda s: A not in s) == {B: ""}
        lease = reg.lease
        await reg.aclose()
        assert await wait_servers(disc, lambda s: not s) == {}
        # the lease is revoked too
        res = await EtcdHTTP(etcd_endpoint).post("/v3/lease/timetolive", {"ID": lease})
        assert int(res.get("TTL", -1)) == -1
    finally:
        await disc.aclose()
        await reg.aclose()


REGISTER_FOREVER = """
import asyncio, sys
from rpc.discovery.etcd import EtcdRegistrar
async def main():
    reg = EtcdRegistrar(sys.argv[1], base=sys.argv[2], ttl=2)
    await reg.register("Arith", sys.argv[3])
    print("registered", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def test_killed_server_lease_expires(etcd_endpoint: str, base: str) -> None:
    disc = EtcdDiscovery(etcd_endpoint, "Arith", base=base, refresh_interval=60)  # the watch sees the expiry
    await assert_killed_server_expires(disc, REGISTER_FOREVER, [etcd_endpoint, base, B], B, expiry=15)


async def test_keepalive_recovers_a_lost_lease(etcd_endpoint: str, base: str) -> None:
    reg = EtcdRegistrar(etcd_endpoint, base=base, ttl=10, heartbeat=9)
    disc = EtcdDiscovery(etcd_endpoint, "Arith", base=base, refresh_interval=60)
    await disc.start()
    try:
        await reg.register("Arith", A, "w")
        await wait_servers(disc, lambda s: A in s)
        await reg.http.post("/v3/lease/revoke", {"ID": reg.lease})  # e.g. expired during a partition
        await wait_servers(disc, lambda s: not s)
        old = reg.lease
        await reg.keepalive()
        assert reg.lease != old
        assert await wait_servers(disc, lambda s: A in s) == {A: "w"}
    finally:
        await disc.aclose()
        await reg.aclose()


async def test_keys_follow_rpcx_layout(etcd_endpoint: str, base: str) -> None:
    reg = EtcdRegistrar(etcd_endpoint, base=base, ttl=10)
    try:
        await reg.register("Arith", A, "weight=1")
        key = f"{base}/Arith/{A}".encode()
        res = await reg.http.post("/v3/kv/range", {"key": base64.b64encode(key).decode()})
        assert base64.b64decode(res["kvs"][0]["value"]) == b"weight=1"
        assert res["kvs"][0]["lease"] == reg.lease
    finally:
        await reg.aclose()


async def test_cache_fallback(etcd_endpoint: str, base: str, tmp_path) -> None:
    cache = FileCache(tmp_path / "arith.json")
    reg = EtcdRegistrar(etcd_endpoint, base=base, ttl=10)
    await reg.register("Arith", A)
    disc = EtcdDiscovery(etcd_endpoint, "Arith", base=base, cache=cache)
    await disc.start()
    await disc.aclose()
    await reg.aclose()
    dead = f"http://127.0.0.1:{free_port()}"
    fallback = EtcdDiscovery(dead, "Arith", base=base, cache=cache)
    await fallback.start()
    try:
        assert fallback.from_cache and fallback.servers() == {A: ""}
        assert not await fallback.refresh()
    finally:
        await fallback.aclose()
    with pytest.raises(RegistryUnavailable):
        await EtcdDiscovery(dead, "Arith", base=base).start()


def test_endpoint_validation() -> None:
    assert EtcdHTTP("127.0.0.1:2379").port == 2379
    assert EtcdHTTP("https://x:1").ssl is not None  # verified against the system's trust store
    with pytest.raises(ValueError):
        EtcdHTTP("ftp://x:1")


async def test_xclient_follows_etcd_registry(etcd_endpoint: str, base: str) -> None:
    from rpc.failmode import FailMode
    from rpc.xclient import XClient, XClientOptions

    reg = EtcdRegistrar(etcd_endpoint, base=base, ttl=10)
    async with node_servers(reg, (A, B)) as net:
        disc = EtcdDiscovery(etcd_endpoint, "Node", base=base, refresh_interval=60)
        await disc.start()
        xc = XClient("Node", disc, net, options=XClientOptions(fail_mode=FailMode.FAILOVER))
        try:
            await xc.start()
            await wait_servers(disc, lambda s: len(s) == 2)
            assert {await xc.call("Who", None) for _ in range(20)} == {"7001", "7002"}
            await reg.unregister("Node", A)
            await wait_servers(disc, lambda s: A not in s)
            assert set(xc.servers) == {B}
            assert {await xc.call("Who", None) for _ in range(5)} == {"7002"}
        finally:
            await xc.aclose()
            await disc.aclose()
            await reg.aclose()


async def test_xclient_groups_with_etcd(etcd_endpoint: str, base: str) -> None:
    """Servers registered in two groups and one in none: an XClient of a group
    uses only that group's servers, one without a group uses all of them, and
    a server re-registered in another group moves with the next update."""
    from rpc.xclient import XClient, XClientOptions

    C = "tcp@127.0.0.1:7003"
    reg = EtcdRegistrar(etcd_endpoint, base=base, ttl=10)
    async with node_servers(reg, (A, B, C)) as net:
        await reg.register("Node", A, "group=blue")
        await reg.register("Node", B, "weight=2&group=green")
        disc = EtcdDiscovery(etcd_endpoint, "Node", base=base, refresh_interval=60)
        await disc.start()
        clients = {g: XClient("Node", disc, net, options=XClientOptions(group=g)) for g in ("blue", "green", "")}
        try:
            for xc in clients.values():
                await xc.start()
            await wait_servers(disc, lambda s: s.get(A) == "group=blue" and s.get(B) == "weight=2&group=green")
            assert {await clients["blue"].call("Who", None) for _ in range(6)} == {"7001"}
            assert {await clients["green"].call("Who", None) for _ in range(6)} == {"7002"}
            assert {await clients[""].call("Who", None) for _ in range(30)} == {"7001", "7002", "7003"}
            await reg.register("Node", C, "group=blue")
            await wait_servers(disc, lambda s: s.get(C) == "group=blue")
            assert set(clients["blue"].servers) == {A, C}
            await reg.register("Node", A, "group=blue&state=inactive")
            await wait_servers(disc, lambda s: "inactive" in s[A])
            assert {await clients["blue"].call("Who", None) for _ in range(6)} == {"7003"}
            assert set(clients[""].servers) == {B, C}
        finally:
            for xc in clients.values():
                await xc.aclose()
            await disc.aclose()
            await reg.aclose()
