"""XClient over in-process servers (rpc.inprocess): selectors, fail modes with
servers dying, breakers, deadlines, auth, go/oneway/broadcast/fork, discovery."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rpc.breaker import BreakerConfig, BreakerState
from rpc.discovery import StaticDiscovery
from rpc.errors import (
    BroadcastError,
    CallTimeout,
    CircuitOpen,
    NoServerAvailable,
    ServiceError,
    TransportError,
)
from rpc.examples import Hello, benchmark_request
from rpc.failmode import FailMode
from rpc.inprocess import InProcessNetwork
from rpc.message import META_SERVER_TIMEOUT, SerializeType
from rpc.plugins import AuthPlugin, PluginContainer
from rpc.proto.benchmark_pb2 import BenchmarkMessage
from rpc.selector import ConsistentHashSelector, LatencySelector, RoundRobinSelector
from rpc.service import Context, ServiceDispatcher
from rpc.xclient import XClient, XClientOptions
from tests.netutil import wait_until

ADDRS = ["tcp@127.0.0.1:9001", "tcp@127.0.0.1:9002", "tcp@127.0.0.1:9003"]


class Node:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.oneway: list[Any] = []
        self.timeouts: list[str | None] = []
        self.gate: asyncio.Event | None = None

    async def Who(self, ctx: Context, args: Any) -> str:
        self.calls += 1
        self.timeouts.append(ctx.metadata.get(META_SERVER_TIMEOUT))
        if self.gate is not None:
            await self.gate.wait()
        return self.name

    async def Bad(self, ctx: Context, args: Any) -> None:
        self.calls += 1
        raise ServiceError(f"bad on {self.name}")

    async def Note(self, ctx: Context, args: Any) -> None:
        self.oneway.append(args)


class Cluster:
    def __init__(self, n: int = 3, plugins: Any = None) -> None:
        self.net = InProcessNetwork()
        self.nodes: dict[str, Node] = {}
        self.dispatchers: list[ServiceDispatcher] = []
        for addr in ADDRS[:n]:
            node = Node(addr.rsplit(":", 1)[1])
            d = ServiceDispatcher(plugins=plugins() if plugins else None)
            d.registry.register(node, "Node")
            d.registry.register(Hello(), "Hello")
            self.net.add(addr, d)
            self.nodes[addr] = node
            self.dispatchers.append(d)
        self.discovery = StaticDiscovery({a: "" for a in self.nodes})

    def client(self, service: str = "Node", **opts: Any) -> XClient:
        selector = opts.pop("selector", RoundRobinSelector())
        clock = opts.pop("clock", None)
        kw = {"clock": clock} if clock else {}
        return XClient(service, self.discovery, self.net, selector=selector, options=XClientOptions(**opts), **kw)

    async def aclose(self) -> None:
        await self.net.aclose()
        for d in self.dispatchers:
            await d.aclose()


@pytest.fixture
async def cluster():
    c = Cluster()
    yield c
    await c.aclose()


async def test_call_round_robin(cluster: Cluster) -> None:
    async with cluster.client() as xc:
        got = [await xc.call("Who", None) for _ in range(6)]
    assert got == ["9001", "9002", "9003"] * 2


async def test_protobuf_call(cluster: Cluster) -> None:
    async with cluster.client("Hello", serialize_type=SerializeType.PROTOBUF) as xc:
        out = await xc.call("Say", benchmark_request(), reply_type=BenchmarkMessage)
    assert isinstance(out, BenchmarkMessage) and out.field1 == "OK" and out.field2 == 100


async def test_failover_keeps_succeeding_when_a_server_dies(cluster: Cluster) -> None:
    async with cluster.client(fail_mode=FailMode.FAILOVER, retries=2, breaker=None) as xc:
        await cluster.net.remove(ADDRS[1])  # the process died
        got = [await xc.call("Who", None) for _ in range(9)]
    assert "9002" not in got and len(got) == 9


async def test_failfast_fails_fast_when_a_server_dies(cluster: Cluster) -> None:
    async with cluster.client(fail_mode=FailMode.FAILFAST, breaker=None) as xc:
        await cluster.net.remove(ADDRS[0])
        with pytest.raises(TransportError):
            await xc.call("Who", None)
        assert await xc.call("Who", None) == "9002"  # round robin moved on


async def test_failtry_retries_the_same_server(cluster: Cluster) -> None:
    async with cluster.client(fail_mode=FailMode.FAILTRY, retries=2, breaker=None) as xc:
        await cluster.net.remove(ADDRS[0])
        with pytest.raises(TransportError):
            await xc.call("Who", None)
    assert cluster.net.calls[ADDRS[0]] == 3 and ADDRS[1] not in cluster.net.calls


async def test_failbackup_slow_server(cluster: Cluster) -> None:
    cluster.nodes[ADDRS[0]].gate = asyncio.Event()  # 9001 hangs
    async with cluster.client(fail_mode=FailMode.FAILBACKUP, backup_latency=0.01) as xc:
        assert await xc.call("Who", None, timeout=5) == "9002"


async def test_service_error_not_retried(cluster: Cluster) -> None:
    async with cluster.client(fail_mode=FailMode.FAILOVER, retries=3) as xc:
        with pytest.raises(ServiceError, match="bad on 9001"):
            await xc.call("Bad", None)
    assert sum(n.calls for n in cluster.nodes.values()) == 1


async def test_breaker_opens_on_dead_server_and_probes_after_timeout(cluster: Cluster) -> None:
    now = [0.0]
    breaker = BreakerConfig(consecutive_failures=2, open_timeout=10)
    async with cluster.client(fail_mode=FailMode.FAILOVER, retries=2, breaker=breaker, clock=lambda: now[0]) as xc:
        await cluster.net.remove(ADDRS[0])
        for _ in range(12):
            assert await xc.call("Who", None) in ("9002", "9003")
        assert xc.breaker(ADDRS[0]).state is BreakerState.OPEN
        assert cluster.net.calls[ADDRS[0]] == 2  # no traffic to it once open
        now[0] += 10  # half-open: one probe goes to the dead server, fails, reopens
        for _ in range(6):
            await xc.call("Who", None)
        assert cluster.net.calls[ADDRS[0]] == 3
        assert xc.breaker(ADDRS[0]).state is BreakerState.OPEN
        # the server comes back: the next probe closes the breaker
        d = ServiceDispatcher()
        d.registry.register(Node("back"), "Node")
        cluster.net.add(ADDRS[0], d)
        now[0] += 10
        got = [await xc.call("Who", None) for _ in range(6)]
        assert "back" in got and xc.breaker(ADDRS[0]).state is BreakerState.CLOSED
        await d.aclose()


async def test_all_breakers_open_fails_with_circuit_open(cluster: Cluster) -> None:
    breaker = BreakerConfig(consecutive_failures=1, open_timeout=60)
    async with cluster.client(fail_mode=FailMode.FAILOVER, retries=5, breaker=breaker) as xc:
        for a in ADDRS:
            await cluster.net.remove(a)
        with pytest.raises(TransportError):
            await xc.call("Who", None)
        with pytest.raises(CircuitOpen):
            await xc.call("Who", None)


async def test_deadline_sent_as_server_timeout_and_enforced(cluster: Cluster) -> None:
    async with cluster.client() as xc:
        await xc.call("Who", None, timeout=2.0)
        sent = cluster.nodes[ADDRS[0]].timeouts[0]
        assert sent is not None and 0 < int(sent) <= 2000
        await xc.call("Who", None)
        assert cluster.nodes[ADDRS[1]].timeouts[0] is None
        cluster.nodes[ADDRS[2]].gate = asyncio.Event()
        with pytest.raises((CallTimeout, ServiceError)):
            await xc.call("Who", None, timeout=0.05)


async def test_default_timeout_option(cluster: Cluster) -> None:
    cluster.nodes[ADDRS[0]].gate = asyncio.Event()
    async with cluster.client(timeout=0.05) as xc:
        with pytest.raises((CallTimeout, ServiceError)):
            await xc.call("Who", None)


async def test_auth_token() -> None:
    c = Cluster(1, plugins=lambda: PluginContainer([AuthPlugin(["tok"])]))
    async with c.client(auth="tok") as xc:
        assert await xc.call("Who", None) == "9001"
    async with c.client(auth="nope") as xc:
        with pytest.raises(ServiceError, match="auth failed"):
            await xc.call("Who", None)
    await c.aclose()


async def test_go_and_oneway(cluster: Cluster) -> None:
    async with cluster.client() as xc:
        tasks = [xc.go("Who", None) for _ in range(3)]
        assert sorted(await asyncio.gather(*tasks)) == ["9001", "9002", "9003"]
        assert await xc.oneway("Note", {"x": 1}) is None
    assert [n.oneway for n in cluster.nodes.values()] == [[{"x": 1}], [], []]


async def test_go_tasks_cancelled_on_close(cluster: Cluster) -> None:
    cluster.nodes[ADDRS[0]].gate = asyncio.Event()
    xc = cluster.client()
    await xc.start()
    task = xc.go("Who", None)
    await wait_until(lambda: cluster.nodes[ADDRS[0]].calls == 1, what="the call in the handler")
    await xc.aclose()
    assert task.cancelled()


async def test_broadcast(cluster: Cluster) -> None:
    async with cluster.client() as xc:
        assert await xc.broadcast("Who", None) == {a: a.rsplit(":", 1)[1] for a in ADDRS}
        await cluster.net.remove(ADDRS[2])
        with pytest.raises(BroadcastError) as info:
            await xc.broadcast("Who", None)
    assert set(info.value.errors) == {ADDRS[2]} and isinstance(info.value.errors[ADDRS[2]], TransportError)
    assert set(info.value.replies) == set(ADDRS[:2])


async def test_inform_returns_every_servers_receipt(cluster: Cluster) -> None:
    async with cluster.client() as xc:
        await cluster.net.remove(ADDRS[1])
        receipts = await xc.inform("Who", None, timeout=5)
        assert [(r.address, r.reply) for r in receipts] == [
            ("127.0.0.1:9001", "9001"), ("127.0.0.1:9002", None), ("127.0.0.1:9003", "9003")]
        assert [r.error is None for r in receipts] == [True, False, True]
        assert isinstance(receipts[1].error, TransportError)
        bad = await xc.inform("Bad", None)  # every server fails: still receipts, nothing raised
        assert [type(r.error) for r in bad] == [ServiceError, TransportError, ServiceError]
        assert [cluster.nodes[a].calls for a in ADDRS] == [2, 0, 2]  # once each, no retries
        cluster.discovery.update([])
        with pytest.raises(NoServerAvailable):
            await xc.inform("Who", None)


async def test_inform_over_rpcx_servers() -> None:
    """Three of our rpcx servers, one of them stopped: a receipt each."""
    from rpc.rpcx_client import RpcxCaller
    from rpc.rpcx_server import RpcxServer

    servers = []
    for name in ("a", "b", "c"):
        d = ServiceDispatcher()
        d.registry.register(Node(name), "Node")
        servers.append(await RpcxServer(d, "tcp@127.0.0.1:0").__aenter__())
    addrs = [s.address for s in servers]
    await servers[1].aclose()  # down: its receipt carries the connection error
    caller = RpcxCaller()
    try:
        async with XClient("Node", StaticDiscovery(addrs), caller) as xc:
            receipts = await xc.inform("Who", None, timeout=5)
        by_addr = {r.address: r for r in receipts}
        assert set(by_addr) == {a.removeprefix("tcp@") for a in addrs}
        assert [(by_addr[a.removeprefix("tcp@")].reply) for a in addrs] == ["a", None, "c"]
        assert isinstance(by_addr[addrs[1].removeprefix("tcp@")].error, TransportError)
    finally:
        await caller.aclose()
        for s in servers:
            await s.aclose()


async def test_fork_first_success_wins(cluster: Cluster) -> None:
    cluster.nodes[ADDRS[0]].gate = asyncio.Event()
    async with cluster.client() as xc:
        await cluster.net.remove(ADDRS[1])
        assert await xc.fork("Who", None, timeout=5) == "9003"
        for a in ADDRS:
            await cluster.net.remove(a)
        with pytest.raises(TransportError):
            await xc.fork("Who", None)


async def test_discovery_updates_reach_the_selector(cluster: Cluster) -> None:
    async with cluster.client() as xc:
        cluster.discovery.update([ADDRS[2]])
        assert {await xc.call("Who", None) for _ in range(3)} == {"9003"}
        assert set(xc.servers) == {ADDRS[2]}
        cluster.discovery.update([])
        with pytest.raises(NoServerAvailable):
            await xc.call("Who", None)
        with pytest.raises(NoServerAvailable):
            await xc.broadcast("Who", None)


async def test_consistent_hash_routes_same_args_to_same_server(cluster: Cluster) -> None:
    async with cluster.client(selector=ConsistentHashSelector()) as xc:
        for key in range(20):
            first = await xc.call("Who", {"user": key})
            assert all([await xc.call("Who", {"user": key}) == first for _ in range(3)])


async def test_latency_selector_gets_rtt(cluster: Cluster) -> None:
    sel = LatencySelector()
    async with cluster.client(selector=sel) as xc:
        for _ in range(6):
            await xc.call("Who", None)
    assert set(sel.rtt) == set(ADDRS)


# -- groups (rpcx's Option.Group) and state=inactive ------------------------------


def test_filter_by_state_and_group_matches_rpcx() -> None:
    from rpc.xclient import filter_by_state_and_group

    servers = {
        "tcp@a:1": "group=a",
        "tcp@b:1": "weight=2&group=b",
        "tcp@ab:1": "group=b&group=a",  # any group= value may match
        "tcp@none:1": "",
        "tcp@w:1": "weight=3",
        "tcp@off:1": "group=a&state=inactive",
        "tcp@esc:1": "group=c%20d",
        "tcp@bad:1": "group=b&state=inactive&x=%zz",  # Go cannot parse it: rpcx keeps it, unfiltered
        "tcp@semi:1": "group=b;state=inactive",  # likewise (a ";" is an error in Go's ParseQuery)
    }
    assert set(filter_by_state_and_group("a", servers)) == {"tcp@a:1", "tcp@ab:1", "tcp@bad:1", "tcp@semi:1"}
    assert set(filter_by_state_and_group("b", servers)) == {"tcp@b:1", "tcp@ab:1", "tcp@bad:1", "tcp@semi:1"}
    assert set(filter_by_state_and_group("c d", servers)) == {"tcp@esc:1", "tcp@bad:1", "tcp@semi:1"}
    assert set(filter_by_state_and_group("A", servers)) == {"tcp@bad:1", "tcp@semi:1"}  # case-sensitive
    # no group: every active server, grouped or not (rpcx filters by group only when one is set)
    assert set(filter_by_state_and_group("", servers)) == set(servers) - {"tcp@off:1"}


async def test_group_filters_servers_and_follows_discovery_updates(cluster: Cluster) -> None:
    a, b, c = ADDRS
    cluster.discovery.update({a: "group=a", b: "group=b&weight=2", c: ""})
    async with cluster.client(group="a") as xa, cluster.client(group="b") as xb, cluster.client() as xany:
        assert xa.servers == {a: "group=a"}
        assert {await xa.call("Who", None) for _ in range(4)} == {"9001"}
        assert {await xb.call("Who", None) for _ in range(4)} == {"9002"}
        assert {await xany.call("Who", None) for _ in range(6)} == {"9001", "9002", "9003"}
        assert set(await xa.broadcast("Who", None)) == {a}  # broadcast and fork see the same servers
        cluster.discovery.update({a: "group=a&state=inactive", b: "group=b", c: "group=a"})
        assert xa.servers == {c: "group=a"}
        assert {await xa.call("Who", None) for _ in range(4)} == {"9003"}
        assert set(xany.servers) == {b, c}
        cluster.discovery.update({b: "group=b"})
        with pytest.raises(NoServerAvailable):
            await xa.call("Who", None)
