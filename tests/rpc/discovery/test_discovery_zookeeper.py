"""ZooKeeper registry against a real ZooKeeper (Debian's zookeeper package):
rpcx-zookeeper's node layout, the children watch, a killed server's session
expiring, a registrar re-registering after its own session expired, groups,
cache fallback. The nodes are read back with a separate kazoo client."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from rpc.discovery import FileCache
from rpc.discovery.zookeeper import (
    ZooKeeperDiscovery,
    ZooKeeperRegistrar,
    ZooKeeperSession,
    base_path,
)
from rpc.errors import RegistryUnavailable
from tests.netutil import free_port
from tests.rpc.discovery.helpers import (
    assert_killed_server_expires,
    node_servers,
    wait_servers,
)
from tests.rpc.zookeeper_fixture import ZooKeeperServer

A, B = "tcp@127.0.0.1:7001", "tcp@127.0.0.1:7002"
_bases = itertools.count()


@pytest.fixture
def base() -> str:
    """A fresh base path per test (the ZooKeeper is shared by the session)."""
    return f"/rpcx-test-{os.getpid()}-{next(_bases)}"


@pytest.fixture
def zk_hosts(zookeeper_server: ZooKeeperServer) -> str:
    return zookeeper_server.hosts


@pytest.fixture
def raw(zk_hosts: str) -> Iterator[KazooClient]:
    """A plain kazoo client to read back (and tamper with) the nodes."""
    zk = KazooClient(hosts=zk_hosts, timeout=4)
    zk.start(timeout=10)
    yield zk
    zk.stop()
    zk.close()


def node(raw: KazooClient, path: str) -> tuple[bytes, bool] | None:
    """(data, ephemeral) of ``path``, None when it does not exist."""
    if raw.exists(path) is None:
        return None
    data, stat = raw.get(path)
    return data, stat.ephemeralOwner != 0


async def test_nodes_follow_rpcx_zookeeper_layout(zk_hosts: str, base: str, raw: KazooClient) -> None:
    """Parents of the base empty, the base "rpcx_path", the service node its
    name (all persistent), the address node ephemeral with the metadata, owned
    by the registrar's session; unregistering leaves the service node."""
    nested = f"{base}/apps/"  # a trailing slash is dropped, as rpcx-zookeeper's clients drop it
    reg = ZooKeeperRegistrar(zk_hosts, base=nested, ttl=4)
    try:
        await reg.register("Arith", A, "weight=2&group=blue")
        tree = await asyncio.to_thread(lambda: {
            p: node(raw, p) for p in (base, f"{base}/apps", f"{base}/apps/Arith", f"{base}/apps/Arith/{A}")})
        assert tree == {
            base: (b"", False),
            f"{base}/apps": (b"rpcx_path", False),
            f"{base}/apps/Arith": (b"Arith", False),
            f"{base}/apps/Arith/{A}": (b"weight=2&group=blue", True),
        }
        _, stat = await asyncio.to_thread(raw.get, f"{base}/apps/Arith/{A}")
        assert stat.ephemeralOwner == reg.session.session_id
        await reg.unregister("Arith", A)
        assert await asyncio.to_thread(node, raw, f"{base}/apps/Arith/{A}") is None
        assert await asyncio.to_thread(node, raw, f"{base}/apps/Arith") == (b"Arith", False)
    finally:
        await reg.aclose()


async def test_register_watch_unregister(zk_hosts: str, base: str, raw: KazooClient) -> None:
    reg = ZooKeeperRegistrar(zk_hosts, base=base, ttl=4)
    disc = ZooKeeperDiscovery(zk_hosts, "Arith", base=base, refresh_interval=60)  # changes come by the watch
    await disc.start()
    try:
        assert disc.servers() == {}  # no service node yet: watched for creation
        await reg.register("Arith", A, "weight=2")
        assert await wait_servers(disc, lambda s: A in s) == {A: "weight=2"}
        await reg.register("Arith", B)
        await reg.register("Arithmetic", A)  # another service, not a child
        assert await wait_servers(disc, lambda s: len(s) == 2) == {A: "weight=2", B: ""}
        await reg.unregister("Arith", A)
        assert await wait_servers(disc, lambda s: A not in s) == {B: ""}
        await reg.aclose()  # deletes the node and closes the session
        assert await wait_servers(disc, lambda s: not s) == {}
        assert await asyncio.to_thread(node, raw, f"{base}/Arithmetic/{A}") is None
    finally:
        await disc.aclose()
        await reg.aclose()


REGISTER_FOREVER = """
import asyncio, sys
from rpc.discovery.zookeeper import ZooKeeperRegistrar
async def main():
    reg = ZooKeeperRegistrar(sys.argv[1], base=sys.argv[2], ttl=2)
    await reg.register("Arith", sys.argv[3])
    print("registered", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def test_killed_server_session_expires(zk_hosts: str, base: str) -> None:
    """SIGKILL leaves the node to ZooKeeper: it goes when the session expires
    (2 s asked; the watch, not the periodic re-read, reports it)."""
    disc = ZooKeeperDiscovery(zk_hosts, "Arith", base=base, refresh_interval=60)
    await assert_killed_server_expires(disc, REGISTER_FOREVER, [zk_hosts, base, B], B, expiry=15)


async def test_registrar_registers_again_after_its_session_expired(
    zk_hosts: str, base: str, raw: KazooClient
) -> None:
    """A session expired (e.g. a long partition) takes the node with it; the
    registrar's new session creates it again, as the Go plugin's refresh does."""
    reg = ZooKeeperRegistrar(zk_hosts, base=base, ttl=4, heartbeat=60)  # the reconnection, not the heartbeat
    disc = ZooKeeperDiscovery(zk_hosts, "Arith", base=base, refresh_interval=60)
    await disc.start()
    try:
        await reg.register("Arith", A, "weight=3")
        await wait_servers(disc, lambda s: A in s)
        old = reg.session.session_id
        assert old is not None
        zk = reg.session._zk
        assert zk is not None
        sid, password = zk.client_id

        def expire() -> None:
            # ZooKeeper's way to expire a session from outside: join it, then close it
            thief = KazooClient(hosts=zk_hosts, client_id=(sid, password), timeout=4)
            thief.start(timeout=10)
            thief.stop()
            thief.close()

        await asyncio.to_thread(expire)
        await wait_servers(disc, lambda s: A not in s, timeout=10)
        assert await wait_servers(disc, lambda s: A in s, timeout=15) == {A: "weight=3"}
        _, stat = await asyncio.to_thread(raw.get, f"{base}/Arith/{A}")
        assert stat.ephemeralOwner == reg.session.session_id != old
    finally:
        await disc.aclose()
        await reg.aclose()


async def test_data_change_is_seen_by_the_periodic_read(zk_hosts: str, base: str, raw: KazooClient) -> None:
    """The watch is on children (as rpcx-zookeeper's); metadata rewritten in
    place (``state=inactive``) arrives with the next re-read."""
    reg = ZooKeeperRegistrar(zk_hosts, base=base, ttl=4)
    disc = ZooKeeperDiscovery(zk_hosts, "Arith", base=base, refresh_interval=0.1)
    try:
        await reg.register("Arith", A, "weight=1")
        await disc.start()
        await wait_servers(disc, lambda s: A in s)
        await asyncio.to_thread(raw.set, f"{base}/Arith/{A}", b"weight=1&state=inactive")
        assert await wait_servers(disc, lambda s: "inactive" in s.get(A, "")) == {A: "weight=1&state=inactive"}
    finally:
        await disc.aclose()
        await reg.aclose()


async def test_xclient_groups_with_zookeeper(zk_hosts: str, base: str) -> None:
    """An XClient of a group uses only that group's servers, one without a
    group every active server; re-registering with state=inactive drops one."""
    from rpc.xclient import XClient, XClientOptions

    C = "tcp@127.0.0.1:7003"
    reg = ZooKeeperRegistrar(zk_hosts, base=base, ttl=4)
    async with node_servers(reg, (A, B, C)) as net:
        await reg.register("Node", A, "group=blue")
        await reg.register("Node", B, "weight=2&group=green")
        disc = ZooKeeperDiscovery(zk_hosts, "Node", base=base, refresh_interval=60)
        await disc.start()
        clients = {g: XClient("Node", disc, net, options=XClientOptions(group=g)) for g in ("blue", "green", "")}
        try:
            for xc in clients.values():
                await xc.start()
            await wait_servers(disc, lambda s: s.get(A) == "group=blue" and s.get(B) == "weight=2&group=green")
            assert {await clients["blue"].call("Who", None) for _ in range(6)} == {"7001"}
            assert {await clients["green"].call("Who", None) for _ in range(6)} == {"7002"}
            assert {await clients[""].call("Who", None) for _ in range(30)} == {"7001", "7002", "7003"}
            await reg.register("Node", A, "group=blue&state=inactive")
            await wait_servers(disc, lambda s: "inactive" in s[A])
            assert set(clients["blue"].servers) == set()
            assert set(clients[""].servers) == {B, C}
        finally:
            for xc in clients.values():
                await xc.aclose()
            await disc.aclose()
            await reg.aclose()


async def test_cache_fallback_and_unreachable(zk_hosts: str, base: str, tmp_path) -> None:
    cache = FileCache(tmp_path / "arith.json")
    reg = ZooKeeperRegistrar(zk_hosts, base=base, ttl=4)
    await reg.register("Arith", A)
    disc = ZooKeeperDiscovery(zk_hosts, "Arith", base=base, cache=cache)
    await disc.start()
    await disc.aclose()
    await reg.aclose()
    dead = f"127.0.0.1:{free_port()}"
    fallback = ZooKeeperDiscovery(dead, "Arith", base=base, cache=cache, timeout=0.5)
    await fallback.start()
    try:
        assert fallback.from_cache and fallback.servers() == {A: ""}
        assert not await fallback.refresh()
    finally:
        await fallback.aclose()
    with pytest.raises(RegistryUnavailable, match="not connected within"):
        await ZooKeeperDiscovery(dead, "Arith", base=base, timeout=0.5).start()
    unreachable = ZooKeeperRegistrar(dead, base=base, timeout=0.5)
    with pytest.raises(RegistryUnavailable):
        await unreachable.register("Arith", A)
    await unreachable.aclose()


def test_validation() -> None:
    assert base_path("rpcx") == base_path("/rpcx/") == "/rpcx"
    with pytest.raises(ValueError, match="must name a node"):
        base_path("/")
    with pytest.raises(ValueError, match="HOST:PORT"):
        ZooKeeperSession("zookeeper://127.0.0.1:2181")
    with pytest.raises(ValueError, match="ttl"):
        ZooKeeperRegistrar("127.0.0.1:2181", ttl=0)


def test_registry_url() -> None:
    from rpc.discovery.url import RegistryURL, is_registry_url

    url = RegistryURL.parse("zookeeper://127.0.0.1/apps/rpcx")
    assert (url.kind, url.endpoint, url.base, url.display) == (
        "zookeeper", "127.0.0.1:2181", "/apps/rpcx", "zookeeper://127.0.0.1:2181")
    assert is_registry_url("zookeeper://h:1/x") and RegistryURL.parse("zookeeper://h:1").base == "/rpcx"
    disc = url.discovery("Arith")
    assert isinstance(disc, ZooKeeperDiscovery) and disc.path == "/apps/rpcx/Arith"
    for bad, why in (("zookeeper://h:1/x?db=1", "takes no query"), ("zookeeper://u:p@h:1/x", "user and password"),
                     ("zookeeper://h:1/", "must name a node"), ("zk://h:1/x", "zookeeper://HOST:PORT/BASE")):
        with pytest.raises(ValueError, match=why):
            RegistryURL.parse(bad)
    with pytest.raises(ValueError, match="TLS options"):
        RegistryURL.parse("zookeeper://h:1/x", tls=object())


@pytest.mark.parametrize(("args", "status", "message"), [
    (["--zookeeper", "zookeeper://127.0.0.1:2181"], 2, "ZooKeeper hosts must be HOST:PORT"),
    (["--zookeeper", "127.0.0.1:1", "--etcd", "http://127.0.0.1:1"], 2, "not allowed with argument --zookeeper"),
    (["--zookeeper", "127.0.0.1:1", "--registry-tls-ca", "ca.pem"], 2, "not supported with --zookeeper"),
    (["--zookeeper", "127.0.0.1:1", "--base", "/"], 2, "base path must name a node"),
    (["--zookeeper", "UNREACHABLE"], 1, "cannot register in the registry: zookeeper 127.0.0.1:"),
])
def test_rpc_serve_zookeeper_errors(args: list[str], status: int, message: str) -> None:
    """One line a user can act on, and no traceback."""
    import subprocess
    import sys

    args = [f"127.0.0.1:{free_port()}" if a == "UNREACHABLE" else a for a in args]
    res = subprocess.run([sys.executable, "-m", "cli", "rpc", "serve", "--example", "arith",
                          "--listen", "127.0.0.1:0", *args],
                         check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == status, res.stderr
    assert message in res.stderr.strip().splitlines()[-1]
    assert "Traceback" not in res.stderr


async def test_zookeeper_restart(base: str) -> None:
    """ZooKeeper stopped and started again (its data kept): the registrar's
    node is there again (its session resumed, or re-created in a new one),
    and the discovery's watch is set again: a registration and a removal
    afterwards come through it (the periodic re-read is set to a minute)."""
    import shutil

    from tests.rpc.zookeeper_fixture import start_zookeeper

    server = await asyncio.to_thread(start_zookeeper)
    reg = ZooKeeperRegistrar(server.hosts, base=base, ttl=4)
    later = ZooKeeperRegistrar(server.hosts, base=base, ttl=4)
    disc = ZooKeeperDiscovery(server.hosts, "Arith", base=base, refresh_interval=60)
    try:
        await reg.register("Arith", A, "weight=1")
        await disc.start()
        await wait_servers(disc, lambda s: A in s)
        await asyncio.to_thread(server.stop)
        server = await asyncio.to_thread(start_zookeeper, port=server.port, workdir=server.dir)
        await later.register("Arith", B)
        assert await wait_servers(disc, lambda s: len(s) == 2, timeout=20) == {A: "weight=1", B: ""}
        await later.unregister("Arith", B)  # seen by the watch set again since
        assert await wait_servers(disc, lambda s: B not in s) == {A: "weight=1"}
    finally:
        await disc.aclose()
        await later.aclose()
        await reg.aclose()
        await asyncio.to_thread(server.stop)
        shutil.rmtree(server.dir, ignore_errors=True)
