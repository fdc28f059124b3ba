"""The rpc client under faults: real ``juggler rpc serve`` processes, real
registries (redis-server, etcd, ZooKeeper, Consul), toxiproxy between the client and them.

Promises checked (docs/rpc/client.md, "Under faults"): a call to a server
that stops answering fails with ``CallTimeout`` within its deadline; a
half-open connection is found by the heartbeat and closed, its calls failing
with a retryable ``TransportError`` before their deadline, and the client
reconnects once the path is back; a registry that is gone (refusing, or
silent) leaves the client with its last known servers and calls keep
succeeding, also when the servers lost it too for longer than their entries
live (the registry expired them meanwhile, and lists them again at their next
heartbeat); the servers do not crash and their descriptors come back.

``FAULTS_REGISTRY_OUTAGE`` (seconds, default 2) is how long the registry stays
gone: set it to 60 for "a registry gone for a minute".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from rpc.client import Client
from rpc.discovery.base import WatchingDiscovery
from rpc.discovery.consul import ConsulDiscovery
from rpc.discovery.etcd import EtcdDiscovery
from rpc.discovery.redis import RedisDiscovery
from rpc.discovery.zookeeper import ZooKeeperDiscovery
from rpc.errors import CallTimeout, RegistryError, TransportError
from rpc.failmode import FailMode
from rpc.rpcx_client import RpcxCaller
from rpc.xclient import XClient, XClientOptions
from tests.faults.conftest import fd_count
from tests.faults.toxiproxy import Toxiproxy
from tests.netutil import LogLines, free_port, start_redis, wait_until
from tests.rpc.conftest import start_etcd
from tests.rpc.consul_fixture import start_consul
from tests.rpc.zookeeper_fixture import start_zookeeper

OUTAGE = float(os.environ.get("FAULTS_REGISTRY_OUTAGE", "2"))

pytestmark = [pytest.mark.timeout(60 + 3 * OUTAGE)]

ROOT = Path(__file__).resolve().parents[2]
#: a call's deadline in these tests (s), and slack over it for a loaded machine
DEADLINE, SLACK = 1.0, 2.0


class RpcServer:
    """``juggler rpc serve --example arith`` on a free port, optionally registered."""

    def __init__(self, *registry: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "rpc", "serve", "--listen", f"127.0.0.1:{self.port}",
             "--example", "arith", "--ttl", "30", *registry],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        self.log = LogLines(self.proc.stdout, "juggler rpc serve")
        self.log.wait("rpc serve: ", 30)  # its start line: listening, and registered

    def output(self) -> str:
        return "\n".join(self.log.log[-40:])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()


@pytest.fixture
def servers() -> Iterator[Callable[..., RpcServer]]:
    started: list[RpcServer] = []

    def start(*registry: str) -> RpcServer:
        s = RpcServer(*registry)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


async def mul(c: Client, a: int) -> None:
    assert await c.call("Arith", "Mul", {"A": a, "B": 2}, timeout=DEADLINE) == {"C": 2 * a}


async def served_again(c: Client, bound: float) -> float:
    """Seconds until a call succeeds again (bounded)."""
    t0 = time.monotonic()

    async def ok() -> bool:
        try:
            await mul(c, 1)
        except (CallTimeout, TransportError):
            return False
        return True

    await wait_until(ok, bound, interval=0.05, what="calls succeeding again")
    return time.monotonic() - t0


async def test_a_server_that_stops_answering_mid_call_is_a_call_timeout_in_time(
        toxiproxy: Toxiproxy, servers: Callable[..., RpcServer]) -> None:
    s = servers()
    link = toxiproxy.link("rpc-silent", s.address)
    async with Client(f"tcp@{link.address}", RpcxCaller(), close_caller=True) as c:
        await mul(c, 3)
        level = fd_count(s.proc.pid)
        link.toxic("timeout", timeout=0)  # requests reach the server; its replies never come back
        for a in range(3):
            t0 = time.monotonic()
            with pytest.raises(CallTimeout):
                await mul(c, a)
            assert time.monotonic() - t0 < DEADLINE + SLACK
        link.clear()
        assert await served_again(c, 5) < 5
    await wait_until(lambda: fd_count(s.proc.pid) <= level, 10, what="the server's descriptors back")
    assert s.proc.poll() is None


async def test_a_half_open_connection_is_found_by_the_heartbeat_and_replaced(
        toxiproxy: Toxiproxy, servers: Callable[..., RpcServer]) -> None:
    s = servers()
    link = toxiproxy.link("rpc-halfopen", s.address)
    caller = RpcxCaller(heartbeat_interval=0.3, heartbeat_timeout=0.5)
    async with Client(f"tcp@{link.address}", caller, close_caller=True) as c:
        await mul(c, 3)
        link.toxic("timeout", "upstream", name="up", timeout=0)  # nothing gets through, nothing is closed
        link.toxic("timeout", "downstream", name="down", timeout=0)
        t0 = time.monotonic()
        with pytest.raises(TransportError):  # the heartbeat gives up before the call's own deadline
            await c.call("Arith", "Mul", {"A": 1, "B": 2}, timeout=10)
        assert time.monotonic() - t0 < 0.3 + 0.5 + SLACK
        link.clear()
        assert await served_again(c, 5) < 5
    assert s.proc.poll() is None


@pytest.fixture(params=["redis", "etcd", "zookeeper", "consul"])
def registry(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(kind, HOST:PORT) of a real registry of its own."""
    starts = {"redis": start_redis, "etcd": start_etcd, "zookeeper": start_zookeeper, "consul": start_consul}
    server = starts[request.param]()
    yield request.param, f"127.0.0.1:{server.port}"
    server.stop(timeout=10)
    shutil.rmtree(server.dir, ignore_errors=True)


def _discovery(kind: str, through: str) -> WatchingDiscovery:
    if kind == "redis":
        return RedisDiscovery(f"redis://{through}/0", "Arith", refresh_interval=0.2)
    if kind == "zookeeper":
        return ZooKeeperDiscovery(through, "Arith", refresh_interval=0.2, timeout=1.0)
    if kind == "consul":
        return ConsulDiscovery(through, "Arith", refresh_interval=0.2)
    return EtcdDiscovery(f"http://{through}", "Arith", refresh_interval=0.2)


async def test_a_registry_gone_leaves_the_last_known_servers_in_use(
        registry: tuple[str, str], toxiproxy: Toxiproxy, servers: Callable[..., RpcServer]) -> None:
    """Gone twice: refusing connections, then silent (nothing gets through, nothing is closed)."""
    kind, address = registry
    flag = {"redis": ["--redis", f"redis://{address}/0"], "etcd": ["--etcd", f"http://{address}"],
            "zookeeper": ["--zookeeper", address], "consul": ["--consul", address]}[kind]
    a, b = servers(*flag), servers(*flag)
    link = toxiproxy.link(f"rpc-{kind}", address)
    disc = _discovery(kind, link.address)
    await disc.start()
    options = XClientOptions(fail_mode=FailMode.FAILOVER, retries=2, timeout=DEADLINE)
    try:
        async with RpcxCaller() as caller, XClient("Arith", disc, caller, options=options) as xc:
            await wait_until(lambda: len(disc.servers()) == 2, 10, what="both servers discovered")
            for gone in ("refusing", "silent"):
                errors = disc.fetch_errors
                if gone == "refusing":
                    link.disable()
                else:
                    link.toxic("timeout", "upstream", name="up", timeout=0)
                    link.toxic("timeout", "downstream", name="down", timeout=0)
                until = time.monotonic() + OUTAGE
                calls = 0
                while time.monotonic() < until:  # the whole outage: every call answered
                    assert await xc.call("Mul", {"A": calls, "B": 2}) == {"C": 2 * calls}
                    calls += 1
                    await asyncio.sleep(0.02)
                assert len(disc.servers()) == 2, (gone, disc.servers())
                if gone == "refusing":
                    # the discovery noticed (its next refresh or its session's loss: a busy machine may need
                    # longer than the outage), and calls still go to the last known servers meanwhile
                    await wait_until(lambda: disc.fetch_errors > errors, 15, interval=0.1, what="the outage seen")
                    assert await xc.call("Mul", {"A": 3, "B": 2}) == {"C": 6}
                    assert len(disc.servers()) == 2, (gone, disc.servers())
                    link.enable()
                else:
                    link.clear()
                back = time.monotonic()
                await wait_until(disc.refresh, 10, interval=0.1, what=f"the registry answering again ({gone})")
                assert time.monotonic() - back < 10
            b.stop()  # unregisters: the discovery follows the registry again
            await wait_until(lambda: list(disc.servers()) == [f"tcp@{a.address}"], 10,
                             what=lambda: f"b's removal seen (servers: {disc.servers()})")
            assert await xc.call("Mul", {"A": 4, "B": 2}) == {"C": 8}
    finally:
        async with asyncio.timeout(10):
            await disc.aclose()
    assert a.proc.poll() is None


#: per registry: the servers' --ttl (s), and how long after a server's last heartbeat the registry has
#: surely dropped its entry (Consul keeps a session up to twice its TTL, which is half the entry's)
EXPIRY = {"redis": (2.0, 2.0), "consul": (20.0, 20.0)}


@pytest.mark.parametrize("kind", ["redis", pytest.param("consul", marks=pytest.mark.slow)])  # Consul: 20 s at least
async def test_a_registry_gone_for_the_servers_too_does_not_empty_the_client(
        kind: str, toxiproxy: Toxiproxy, servers: Callable[..., RpcServer]) -> None:
    """Servers and client lose the registry for longer than the servers' entries live: the registry
    expires them meanwhile and lists them again only at their next heartbeat; the client keeps using
    them throughout, calls keep succeeding, and it follows the registry again afterwards."""
    ttl, expiry = EXPIRY[kind]
    server = start_redis() if kind == "redis" else start_consul()
    address = f"127.0.0.1:{server.port}"
    link = toxiproxy.link(f"rpc-all-{kind}", address)
    flag = ["--redis", f"redis://{link.address}/0"] if kind == "redis" else ["--consul", link.address]
    a, b = servers(*flag, "--ttl", str(ttl)), servers(*flag, "--ttl", str(ttl))
    disc, direct = _discovery(kind, link.address), _discovery(kind, address)
    await disc.start()
    options = XClientOptions(fail_mode=FailMode.FAILOVER, retries=2, timeout=DEADLINE)
    both = {f"tcp@{a.address}", f"tcp@{b.address}"}
    try:
        async with RpcxCaller() as caller, XClient("Arith", disc, caller, options=options) as xc:
            await wait_until(lambda: set(disc.servers()) == both, 10, what="both servers discovered")
            calls = 0

            async def call_and_check() -> None:
                nonlocal calls
                assert set(disc.servers()) == both, disc.servers()
                assert await xc.call("Mul", {"A": calls, "B": 2}) == {"C": 2 * calls}
                calls += 1

            link.disable()
            t0 = time.monotonic()
            while time.monotonic() - t0 < expiry + 1:  # the servers' entries expire meanwhile
                await call_and_check()
                await asyncio.sleep(0.05)

            async def registered() -> set[str]:
                with contextlib.suppress(RegistryError):
                    return set(await direct._fetch())
                return {"?"}

            await wait_until(lambda: _empty(registered()), expiry, what="the entries expired in the registry")
            link.enable()
            t0 = time.monotonic()
            while await registered() != both:  # the registry empty, then the servers' next heartbeats
                await call_and_check()
                assert time.monotonic() - t0 < ttl + 10, \
                    f"the servers did not register again:\n{a.output()}\n{b.output()}"
                await asyncio.sleep(0.05)
            assert await disc.refresh()  # the discovery sees them listed again: it follows the registry now
            assert disc.fetch_errors > 0
            await call_and_check()
            b.stop()  # unregisters: the discovery follows the registry again
            await wait_until(lambda: list(disc.servers()) == [f"tcp@{a.address}"], 10,
                             what=lambda: f"b's removal seen (servers: {disc.servers()})")
    finally:
        async with asyncio.timeout(10):
            await disc.aclose()
            await direct._close_backend()
        server.stop(timeout=10)
        shutil.rmtree(server.dir, ignore_errors=True)
    assert a.proc.poll() is None


async def _empty(servers: Awaitable[set[str]]) -> bool:
    return not await servers
