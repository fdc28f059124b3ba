"""Served by `juggler rpc serve --app tests.rpc.stream_app:setup` in the
stream interop tests: rpcx's stream service, echoing what each stream sends."""

from __future__ import annotations

from rpc.server import Server
from rpc.sidechannel import ByteStream
from rpc.streams import StreamService, StreamServiceArgs


async def echo(args: StreamServiceArgs, conn: ByteStream) -> None:
    async for chunk in conn:  # until the client half-closes; writes wait while the client is slow
        await conn.write(chunk)


def setup(server: Server) -> None:
    StreamService("127.0.0.1:0", echo).register(server)
