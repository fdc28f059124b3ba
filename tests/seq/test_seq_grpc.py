"""The native gRPC server and client (rustext.GrpcServer / GrpcClient, seq.api, seq.channel):
interoperability with grpcio both ways, statuses, deadlines, malformed input, the batch
bridge under concurrency, and a lifecycle that leaves no thread or port behind."""

from __future__ import annotations

import asyncio
import os
import pathlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

import rustext
from rustext import GrpcClient, GrpcServer
from seq import RRSeq, SeqExhausted, SeqUnavailable
from seq._proto import rrseq_pb2 as pb
from seq.channel import ApiChannel
from seq.errors import RpcFailed
from seq.localcluster import LocalCluster
from seq.wire import API_SERVICE, ApiStub, api_handler
from tests.netutil import free_port, wait_until

NEXT, CUR, SET = f"/{API_SERVICE}/GRPCNextID", f"/{API_SERVICE}/GRPCCurID", f"/{API_SERVICE}/GRPCSetID"


def native_threads() -> list[str]:
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            names.append(pathlib.Path(f"/proc/self/task/{t}/comm").read_text().strip())
        except OSError:
            pass
    return [n for n in names if n in ("grpc-server", "grpc-client")]


async def threads_become(n: int) -> None:
    """A new thread names itself once it runs: wait (bounded) for the count of named native threads."""
    for _ in range(500):
        if len(native_threads()) == n:
            return
        await asyncio.sleep(0.01)
    assert len(native_threads()) == n


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class App:
    """The application side of a bare GrpcServer on the running loop: answers NextID with
    [n, 2n), CurID 42, SetID success = new_id > 10; names 'slow' are never answered,
    'bad' get OUT_OF_RANGE. Records the size of every batch taken."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.batches: list[int] = []
        self.raw: list[bytes] = []
        self.port = 0
        asyncio.get_running_loop().add_reader(server.fileno(), self.on_calls)

    def on_calls(self) -> None:
        calls = self.server.take()
        if not calls:
            return
        self.batches.append(len(calls))
        replies = []
        for token, kind, name, arg, timeout in calls:
            assert timeout is None or timeout > 0
            if kind == 3:
                self.raw.append(name)
                self.server.complete_raw(token, bytes(reversed(name)))
            elif name == "slow":
                continue
            elif name == "bad":
                self.server.fail(token, 11, "no more IDs for 'bad' é")
            elif kind == 0:
                replies.append((token, arg, 2 * arg))
            elif kind == 1:
                replies.append((token, 42, 0))
            else:
                replies.append((token, int(arg > 10), 0))
        self.server.complete(replies)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.server.fileno())


@pytest.fixture
async def app() -> AsyncIterator[App]:
    server = GrpcServer("127.0.0.1", 0, raw_methods=["/test.Raw/Echo"], max_message=1024)
    port = server.start()
    a = App(server)
    a.port = port
    try:
        yield a
    finally:
        a.close()
        await asyncio.get_running_loop().run_in_executor(None, server.close)


def raw_call(ch: grpc.aio.Channel, path: str) -> Callable[..., Any]:
    return ch.unary_unary(path, request_serializer=lambda b: b, response_deserializer=lambda b: b)


async def test_grpcio_client_against_native_server(app: App) -> None:
    port = app.port
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = ApiStub(ch)
        r = await stub.NextID(pb.NextIDRequest(name="x", range_size=7), timeout=5)
        assert (r.from_id, r.to_id) == (7, 14)
        assert (await stub.CurID(pb.CurIDRequest(name="x"), timeout=5)).cur_id == 42
        assert (await stub.SetID(pb.SetIDRequest(name="x", new_id=11), timeout=5)).success is True
        assert (await stub.SetID(pb.SetIDRequest(name="x", new_id=3), timeout=5)).success is False
        # no deadline sent: still answered (the server bounds it with max_wait)
        r = await stub.NextID(pb.NextIDRequest(name="x", range_size=1))
        assert (r.from_id, r.to_id) == (1, 2)
        # a raw method passes bytes through
        assert await raw_call(ch, "/test.Raw/Echo")(b"abc", timeout=5) == b"cba"
        assert app.raw == [b"abc"]


async def test_statuses(app: App) -> None:
    port = app.port
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = ApiStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.NextID(pb.NextIDRequest(name="bad", range_size=1), timeout=5)
        assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert e.value.details() == "no more IDs for 'bad' é"
        for path in ("/pb.RRAPI/Nope", "/other.Service/GRPCNextID"):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await raw_call(ch, path)(b"", timeout=5)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert path in (e.value.details() or "")
        # grpc-timeout honored: never answered -> DEADLINE_EXCEEDED, and the call is forgotten
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.NextID(pb.NextIDRequest(name="slow", range_size=1), timeout=0.2)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        for _ in range(500):  # the server's own timer, or the client's RST_STREAM, forgets it
            if app.server.pending() == 0:
                break
            await asyncio.sleep(0.01)
        assert app.server.pending() == 0
        # over max_message (1024 bytes)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.NextID(pb.NextIDRequest(name="y" * 2000, range_size=1), timeout=5)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    "payload",
    [
        b"\x0a\x05ab",  # string longer than the message
        b"\x0a\x02\xff\xfe",  # name not UTF-8
        b"\x0b",  # group wire type
        b"\x10" + b"\xff" * 11,  # varint too long
    ],
)
async def test_malformed_requests_get_internal_and_others_are_served(app: App, payload: bytes) -> None:
    port = app.port
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = ApiStub(ch)
        good = [stub.NextID(pb.NextIDRequest(name="g", range_size=i), timeout=5) for i in range(1, 21)]
        bad = raw_call(ch, NEXT)(payload, timeout=5)
        results = await asyncio.gather(bad, *good, return_exceptions=True)
    err = results[0]
    assert isinstance(err, grpc.aio.AioRpcError)
    assert err.code() == grpc.StatusCode.INTERNAL
    assert "cannot parse the request message" in (err.details() or "")
    assert [(r.from_id, r.to_id) for r in results[1:]] == [(i, 2 * i) for i in range(1, 21)]  # type: ignore[union-attr]


async def test_grpcio_client_asking_for_gzip_is_served(app: App) -> None:
    """The server announces no compression, so grpcio sends identity (a compressed message
    would get UNIMPLEMENTED: rustext/src/grpc/server.rs tests)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}", compression=grpc.Compression.Gzip) as ch:
        r = await ApiStub(ch).NextID(pb.NextIDRequest(name="x", range_size=2), timeout=5)
        assert (r.from_id, r.to_id) == (2, 4)


async def test_malformed_http2_client_does_not_disturb_others(app: App) -> None:
    """Garbage instead of an HTTP/2 preface, and a half-open connection: other clients are served."""
    port = app.port
    r1, w1 = await asyncio.open_connection("127.0.0.1", port)
    w1.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(64))
    await w1.drain()
    r2, w2 = await asyncio.open_connection("127.0.0.1", port)
    w2.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # preface, then silence
    await w2.drain()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        r = await ApiStub(ch).NextID(pb.NextIDRequest(name="x", range_size=3), timeout=5)
        assert (r.from_id, r.to_id) == (3, 6)
    try:  # the server closed the garbage connection
        await asyncio.wait_for(r1.read(), 5)
    except ConnectionResetError:
        pass
    for w in (w1, w2):
        w.close()


async def test_batch_bridge_under_concurrency(app: App) -> None:
    """Many concurrent calls over several connections: every one gets its own answer."""
    port = app.port
    chans = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(4)]
    try:
        stubs = [ApiStub(c) for c in chans]
        calls = [stubs[i % 4].NextID(pb.NextIDRequest(name="c", range_size=i), timeout=10) for i in range(1, 801)]
        got = await asyncio.gather(*calls)
    finally:
        for c in chans:
            await c.close()
    assert [(r.from_id, r.to_id) for r in got] == [(i, 2 * i) for i in range(1, 801)]
    assert sum(app.batches) >= 800  # (+ none lost) every call went through take()
    assert app.server.pending() == 0


async def test_drain_then_close_releases_thread_and_port() -> None:
    before = len(native_threads())
    server = GrpcServer("127.0.0.1", 0)
    port = server.start()
    await threads_become(before + 1)
    a = App(server)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = ApiStub(ch)
        assert (await stub.CurID(pb.CurIDRequest(name="x"), timeout=5)).cur_id == 42
        slow = asyncio.ensure_future(stub.NextID(pb.NextIDRequest(name="slow", range_size=1), timeout=10))
        for _ in range(500):  # until the call reached the server (polled: it has no event to await)
            if server.pending():
                break
            await asyncio.sleep(0.01)
        assert server.pending() == 1
        server.drain()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.CurID(pb.CurIDRequest(name="x"), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        a.close()
        await asyncio.get_running_loop().run_in_executor(None, server.close)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await slow
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.closed
    server.close()  # idempotent
    assert len(native_threads()) == before
    assert port_is_free(port)
    with pytest.raises(OSError):
        _bind_twice()


def _bind_twice() -> None:
    a = GrpcServer("127.0.0.1", 0)
    p = a.start()
    try:
        GrpcServer("127.0.0.1", p).start()
    finally:
        a.close()


def test_constructor_checks() -> None:
    with pytest.raises(ValueError):
        GrpcServer("127.0.0.1", 0, raw_methods=["nope"])
    with pytest.raises(ValueError):
        GrpcServer("127.0.0.1", 0, max_wait=-1)
    with pytest.raises(ValueError):
        GrpcClient([])
    with pytest.raises(ValueError):
        GrpcClient(["no-port"])
    c = GrpcClient(["127.0.0.1:1"])
    with pytest.raises(ValueError):
        c.next_id(1, "x", 1, 1.0)
    with pytest.raises(ValueError):
        c.next_id(0, "x", 1, -1.0)
    c.close()
    with pytest.raises(rustext.RustextError):
        c.next_id(0, "x", 1, 1.0)


# -- the native client against grpc.aio servers (interop the other way) ----------------


class AioRRAPI:
    """A grpc.aio RRAPI server: NextID hands out [next, next + n) of one counter."""

    def __init__(self, *, exhausted: bool = False, hang: bool = False) -> None:
        self.next = 1
        self.exhausted = exhausted
        self.hang = hang
        self.calls = 0
        self.server: grpc.aio.Server | None = None
        self.addr = ""

    async def next_id(self, req: pb.NextIDRequest, ctx: grpc.aio.ServicerContext) -> pb.NextIDReply:
        self.calls += 1
        if self.hang:
            await asyncio.sleep(30)
        if self.exhausted:
            await ctx.abort(grpc.StatusCode.OUT_OF_RANGE, "sequence would pass 2**63-1")
        lo = self.next
        self.next += max(1, req.range_size)
        return pb.NextIDReply(from_id=lo, to_id=self.next)

    async def cur_id(self, req: pb.CurIDRequest, ctx: grpc.aio.ServicerContext) -> pb.CurIDReply:
        return pb.CurIDReply(cur_id=self.next)

    async def set_id(self, req: pb.SetIDRequest, ctx: grpc.aio.ServicerContext) -> pb.SetIDReply:
        if req.new_id > self.next:
            self.next = req.new_id
            return pb.SetIDReply(success=True)
        return pb.SetIDReply(success=False)

    async def __aenter__(self) -> AioRRAPI:
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((api_handler(self.next_id, self.cur_id, self.set_id),))
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.addr = f"127.0.0.1:{port}"
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        await self.server.stop(0)


async def test_native_client_against_grpc_aio_server() -> None:
    before = len(native_threads())
    async with AioRRAPI() as srv:
        ch = ApiChannel([srv.addr, f"127.0.0.1:{free_port()}"])
        assert await ch.next_id(0, "x", 5, 5.0) == (1, 6)
        assert await ch.cur_id(0, "x", 5.0) == (6, 0)
        assert await ch.set_id(0, "x", 100, 5.0) == (1, 0)
        assert await ch.set_id(0, "x", 7, 5.0) == (0, 0)
        got = await asyncio.gather(*(ch.next_id(0, "x", 1, 5.0) for _ in range(100)))
        assert sorted(got) == [(i, i + 1) for i in range(100, 200)]
        with pytest.raises(RpcFailed) as e:
            await ch.next_id(1, "x", 1, 2.0)  # nobody listens there
        assert e.value.code_name == "UNAVAILABLE"
        srv.hang = True
        with pytest.raises(RpcFailed) as e:
            await ch.next_id(0, "x", 1, 0.2)
        assert e.value.code_name == "DEADLINE_EXCEEDED"
        srv.hang, srv.exhausted = False, True
        with pytest.raises(RpcFailed) as e:
            await ch.next_id(0, "x", 1, 5.0)
        assert e.value.code == 11 and "2**63-1" in e.value.details
        await ch.aclose()
        await ch.aclose()
    assert len(native_threads()) == before


async def test_rrseq_round_robin_skips_a_dead_server_and_maps_out_of_range() -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with AioRRAPI() as srv:
        async with RRSeq("x", 0, [dead, srv.addr], timeout=5, backoff_min=10) as s:
            got = [await s.next() for _ in range(20)]
        assert got == list(range(1, 21))
        assert srv.calls == 20  # the dead one was tried once, then skipped (backoff 10 s)
        srv.exhausted = True
        async with RRSeq("x", 0, [srv.addr], timeout=5) as s:
            with pytest.raises(SeqExhausted):
                await s.next()
    async with RRSeq("x", 0, [dead], timeout=0.5, backoff_min=0.05) as s:
        with pytest.raises(SeqUnavailable) as e:
            await s.next()
        assert "UNAVAILABLE" in str(e.value)


async def test_sequences_share_the_channel_they_are_given() -> None:
    """Sequences made with one ApiChannel share it (one native thread) and leave
    it open; a sequence made without one owns a channel of its own."""
    before = len(native_threads())
    async with AioRRAPI() as srv:
        async with ApiChannel([srv.addr]) as ch:
            seqs = [RRSeq("x", 0, channel=ch) for _ in range(8)]
            got = await asyncio.gather(*(s.next() for s in seqs))
            assert sorted(got) == list(range(1, 9))
            await threads_become(before + 1)
            for s in seqs:
                await s.aclose()
            assert await ch.next_id(0, "x", 1, 5.0) == (9, 10)  # the sequences did not close it
        assert len(native_threads()) == before
        async with RRSeq("x", 0, [srv.addr]) as s:  # a channel of its own, closed with it
            assert await s.next() == 10
            await threads_become(before + 1)
        assert len(native_threads()) == before


async def test_a_cancelled_call_is_cancelled_in_the_native_client() -> None:
    """A cancelled call frees its place at once (never sent, or its stream
    reset), not when the server answers: no in-flight call is left behind;
    a cancelled RRSeq fetch does it by itself."""
    async with AioRRAPI(hang=True) as srv:
        async with ApiChannel([srv.addr]) as ch:
            futs = [ch.next_id(0, "x", 1, 30.0) for _ in range(200)]
            await wait_until(lambda: srv.calls >= 1, what="the server received calls")
            assert all(ch.cancel(f) for f in futs) and all(f.cancelled() for f in futs)
            native = ch._native
            assert native is not None and native.inflight() == 0
            assert not ch.cancel(futs[0])
            seq = RRSeq("x", 0, channel=ch, timeout=30)
            fetch = asyncio.ensure_future(seq.next())
            await wait_until(lambda: native.inflight() == 1, what="the sequence's call in flight")
            fetch.cancel()
            with pytest.raises(asyncio.CancelledError):
                await fetch
            await seq.aclose()  # its background fetch is cancelled, and with it the call
            assert native.inflight() == 0


def test_rrseq_can_be_made_outside_a_loop() -> None:
    """The channel is leased on the first fetch, inside the loop that uses the sequence."""
    s = RRSeq("x", 0, ["127.0.0.1:1"], timeout=0.3)

    async def use() -> None:
        with pytest.raises(SeqUnavailable):
            await s.next()
        await s.aclose()

    asyncio.run(use())


async def test_native_client_and_server_on_a_real_cluster(cluster: LocalCluster) -> None:
    """The cluster's members serve RRAPI natively; both grpcio and the native client draw from it."""
    ch = ApiChannel(cluster.addrs)
    try:
        a = await ch.next_id(0, "both", 10, 5.0)
        async with grpc.aio.insecure_channel(cluster.addrs[2]) as gch:
            r = await ApiStub(gch).NextID(pb.NextIDRequest(name="both", range_size=10), timeout=5)
        b = (r.from_id, r.to_id)
        c = await ch.next_id(1, "both", 10, 5.0)
        assert a == (1, 11) and b == (11, 21) and c == (21, 31)
        with pytest.raises(RpcFailed) as e:
            await ch.next_id(0, "n" * 300, 1, 5.0)
        assert e.value.code_name == "INVALID_ARGUMENT"
        with pytest.raises(RpcFailed) as e:
            await ch.next_id(0, "both", 1 << 40, 5.0)
        assert e.value.code_name == "INVALID_ARGUMENT"
    finally:
        await ch.aclose()
