"""Served by `juggler rpc serve --app tests.rpc.stream_app:...` in the
stream interop tests: rpcx's stream service echoing what each stream sends
(``setup``), a download that fails half way (``setup_failing_download``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from rpc.filetransfer import DownloadFileArgs, FileTransfer
from rpc.server import Server
from rpc.sidechannel import ByteStream
from rpc.streams import StreamService, StreamServiceArgs


async def echo(args: StreamServiceArgs, conn: ByteStream) -> None:
    async for chunk in conn:  # until the client half-closes; writes wait while the client is slow
        await conn.write(chunk)


def setup(server: Server) -> None:
    StreamService("127.0.0.1:0", echo).register(server)


async def half_then_fail(args: DownloadFileArgs) -> AsyncIterator[bytes]:
    yield b"x" * (1 << 20)
    raise OSError("the disk went away")


def setup_failing_download(server: Server) -> None:
    """A download handler that fails after 1 MiB: the client must see an error."""
    FileTransfer(on_download=half_then_fail).register(server)
