"""HTTPCaller (a ServerCaller over the HTTP gateway) and XClient over real
server processes: failover keeps succeeding when one is killed mid-run,
failfast fails fast."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rpc.discovery import StaticDiscovery
from rpc.errors import CallTimeout, ServiceError, TransportError
from rpc.examples import Arith, Hello, benchmark_request
from rpc.failmode import FailMode
from rpc.gateway import Gateway, GatewayServer
from rpc.gateway_client import HTTPCaller, split_address
from rpc.message import META_AUTH, META_SERVER_TIMEOUT, Message, SerializeType
from rpc.plugins import AuthPlugin
from rpc.proto.benchmark_pb2 import BenchmarkMessage
from rpc.selector import RoundRobinSelector
from rpc.service import Context, ServiceDispatcher
from rpc.xclient import XClient, XClientOptions
from tests.netutil import free_port, wait_until


def test_split_address() -> None:
    assert split_address("http://127.0.0.1:80/") == ("127.0.0.1", 80)
    assert split_address("tcp@10.0.0.1:8972") == ("10.0.0.1", 8972)
    assert split_address("[::1]:1") == ("::1", 1)
    with pytest.raises(ValueError):
        split_address("nope")


class Slow:
    async def Sleep(self, ctx: Context, args: float) -> str:
        await asyncio.sleep(args)
        return "done"


@pytest.fixture
async def gateway_server():
    d = ServiceDispatcher()
    d.registry.register(Arith(), "Arith")
    d.registry.register(Hello(), "Hello")
    d.registry.register(Slow())
    server = GatewayServer(Gateway(d))
    await server.start()
    d.gateway_server = server  # type: ignore[attr-defined]  # for the connection count below
    yield f"http://127.0.0.1:{server.port}", d
    await server.aclose()
    await d.aclose()


async def test_http_caller_messages(gateway_server) -> None:
    url, d = gateway_server
    caller = HTTPCaller(pool=2)
    try:
        res = await caller(url, Message(service_path="Arith", service_method="Mul", payload=b'{"A":6,"B":7}', seq=5), 5)
        assert res is not None and not res.is_error and res.payload == b'{"C":42}' and res.seq == 5
        res = await caller(url, Message(service_path="Hello", service_method="Say", serialize_type=SerializeType.PROTOBUF,
                                        payload=benchmark_request().SerializeToString()), 5)
        assert BenchmarkMessage.FromString(res.payload).field2 == 100
        res = await caller(url, Message(service_path="Nope", service_method="X", payload=b"{}"), 5)
        assert res.is_error and res.error_text == "rpcx: can't find service Nope"
        # concurrency beyond the pool queues; all succeed on 2 keep-alive connections
        results = await asyncio.gather(*(
            caller(url, Message(service_path="Arith", service_method="Add", payload=b'{"A":%d,"B":1}' % i), 5)
            for i in range(20)
        ))
        assert [r.payload for r in results] == [b'{"C":%d}' % (i + 1) for i in range(20)]
        assert len(d.gateway_server._conns) <= 2  # the connections the server has open
        # the server has a deadline too (later than ours, so ours fires first)
        # and gives up: else its handler sleeps 5 s on and the teardown waits
        slow = Message(service_path="Slow", service_method="Sleep", payload=b"5", metadata={META_SERVER_TIMEOUT: "200"})
        with pytest.raises(CallTimeout):
            await caller(url, slow, 0.05)
    finally:
        await caller.aclose()


async def test_http_caller_connect_refused_is_transport_error() -> None:
    caller = HTTPCaller()
    with pytest.raises(TransportError):
        await caller(f"http://127.0.0.1:{free_port()}", Message(service_path="A", service_method="B"), 5)
    await caller.aclose()


async def test_http_caller_auth(gateway_server) -> None:
    url, d = gateway_server
    d.plugins.add(AuthPlugin(["tok"]))
    caller = HTTPCaller()
    try:
        ok = await caller(url, Message(service_path="Arith", service_method="Add", payload=b'{"A":1,"B":1}',
                                       metadata={META_AUTH: "tok"}), 5)
        assert not ok.is_error
        bad = await caller(url, Message(service_path="Arith", service_method="Add", payload=b"{}"), 5)
        assert bad.is_error and bad.error_text == "auth failed"
    finally:
        await caller.aclose()


SERVE = """
import asyncio, sys
from rpc.examples import register_example
from rpc.gateway import Gateway, GatewayServer
from rpc.service import ServiceDispatcher, Context

class Node:
    async def Who(self, ctx: Context, args) -> str:
        return sys.argv[2]

async def main():
    d = ServiceDispatcher()
    d.registry.register(Node())
    server = GatewayServer(Gateway(d), "127.0.0.1", int(sys.argv[1]))
    await server.start()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


@pytest.fixture
def node_processes() -> Iterator[list[tuple[str, subprocess.Popen]]]:
    procs = []
    for name in ("a", "b", "c"):
        port = free_port()
        p = subprocess.Popen([sys.executable, "-c", SERVE, str(port), name], stdout=subprocess.PIPE, cwd=os.getcwd())
        procs.append((f"http://127.0.0.1:{port}", p))
    for _, p in procs:
        assert p.stdout.readline().strip() == b"ready"
    yield procs
    for _, p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5)
        p.stdout.close()


async def test_failover_survives_a_killed_server_process(node_processes) -> None:
    addrs = [a for a, _ in node_processes]
    caller = HTTPCaller(pool=2)
    xc = XClient("Node", StaticDiscovery(addrs), caller, selector=RoundRobinSelector(),
                 options=XClientOptions(fail_mode=FailMode.FAILOVER, retries=2, timeout=5))
    async with xc:
        assert {await xc.call("Who", None) for _ in range(6)} == {"a", "b", "c"}
        os.kill(node_processes[1][1].pid, signal.SIGKILL)  # mid-run
        node_processes[1][1].wait(timeout=5)
        got = [await xc.call("Who", None) for _ in range(30)]
    assert "b" not in got and set(got) == {"a", "c"}
    await caller.aclose()


async def test_failfast_fails_fast_on_a_killed_server_process(node_processes) -> None:
    names = {a: name for (a, _), name in zip(node_processes, "abc", strict=True)}
    procs = dict(node_processes)
    order = sorted(names)  # round robin goes through the servers in address order
    caller = HTTPCaller(pool=2)
    xc = XClient("Node", StaticDiscovery(list(names)), caller, selector=RoundRobinSelector(),
                 options=XClientOptions(fail_mode=FailMode.FAILFAST, timeout=5))
    async with xc:
        assert await xc.call("Who", None) == names[order[0]]
        os.kill(procs[order[1]].pid, signal.SIGKILL)
        procs[order[1]].wait(timeout=5)
        with pytest.raises(TransportError):
            await xc.call("Who", None)  # the killed one: no retry
        assert await xc.call("Who", None) == names[order[2]]
        with pytest.raises(ServiceError):
            await xc.call("Nope", None)
    await caller.aclose()


async def test_deadline_propagates_to_the_server_handler() -> None:
    cancelled = asyncio.Event()
    seen: list[str] = []

    class Sleeper:
        async def Nap(self, ctx: Context, args: float) -> str:
            seen.append(ctx.metadata.get("__ServerTimeout", ""))
            try:
                await asyncio.sleep(args)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return "rested"

    d = ServiceDispatcher()
    d.registry.register(Sleeper())
    async with GatewayServer(Gateway(d)) as server:
        caller = HTTPCaller()
        xc = XClient("Sleeper", StaticDiscovery([f"http://127.0.0.1:{server.port}"]), caller)
        async with xc:
            with pytest.raises((CallTimeout, ServiceError)):
                await xc.call("Nap", 30, timeout=0.2)
            await asyncio.wait_for(cancelled.wait(), 5)  # the server gave up too: no orphan work
            assert 0 < int(seen[0]) <= 200
            assert await xc.call("Nap", 0, timeout=5) == "rested"
        await caller.aclose()
    await d.aclose()


async def test_http_caller_survives_server_closing_idle_connections() -> None:
    d = ServiceDispatcher()
    d.registry.register(Arith(), "Arith")
    async with GatewayServer(Gateway(d), idle_timeout=0.05) as server:
        url = f"http://127.0.0.1:{server.port}"
        caller = HTTPCaller(pool=1)
        msg = Message(service_path="Arith", service_method="Add", payload=b'{"A":1,"B":1}')
        assert (await caller(url, msg, 5)).payload == b'{"C":2}'
        await wait_until(lambda: not server._conns, what="the server closed the idle connection")
        assert (await caller(url, msg, 5)).payload == b'{"C":2}'  # a new connection, no error
        await caller.aclose()
    await d.aclose()
