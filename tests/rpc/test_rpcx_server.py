"""RpcxServer / RpcxCaller in one process over real sockets: plugin hooks at
each step (plain and async), refused connections, reply metadata, push,
shutdown order, addresses, the error tree."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rpc.client import Client
from rpc.errors import RpcError, ServiceError, TransportError
from rpc.examples import register_example
from rpc.rpcx_client import RpcxCaller
from rpc.rpcx_server import RpcxServer, address_of, endpoint_of
from rpc.server import Server
from rpc.service import Context
from rpc.transport import errors as terr
from rpc.transport.endpoint import Endpoint
from tests.netutil import wait_until


class Recorder:
    """Every hook, as plain methods."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def on_conn_accept(self, peer: Any) -> bool:
        self.events.append("accept")
        return True

    def on_conn_close(self, peer: Any) -> None:
        self.events.append("close")

    def pre_read(self, peer: Any) -> None:
        self.events.append("pre_read")

    def post_read(self, peer: Any, msg: Any) -> None:
        self.events.append("post_read")

    def on_heartbeat(self, peer: Any, msg: Any) -> None:
        self.events.append("heartbeat")

    def authenticate(self, ctx: Context, token: str | None) -> bool:
        self.events.append(f"auth:{token}")
        return True

    def pre_call(self, ctx: Context, args: Any) -> None:
        self.events.append("pre_call")

    def post_call(self, ctx: Context, args: Any, reply: Any, error: BaseException | None) -> None:
        self.events.append("post_call")

    def pre_write(self, ctx: Context, req: Any, res: Any) -> None:
        self.events.append("pre_write")

    def post_write(self, peer: Any, req: Any, res: Any, error: Any) -> None:
        self.events.append("post_write")


class AsyncRecorder(Recorder):
    """The same hooks as coroutines (the request path then runs in a task)."""

    async def on_conn_accept(self, peer: Any) -> bool:  # type: ignore[override]
        await asyncio.sleep(0)
        return Recorder.on_conn_accept(self, peer)

    async def on_conn_close(self, peer: Any) -> None:  # type: ignore[override]
        Recorder.on_conn_close(self, peer)

    async def pre_call(self, ctx: Context, args: Any) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        Recorder.pre_call(self, ctx, args)

    async def post_write(self, peer: Any, req: Any, res: Any, error: Any) -> None:  # type: ignore[override]
        Recorder.post_write(self, peer, req, res, error)


@pytest.mark.parametrize("plugin_cls", [Recorder, AsyncRecorder])
async def test_hooks_at_each_step(plugin_cls: type[Recorder]) -> None:
    plugin = plugin_cls()
    server = Server(plugins=[plugin])
    register_example(server.registry, "arith")
    async with RpcxServer(server, "tcp@127.0.0.1:0") as rpcx:
        caller = RpcxCaller()
        client = Client(rpcx.address, caller, auth="tok")
        assert await client.call("Arith", "Mul", {"A": 2, "B": 3}, timeout=5) == {"C": 6}
        await wait_until(lambda: "post_write" in plugin.events)
        conn = await caller.connection(rpcx.address)
        await conn.heartbeat(timeout=5)
        await caller.aclose()
        await wait_until(lambda: "close" in plugin.events)
    assert plugin.events[0] == "accept" and plugin.events[-1] == "close"
    call = [e for e in plugin.events if e not in ("pre_read", "accept", "close", "heartbeat")]
    assert call == ["post_read", "auth:tok", "pre_call", "post_call", "pre_write", "post_write"]
    assert "heartbeat" in plugin.events and "pre_read" in plugin.events
    await server.dispatcher.aclose()


class Refuse:
    def on_conn_accept(self, peer: Any) -> bool:
        return False


class RefuseLater:
    async def on_conn_accept(self, peer: Any) -> bool:
        await asyncio.sleep(0.01)
        return False


@pytest.mark.parametrize("plugin", [Refuse(), RefuseLater()])
async def test_refused_connection(plugin: object) -> None:
    server = Server(plugins=[plugin])
    register_example(server.registry, "arith")
    async with RpcxServer(server, "tcp@127.0.0.1:0") as rpcx:
        async with Client(rpcx.address, RpcxCaller(), close_caller=True) as client:
            with pytest.raises(TransportError):
                await client.call("Arith", "Mul", {"A": 2, "B": 3}, timeout=5)
    await server.dispatcher.aclose()


class Svc:
    async def Meta(self, ctx: Context, args: Any) -> str:
        ctx.reply_metadata["seen"] = ctx.metadata.get("in", "")
        return "ok"

    async def Fail(self, ctx: Context, args: Any) -> str:
        ctx.reply_metadata["why"] = "testing"
        raise ServiceError("nope")

    async def Push(self, ctx: Context, args: Any) -> str:
        await ctx.push("Client", "Hello", args)
        return "pushed"

    async def Slow(self, ctx: Context, args: Any) -> str:
        await asyncio.sleep(args)
        return "done"


async def test_metadata_errors_and_push() -> None:
    server = Server()
    server.register(Svc())
    got: list[Any] = []
    async with RpcxServer(server, "tcp@127.0.0.1:0") as rpcx:
        async with Client(rpcx.address, RpcxCaller(on_push=got.append), close_caller=True) as client:
            res = await client.call_message("Svc", "Meta", None, metadata={"in": "x"}, timeout=5)
            assert res.metadata == {"seen": "x"} and res.payload == b'"ok"'
            res = await client.caller(rpcx.address, client._request("Svc", "Fail", None, None, False, 5)[0], 5)
            assert res is not None and res.is_error and res.error_text == "nope" and res.metadata["why"] == "testing"
            with pytest.raises(ServiceError, match="nope"):
                await client.call("Svc", "Fail", None, timeout=5)
            assert await client.call("Svc", "Push", {"n": 1}, timeout=5) == "pushed"
            await wait_until(lambda: got)
            assert got[0].service_path == "Client" and got[0].payload == b'{"n":1}'
            assert len(rpcx.connections) == 1
    await server.dispatcher.aclose()


async def test_shutdown_drains_then_refuses_as_retryable() -> None:
    server = Server()
    server.register(Svc())
    rpcx = RpcxServer(server, "tcp@127.0.0.1:0")
    await rpcx.start()
    caller = RpcxCaller()
    client = Client(rpcx.address, caller)
    try:
        slow = asyncio.ensure_future(client.call("Svc", "Slow", 0.3, timeout=5))
        await wait_until(lambda: server.in_flight == 1)
        shutdown = asyncio.ensure_future(server.shutdown(rpcx, timeout=5))
        await wait_until(lambda: server.dispatcher.closing)
        with pytest.raises(TransportError):  # refused without running: retryable, not a ServiceError
            await client.call("Svc", "Meta", None, timeout=5)
        assert await slow == "done"
        assert await shutdown is True
    finally:
        await caller.aclose()


def test_addresses() -> None:
    assert endpoint_of("127.0.0.1:8972") == Endpoint("tcp", host="127.0.0.1", port=8972)
    assert endpoint_of("tcp@h:1") == Endpoint("tcp", host="h", port=1)
    assert endpoint_of("unix@/tmp/x.sock") == Endpoint("unix", path="/tmp/x.sock")
    assert endpoint_of("tcp://h:2") == Endpoint("tcp", host="h", port=2)
    assert endpoint_of("quic@h:1") == Endpoint("quic", host="h", port=1)
    with pytest.raises(ValueError):
        endpoint_of("utp@h:1")
    assert address_of(Endpoint("tcp", host="h", port=1)) == "tcp@h:1"
    assert address_of(Endpoint("unix", path="/s")) == "unix@/s"


def test_the_transport_knows_nothing_of_rpc() -> None:
    """rpc.transport is the layer under rpc (seq uses it on its own): its
    errors have a root of their own and none of its modules imports rpc."""
    import ast
    import pathlib

    import rpc.transport

    for cls in (terr.TransportLayerError, terr.ConnectionLost, terr.RequestTimeout, terr.RemoteError, terr.ProtocolError):
        assert issubclass(cls, terr.TransportLayerError) and not issubclass(cls, RpcError)
    for path in pathlib.Path(rpc.transport.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not (name.startswith("rpc.") and not name.startswith("rpc.transport")), (path.name, name)


async def test_http_on_the_rpcx_port_and_quick_close_of_idle_http() -> None:
    from rpc.gateway import Gateway
    from rpc.gateway_client import HTTPCaller

    server = Server()
    register_example(server.registry, "arith")
    rpcx = RpcxServer(server, "tcp@127.0.0.1:0", gateway=Gateway(server.dispatcher))
    await rpcx.start()
    http = HTTPCaller()
    try:
        url = f"http://127.0.0.1:{rpcx.endpoint.port}"
        assert await Client(url, http).call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
        # the kept-alive HTTP connection is idle: closing does not wait for it
        await asyncio.wait_for(server.shutdown(rpcx, timeout=5), 2)
    finally:
        await http.aclose()


async def test_failed_auth_in_a_pipelined_buffer() -> None:
    """Two requests in one write, the second with a bad token: the first is
    answered, the second gets "auth failed", then the server closes."""
    import rustext

    from rpc.plugins import AuthPlugin

    server = Server(plugins=[AuthPlugin(["good"])])
    register_example(server.registry, "arith")
    async with RpcxServer(server, "tcp@127.0.0.1:0") as rpcx:
        reader, writer = await asyncio.open_connection("127.0.0.1", rpcx.endpoint.port)
        frames = b"".join(
            rustext.encode_rpcx_request(seq, b'{"A":2,"B":3}', service_path="Arith", service_method="Mul",
                                        metadata=[("__AUTH", token)], serialize_type=1)
            for seq, token in ((1, "good"), (2, "bad"))
        )
        writer.write(frames)
        data = await asyncio.wait_for(reader.read(-1), 5)  # until the server closes
        writer.close()
        replies = {m.seq: m for m in rustext.RpcxStream().feed(data)}
        assert replies[1].status == 0 and replies[1].payload == b'{"C":6}'
        assert replies[2].status == 1 and replies[2].error == "auth failed"
    await server.dispatcher.aclose()


async def test_idle_timeout_drops_silent_clients_not_heartbeating_ones() -> None:
    server = Server()
    register_example(server.registry, "arith")
    async with RpcxServer(server, "tcp@127.0.0.1:0", idle_timeout=1.0) as rpcx:
        silent, beating = RpcxCaller(), RpcxCaller(heartbeat_interval=0.05)
        try:
            for caller in (silent, beating):
                assert await Client(rpcx.address, caller).call("Arith", "Add", {"A": 1, "B": 1}, timeout=5) == {"C": 2}
            quiet = await silent.connection(rpcx.address)
            alive = await beating.connection(rpcx.address)
            await asyncio.wait_for(quiet.wait_closed(), 5)  # closed by the server after 1 s of silence
            assert alive.is_open  # its heartbeats kept it (it was checked at least once meanwhile)
            assert await Client(rpcx.address, beating).call("Arith", "Add", {"A": 2, "B": 2}, timeout=5) == {"C": 4}
        finally:
            await silent.aclose()
            await beating.aclose()
    await server.dispatcher.aclose()
    with pytest.raises(ValueError):
        RpcxServer(server, "tcp@127.0.0.1:0", idle_timeout=0)


async def test_refused_connections_run_no_close_hook() -> None:
    from rpc.transport.config import ServerConfig

    plugin = Recorder()
    refuse_second = Refuse()
    server = Server(plugins=[plugin])
    register_example(server.registry, "arith")
    async with RpcxServer(server, "tcp@127.0.0.1:0", config=ServerConfig(max_connections=1)) as rpcx:
        first, second = RpcxCaller(), RpcxCaller(connect_timeout=2)
        try:
            assert await Client(rpcx.address, first).call("Arith", "Add", {"A": 1, "B": 1}, timeout=5) == {"C": 2}
            with pytest.raises(TransportError):  # over max_connections: closed by the transport
                await Client(rpcx.address, second).call("Arith", "Add", {"A": 1, "B": 1}, timeout=5)
        finally:
            await first.aclose()
            await second.aclose()
        await wait_until(lambda: "close" in plugin.events)
        server.add_plugin(refuse_second)  # now a plugin refuses: no close hook either
        third = RpcxCaller(connect_timeout=2)
        try:
            with pytest.raises(TransportError):
                await Client(rpcx.address, third).call("Arith", "Add", {"A": 1, "B": 1}, timeout=5)
        finally:
            await third.aclose()
    assert plugin.events.count("accept") == 2 and plugin.events.count("close") == 1
    await server.dispatcher.aclose()


TLS_HELLO = bytes.fromhex("16030100c4010000c00303") + bytes(32) + b"\x00\x00\x02\x13\x01\x01\x00"


@pytest.mark.parametrize("garbage", [b"\x08\x00" + bytes(range(256)) * 4, b"\x00\xff garbage \r\n\r\n",
                                     b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", b"get / HTTP/1.1\r\nConnection: close\r\n\r\n",
                                     TLS_HELLO])
async def test_garbage_closes_only_that_connection(garbage: bytes) -> None:
    from rpc.gateway import Gateway

    server = Server()
    register_example(server.registry, "arith")
    async with RpcxServer(server, "tcp@127.0.0.1:0", gateway=Gateway(server.dispatcher)) as rpcx:
        async with Client(rpcx.address, RpcxCaller(), close_caller=True) as client:
            assert await client.call("Arith", "Add", {"A": 1, "B": 1}, timeout=5) == {"C": 2}
            reader, writer = await asyncio.open_connection("127.0.0.1", rpcx.endpoint.port)
            writer.write(garbage)
            data = await asyncio.wait_for(reader.read(-1), 5)  # the server answers (HTTP) or not, and closes
            writer.close()
            if garbage[:1].isalpha():  # what starts like an HTTP request gets the gateway's HTTP answer
                assert data.startswith(b"HTTP/1.1 4")
            else:  # anything else (a TLS ClientHello among them) is closed at once, unanswered
                assert data == b""
            assert await client.call("Arith", "Add", {"A": 2, "B": 2}, timeout=5) == {"C": 4}
    await server.dispatcher.aclose()
