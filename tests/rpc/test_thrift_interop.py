"""Thrift payloads (serialize type 4) between us and Go rpcx v1.9.1 (its
codec.ThriftCodec, Apache Thrift v0.21's binary protocol): a Go client
calling `juggler rpc serve`, our client and XClient calling a Go server, the
structs of tests/rpc/arith_thrift/arith.thrift on both sides."""

from __future__ import annotations

import json
import selectors
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rpc.client import Client
from rpc.discovery.base import StaticDiscovery
from rpc.errors import ServiceError
from rpc.message import SerializeType
from rpc.rpcx_client import RpcxCaller
from rpc.xclient import XClient, XClientOptions
from tests.netutil import free_port
from tests.rpc.arith_thrift.ttypes import MulArgs, MulReply
from tests.rpc.gopeer import build_go_peer
from tests.rpc.test_rpcx_e2e import Served, serve


@pytest.fixture(scope="module")
def go_thrift_peer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_peer(tmp_path_factory, "go-thrift", "the rpcx Thrift interop peer")


@pytest.fixture
def go_server(go_thrift_peer: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([str(go_thrift_peer), "server", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        assert sel.select(timeout=30), "the Go server did not start"
        assert proc.stdout.readline().startswith("ready"), "the Go server did not start"
        yield f"tcp@127.0.0.1:{port}"
    finally:
        sel.close()
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.fixture
def our_server() -> Iterator[Served]:
    s = serve("--app", "tests.rpc.thrift_app:setup")
    yield s
    s.stop()


def test_a_go_client_calls_our_server_with_thrift(go_thrift_peer: Path, our_server: Served) -> None:
    addr = our_server.address.removeprefix("tcp@")
    out = subprocess.run([str(go_thrift_peer), "client", addr, "6", "7", "héllo", "1", "2", "-3"],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"c": 42, "note": "py:héllo", "tags": [-3, 2, 1]}
    # large values, an empty list
    out = subprocess.run([str(go_thrift_peer), "client", addr, str(2**40), "-3", ""],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"c": -3 * 2**40, "note": "py:", "tags": []}


async def test_our_clients_call_a_go_server_with_thrift(go_server: str) -> None:
    caller = RpcxCaller()
    try:
        client = Client(go_server, caller, serialize_type=SerializeType.THRIFT)
        reply = await client.call("Arith", "Mul", MulArgs(a=6, b=7, note="é", tags=[1, 2, 3]), reply_type=MulReply,
                                  timeout=5)
        assert reply == MulReply(c=42, note="go:é", tags=[3, 2, 1])
        # a JSON request to the same Go method still works: the codec is chosen per request
        plain = Client(go_server, caller)
        with pytest.raises(ServiceError):
            await plain.call("Arith", "Nope", {}, timeout=5)
        async with XClient("Arith", StaticDiscovery.peer(go_server), caller,
                           options=XClientOptions(serialize_type=SerializeType.THRIFT)) as xc:
            reply = await xc.call("Mul", MulArgs(a=-2**40, b=3, note="", tags=[]), reply_type=MulReply, timeout=5)
            assert reply == MulReply(c=-3 * 2**40, note="go:", tags=[])
    finally:
        await caller.aclose()


async def test_our_client_and_server_with_thrift_and_a_wrong_type(our_server: Served) -> None:
    caller = RpcxCaller()
    try:
        client = Client(our_server.address, caller, serialize_type=SerializeType.THRIFT)
        reply = await client.call("Arith", "Mul", MulArgs(a=3, b=5, note="x", tags=[7]), reply_type=MulReply,
                                  timeout=5)
        assert reply == MulReply(c=15, note="py:x", tags=[7])
        # a handler typed for JSON: the Thrift request is refused with a reason, the server goes on
        with pytest.raises(ServiceError, match="thrift payloads need a Thrift struct type"):
            await client.call("Arith", "Echo", MulArgs(a=1), timeout=5)
        assert (await client.call("Arith", "Mul", MulArgs(a=2, b=2, note="", tags=[]), reply_type=MulReply,
                                  timeout=5)).c == 4
    finally:
        await caller.aclose()
