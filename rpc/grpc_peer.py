"""The grpc.aio peer of the benchmark: the same ``Hello.Say`` echo over gRPC.

``juggler rpc bench`` compares our server with grpc.aio doing the same work
in the same run: ``start_grpc_server`` serves ``/Hello/Say`` (decode the
``BenchmarkMessage``, set ``field1 = "OK"``, ``field2 = 100``, encode it
back, like rpcx's benchmark server) and ``GrpcCaller`` is a ``ServerCaller``
over grpc.aio channels, so the same bench engine drives both. No generated
service code: generic handlers on the message classes.

Addresses: ``grpc://host:port``.
"""

from __future__ import annotations

import itertools
from typing import Any

import grpc

from rpc.errors import CallTimeout, TransportError, TransportErrorKind
from rpc.examples import BenchmarkMessage
from rpc.message import Message


def _say(request: BenchmarkMessage, context: Any) -> BenchmarkMessage:
    request.field1 = "OK"
    request.field2 = 100
    return request


async def start_grpc_server(host: str = "127.0.0.1", port: int = 0) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server with ``Hello.Say``; returns (server, bound port)."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    handler = grpc.method_handlers_generic_handler(
        "Hello",
        {
            "Say": grpc.unary_unary_rpc_method_handler(
                _say,
                request_deserializer=BenchmarkMessage.FromString,
                response_serializer=BenchmarkMessage.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    from rustext.net import ListenError

    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # grpcio >= 1.62 raises instead of returning 0
        bound = 0
    if not bound:
        raise ListenError(host, port, "address already in use or not available")
    await server.start()
    return server, bound


def _target(address: str) -> str:
    return address.split("://", 1)[1].rstrip("/") if "://" in address else address


def _identity(data: bytes) -> bytes:
    return data


class GrpcCaller:
    """``ServerCaller`` over grpc.aio: ``pool`` channels per address, used in turn.
    Payloads pass through as bytes (the server does the protobuf work)."""

    def __init__(self, *, pool: int = 1) -> None:
        if pool < 1:
            raise ValueError("pool must be >= 1")
        self.pool = pool
        self._channels: dict[str, list[grpc.aio.Channel]] = {}
        self._next: dict[str, itertools.cycle[int]] = {}
        self._stubs: dict[tuple[str, int, str], Any] = {}

    def _stub(self, address: str, path: str) -> Any:
        chans = self._channels.get(address)
        if chans is None:
            chans = self._channels[address] = [grpc.aio.insecure_channel(_target(address)) for _ in range(self.pool)]
            self._next[address] = itertools.cycle(range(self.pool))
        i = next(self._next[address])
        key = (address, i, path)
        stub = self._stubs.get(key)
        if stub is None:
            stub = self._stubs[key] = chans[i].unary_unary(
                path, request_serializer=_identity, response_deserializer=_identity
            )
        return stub

    async def __call__(self, address: str, request: Message, timeout: float | None) -> Message | None:
        stub = self._stub(address, f"/{request.service_path}/{request.service_method}")
        try:
            payload = await stub(request.payload, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise CallTimeout(f"gRPC deadline exceeded ({address})") from exc
            if code == grpc.StatusCode.UNAVAILABLE:
                raise TransportError(f"gRPC {address} unavailable: {exc.details()}", TransportErrorKind.CONNECT) from exc
            return request.error_reply(f"gRPC {code.name}: {exc.details()}")
        return None if request.oneway else request.reply(payload)

    async def aclose(self) -> None:
        channels, self._channels = self._channels, {}
        self._stubs.clear()
        for chans in channels.values():
            for ch in chans:
                await ch.close()
