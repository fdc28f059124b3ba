"""rpcx file transfer and streams (rpc.sidechannel, rpc.filetransfer,
rpc.streams) between our server and our client over real sockets: round
trips in both codecs, and the hostile cases (bad, expired and reused tokens,
truncated and broken transfers, a silent client, shutdown with a transfer
running)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rpc.client import Client
from rpc.errors import ServiceError
from rpc.filetransfer import (
    DirectoryFiles,
    DownloadFileArgs,
    FileTransfer,
    FileTransferArgs,
    IncomingFile,
)
from rpc.message import SerializeType
from rpc.rpcx_client import RpcxCaller
from rpc.rpcx_server import RpcxServer
from rpc.server import Server
from rpc.sidechannel import (
    TOKEN_SIZE,
    ByteStream,
    SideChannelConfig,
    TokenStore,
    TransferError,
    TransferTruncated,
    await_close,
    connect,
    decode_reply,
)
from rpc.streams import StreamService, StreamServiceArgs
from tests.netutil import wait_until
from tests.rpc.pattern import pattern, pattern_sha256

pytestmark = pytest.mark.timeout(60)


@dataclass
class Node:
    server: Server
    rpcx: RpcxServer
    ft: FileTransfer
    streams: StreamService
    root: Path
    client: Client
    clock: list[float]
    #: what each upload handler run ended with: None (stored) or the exception
    uploads: asyncio.Queue[BaseException | None] = field(default_factory=asyncio.Queue)
    stream_args: list[StreamServiceArgs] = field(default_factory=list)

    @property
    def stored(self) -> list[str]:
        return sorted(os.listdir(self.root))


async def echo(args: StreamServiceArgs, conn: ByteStream) -> None:
    async for chunk in conn:
        await conn.write(chunk)


@pytest.fixture(params=[SerializeType.MSGPACK, SerializeType.JSON], ids=["msgpack", "json"])
async def node(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Node]:
    clock = [0.0]
    files = DirectoryFiles(tmp_path)
    config = SideChannelConfig(token_ttl=30, token_timeout=0.5, drain_timeout=0.5)
    server = Server()
    uploads: asyncio.Queue[BaseException | None] = asyncio.Queue()

    async def receive(args: FileTransferArgs, data: IncomingFile) -> None:
        try:
            await files.receive(args, data)
        except BaseException as exc:
            uploads.put_nowait(exc)
            raise
        uploads.put_nowait(None)

    async def refuse_secret(ctx: object, args: FileTransferArgs | DownloadFileArgs) -> bool:
        return args.file_name != "secret" and files.accept(ctx, args)  # type: ignore[arg-type]

    ft = FileTransfer(on_upload=receive, on_download=files.send, acceptor=refuse_secret, config=config,
                      now=lambda: clock[0])
    ft.register(server)
    stream_args: list[StreamServiceArgs] = []

    async def record_and_echo(args: StreamServiceArgs, conn: ByteStream) -> None:
        stream_args.append(args)
        await echo(args, conn)

    streams = StreamService("127.0.0.1:0", record_and_echo, config=config,
                            acceptor=lambda ctx, args: args.meta.get("who") != "mallory")
    streams.register(server)
    rpcx = RpcxServer(server, "tcp://127.0.0.1:0")
    await rpcx.start()
    for side in server.attached:
        await side.start()
    client = Client(rpcx.address, RpcxCaller(), serialize_type=request.param, close_caller=True, timeout=5)
    n = Node(server, rpcx, ft, streams, tmp_path, client, clock, uploads, stream_args)
    try:
        yield n
    finally:
        await client.aclose()
        await server.shutdown(rpcx, timeout=2)


async def _token(node: Node, method: str = "TransferFile", args: object = None) -> tuple[bytes, str]:
    if args is None:
        args = FileTransferArgs(file_name="f.bin", file_size=10).to_wire(node.client.serialize_type)
    reply = await node.client.call("_filetransfer", method, args)
    return decode_reply(reply)


async def _reset_by_server(stream: ByteStream) -> bool:
    """True when the server resets the connection, False on a clean end."""
    try:
        async with asyncio.timeout(5):
            while await stream.reader.read(1 << 16):
                pass
    except ConnectionResetError:
        return True
    finally:
        stream.abort()
    return False


# -- round trips ---------------------------------------------------------------------------------


async def test_upload_download_and_stream_round_trip(node: Node) -> None:
    size = 8 << 20
    want = pattern_sha256(size)
    sent = await node.client.send_file(pattern(size), name="data.bin", size=size, meta={"k": "v"})
    assert sent == size
    assert await node.uploads.get() is None  # send_file returned after the server stored it
    assert node.stored == ["data.bin"]

    h = hashlib.sha256()
    async with await node.client.open_download("data.bin") as down:
        async for chunk in down:
            h.update(chunk)
    assert h.hexdigest() == want and down.received == size

    copy = node.root / "copy.bin"
    assert await node.client.download_file("data.bin", copy) == size
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == want

    conn = await node.client.open_stream(meta={"who": "alice"})

    async def write() -> None:
        for chunk in pattern(size):
            await conn.write(chunk)
        await conn.write_eof()

    writer = asyncio.create_task(write())
    back = hashlib.sha256()
    async for chunk in conn:
        back.update(chunk)
    await writer
    await conn.aclose()
    assert back.hexdigest() == want
    assert node.stream_args == [StreamServiceArgs(meta={"who": "alice"})]


async def test_send_file_from_a_path_announces_its_name_and_size(node: Node, tmp_path_factory: pytest.TempPathFactory) -> None:
    src = tmp_path_factory.mktemp("src") / "from-disk.txt"
    src.write_bytes(b"hello " * 1000)
    assert await node.client.send_file(src) == 6000
    assert await node.uploads.get() is None
    assert (node.root / "from-disk.txt").read_bytes() == b"hello " * 1000


async def test_send_file_keeps_to_its_rate(node: Node) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    await node.client.send_file(pattern(512 << 10), name="slow.bin", size=512 << 10, rate=2 << 20)
    assert loop.time() - started >= 0.24  # 512 KiB at 2 MiB/s: the last chunk waits until 0.25 s
    assert await node.uploads.get() is None


# -- refusals at the call -------------------------------------------------------------------------


async def test_acceptors_and_bad_names_refuse_at_the_call(node: Node) -> None:
    with pytest.raises(ServiceError, match="server refused the connection"):
        await node.client.send_file([b"x"], name="secret")
    with pytest.raises(ServiceError, match="plain name"):
        await node.client.send_file([b"x"], name="../escape")
    with pytest.raises(ServiceError, match="no file 'missing'"):
        await node.client.open_download("missing")
    with pytest.raises(ServiceError, match="server refused the connection"):
        await node.client.open_stream(meta={"who": "mallory"})
    assert node.stored == [] and len(node.ft.listener.tokens) == 0


# -- tokens -----------------------------------------------------------------------------------------


async def test_a_bad_token_is_reset_and_runs_no_handler(node: Node) -> None:
    _, addr = await _token(node)
    stream = await connect(os.urandom(TOKEN_SIZE), addr)
    await stream.write(b"0123456789")
    assert await _reset_by_server(stream)
    bad = await connect(os.urandom(TOKEN_SIZE), addr)
    await bad.write_eof()
    with pytest.raises(TransferError, match="the server reset the connection"):
        await await_close(bad, 5)
    assert node.uploads.empty() and node.stored == []


async def test_an_expired_token_is_refused(node: Node) -> None:
    token, addr = await _token(node)
    node.clock[0] += 31  # past token_ttl
    stream = await connect(token, addr)
    await stream.write(b"0123456789")
    assert await _reset_by_server(stream)
    assert node.uploads.empty() and node.stored == []
    assert len(node.ft.listener.tokens) == 0  # expired tokens are forgotten


async def test_a_token_works_once(node: Node) -> None:
    token, addr = await _token(node)
    first = await connect(token, addr)
    await first.write(b"0123456789")
    await first.write_eof()
    assert not await _reset_by_server(first)  # a clean close: stored
    assert await node.uploads.get() is None and node.stored == ["f.bin"]
    again = await connect(token, addr)
    await again.write(b"0123456789")
    assert await _reset_by_server(again)
    assert node.uploads.empty()


async def test_the_oldest_pending_token_is_dropped_past_capacity() -> None:
    store = TokenStore(ttl=10, capacity=2, now=lambda: 0.0)
    a, b, c = store.issue("a"), store.issue("b"), store.issue("c")
    assert len(a) == TOKEN_SIZE and len({a, b, c}) == 3
    assert store.take(a) is None and store.take(c) == "c" and store.take(b) == "b" and store.take(b) is None


async def test_a_client_that_sends_no_token_is_dropped(node: Node) -> None:
    host, _, port = node.ft.listener.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"short")  # not a whole token, then silence
    assert await _reset_by_server(ByteStream(reader, writer))  # after token_timeout (0.5 s)


# -- broken transfers --------------------------------------------------------------------------------


async def test_a_truncated_upload_is_reported_and_leaves_nothing(node: Node) -> None:
    with pytest.raises(TransferError, match="the server reset the connection"):
        await node.client.send_file(pattern(100_000), name="short.bin", size=1 << 20)
    assert isinstance(await node.uploads.get(), TransferTruncated)
    assert node.stored == []


async def test_an_upload_longer_than_announced_is_refused(node: Node) -> None:
    with pytest.raises(TransferError):
        await node.client.send_file(pattern(200_000), name="long.bin", size=100_000)
    exc = await node.uploads.get()
    assert isinstance(exc, TransferError) and "longer than" in str(exc)
    assert node.stored == []


async def test_a_connection_closed_mid_upload_leaves_nothing(node: Node) -> None:
    token, addr = await _token(node, args=FileTransferArgs(file_name="mid.bin", file_size=10 << 20).to_wire(
        node.client.serialize_type))
    stream = await connect(token, addr)
    for chunk in pattern(1 << 20):
        await stream.write(chunk)
    stream.abort()
    assert isinstance(await node.uploads.get(), TransferError)
    assert node.stored == []


async def test_a_failing_download_handler_resets_the_client(node: Node) -> None:
    async def failing(args: DownloadFileArgs) -> AsyncIterator[bytes]:
        yield b"x" * 100_000
        raise OSError("disk gone")

    node.ft.on_download = failing
    node.ft.acceptor = None
    target = node.root / "never.bin"
    with pytest.raises(TransferError, match="the server reset the connection"):
        await node.client.download_file("any", target)
    assert not target.exists() and node.stored == []


# -- lifecycle -------------------------------------------------------------------------------------


async def test_shutdown_closes_the_port_and_resets_a_stalled_stream(node: Node) -> None:
    conn = await node.client.open_stream()
    await conn.write(b"ping")
    assert await conn.reader.readexactly(4) == b"ping"  # the handler runs
    host, _, port = node.streams.listener.address.rpartition(":")
    await node.server.shutdown(node.rpcx, timeout=1)
    assert node.streams.listener.active == 0  # the stalled stream was reset after drain_timeout
    assert await _reset_by_server(conn)
    with pytest.raises(OSError):
        await asyncio.open_connection(host, int(port))
    with pytest.raises(Exception, match="not running"):
        node.ft.listener.issue(("upload", None))


def test_rpc_serve_file_transfer_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from cli.rpc_serve import main

    assert main(["--listen", "127.0.0.1:0", "--example", "arith", "--file-transfer", str(tmp_path / "no")]) == 2
    assert "--file-transfer: " in capsys.readouterr().err
    assert main(["--listen", "127.0.0.1:0", "--example", "arith", "--file-transfer-listen", "127.0.0.1:0"]) == 2
    assert "--file-transfer-listen needs --file-transfer DIR" in capsys.readouterr().err


async def test_a_client_leaving_mid_download_frees_the_server(node: Node) -> None:
    await node.client.send_file(pattern(16 << 20), name="big.bin", size=16 << 20)
    assert await node.uploads.get() is None
    down = await node.client.open_download("big.bin")
    assert await down.read()  # the download runs
    assert node.ft.listener.active == 1
    down.abort()
    await wait_until(lambda: node.ft.listener.active == 0, 5, what="the server's download ended")
