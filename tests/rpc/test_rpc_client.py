"""Client (one server) over in-process and HTTP callers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rpc.client import Client
from rpc.errors import CallTimeout, RpcError, ServiceError, TransportError
from rpc.examples import Arith, Hello, benchmark_request
from rpc.gateway import Gateway, GatewayServer
from rpc.gateway_client import HTTPCaller
from rpc.inprocess import InProcessNetwork
from rpc.message import META_SERVER_TIMEOUT, Message, SerializeType
from rpc.plugins import AuthPlugin, PluginContainer
from rpc.proto.benchmark_pb2 import BenchmarkMessage
from rpc.service import Context, ServiceDispatcher
from tests.netutil import wait_until


class Box:
    def __init__(self) -> None:
        self.items: list[Any] = []
        self.timeouts: list[str | None] = []
        self.gate = asyncio.Event()

    async def Put(self, ctx: Context, args: Any) -> None:
        self.items.append(args)

    async def Wait(self, ctx: Context, args: Any) -> str:
        self.timeouts.append(ctx.metadata.get(META_SERVER_TIMEOUT))
        await self.gate.wait()
        return "open"


@pytest.fixture
async def net():
    box = Box()
    d = ServiceDispatcher(plugins=PluginContainer([AuthPlugin(["t"])]))
    d.registry.register(Arith(), "Arith")
    d.registry.register(Hello(), "Hello")
    d.registry.register(box, "Box")
    n = InProcessNetwork()
    n.add("tcp@s:1", d)
    yield n, box
    await n.aclose()
    await d.aclose()


async def test_call_go_oneway(net) -> None:
    n, box = net
    async with Client("tcp@s:1", n, auth="t") as c:
        assert await c.call("Arith", "Mul", {"A": 6, "B": 7}) == {"C": 42}
        assert await c.go("Arith", "Add", {"A": 1, "B": 2}) == {"C": 3}
        await c.oneway("Box", "Put", [1])
        assert box.items == [[1]]
        with pytest.raises(ServiceError, match="can't find method"):
            await c.call("Arith", "Div", {})
    with pytest.raises(RpcError, match="closed"):
        await c.call("Arith", "Mul", {})


async def test_protobuf_and_msgpack(net) -> None:
    n, _ = net
    async with Client("tcp@s:1", n, auth="t", serialize_type=SerializeType.PROTOBUF) as c:
        out = await c.call("Hello", "Say", benchmark_request(), reply_type=BenchmarkMessage)
        assert out.field1 == "OK"
    async with Client("tcp@s:1", n, auth="t", serialize_type=SerializeType.MSGPACK) as c:
        assert await c.call("Arith", "Add", {"A": 2, "B": 2}) == {"C": 4}


async def test_timeout_and_server_timeout(net) -> None:
    n, box = net
    async with Client("tcp@s:1", n, auth="t", timeout=0.05) as c:
        with pytest.raises((CallTimeout, ServiceError)):
            await c.call("Box", "Wait", None)
        assert box.timeouts == ["50"]


async def test_go_cancelled_on_close(net) -> None:
    n, box = net
    c = Client("tcp@s:1", n, auth="t")
    task = c.go("Box", "Wait", None)
    await wait_until(lambda: box.timeouts, what="the call in the handler")
    await c.aclose()
    assert task.cancelled()


async def test_over_http_gateway_owning_the_caller() -> None:
    d = ServiceDispatcher()
    d.registry.register(Arith(), "Arith")
    async with GatewayServer(Gateway(d)) as server:
        url = f"http://127.0.0.1:{server.port}"
        caller = HTTPCaller()
        async with Client(url, caller, close_caller=True) as c:
            assert await c.call("Arith", "Mul", {"A": 3, "B": 3}, timeout=5) == {"C": 9}
        with pytest.raises(TransportError):  # closed with the client
            await caller(url, Message(service_path="Arith", service_method="Mul"), 1)
    await d.aclose()
