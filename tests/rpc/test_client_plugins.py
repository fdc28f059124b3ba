"""Client plugins (``rpc.client_plugins``) against a real ``RpcxServer`` on
127.0.0.1: hook order (plain and async), metadata added before a call,
refusals, errors seen after a call, connection hooks across a server restart,
and hooks that fail unexpectedly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rpc.client import Client
from rpc.client_plugins import CallInfo, ClientPluginContainer
from rpc.discovery.base import StaticDiscovery
from rpc.errors import ServiceError, TransportError, TransportErrorKind
from rpc.examples import register_example
from rpc.failmode import FailMode
from rpc.inprocess import InProcessNetwork
from rpc.message import Message
from rpc.rpcx_client import RpcxCaller
from rpc.rpcx_server import RpcxServer
from rpc.server import Server
from rpc.service import Context
from rpc.transport.config import ConnectionConfig, PoolConfig
from rpc.transport.pool import Health
from rpc.xclient import XClient, XClientOptions
from tests.netutil import wait_until


class Seen:
    """A server plugin: the requests that reached the handler, with their metadata."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []

    def pre_call(self, ctx: Context, args: Any) -> None:
        self.calls.append((ctx.method, dict(ctx.metadata)))


class Recorder:
    """Every client hook, as plain methods, into a shared event list."""

    def __init__(self, name: str, events: list[Any]) -> None:
        self.name = name
        self.events = events

    def pre_call(self, call: CallInfo, args: Any) -> None:
        self.events.append((self.name, "pre_call", call.method))
        call.metadata[f"x-{self.name}"] = "1"

    def post_call(self, call: CallInfo, args: Any, reply: Message | None, error: BaseException | None) -> None:
        self.events.append((self.name, "post_call", call.method, type(error).__name__ if error else None))

    def on_conn_open(self, address: str, conn: Any) -> None:
        self.events.append((self.name, "open", address))

    def on_conn_close(self, address: str, conn: Any) -> None:
        self.events.append((self.name, "close", address))


class AsyncRecorder(Recorder):
    """The same hooks as coroutines."""

    async def pre_call(self, call: CallInfo, args: Any) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        Recorder.pre_call(self, call, args)

    async def post_call(self, call: CallInfo, args: Any, reply: Message | None,  # type: ignore[override]
                        error: BaseException | None) -> None:
        await asyncio.sleep(0)
        Recorder.post_call(self, call, args, reply, error)

    async def on_conn_open(self, address: str, conn: Any) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        Recorder.on_conn_open(self, address, conn)

    async def on_conn_close(self, address: str, conn: Any) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        Recorder.on_conn_close(self, address, conn)


def arith_server(*plugins: object) -> Server:
    server = Server(plugins=list(plugins))
    register_example(server.registry, "arith")
    return server


def fast_reconnect() -> PoolConfig:
    return PoolConfig(connection=ConnectionConfig(default_timeout=None), backoff_initial=0.01,
                      backoff_max=0.05, down_after=1000)


@pytest.mark.parametrize("plugin_cls", [Recorder, AsyncRecorder])
async def test_hook_order_and_metadata_reaching_the_server(plugin_cls: type[Recorder]) -> None:
    seen = Seen()
    events: list[Any] = []
    async with RpcxServer(arith_server(seen), "tcp@127.0.0.1:0") as rpcx:
        addr = rpcx.address
        client = Client(addr, RpcxCaller(), close_caller=True,
                        plugins=[plugin_cls("a", events), plugin_cls("b", events)])
        async with client:
            assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, metadata={"k": "v"}) == {"C": 42}
            await client.oneway("Arith", "Add", {"A": 1, "B": 2})
            await wait_until(lambda: len(seen.calls) == 2)
        assert events == [
            ("a", "pre_call", "Mul"), ("b", "pre_call", "Mul"),
            ("a", "open", addr), ("b", "open", addr),  # the connection opens on first use
            ("a", "post_call", "Mul", None), ("b", "post_call", "Mul", None),
            ("a", "pre_call", "Add"), ("b", "pre_call", "Add"),
            ("a", "post_call", "Add", None), ("b", "post_call", "Add", None),
            ("a", "close", addr), ("b", "close", addr),
        ]
        assert [md.get("k") for _, md in seen.calls] == ["v", None]
        for _, md in seen.calls:
            assert md["x-a"] == "1" and md["x-b"] == "1"


async def test_xclient_runs_hooks_on_each_try_with_its_own_metadata() -> None:
    seen = Seen()
    calls: list[CallInfo] = []

    class Tag:
        def pre_call(self, call: CallInfo, args: Any) -> None:
            calls.append(call)
            call.metadata["try"] = str(len(calls))
            call.values["args"] = args

    async with RpcxServer(arith_server(seen), "tcp@127.0.0.1:0") as rpcx:
        caller = RpcxCaller()
        xc = XClient("Arith", StaticDiscovery(["tcp@127.0.0.1:1", rpcx.address]), caller, plugins=[Tag()],
                     options=XClientOptions(fail_mode=FailMode.FAILOVER, retries=3, breaker=None))
        xc.selector.select = lambda s, m, p, ex: "tcp@127.0.0.1:1" if not ex else rpcx.address  # type: ignore[method-assign]
        async with caller, xc:
            assert await xc.call("Mul", {"A": 2, "B": 3}) == {"C": 6}
        # the first try went to a dead address; the second, with its own metadata, to the server
        assert [c.address for c in calls] == ["tcp@127.0.0.1:1", rpcx.address]
        assert calls[1].values["args"] == {"A": 2, "B": 3}
        assert seen.calls == [("Mul", {"try": "2"})]


async def test_refusing_pre_call_sends_nothing() -> None:
    seen = Seen()
    after: list[Any] = []

    class Refuse:
        def pre_call(self, call: CallInfo, args: Any) -> None:
            if call.method == "Mul":
                raise PermissionError("Mul is not allowed from here")

        def post_call(self, call: CallInfo, args: Any, reply: Any, error: Any) -> None:
            after.append(call.method)

    async with RpcxServer(arith_server(seen), "tcp@127.0.0.1:0") as rpcx:
        caller = RpcxCaller()
        async with caller, Client(rpcx.address, caller, plugins=[Refuse()]) as client:
            with pytest.raises(PermissionError, match="not allowed") as info:
                await client.call("Arith", "Mul", {"A": 1, "B": 1})
            assert any("Refuse.pre_call" in note for note in info.value.__notes__)
            assert caller._pools[0].connects == 0  # not even a connection was opened
            xc = XClient("Arith", StaticDiscovery([rpcx.address]), caller, plugins=[Refuse()],
                         options=XClientOptions(fail_mode=FailMode.FAILOVER, retries=3))
            async with xc:
                with pytest.raises(PermissionError):
                    await xc.call("Mul", {"A": 1, "B": 1})  # not retried
                assert await xc.call("Add", {"A": 1, "B": 1}) == {"C": 2}
        assert seen.calls == [("Add", {})]
        assert after == ["Add"]  # a refused call has no post_call


async def test_post_call_sees_replies_and_errors() -> None:
    seen_after: list[tuple[Any, Any]] = []

    class After:
        def post_call(self, call: CallInfo, args: Any, reply: Message | None, error: BaseException | None) -> None:
            seen_after.append((reply, error))

    async with RpcxServer(arith_server(), "tcp@127.0.0.1:0") as rpcx:
        caller = RpcxCaller()
        async with caller, Client(rpcx.address, caller, plugins=[After()]) as client:
            await client.call("Arith", "Mul", {"A": 2, "B": 2})
            with pytest.raises(ServiceError, match="can't find method"):
                await client.call("Arith", "Nope", {})
            xc = XClient("Arith", StaticDiscovery([rpcx.address, "tcp@127.0.0.1:1"]), caller, plugins=[After()],
                         options=XClientOptions(breaker=None))
            async with xc:
                receipts = await xc.inform("Mul", {"A": 3, "B": 3})
        ok, err = seen_after[0], seen_after[1]
        assert isinstance(ok[0], Message) and ok[0].payload and ok[1] is None
        assert err[0] is None and isinstance(err[1], ServiceError)
        assert sorted(type(e).__name__ if e else "reply" for _, e in seen_after[2:]) == ["TransportError", "reply"]
        assert sorted(r.error is None for r in receipts) == [False, True]


async def test_connection_hooks_across_a_server_restart() -> None:
    events: list[Any] = []
    async with RpcxServer(arith_server(), "tcp@127.0.0.1:0") as rpcx:
        addr = rpcx.address
        caller = RpcxCaller(config=fast_reconnect())
        client = Client(addr, caller, close_caller=True, plugins=[Recorder("r", events)])
        await client.call("Arith", "Mul", {"A": 1, "B": 1})
    # the server is gone: its connection's close hook ran
    await wait_until(lambda: ("r", "close", addr) in events)
    async with RpcxServer(arith_server(), addr):
        await wait_until(lambda: [e[1] for e in events].count("open") == 2, timeout=10)
        assert await client.call("Arith", "Mul", {"A": 2, "B": 5}) == {"C": 10}
        await client.aclose()
    assert [e[1] for e in events if e[1] in ("open", "close")] == ["open", "close", "open", "close"]


@pytest.mark.parametrize("how", ["false", "raise"])
async def test_refused_connection_fails_the_call_as_a_connect_error(how: str) -> None:
    seen = Seen()
    closed: list[str] = []

    class Gate:
        allow = False

        def on_conn_open(self, address: str, conn: Any) -> bool:
            if not self.allow:
                if how == "raise":
                    raise PermissionError("not this server")
                return False
            return True

        def on_conn_close(self, address: str, conn: Any) -> None:
            closed.append(address)

    gate = Gate()
    async with RpcxServer(arith_server(seen), "tcp@127.0.0.1:0") as rpcx:
        caller = RpcxCaller(config=fast_reconnect())
        async with Client(rpcx.address, caller, close_caller=True, plugins=[gate]) as client:
            with pytest.raises(TransportError) as info:
                await client.call("Arith", "Mul", {"A": 1, "B": 1})
            assert info.value.kind is TransportErrorKind.CONNECT
            assert ("not this server" if how == "raise" else "refused by client plugin hook") in str(info.value)
            assert closed == []  # a refused connection was never open
            gate.allow = True  # the pool keeps reconnecting; the next attempt passes
            ep = caller._endpoint(rpcx.address)
            await wait_until(lambda: caller._pools[0].health(ep) is Health.WORKING)
            assert await client.call("Arith", "Mul", {"A": 1, "B": 1}) == {"C": 1}
        assert seen.calls and closed == [rpcx.address]


async def test_a_hook_failing_unexpectedly_fails_that_call_only() -> None:
    seen = Seen()

    class Flaky:
        def __init__(self) -> None:
            self.failures = {"pre_call": 1, "post_call": 1}

        def pre_call(self, call: CallInfo, args: Any) -> None:
            if self.failures["pre_call"]:
                self.failures["pre_call"] -= 1
                raise KeyError("missing")

        def post_call(self, call: CallInfo, args: Any, reply: Any, error: Any) -> None:
            if self.failures["post_call"]:
                self.failures["post_call"] -= 1
                raise RuntimeError("bug after the call")

    async with RpcxServer(arith_server(seen), "tcp@127.0.0.1:0") as rpcx:
        async with Client(rpcx.address, RpcxCaller(), close_caller=True, plugins=[Flaky()]) as client:
            with pytest.raises(KeyError) as first:
                await client.call("Arith", "Mul", {"A": 1, "B": 1})
            assert first.value.__notes__[0].endswith("Flaky.pre_call")
            with pytest.raises(RuntimeError, match="bug after the call") as second:
                await client.call("Arith", "Mul", {"A": 2, "B": 2})
            assert second.value.__notes__[0].endswith("Flaky.post_call")
            assert await client.call("Arith", "Mul", {"A": 3, "B": 3}) == {"C": 9}
        assert [m for m, _ in seen.calls] == ["Mul", "Mul"]  # the second call ran; its post_call failed


async def test_closing_connection_hook_failure_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def on_conn_close(self, address: str, conn: Any) -> None:
            raise RuntimeError("close hook bug")

    async with RpcxServer(arith_server(), "tcp@127.0.0.1:0") as rpcx, \
            Client(rpcx.address, RpcxCaller(), close_caller=True, plugins=[Broken()]) as client:
        await client.call("Arith", "Mul", {"A": 1, "B": 1})
    assert "client plugin hook" in caplog.text and "close hook bug" in caplog.text


async def test_no_plugins_no_hooks_and_misuse() -> None:
    caller = RpcxCaller()
    client = Client("tcp@127.0.0.1:1", caller)
    assert client.plugins.call_hooks is False and not caller.plugins
    with pytest.raises(TypeError, match="implements no client plugin hook"):
        ClientPluginContainer([object()])
    net = InProcessNetwork()
    with pytest.raises(TypeError, match="connection hooks"):
        Client("inproc:x", net, plugins=[Recorder("r", [])])

    class CallsOnly:
        def pre_call(self, call: CallInfo, args: Any) -> None: ...

    Client("inproc:x", net, plugins=[CallsOnly()])  # call hooks need no connections
    # a client's connection hooks leave a shared caller when the client closes
    shared = Client("tcp@127.0.0.1:1", caller, plugins=[Recorder("r", [])])
    assert len(caller.plugins.plugins) == 1
    await shared.aclose()
    assert not caller.plugins
    await caller.aclose()
    await net.aclose()
