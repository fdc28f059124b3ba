"""The grpc.aio reference peer: Hello.Say over gRPC, driven by the bench engine."""

from __future__ import annotations

import pytest

from rpc.bench import BenchTarget, bench_target
from rpc.errors import TransportError
from rpc.examples import BenchmarkMessage, benchmark_request
from rpc.grpc_peer import GrpcCaller, start_grpc_server
from rpc.message import Message, SerializeType
from tests.netutil import free_port


async def test_grpc_say_and_bench() -> None:
    server, port = await start_grpc_server("127.0.0.1", 0)
    caller = GrpcCaller(pool=2)
    try:
        addr = f"grpc://127.0.0.1:{port}"
        res = await caller(addr, Message(service_path="Hello", service_method="Say",
                                         payload=benchmark_request().SerializeToString()), 5)
        out = BenchmarkMessage.FromString(res.payload)
        assert out.field1 == "OK" and out.field2 == 100 and out.field3 == 100000
        res = await caller(addr, Message(service_path="Hello", service_method="Nope", payload=b""), 5)
        assert res.is_error and "UNIMPLEMENTED" in res.error_text
        r = await bench_target(BenchTarget(addr, "Hello", "Say", SerializeType.PROTOBUF,
                                           benchmark_request().SerializeToString(), pool=2),
                               concurrency=10, total=200)
        assert r.ok == 200 and r.errors == 0
    finally:
        await caller.aclose()
        await server.stop(grace=None)


async def test_grpc_unavailable_is_transport_error() -> None:
    caller = GrpcCaller()
    try:
        with pytest.raises(TransportError):
            await caller(f"grpc://127.0.0.1:{free_port()}", Message(service_path="Hello", service_method="Say"), 5)
    finally:
        await caller.aclose()
