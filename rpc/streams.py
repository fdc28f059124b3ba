"""Streams as rpcx v1.9.1 does them: ``_streamservice.Stream`` answers a
token, then client and server share a raw TCP connection (``rpc.sidechannel``
has the wire).

Server (Go: ``server.NewStreamService`` + ``Server.EnableStreamService``)::

    async def echo(args: StreamServiceArgs, conn: ByteStream) -> None:
        async for chunk in conn:        # until the client half-closes
            await conn.write(chunk)     # waits while the client is slow

    streams = StreamService("0.0.0.0:8974", echo)
    streams.register(server)            # the _streamservice service; Server.shutdown closes the listener
    await streams.start()               # `juggler rpc serve` starts it itself

When the handler returns the connection is closed; when it raises, reset.
``acceptor(ctx, args)`` may refuse a stream before a token is issued (the
call fails with rpcx's "server refused the connection").

Client (Go: ``XClient.Stream``): ``Client.open_stream`` / ``XClient.open_stream``
return a ``ByteStream``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rpc.errors import ServiceError
from rpc.message import SerializeType
from rpc.service import Context
from rpc.sidechannel import (
    ByteStream,
    Call,
    SideChannelConfig,
    SideListener,
    check_codec,
    connect,
    decode_reply,
    encode_reply,
    meta_of,
)

#: rpcx's ``share.StreamServiceName``
STREAM_SERVICE = "_streamservice"


@dataclass(kw_only=True)
class StreamServiceArgs:
    """``share.StreamServiceArgs``: the metadata a client opens a stream with."""

    meta: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, args: Any) -> StreamServiceArgs:
        return cls(meta=meta_of(args))

    def to_wire(self, serialize_type: int) -> dict[str, Any]:
        if serialize_type == SerializeType.MSGPACK:
            return {"Meta": self.meta or None}
        return {"meta": self.meta} if self.meta else {}


StreamHandler = Callable[[StreamServiceArgs, ByteStream], Awaitable[None]]
StreamAcceptor = Callable[[Context, StreamServiceArgs], "bool | Awaitable[bool]"]


class StreamServiceHandlers:
    """The ``_streamservice`` rpcx service of a ``StreamService``."""

    def __init__(self, streams: StreamService) -> None:
        self._streams = streams

    async def Stream(self, ctx: Context, args: Any) -> dict[str, Any]:
        s = self._streams
        parsed = StreamServiceArgs.from_wire(args)
        if s.acceptor is not None:
            ok = s.acceptor(ctx, parsed)
            if inspect.isawaitable(ok):
                ok = await ok
            if not ok:
                raise ServiceError("server refused the connection")
        local = ctx.peer.local_address if ctx.peer is not None else ""
        token, addr = s.listener.issue(parsed, local.rpartition(":")[0].strip("[]") if local else "")
        return encode_reply(token, addr, ctx.serialize_type)


class StreamService:
    """Streams served by ``handler`` over a side listener on ``listen``
    (``host:port``; port 0 picks one); ``advertise`` as in ``FileTransfer``."""

    def __init__(self, listen: str, handler: StreamHandler, *, acceptor: StreamAcceptor | None = None,
                 advertise: str | None = None, config: SideChannelConfig | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.handler = handler
        self.acceptor = acceptor
        self.listener = SideListener(listen, self._serve, advertise=advertise, config=config, name="stream",
                                     now=now)
        self.service = StreamServiceHandlers(self)

    def register(self, server: Any, name: str = STREAM_SERVICE) -> None:
        """Register the service on ``server`` (an ``rpc.server.Server``) and
        attach the listener to its lifecycle (rpcx's ``EnableStreamService``)."""
        server.register(self.service, name)
        server.attach(self.listener)

    async def start(self) -> str:
        return await self.listener.start()

    async def aclose(self) -> None:
        await self.listener.aclose()

    async def _serve(self, args: StreamServiceArgs, stream: ByteStream) -> None:
        await self.handler(args, stream)


async def open_stream(call: Call, *, serialize_type: int, server_address: str | None = None,
                      meta: Mapping[str, str] | None = None, connect_timeout: float = 10.0) -> ByteStream:
    """Call ``Stream`` and return the connection (``write_eof`` to end what
    you send; iterate for what comes back; ``aclose`` when done)."""
    check_codec(serialize_type)
    args = StreamServiceArgs(meta=dict(meta or {}))
    token, addr = decode_reply(await call("Stream", args.to_wire(serialize_type)))
    return await connect(token, addr, server_address, connect_timeout=connect_timeout)


__all__ = ["STREAM_SERVICE", "StreamHandler", "StreamService", "StreamServiceArgs", "open_stream"]
