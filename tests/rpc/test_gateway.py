"""HTTP gateway: rpcx X-RPCX-* headers and JSON-RPC 2.0 onto the dispatcher;
the HTTP/1.1 parser (fuzzed); a real GatewayServer called with urllib."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpc.examples import Arith, Hello, benchmark_request
from rpc.gateway import (
    X_ERROR,
    X_JSONRPC,
    X_MESSAGE_ID,
    X_META,
    X_SERIALIZE,
    X_SERVICE_METHOD,
    X_STATUS,
    Gateway,
    GatewayServer,
    Headers,
    HTTPParseError,
    HTTPParser,
    HTTPRequest,
)
from rpc.plugins import AuthPlugin
from rpc.proto.benchmark_pb2 import BenchmarkMessage
from rpc.service import Context, ServiceDispatcher


class Echo:
    async def Meta(self, ctx: Context, args: Any) -> Any:
        ctx.reply_metadata["seen"] = ctx.metadata.get("k", "")
        return args

    async def Log(self, ctx: Context, args: Any) -> None:
        LOG.append(args)


LOG: list[Any] = []


@pytest.fixture
async def gateway():
    d = ServiceDispatcher()
    d.registry.register(Arith(), "Arith")
    d.registry.register(Hello(), "Hello")
    d.registry.register(Echo())
    yield Gateway(d)
    await d.aclose()


def post(path: str, body: bytes, **headers: str) -> HTTPRequest:
    return HTTPRequest("POST", path, Headers(headers), body)


async def test_rpcx_gateway_json(gateway: Gateway) -> None:
    res = await gateway.handle(post("/Arith", b'{"A":6,"B":7}', **{X_SERVICE_METHOD: "Mul", X_SERIALIZE: "1", X_MESSAGE_ID: "12"}))
    assert res.status == 200 and res.body == b'{"C":42}'
    assert res.header(X_STATUS) == "Normal" and res.header(X_MESSAGE_ID) == "12"


async def test_rpcx_gateway_protobuf_and_meta(gateway: Gateway) -> None:
    res = await gateway.handle(post("/Hello", benchmark_request().SerializeToString(),
                                    **{X_SERVICE_METHOD: "Say", X_SERIALIZE: "2"}))
    assert res.status == 200 and BenchmarkMessage.FromString(res.body).field1 == "OK"
    res = await gateway.handle(post("/", b'"x"', **{"X-RPCX-ServicePath": "Echo", X_SERVICE_METHOD: "Meta",
                                                     X_SERIALIZE: "1", X_META: "k=v%26w&z=1"}))
    assert res.body == b'"x"' and res.header(X_META) == "seen=v%26w"


@pytest.mark.parametrize(
    ("path", "headers", "status", "error"),
    [
        ("/", {X_SERVICE_METHOD: "Mul", X_SERIALIZE: "1"}, 400, "empty servicepath"),
        ("/Arith", {X_SERIALIZE: "1"}, 400, "empty servicemethod"),
        ("/Arith", {X_SERVICE_METHOD: "Mul"}, 400, "empty serialized type"),
        ("/Arith", {X_SERVICE_METHOD: "Mul", X_SERIALIZE: "9"}, 400, "not a valid SerializeType"),
        ("/Arith", {X_SERVICE_METHOD: "Mul", X_SERIALIZE: "1", X_MESSAGE_ID: "-1"}, 400, "out of range"),
        ("/Nope", {X_SERVICE_METHOD: "Mul", X_SERIALIZE: "1"}, 500, "rpcx: can't find service Nope"),
        ("/Arith", {X_SERVICE_METHOD: "Mul", X_SERIALIZE: "1"}, 500, "invalid JSON"),
    ],
)
async def test_rpcx_gateway_errors(gateway: Gateway, path: str, headers: dict[str, str], status: int, error: str) -> None:
    res = await gateway.handle(post(path, b"{bad", **headers))
    assert res.status == status and res.header(X_STATUS) == "Error" and error in res.header(X_ERROR)


async def test_rpcx_gateway_auth_and_oneway(gateway: Gateway) -> None:
    gateway.dispatcher.plugins.add(AuthPlugin(["tok"]))
    hdr = {X_SERVICE_METHOD: "Add", X_SERIALIZE: "1"}
    assert (await gateway.handle(post("/Arith", b'{"A":1,"B":1}', **hdr))).status == 401
    res = await gateway.handle(post("/Arith", b'{"A":1,"B":1}', Authorization="tok", **hdr))
    assert res.status == 200 and res.body == b'{"C":2}'
    LOG.clear()
    res = await gateway.handle(post("/Echo", b"5", Authorization="tok", **{X_SERVICE_METHOD: "Log", X_SERIALIZE: "1", "X-RPCX-Oneway": "true"}))
    assert res.status == 200 and res.body == b"" and LOG == [5]


async def test_jsonrpc(gateway: Gateway) -> None:
    def rpc(body: Any) -> HTTPRequest:
        return post("/", json.dumps(body).encode() if not isinstance(body, bytes) else body, **{X_JSONRPC: "true"})

    res = await gateway.handle(rpc({"jsonrpc": "2.0", "id": 1, "method": "Arith.Mul", "params": {"A": 3, "B": 4}}))
    assert json.loads(res.body) == {"jsonrpc": "2.0", "id": 1, "result": {"C": 12}}
    res = await gateway.handle(rpc({"jsonrpc": "2.0", "id": "a", "method": "Arith.Nope", "params": {}}))
    assert json.loads(res.body)["error"]["code"] == -32601
    res = await gateway.handle(rpc({"jsonrpc": "2.0", "id": 2, "method": "Arith.Mul", "params": {"A": "x"}}))
    err = json.loads(res.body)["error"]
    assert err["code"] == -32603 and "A must be an integer" in err["message"]
    res = await gateway.handle(rpc({"jsonrpc": "2.0", "id": 3, "method": "Mul"}))
    assert json.loads(res.body)["error"]["code"] == -32601
    res = await gateway.handle(rpc(b"{nope"))
    assert json.loads(res.body)["error"]["code"] == -32700
    res = await gateway.handle(rpc({"id": 4, "method": "Arith.Mul"}))
    assert json.loads(res.body)["error"]["code"] == -32600
    LOG.clear()
    res = await gateway.handle(rpc({"jsonrpc": "2.0", "method": "Echo.Log", "params": [1]}))
    assert res.status == 204 and LOG == [[1]]
    res = await gateway.handle(rpc([
        {"jsonrpc": "2.0", "id": 1, "method": "Arith.Add", "params": {"A": 1, "B": 2}},
        {"jsonrpc": "2.0", "method": "Echo.Log", "params": 2},
        {"jsonrpc": "2.0", "id": 2, "method": "Arith.Mul", "params": {"A": 2, "B": 5}},
    ]))
    assert [r["result"] for r in json.loads(res.body)] == [{"C": 3}, {"C": 10}]


def test_parser_pipelined_and_partial() -> None:
    p = HTTPParser()
    raw = (b"POST /a HTTP/1.1\r\nContent-Length: 3\r\nX-A: 1\r\n\r\nabc"
           b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
    out = []
    for i in range(len(raw)):
        out += p.feed(raw[i:i + 1])
    assert [(r.method, r.path, r.body) for r in out] == [("POST", "/a", b"abc"), ("GET", "/b", b"")]
    assert out[0].headers.get("x-a") == "1" and out[0].keep_alive


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nBad Header\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
        (b"POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413),
        (b"POST / HTTP/1.1\r\n" + b"X: " + b"a" * 20000, 431),
    ],
)
def test_parser_rejects(raw: bytes, status: int) -> None:
    with pytest.raises(HTTPParseError) as info:
        HTTPParser().feed(raw)
    assert info.value.status == status


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_parser_fuzz(data: bytes) -> None:
    try:
        HTTPParser(max_header=256, max_body=256).feed(data)
    except HTTPParseError as exc:
        assert 400 <= exc.status < 500


async def test_gateway_server_with_urllib(gateway: Gateway) -> None:
    async with GatewayServer(gateway) as server:
        url = f"http://127.0.0.1:{server.port}"

        def call() -> tuple[int, dict[str, str], bytes]:
            req = urllib.request.Request(f"{url}/Arith", data=b'{"A":2,"B":21}', method="POST",
                                         headers={X_SERVICE_METHOD: "Mul", X_SERIALIZE: "1"})
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, dict(r.headers), r.read()

        status, headers, body = await asyncio.to_thread(call)
        assert status == 200 and body == b'{"C":42}' and headers[X_STATUS] == "Normal"

        def jsonrpc() -> Any:
            req = urllib.request.Request(url, method="POST", headers={X_JSONRPC: "true"},
                                         data=b'{"jsonrpc":"2.0","id":7,"method":"Arith.Add","params":{"A":1,"B":1}}')
            with urllib.request.urlopen(req, timeout=5) as r:
                return json.loads(r.read())

        assert (await asyncio.to_thread(jsonrpc))["result"] == {"C": 2}

        def bad() -> int:
            req = urllib.request.Request(f"{url}/Nope", data=b"{}", method="POST",
                                         headers={X_SERVICE_METHOD: "X", X_SERIALIZE: "1"})
            try:
                urllib.request.urlopen(req, timeout=5)
            except urllib.error.HTTPError as exc:
                exc.close()
                return exc.code
            return 0

        assert await asyncio.to_thread(bad) == 500


async def test_gateway_server_keep_alive_and_close(gateway: Gateway) -> None:
    server = GatewayServer(gateway)
    await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    req = (b"POST /Arith HTTP/1.1\r\nX-RPCX-ServiceMethod: Add\r\nX-RPCX-SerializeType: 1\r\n"
           b"Content-Length: 13\r\n\r\n{\"A\":1,\"B\":2}")
    writer.write(req + req)  # pipelined on one connection
    for _ in range(2):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        assert await reader.readexactly(length) == b'{"C":3}'
    await server.aclose()  # the idle keep-alive connection is closed at once
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await writer.wait_closed()


async def test_gateway_server_times_out_slow_requests(gateway: Gateway) -> None:
    async with GatewayServer(gateway, request_timeout=0.2) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /Arith HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")  # never completes
        head = await asyncio.wait_for(reader.read(), 5)
        assert head.startswith(b"HTTP/1.1 408")
        writer.close()
        await writer.wait_closed()


# -- CONNECT /_rpcx_ (rpcx's "http" network) ---------------------------------------------


def test_parser_connect_ends_http_and_bare_lf() -> None:
    p = HTTPParser()
    out = p.feed(b"CONNECT /_rpcx_ HTTP/1.0\n\n\x08\x01rest")  # Go's client: bare LF
    assert [(r.method, r.path, r.version) for r in out] == [("CONNECT", "/_rpcx_", "HTTP/1.0")]
    assert p.feed(b"GET / HTTP/1.1\r\n\r\n") == []  # after CONNECT nothing is HTTP
    assert p.rest() == b"\x08\x01restGET / HTTP/1.1\r\n\r\n" and p.rest() == b""
    # anything but a CONNECT: bare LF is refused (a front proxy may read it otherwise)
    for raw in (b"POST /a HTTP/1.1\nContent-Length: 2\nX-A: 1\n\nok",
                b"GET /a HTTP/1.1\r\nX-A: 1\nX-B: 2\r\n\r\n"):
        with pytest.raises(HTTPParseError) as e:
            HTTPParser().feed(raw)
        assert e.value.status == 400


async def _rpcx_call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seq: int, a: int, b: int) -> bytes:
    from rpc.transport.config import ConnectionConfig
    from rpc.transport.wire import RpcxWire

    wire = RpcxWire()
    writer.write(wire.encode_request(seq, json.dumps({"A": a, "B": b}).encode(), service_path="Arith",
                                     service_method="Mul", serialize_type=1))
    decoder = wire.decoder(ConnectionConfig())
    while True:
        data = await asyncio.wait_for(reader.read(65536), 5)
        assert data, "connection closed"
        msgs = decoder.feed(data)
        if msgs:
            assert msgs[0].seq == seq and not msgs[0].status
            return bytes(msgs[0].payload)


async def _connect(port: int, preamble: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(preamble)
    return reader, writer


async def _closed(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


@pytest.fixture
async def rpcx_port() -> Any:
    from rpc.rpcx_server import RpcxServer
    from rpc.server import Server

    server = Server()
    server.register(Arith())
    async with RpcxServer(server, "tcp@127.0.0.1:0", gateway=Gateway(server.dispatcher)) as rpcx:
        yield rpcx


async def test_connect_rpcx_path_on_the_rpcx_port(rpcx_port: Any) -> None:
    port = rpcx_port.endpoint.port
    reader, writer = await _connect(port, b"CONNECT /_rpcx_ HTTP/1.0\n\n")
    assert await asyncio.wait_for(reader.readexactly(32), 5) == b"HTTP/1.0 200 Connected to rpcx\n\n"
    assert await _rpcx_call(reader, writer, 1, 6, 7) == b'{"C":42}'
    assert len(rpcx_port.connections) == 1  # it is one of the listener's rpcx connections now
    # pipelined: the first rpcx frame right behind the request (CRLF as well)
    from rpc.transport.wire import RpcxWire

    frame = RpcxWire().encode_request(9, b'{"A":2,"B":3}', service_path="Arith", service_method="Mul", serialize_type=1)
    r2, w2 = await _connect(port, b"CONNECT /_rpcx_ HTTP/1.1\r\nHost: x\r\n\r\n" + frame)
    assert await asyncio.wait_for(r2.readexactly(32), 5) == b"HTTP/1.0 200 Connected to rpcx\n\n"
    from rpc.transport.config import ConnectionConfig

    dec = RpcxWire().decoder(ConnectionConfig())
    msgs: list[Any] = []
    while not msgs:
        msgs = dec.feed(await asyncio.wait_for(r2.read(65536), 5))
    assert msgs[0].seq == 9 and bytes(msgs[0].payload) == b'{"C":6}'
    assert await _rpcx_call(reader, writer, 2, 2, 2) == b'{"C":4}'  # the first is unharmed
    await _closed(w2)
    await _closed(writer)


@pytest.mark.parametrize(
    ("preamble", "answer"),
    [
        (b"CONNECT /other HTTP/1.0\n\n", b"HTTP/1.1 405"),  # another path: today's 405, then closed
        (b"CONNECT /_rpcx_\n\n", b"HTTP/1.1 400"),  # malformed request line
        (b"CONNECT /_rpcx_ HTTP/1.0", b""),  # cut short, then EOF: closed quietly
        (b"CONNECT /_rpcx_ HTTP/1.0\n\nGET / HTTP/1.1\r\n\r\n" + b"\x00" * 64, b"HTTP/1.0 200 Connected to rpcx\n\n"),
    ],
)
async def test_connect_hostile(rpcx_port: Any, preamble: bytes, answer: bytes) -> None:
    port = rpcx_port.endpoint.port
    good_r, good_w = await _connect(port, b"CONNECT /_rpcx_ HTTP/1.0\n\n")
    await asyncio.wait_for(good_r.readexactly(32), 5)
    reader, writer = await _connect(port, preamble)
    if not preamble.endswith(b"\n"):
        writer.write_eof()
    got = await asyncio.wait_for(reader.read(), 5)  # refused: the server closes the connection
    assert got.startswith(answer) and (not answer.startswith(b"HTTP/1.0") or got == answer)
    await _closed(writer)
    assert await _rpcx_call(good_r, good_w, 3, 3, 3) == b'{"C":9}'  # other connections go on
    await _closed(good_w)


async def test_connect_on_the_gateway_port(gateway: Gateway) -> None:
    from rpc.rpcx_server import RpcxServer
    from rpc.server import Server

    server = Server()
    server.register(Arith())
    async with RpcxServer(server, "tcp@127.0.0.1:0") as rpcx:
        async with GatewayServer(Gateway(server.dispatcher), on_connect=rpcx.adopt) as gw:
            reader, writer = await _connect(gw.port, b"CONNECT /_rpcx_ HTTP/1.0\n\n")
            assert await asyncio.wait_for(reader.readexactly(32), 5) == b"HTTP/1.0 200 Connected to rpcx\n\n"
            assert await _rpcx_call(reader, writer, 1, 4, 5) == b'{"C":20}'
            await _closed(writer)
        async with GatewayServer(gateway) as plain:  # no rpcx listener to hand to: 405 as before
            reader, writer = await _connect(plain.port, b"CONNECT /_rpcx_ HTTP/1.0\n\n")
            assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 405")
            await _closed(writer)
