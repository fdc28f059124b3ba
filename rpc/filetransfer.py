"""File transfer as rpcx v1.9.1 does it: ``_filetransfer.TransferFile`` /
``DownloadFile`` answer a token, the bytes go over a side listener
(``rpc.sidechannel`` has the wire).

Server (Go: ``server.NewFileTransfer`` + ``Server.EnableFileTransfer``)::

    ft = FileTransfer("0.0.0.0:8973", on_upload=store, on_download=load)
    ft.register(server)                 # the _filetransfer service; Server.shutdown closes the listener
    await ft.start()                    # `juggler rpc serve` starts it itself
    # or: FileTransfer.for_directory("/srv/files", "0.0.0.0:8973")

    async def store(args: FileTransferArgs, data: IncomingFile) -> None:
        async for chunk in data: ...    # raises TransferTruncated if fewer than args.file_size bytes come

    async def load(args: DownloadFileArgs) -> AsyncIterator[bytes]:
        yield b"..."

An upload ends with the client's half-close; the server says "stored" by
closing the connection, "failed" by resetting it (which ``send_file`` reports;
a Go client does not wait for either). A download ends when the server
closes; a failed one is reset, so the client sees an error and not a short
file.

Client (Go: ``XClient.SendFile`` / ``DownloadFile``): ``Client.send_file``,
``Client.download_file``, ``Client.open_download`` and the same on XClient,
built on ``send_file`` / ``open_download`` here.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import secrets
import time
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rpc.errors import RpcError, ServiceError
from rpc.message import SerializeType
from rpc.service import Context
from rpc.sidechannel import (
    CHUNK,
    ByteStream,
    Call,
    SideChannelConfig,
    SideListener,
    TransferError,
    TransferTruncated,
    args_field,
    await_close,
    check_codec,
    connect,
    decode_reply,
    encode_reply,
    meta_of,
)

#: rpcx's ``share.SendFileServiceName``
SEND_FILE_SERVICE = "_filetransfer"


@dataclass(kw_only=True)
class FileTransferArgs:
    """``share.FileTransferArgs``: what a client announces before an upload.
    ``file_size`` 0 means unknown (Go's JSON omits a zero size)."""

    file_name: str
    file_size: int = 0
    meta: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, args: Any) -> FileTransferArgs:
        size = args_field(args, "FileSize", "file_size", 0)
        if not isinstance(size, int) or size < 0:
            raise RpcError(f"file size must be a non-negative integer, got {size!r}")
        return cls(file_name=str(args_field(args, "FileName", "file_name", "")), file_size=size,
                   meta=meta_of(args))

    def to_wire(self, serialize_type: int) -> dict[str, Any]:
        if serialize_type == SerializeType.MSGPACK:  # Go's msgpack: field names, every field
            return {"FileName": self.file_name, "FileSize": self.file_size, "Meta": self.meta or None}
        wire: dict[str, Any] = {"file_name": self.file_name}  # Go's JSON tags, omitempty
        if self.file_size:
            wire["file_size"] = self.file_size
        if self.meta:
            wire["meta"] = self.meta
        return wire


@dataclass(kw_only=True)
class DownloadFileArgs:
    """``share.DownloadFileArgs``: the file a client asks for."""

    file_name: str
    meta: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, args: Any) -> DownloadFileArgs:
        return cls(file_name=str(args_field(args, "FileName", "file_name", "")), meta=meta_of(args))

    def to_wire(self, serialize_type: int) -> dict[str, Any]:
        if serialize_type == SerializeType.MSGPACK:
            return {"FileName": self.file_name, "Meta": self.meta or None}
        wire: dict[str, Any] = {"file_name": self.file_name}
        if self.meta:
            wire["meta"] = self.meta
        return wire


class IncomingFile:
    """The bytes of an upload, in chunks of at most ``CHUNK`` (reading is
    paused while the handler is busy: memory stays bounded). With an
    announced size, the end of the connection before that many bytes raises
    ``TransferTruncated`` and more bytes than that raise ``TransferError``."""

    def __init__(self, stream: ByteStream, size: int) -> None:
        self._stream = stream
        self.size = size

    @property
    def received(self) -> int:
        return self._stream.received

    async def read(self, n: int = CHUNK) -> bytes:
        """Up to ``n`` bytes, ``b""`` at the (complete) end."""
        data = await self._stream.read(n)
        got = self._stream.received
        if self.size:
            if not data and got < self.size:
                raise TransferTruncated(f"the upload ended after {got} of {self.size} bytes")
            if got > self.size:
                raise TransferError(f"the upload is longer than the {self.size} bytes announced")
        return data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while data := await self.read():
            yield data


UploadHandler = Callable[[FileTransferArgs, IncomingFile], Awaitable[None]]
DownloadHandler = Callable[[DownloadFileArgs], AsyncIterator[bytes]]
#: called in the rpcx call, before a token is issued; False refuses it
Acceptor = Callable[[Context, "FileTransferArgs | DownloadFileArgs"], "bool | Awaitable[bool]"]


class FileTransferService:
    """The ``_filetransfer`` rpcx service of a ``FileTransfer``."""

    def __init__(self, transfer: FileTransfer) -> None:
        self._ft = transfer

    async def TransferFile(self, ctx: Context, args: Any) -> dict[str, Any]:
        parsed = FileTransferArgs.from_wire(args)
        if self._ft.on_upload is None:
            raise ServiceError("this server does not accept uploads")
        return await self._ft._issue(ctx, ("upload", parsed))

    async def DownloadFile(self, ctx: Context, args: Any) -> dict[str, Any]:
        parsed = DownloadFileArgs.from_wire(args)
        if self._ft.on_download is None:
            raise ServiceError("this server does not serve downloads")
        return await self._ft._issue(ctx, ("download", parsed))


class FileTransfer:
    """Uploads and downloads over a side listener on ``listen`` (``host:port``;
    port 0 picks one). ``advertise`` is the ``host:port`` put in replies
    (default: the bound address, a wildcard host replaced by the address the
    client reached the rpcx server at). ``acceptor`` may refuse a transfer
    before its token is issued (the call then fails with its reason when it
    raises ``ServiceError``, with rpcx's "server refused the connection" when
    it returns False)."""

    def __init__(self, listen: str = "127.0.0.1:0", *, on_upload: UploadHandler | None = None,
                 on_download: DownloadHandler | None = None, acceptor: Acceptor | None = None,
                 advertise: str | None = None, config: SideChannelConfig | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.on_upload = on_upload
        self.on_download = on_download
        self.acceptor = acceptor
        self.listener = SideListener(listen, self._serve, advertise=advertise, config=config,
                                     name="file transfer", now=now)
        self.service = FileTransferService(self)

    @classmethod
    def for_directory(cls, root: str | os.PathLike[str], listen: str = "127.0.0.1:0", **kwargs: Any) -> FileTransfer:
        """Uploads stored in ``root`` under their file name, downloads read from it."""
        files = DirectoryFiles(root)
        return cls(listen, on_upload=files.receive, on_download=files.send, acceptor=files.accept, **kwargs)

    def register(self, server: Any, name: str = SEND_FILE_SERVICE) -> None:
        """Register the service on ``server`` (an ``rpc.server.Server``) and
        attach the listener to its lifecycle (rpcx's ``EnableFileTransfer``)."""
        server.register(self.service, name)
        server.attach(self.listener)

    async def start(self) -> str:
        return await self.listener.start()

    async def aclose(self) -> None:
        await self.listener.aclose()

    async def _issue(self, ctx: Context, value: tuple[str, Any]) -> dict[str, Any]:
        if self.acceptor is not None:
            ok = self.acceptor(ctx, value[1])
            if inspect.isawaitable(ok):
                ok = await ok
            if not ok:
                raise ServiceError("server refused the connection")
        local = ctx.peer.local_address if ctx.peer is not None else ""
        host = local.rpartition(":")[0].strip("[]") if local else ""
        token, addr = self.listener.issue(value, host)
        return encode_reply(token, addr, ctx.serialize_type)

    async def _serve(self, value: tuple[str, Any], stream: ByteStream) -> None:
        kind, args = value
        if kind == "upload":
            assert self.on_upload is not None
            await self.on_upload(args, IncomingFile(stream, args.file_size))
            return
        assert self.on_download is not None
        async for chunk in self.on_download(args):
            await stream.write(chunk)


def _plain_name(name: str) -> str:
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ServiceError(f"file name must be a plain name without a directory, got {name!r}")
    return name


class DirectoryFiles:
    """Files in one directory: uploads stored under their name (written to a
    temporary name, renamed when complete: a truncated upload leaves
    nothing), downloads read from it. Names with a directory part are
    refused at the call."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ValueError(f"{self.root} is not a directory")

    def accept(self, ctx: Context, args: FileTransferArgs | DownloadFileArgs) -> bool:
        name = _plain_name(args.file_name)
        if isinstance(args, DownloadFileArgs) and not (self.root / name).is_file():
            raise ServiceError(f"no file {name!r} on this server")
        return True

    async def receive(self, args: FileTransferArgs, data: IncomingFile) -> None:
        name = _plain_name(args.file_name)
        partial = self.root / f".{name}.{secrets.token_hex(4)}.partial"
        f = await asyncio.to_thread(open, partial, "wb")
        try:
            async for chunk in data:
                await asyncio.to_thread(f.write, chunk)
            await asyncio.to_thread(f.close)
            await asyncio.to_thread(os.replace, partial, self.root / name)
        except BaseException:
            f.close()
            partial.unlink(missing_ok=True)
            raise

    async def send(self, args: DownloadFileArgs) -> AsyncIterator[bytes]:
        f = await asyncio.to_thread(open, self.root / _plain_name(args.file_name), "rb")
        try:
            while chunk := await asyncio.to_thread(f.read, CHUNK):
                yield chunk
        finally:
            f.close()


# -- client side -------------------------------------------------------------------------------

Source = str | os.PathLike[str] | AsyncIterable[bytes] | Iterable[bytes]


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    f = await asyncio.to_thread(open, path, "rb")
    try:
        while chunk := await asyncio.to_thread(f.read, CHUNK):
            yield chunk
    finally:
        f.close()


async def _as_async(source: AsyncIterable[bytes] | Iterable[bytes]) -> AsyncIterator[bytes]:
    if isinstance(source, AsyncIterable):
        async for chunk in source:
            yield chunk
    else:
        for chunk in source:
            yield chunk


async def send_file(call: Call, source: Source, *, serialize_type: int, server_address: str | None = None,
                    name: str | None = None, size: int | None = None, meta: Mapping[str, str] | None = None,
                    rate: float | None = None, timeout: float | None = None,
                    connect_timeout: float = 10.0, linger: float = 30.0) -> int:
    """Upload ``source`` (a path, or chunks with ``name`` and, for the
    server's truncation check, ``size``); returns the bytes sent.

    ``rate`` limits bytes per second; ``timeout`` bounds the whole upload
    (None: none); after the last byte the server has ``linger`` seconds to
    close (stored) or reset (failed, or a refused token: ``TransferError``)."""
    check_codec(serialize_type)
    if rate is not None and rate <= 0:
        raise ValueError("rate must be > 0 bytes per second or None")
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        st = await asyncio.to_thread(path.stat)
        name = name or path.name
        size = st.st_size if size is None else size
        chunks: AsyncIterator[bytes] = _file_chunks(path)
    else:
        if not name:
            raise ValueError("name= is needed when the source is not a file path")
        chunks = _as_async(source)
    args = FileTransferArgs(file_name=name, file_size=size or 0, meta=dict(meta or {}))
    async with asyncio.timeout(timeout):
        token, addr = decode_reply(await call("TransferFile", args.to_wire(serialize_type)))
        stream = await connect(token, addr, server_address, connect_timeout=connect_timeout)
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            async for chunk in chunks:
                await stream.write(chunk)
                if rate is not None:
                    ahead = stream.sent / rate - (loop.time() - started)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
            await stream.write_eof()
            await await_close(stream, linger)
        except BaseException:
            stream.abort()
            raise
        finally:
            if hasattr(chunks, "aclose"):
                await chunks.aclose()
        await stream.aclose()
        return stream.sent


async def open_download(call: Call, name: str, *, serialize_type: int, server_address: str | None = None,
                        meta: Mapping[str, str] | None = None, connect_timeout: float = 10.0) -> ByteStream:
    """Ask for ``name`` and return the connection its bytes come on
    (iterate it; the end of the iteration is the end of the file, a reset
    raises ``TransferError``). Close it with ``aclose``."""
    check_codec(serialize_type)
    args = DownloadFileArgs(file_name=name, meta=dict(meta or {}))
    token, addr = decode_reply(await call("DownloadFile", args.to_wire(serialize_type)))
    return await connect(token, addr, server_address, connect_timeout=connect_timeout)


async def download_file(call: Call, name: str, dest: str | os.PathLike[str] | IO[bytes], *, serialize_type: int,
                        server_address: str | None = None, meta: Mapping[str, str] | None = None,
                        timeout: float | None = None, connect_timeout: float = 10.0) -> int:
    """Download ``name`` into ``dest`` (a path, written whole or not at all,
    or a binary file object); returns the bytes received. A reset from the
    server (its handler failed, the token was refused) raises
    ``TransferError``."""
    async with asyncio.timeout(timeout):
        stream = await open_download(call, name, serialize_type=serialize_type, server_address=server_address,
                                     meta=meta, connect_timeout=connect_timeout)
        async with stream:
            if not isinstance(dest, (str, os.PathLike)):
                async for chunk in stream:
                    await asyncio.to_thread(dest.write, chunk)
                return stream.received
            target = Path(dest)
            partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
            f = await asyncio.to_thread(open, partial, "wb")
            try:
                async for chunk in stream:
                    await asyncio.to_thread(f.write, chunk)
                await asyncio.to_thread(f.close)
                await asyncio.to_thread(os.replace, partial, target)
            except BaseException:
                f.close()
                partial.unlink(missing_ok=True)
                raise
            return stream.received


__all__ = [
    "SEND_FILE_SERVICE",
    "DirectoryFiles",
    "DownloadFileArgs",
    "FileTransfer",
    "FileTransferArgs",
    "FileTransferService",
    "IncomingFile",
    "download_file",
    "open_download",
    "send_file",
]
