"""The service layer: registration, dispatch, codecs by annotation, deadlines,
auth, errors, oneway, heartbeat, push, drain (no network: ServiceDispatcher)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest

from rpc.errors import ServiceError
from rpc.examples import Arith, Hello, benchmark_request
from rpc.message import (
    META_AUTH,
    META_ERROR,
    META_SERVER_TIMEOUT,
    CompressType,
    Message,
    MessageStatus,
    MessageType,
    SerializeType,
)
from rpc.plugins import AuthPlugin, PluginContainer
from rpc.proto.benchmark_pb2 import BenchmarkMessage
from rpc.service import (
    Context,
    Peer,
    ServiceDispatcher,
    ServiceRegistry,
    fast,
    response_status_error,
)


def req(service: str, method: str, payload: bytes = b"", *, st: SerializeType = SerializeType.JSON, **kw: Any) -> Message:
    return Message(service_path=service, service_method=method, payload=payload, serialize_type=st, seq=kw.pop("seq", 7), **kw)


@dataclass
class Pair:
    A: int
    B: int


class Calc:
    def __init__(self) -> None:
        self.log: list[Any] = []
        self.started = asyncio.Event()
        self.cancelled = False

    async def Add(self, ctx: Context, args: Pair) -> dict[str, int]:
        return {"C": args.A + args.B}

    def SyncMul(self, ctx: Context, args: dict[str, int]) -> int:
        self.log.append(threading.current_thread().name)
        return args["A"] * args["B"]

    @fast
    def Inline(self, ctx: Context, args: int) -> int:
        self.log.append(threading.current_thread().name)
        return args + 1

    async def Fail(self, ctx: Context, args: Any) -> None:
        raise ValueError("boom")

    async def Refuse(self, ctx: Context, args: Any) -> None:
        raise ServiceError("not allowed")

    async def Slow(self, ctx: Context, args: Any) -> str:
        self.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return "late"

    async def Meta(self, ctx: Context, args: Any) -> dict[str, Any]:
        ctx.reply_metadata["echo"] = ctx.metadata.get("in", "")
        return {"remaining": ctx.remaining() is not None, "peer": ctx.peer.address if ctx.peer else None}

    async def Log(self, ctx: Context, args: Any) -> None:
        self.log.append(args)

    async def Push(self, ctx: Context, args: Any) -> str:
        await ctx.push("Client", "Notify", {"n": args})
        return "pushed"

    def helper(self) -> None:  # not a handler shape: not exported
        pass

    def _private(self, ctx: Context, args: Any) -> None:
        pass


@pytest.fixture
async def calc():
    calc = Calc()
    d = ServiceDispatcher(max_sync_workers=2)
    d.registry.register(calc, "Calc")
    yield calc, d
    await d.aclose()


def test_register_exports_handler_shaped_public_methods() -> None:
    reg = ServiceRegistry()
    svc = reg.register(Calc, metadata="weight=2")
    assert svc.name == "Calc" and svc.metadata == "weight=2"
    assert "Add" in svc.methods and "helper" not in svc.methods and "_private" not in svc.methods
    assert svc.methods["Add"].is_async and svc.methods["Add"].arg_type is Pair
    assert svc.methods["Inline"].inline and not svc.methods["SyncMul"].inline
    with pytest.raises(ValueError, match="already registered"):
        reg.register(Calc())

    class Empty:
        def nothing(self) -> None: ...

    with pytest.raises(ValueError, match="no method"):
        reg.register(Empty())


async def test_async_handler_json_dataclass(calc) -> None:
    _, d = calc
    out = await d.dispatch(req("Calc", "Add", b'{"A":2,"B":3}', compress_type=CompressType.GZIP))
    res = out.reply
    assert res is not None and not out.close
    assert res.message_type == MessageType.RESPONSE and res.status == MessageStatus.NORMAL
    assert (res.seq, res.service_path, res.service_method) == (7, "Calc", "Add")
    assert res.compress_type == CompressType.GZIP  # answers in the request's formats
    assert res.payload == b'{"C":5}'


async def test_sync_handler_runs_in_pool_and_fast_inline(calc) -> None:
    c, d = calc
    res = (await d.dispatch(req("Calc", "SyncMul", b'{"A":6,"B":7}'))).reply
    assert res is not None and res.payload == b"42"
    res = (await d.dispatch(req("Calc", "Inline", b"41"))).reply
    assert res is not None and res.payload == b"42"
    assert c.log[0].startswith("rpc-handler") and c.log[1] == threading.current_thread().name


async def test_msgpack_and_protobuf_by_annotation() -> None:
    d = ServiceDispatcher()
    d.registry.register(Arith(), "Arith")
    d.registry.register(Hello(), "Hello")
    res = (await d.dispatch(req("Arith", "Mul", msgpack.packb({"A": 7, "B": 6}), st=SerializeType.MSGPACK))).reply
    assert res is not None and msgpack.unpackb(res.payload) == {"C": 42}
    payload = benchmark_request().SerializeToString()
    assert len(payload) == 581
    res = (await d.dispatch(req("Hello", "Say", payload, st=SerializeType.PROTOBUF))).reply
    assert res is not None and res.serialize_type == SerializeType.PROTOBUF
    out = BenchmarkMessage.FromString(res.payload)
    assert out.field1 == "OK" and out.field2 == 100 and out.field3 == 100000
    # protobuf payload to a JSON-typed handler: a clean error, not a crash
    res = (await d.dispatch(req("Arith", "Mul", payload, st=SerializeType.PROTOBUF))).reply
    assert res is not None and res.is_error and "protobuf" in res.metadata[META_ERROR]
    await d.aclose()


@pytest.mark.parametrize(
    ("service", "method", "payload", "st", "error"),
    [
        ("Nope", "Add", b"{}", SerializeType.JSON, "rpcx: can't find service Nope"),
        ("Calc", "Nope", b"{}", SerializeType.JSON, "rpcx: can't find method Nope"),
        ("Calc", "Add", b"{not json", SerializeType.JSON, "invalid JSON"),
        ("Calc", "Add", b'{"A":1}', SerializeType.JSON, "cannot build Pair"),
        ("Calc", "Add", b"{}", SerializeType.THRIFT, "thrift payloads need a Thrift struct type"),
        ("Calc", "Fail", b"null", SerializeType.JSON, "boom"),
        ("Calc", "Refuse", b"null", SerializeType.JSON, "not allowed"),
    ],
)
async def test_errors_become_status_error(calc, service, method, payload, st, error) -> None:
    _, d = calc
    out = await d.dispatch(req(service, method, payload, st=st))
    res = out.reply
    assert res is not None and not out.close
    assert res.status == MessageStatus.ERROR and res.payload == b""
    assert error in res.metadata[META_ERROR]
    assert res.seq == 7
    err = response_status_error(res)
    assert isinstance(err, ServiceError) and error in err.text


async def test_server_timeout_cancels_async_handler(calc) -> None:
    c, d = calc
    out = await d.dispatch(req("Calc", "Slow", b"null", metadata={META_SERVER_TIMEOUT: "50"}))
    assert out.reply is not None and out.reply.is_error
    assert "deadline exceeded" in out.reply.metadata[META_ERROR]
    assert c.cancelled


async def test_server_timeout_on_sync_handler_answers_at_deadline() -> None:
    release = threading.Event()

    class Blocking:
        def Wait(self, ctx: Context, args: Any) -> str:
            release.wait(10)
            return "done"

    d = ServiceDispatcher()
    d.registry.register(Blocking())
    out = await d.dispatch(req("Blocking", "Wait", b"null", metadata={META_SERVER_TIMEOUT: "30"}))
    release.set()
    assert out.reply is not None and "deadline exceeded" in out.reply.metadata[META_ERROR]
    await d.aclose()


async def test_bad_or_zero_server_timeout_means_none_and_default_applies(calc) -> None:
    _, d = calc
    res = (await d.dispatch(req("Calc", "Meta", b"null", metadata={META_SERVER_TIMEOUT: "x"}))).reply
    assert res is not None and b'"remaining":false' in res.payload
    d.handler_timeout = 0.05
    out = await d.dispatch(req("Calc", "Slow", b"null"))
    assert out.reply is not None and "deadline exceeded" in out.reply.metadata[META_ERROR]


async def test_context_metadata_in_and_out(calc) -> None:
    _, d = calc
    peer = Peer(address="10.0.0.1:5555")
    res = (await d.dispatch(req("Calc", "Meta", b"null", metadata={"in": "hello", META_SERVER_TIMEOUT: "1000"}), peer)).reply
    assert res is not None and res.metadata == {"echo": "hello"}
    assert res.payload == b'{"remaining":true,"peer":"10.0.0.1:5555"}'


async def test_oneway_runs_without_reply_even_on_error(calc) -> None:
    c, d = calc
    out = await d.dispatch(req("Calc", "Log", b'"line"', oneway=True))
    assert out.reply is None and c.log == ["line"]
    out = await d.dispatch(req("Calc", "Fail", b"null", oneway=True))
    assert out.reply is None


async def test_heartbeat_echoed_and_hooked(calc) -> None:
    _, d = calc
    seen: list[int] = []

    class HB:
        def on_heartbeat(self, peer: Peer, msg: Message) -> None:
            seen.append(msg.seq)

    d.plugins.add(HB())
    hb = Message(heartbeat=True, seq=99, payload=b"ping", metadata={"k": "v"})
    res = (await d.dispatch(hb)).reply
    assert res is not None and res.heartbeat and res.message_type == MessageType.RESPONSE
    assert (res.seq, res.payload, res.metadata) == (99, b"ping", {"k": "v"})
    assert seen == [99]


async def test_responses_are_ignored(calc) -> None:
    _, d = calc
    out = await d.dispatch(Message(message_type=MessageType.RESPONSE, seq=1))
    assert out.reply is None and not out.close


async def test_auth_failure_replies_and_closes_connection(calc) -> None:
    _, d = calc
    d.plugins.add(AuthPlugin(["s3cret"]))
    ok = await d.dispatch(req("Calc", "Add", b'{"A":1,"B":1}', metadata={META_AUTH: "s3cret"}))
    assert ok.reply is not None and not ok.reply.is_error and not ok.close
    for md in ({META_AUTH: "wrong"}, {}):
        bad = await d.dispatch(req("Calc", "Add", b'{"A":1,"B":1}', metadata=md))
        assert bad.close and bad.reply is not None and bad.reply.metadata[META_ERROR] == "auth failed"
    bad = await d.dispatch(req("Calc", "Log", b"1", oneway=True))
    assert bad.close and bad.reply is None
    # heartbeats are not authenticated
    hb = await d.dispatch(Message(heartbeat=True, seq=1))
    assert hb.reply is not None and not hb.close


async def test_auth_check_function_sees_context() -> None:
    seen: list[tuple[str, str]] = []

    async def check(ctx: Context, token: str) -> bool:
        seen.append((ctx.service, token))
        return token == "t"

    d = ServiceDispatcher(plugins=PluginContainer([AuthPlugin(check=check)]))
    d.registry.register(Arith(), "Arith")
    out = await d.dispatch(req("Arith", "Add", b'{"A":1,"B":2}', metadata={META_AUTH: "t"}))
    assert out.reply is not None and out.reply.payload == b'{"C":3}'
    assert seen == [("Arith", "t")]
    await d.aclose()


async def test_hook_order_and_rejections(calc) -> None:
    _, d = calc
    calls: list[str] = []

    class Trace:
        def post_read(self, peer, msg):
            calls.append("post_read")

        def pre_call(self, ctx, args):
            calls.append(f"pre_call:{args}")
            if args == Pair(0, 0):
                raise ServiceError("zero refused")

        async def post_call(self, ctx, args, reply, error):
            calls.append(f"post_call:{reply}:{type(error).__name__ if error else None}")

        def pre_write(self, ctx, req, res):
            calls.append("pre_write")

    d.plugins.add(Trace())
    await d.dispatch(req("Calc", "Add", b'{"A":1,"B":2}'))
    assert calls == ["post_read", "pre_call:Pair(A=1, B=2)", "post_call:{'C': 3}:None", "pre_write"]
    calls.clear()
    out = await d.dispatch(req("Calc", "Add", b'{"A":0,"B":0}'))
    assert out.reply is not None and out.reply.metadata[META_ERROR] == "zero refused"
    assert calls == ["post_read", "pre_call:Pair(A=0, B=0)", "post_call:None:ServiceError"]


async def test_session_connection_hooks() -> None:
    events: list[str] = []

    class Conn:
        def on_conn_accept(self, peer):
            events.append("accept")
            return peer.address != "banned"

        def pre_read(self, peer):
            events.append("pre_read")

        def post_write(self, peer, req, res, error):
            events.append(f"post_write:{res.seq}")

        def on_conn_close(self, peer):
            events.append("close")

    d = ServiceDispatcher(plugins=PluginContainer([Conn()]))
    d.registry.register(Arith(), "Arith")
    s = d.session(Peer(address="ok"))
    assert await s.accept()
    await s.before_read()
    m = req("Arith", "Add", b'{"A":1,"B":2}', seq=3)
    out = await s.handle(m)
    assert out.reply is not None
    await s.written(m, out.reply)
    await s.close()
    await s.close()  # idempotent
    assert events == ["accept", "pre_read", "post_write:3", "close"]
    assert not await d.session(Peer(address="banned")).accept()
    await d.aclose()


async def test_server_push_through_peer_send(calc) -> None:
    _, d = calc
    sent: list[Message] = []

    async def send(msg: Message) -> None:
        sent.append(msg)

    res = (await d.dispatch(req("Calc", "Push", b"5"), Peer(address="c", send=send))).reply
    assert res is not None and res.payload == b'"pushed"'
    assert len(sent) == 1
    push = sent[0]
    assert push.oneway and push.is_request and not push.heartbeat
    assert (push.service_path, push.service_method, push.payload) == ("Client", "Notify", b'{"n":5}')
    # without a send function, push is an error for the handler
    res = (await d.dispatch(req("Calc", "Push", b"5"))).reply
    assert res is not None and "server push" in res.metadata[META_ERROR]


async def test_drain_waits_for_in_flight_and_shutdown_refuses_new(calc) -> None:
    c, d = calc
    task = asyncio.create_task(d.dispatch(req("Calc", "Slow", b"null", metadata={META_SERVER_TIMEOUT: "300"})))
    await c.started.wait()
    assert d.in_flight == 1
    d.begin_shutdown()
    out = await d.dispatch(req("Calc", "Add", b'{"A":1,"B":1}'))
    assert out.reply is not None and out.reply.metadata[META_ERROR] == "server is shutting down"
    assert not await d.drain(0.01)  # still running
    assert await d.drain(5)
    assert task.done() and d.in_flight == 0
    assert await d.drain(0)


async def test_register_function() -> None:
    d = ServiceDispatcher()

    async def echo(ctx: Context, args: Any) -> Any:
        return args

    d.registry.register_function("Util", echo)
    res = (await d.dispatch(req("Util", "echo", b'[1,"a"]'))).reply
    assert res is not None and res.payload == b'[1,"a"]'
    with pytest.raises(ValueError):
        d.registry.register_function("Util", echo)
    await d.aclose()


_fuzz_dispatcher = ServiceDispatcher(max_sync_workers=1)
_fuzz_dispatcher.registry.register(Arith(), "Arith")
_fuzz_dispatcher.registry.register(Hello(), "Hello")


from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=300, deadline=None)
@given(
    service=st.sampled_from(["Arith", "Hello", "Nope", ""]),
    method=st.sampled_from(["Mul", "Add", "Say", "", "x"]),
    payload=st.binary(max_size=64) | st.sampled_from([b'{"A":1,"B":2}', b'{"A":"1"}', b"[]", b"null"]),
    st_=st.sampled_from(list(SerializeType)),
    metadata=st.dictionaries(st.sampled_from([META_SERVER_TIMEOUT, META_AUTH, "k"]), st.text(max_size=8), max_size=3),
    oneway=st.booleans(),
    heartbeat=st.booleans(),
)
def test_dispatch_never_raises(service, method, payload, st_, metadata, oneway, heartbeat) -> None:
    msg = Message(service_path=service, service_method=method, payload=payload, serialize_type=st_,
                  metadata=metadata, oneway=oneway, heartbeat=heartbeat, seq=1)
    out = asyncio.run(_fuzz_dispatcher.dispatch(msg))
    if heartbeat:
        assert out.reply is not None and out.reply.heartbeat
    elif oneway:
        assert out.reply is None
    else:
        assert out.reply is not None and out.reply.seq == 1
        assert out.reply.is_error == (META_ERROR in out.reply.metadata)


async def test_protobuf_handler_called_with_json() -> None:
    import json as _json

    d = ServiceDispatcher()
    d.registry.register(Hello(), "Hello")
    res = (await d.dispatch(req("Hello", "Say", b'{"field1":"x","field2":1,"field3":3}'))).reply
    assert res is not None and not res.is_error
    assert _json.loads(res.payload)["field1"] == "OK" and _json.loads(res.payload)["field3"] == 3
    await d.aclose()


async def test_register_with_a_method_allow_list() -> None:
    d = ServiceDispatcher(max_sync_workers=2)
    svc = d.registry.register(Calc(), "Calc", methods=["Add", "Inline"])
    assert set(svc.methods) == {"Add", "Inline"}
    res = (await d.dispatch(req("Calc", "Add", b'{"A":1,"B":2}'))).reply
    assert res is not None and not res.is_error and res.payload == b'{"C":3}'
    for method in ("SyncMul", "Fail", "helper"):
        # the answer Go's rpcx server gives for a method it does not export
        for out in (await d.dispatch(req("Calc", method, b"null")), d.dispatch_now(req("Calc", method, b"null"), Peer("p"))):
            assert out is not None and out.reply is not None
            assert out.reply.metadata[META_ERROR] == f"rpcx: can't find method {method}"
    assert d.dispatch_now(req("Calc", "Inline", b"41"), Peer("p")).reply.payload == b"42"  # the fast path still serves listed ones
    await d.aclose()

    reg = ServiceRegistry()
    with pytest.raises(ValueError, match=r"Calc has no method Sub, helper of the shape"):
        reg.register(Calc(), methods=["Add", "Sub", "helper"])  # unknown and not-a-handler names, in order
    with pytest.raises(ValueError, match="_private"):
        reg.register(Calc(), methods=["_private"])
    with pytest.raises(ValueError, match="empty"):
        reg.register(Calc(), methods=[])
    with pytest.raises(TypeError):
        reg.register(Calc(), methods="Add")
    assert reg.services == {}  # a refused registration registers nothing
