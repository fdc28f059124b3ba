"""rpcx file transfer and streams against Go rpcx v1.9.1
(``tests/rpc/interop/go-stream``, built here): a Go client sends, downloads
and streams 200 MiB through `juggler rpc serve`, and our client sends to,
downloads from and streams through a Go server; sha256 checked at both ends.
Data is generated in pieces on both sides (``tests.rpc.pattern``), never held
whole. Without ``go`` the tests skip on a developer's machine and fail in CI."""

from __future__ import annotations

import asyncio
import hashlib
import os
import selectors
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rpc.client import Client
from rpc.discovery.base import StaticDiscovery
from rpc.message import SerializeType
from rpc.rpcx_client import RpcxCaller
from rpc.xclient import XClient, XClientOptions
from tests.netutil import free_port, wait_until
from tests.rpc.gopeer import build_go_peer
from tests.rpc.pattern import file_sha256, pattern, pattern_sha256
from tests.rpc.test_rpcx_e2e import serve

pytestmark = pytest.mark.timeout(120)

BIG = 200 << 20


@pytest.fixture(scope="module")
def go_peer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_peer(tmp_path_factory, "go-stream", "the rpcx stream interop peer")


def _go(peer: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    res = subprocess.run([str(peer), *args], check=False, capture_output=True, text=True, timeout=90,
                         env={**os.environ, **(env or {})})
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def _peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc")


def test_go_client_sends_downloads_and_streams_200_mib_through_our_server(go_peer: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    ours = serve("--app", "tests.rpc.stream_app:setup", "--file-transfer", str(store))
    addr = ours.address.removeprefix("tcp@")
    want = pattern_sha256(BIG)
    try:
        before = _peak_rss_mib(ours.proc.pid)
        assert _go(go_peer, "send", addr, str(tmp_path / "big.bin"), str(BIG)) == ["sent", want]
        # Go's SendFile returns once it wrote the last byte; the file appears when stored
        asyncio.run(wait_until(lambda: (store / "big.bin").exists(), 30, what="the upload stored"))
        assert file_sha256(str(store / "big.bin")) == want
        assert _go(go_peer, "download", addr, "big.bin") == ["received", want, str(BIG)]
        assert _go(go_peer, "stream", addr, str(BIG)) == ["sent", want, "received", want, str(BIG)]
        # the server never held a transfer whole: 600 MiB went through it
        peak = _peak_rss_mib(ours.proc.pid)
        assert peak - before < 64, f"the server's peak RSS grew by {peak - before:.0f} MiB"
    finally:
        ours.stop()


def test_go_client_with_json_and_a_missing_file(go_peer: Path, tmp_path: Path) -> None:
    """Go's JSON spelling of the share types (``file_name``, a base64 token);
    a download of a missing file fails the Go call with our server's reason."""
    store = tmp_path / "store"
    store.mkdir()
    ours = serve("--example", "arith", "--file-transfer", str(store))
    addr = ours.address.removeprefix("tcp@")
    json = {"SERIALIZE": "json"}
    try:
        want = pattern_sha256(3 << 20)
        assert _go(go_peer, "send", addr, str(tmp_path / "small.bin"), str(3 << 20), env=json) == ["sent", want]
        asyncio.run(wait_until(lambda: (store / "small.bin").exists(), 30, what="the upload stored"))
        assert _go(go_peer, "download", addr, "small.bin", env=json) == ["received", want, str(3 << 20)]
        res = subprocess.run([str(go_peer), "download", addr, "missing.bin"], check=False, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 1 and "no file 'missing.bin' on this server" in res.stderr
    finally:
        ours.stop()


def test_a_failed_download_is_an_error_for_a_go_client(go_peer: Path) -> None:
    """Our server resets a download whose handler fails, so Go's DownloadFile
    returns an error instead of a short file."""
    ours = serve("--app", "tests.rpc.stream_app:setup_failing_download")
    try:
        res = subprocess.run([str(go_peer), "download", ours.address.removeprefix("tcp@"), "any.bin"],
                             check=False, capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and "connection reset by peer" in res.stderr, res.stderr
    finally:
        ours.stop()


@pytest.fixture
def go_server(go_peer: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    store = tmp_path / "go-store"
    store.mkdir()
    port, ft_port, stream_port = free_port(), free_port(), free_port()
    proc = subprocess.Popen([str(go_peer), "server", f"127.0.0.1:{port}", f"127.0.0.1:{ft_port}",
                             f"127.0.0.1:{stream_port}", str(store)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        assert sel.select(timeout=30), "the Go server did not start"
        assert proc.stdout.readline().startswith("ready"), "the Go server did not start"
        yield f"tcp@127.0.0.1:{port}", store
    finally:
        sel.close()
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.mark.parametrize("codec", [SerializeType.MSGPACK, SerializeType.JSON], ids=["msgpack", "json"])
async def test_our_client_sends_to_and_downloads_from_a_go_server(go_server: tuple[str, Path],
                                                                 codec: SerializeType) -> None:
    address, store = go_server
    size = 20 << 20
    want = pattern_sha256(size)
    async with Client(address, RpcxCaller(), serialize_type=codec, close_caller=True, timeout=10) as client:
        # a Go upload handler closes the connection when it stored the file: send_file returns then
        assert await client.send_file(pattern(size), name="ours.bin", size=size, timeout=60) == size
        assert file_sha256(str(store / "ours.bin")) == want
        h = hashlib.sha256()
        async with await client.open_download("ours.bin") as down:
            async for chunk in down:
                h.update(chunk)
        assert h.hexdigest() == want and down.received == size


async def test_our_xclient_streams_200_mib_through_a_go_server(go_server: tuple[str, Path]) -> None:
    address, _ = go_server
    want = pattern_sha256(BIG)
    caller = RpcxCaller()
    xc = XClient("_streamservice", StaticDiscovery([address]), caller,
                 options=XClientOptions(serialize_type=SerializeType.MSGPACK, timeout=10))
    try:
        async with xc:
            conn = await xc.open_stream(meta={"from": "python"})

            async def write() -> None:
                for chunk in pattern(BIG):
                    await conn.write(chunk)
                await conn.write_eof()

            writer = asyncio.create_task(write())
            back = hashlib.sha256()
            async with asyncio.timeout(60):
                async for chunk in conn:
                    back.update(chunk)
                await writer
            await conn.aclose()
        assert back.hexdigest() == want and conn.received == BIG and conn.sent == BIG
    finally:
        await caller.aclose()


@pytest.mark.parametrize("serialize", ["msgpack", "json"])
async def test_go_clients_arguments_reach_our_handlers(go_peer: Path, tmp_path: Path, serialize: str) -> None:
    """Go's ``share`` structs, in both codecs, decode to our args: file name,
    size and meta of ``SendFile``, meta of ``Stream``."""
    from rpc.filetransfer import FileTransfer, FileTransferArgs, IncomingFile
    from rpc.rpcx_server import RpcxServer
    from rpc.server import Server
    from rpc.sidechannel import ByteStream
    from rpc.streams import StreamService, StreamServiceArgs

    uploads: list[tuple[FileTransferArgs, str]] = []
    streams: list[StreamServiceArgs] = []

    async def upload(args: FileTransferArgs, data: IncomingFile) -> None:
        h = hashlib.sha256()
        async for chunk in data:
            h.update(chunk)
        uploads.append((args, h.hexdigest()))

    async def stream(args: StreamServiceArgs, conn: ByteStream) -> None:
        streams.append(args)
        async for chunk in conn:
            await conn.write(chunk)

    server = Server()
    FileTransfer(on_upload=upload).register(server)
    StreamService("127.0.0.1:0", stream).register(server)
    rpcx = RpcxServer(server, "tcp://127.0.0.1:0")
    await rpcx.start()
    for side in server.attached:
        await side.start()
    addr = rpcx.address.removeprefix("tcp@")
    env = {**os.environ, "SERIALIZE": serialize}
    try:
        for args in (("send", addr, str(tmp_path / "m.bin"), str(1 << 20)), ("stream", addr, "1000")):
            proc = await asyncio.create_subprocess_exec(str(go_peer), *args, env=env, stdout=subprocess.PIPE,
                                                        stderr=subprocess.PIPE)
            _, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
        # Go's SendFile does not wait for the server: the upload may still be running
        await wait_until(lambda: uploads, 10, what="the upload handler finished")
        assert uploads == [(FileTransferArgs(file_name="m.bin", file_size=1 << 20, meta={"from": "go"}),
                            pattern_sha256(1 << 20))]
        assert streams == [StreamServiceArgs(meta={"mode": "echo"})]
    finally:
        await server.shutdown(rpcx, timeout=2)
