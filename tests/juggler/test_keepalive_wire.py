"""Keepalive on the wire (juggler/keepalive.py, driven by juggler/conn.py):
a real server on loopback, raw sockets speaking RFC 6455 by hand (so every
frame the server sends is seen, and a client can be made to answer
nothing), the Python clients, and a real ``juggler server`` process paused
with SIGSTOP."""

from __future__ import annotations

import asyncio
import json
import signal
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from test_wsproto import REQUEST, masked
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed as WsConnectionClosed
from websockets.exceptions import InvalidStatus
from websockets.protocol import State as WsState

import rustext
from juggler.broker.memory import MemoryBroker
from juggler.client import connect
from juggler.config import ServerConfig
from juggler.conn import Conn, ConnState
from juggler.errors import ConnectionClosed
from juggler.keepalive import KEEPALIVE
from juggler.protocol import Outgoing
from juggler.reconnecting import reconnecting
from juggler.server import Server
from tests.faultproxy import FaultProxy
from tests.juggler.jugglerprocs import Proc, juggler
from tests.netutil import free_port, wait_for_port, wait_until

pytestmark = pytest.mark.timeout(60)

TEXT, CLOSE, PING, PONG = 0x1, 0x8, 0x9, 0xA
#: pings every 0.2 s, a ping unanswered for 0.2 s closes the connection: for clients that answer nothing
FAST = {"ping_interval": 0.2, "pong_timeout": 0.2}
#: for clients that answer: a ping unanswered closes after 0.6 s, and they are watched well past that
#: (the server and the client share this test's event loop, so a longer stall must not fail them)
LIVELY = {"ping_interval": 0.1, "pong_timeout": 0.5}


@asynccontextmanager
async def serving(**cfg: Any) -> AsyncIterator[Server]:
    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0, **cfg))
    try:
        await server.start()
        yield server
    finally:
        await server.aclose()
        await broker.aclose()


class Raw:
    """A websocket client on a bare socket: it reads only when told and
    answers nothing by itself (no pong unless :meth:`pong`)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, target: bytes = b"/ws", headers: bytes = b"") -> Raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = REQUEST.replace(b"GET /ws ", b"GET " + target + b" ").replace(b"\r\n\r\n", b"\r\n" + headers + b"\r\n")
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 101"), head
        return cls(reader, writer)

    async def recv(self, timeout: float = 10) -> tuple[int, bytes] | None:
        """The next server frame (opcode, payload), or None at EOF."""
        try:
            b0, b1 = await asyncio.wait_for(self.reader.readexactly(2), timeout)
        except asyncio.IncompleteReadError:
            return None
        assert b0 & 0x80 and not b1 & 0x80, "unfragmented, unmasked server frames"
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", await self.reader.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", await self.reader.readexactly(8))[0]
        return b0 & 0x0F, await self.reader.readexactly(n)

    def pong(self, payload: bytes) -> None:
        self.writer.write(masked(payload, opcode=PONG))

    def send_text(self, data: bytes) -> None:
        self.writer.write(masked(data))

    async def aclose(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass


async def connected(server: Server, n: int = 1) -> list[Conn]:
    """The server's connected connections, once there are `n`."""
    return await wait_until(
        lambda: (conns := [c for c in server.conns if c.state is ConnState.CONNECTED]) and len(conns) == n and conns,
        what=f"{n} connected connection(s)")


# --- the server ----------------------------------------------------------------------------------


async def test_a_client_that_answers_nothing_is_closed_after_ping_interval_plus_pong_timeout() -> None:
    # close_timeout is long: a dead peer's connection is dropped at once, not after a closing handshake
    async with serving(**FAST, close_timeout=30) as server:
        raw = await Raw.open(server.port)  # completes the handshake, then reads and answers nothing
        try:
            (conn,) = await connected(server)
            await asyncio.wait_for(conn.wait_closed(), 10)
            # never before a ping was left unanswered for pong_timeout
            assert conn.loop.time() - conn.opened_at >= 0.2 + 0.2
            assert conn.close_reason == "ping_timeout"
            assert server.stats.closed == {"ping_timeout": 1} and not server.conns
            # what reached the silent client meanwhile: a ping, then the close frame, then EOF
            assert await raw.recv() == (PING, b"")
            frames = []
            while (got := await raw.recv()) is not None:
                frames.append(got)
            assert frames[-1] == (CLOSE, struct.pack("!H", 1011) + b"keepalive timeout")
            assert {op for op, _ in frames[:-1]} <= {PING}
        finally:
            await raw.aclose()


async def test_clients_that_answer_pings_stay_connected_across_intervals() -> None:
    async with serving(**LIVELY) as server:
        # the websockets library answers pings as gorilla (the Go client) does; it never pings itself here
        async with ws_connect(server.url, subprotocols=["juggler.0"], ping_interval=None,
                              compression=None) as plain, connect(server.url) as client:
            await wait_until(lambda: client.keepalives >= 15, 20, what="15 KEEPALIVEs: 14 ping intervals")
            assert plain.state is WsState.OPEN and not client.closed
            assert len(await connected(server, 2)) == 2
            assert server.stats.closed == {}
            await client.sub("still.served")


async def test_a_connection_that_did_not_opt_in_gets_pings_and_never_a_keepalive_message() -> None:
    """What the original Go client and its tools see: websocket pings (which
    their library answers), nothing they could not parse."""
    async with serving(**LIVELY) as server:
        raw = await Raw.open(server.port)
        try:
            frames = []
            while sum(op == PING for op, _ in frames) < 10:
                got = await raw.recv()
                assert got is not None, "closed while answering every ping"
                frames.append(got)
                if got[0] == PING:
                    raw.pong(got[1])
            assert all(op == PING for op, _ in frames), frames
            (conn,) = await connected(server)
            assert not conn.keepalive_messages and server.stats.closed == {}
        finally:
            await raw.aclose()


@pytest.mark.parametrize("how", ["query", "header"])
async def test_a_client_that_opted_in_gets_a_keepalive_at_once_and_with_every_ping(how: str) -> None:
    async with serving(**LIVELY) as server:
        if how == "query":  # what browsers can do
            raw = await Raw.open(server.port, b"/ws?juggler-keepalive=1")
        else:
            raw = await Raw.open(server.port, headers=b"Juggler-Keepalive: 1\r\n")
        try:
            frames = []
            while len(frames) < 7:
                got = await raw.recv()
                assert got is not None
                frames.append(got)
                if got[0] == PING:
                    raw.pong(got[1])
            assert [op for op, _ in frames] == [TEXT, PING, TEXT, PING, TEXT, PING, TEXT]
            uuids = set()
            for op, payload in frames:
                if op == TEXT:
                    assert payload.endswith(b"\n")
                    msg = json.loads(payload)
                    assert msg["meta"]["type"] == KEEPALIVE and msg["payload"] == {"interval_ms": 100}
                    uuids.add(msg["meta"]["uuid"])
            assert len(uuids) == 4  # each an envelope with its own uuid
            assert server.stats.closed == {}
        finally:
            await raw.aclose()


async def test_any_message_counts_as_life_not_only_pongs() -> None:
    """A client never answers a ping with a pong but sends a message after
    each: it is alive, and stays (nothing is required of it but traffic)."""
    async with serving(**LIVELY) as server:
        raw = await Raw.open(server.port, b"/ws?juggler-keepalive=1")
        try:
            pings = acks = 0
            while pings < 10 or acks < 10:
                got = await raw.recv()
                assert got is not None, "closed although it sent a message after every ping"
                op, payload = got
                if op == PING:
                    pings += 1
                    raw.send_text(rustext.build_sub(rustext.new_uuid(), f"life.{pings}"))
                elif json.loads(payload)["meta"]["type"] == 8:
                    acks += 1
            (conn,) = await connected(server)
            assert not conn.closed and server.stats.closed == {}
        finally:
            await raw.aclose()


async def test_pings_off_send_nothing_and_an_invalid_opt_in_is_refused() -> None:
    async with serving(ping_interval=0) as server:
        raw = await Raw.open(server.port, b"/ws?juggler-keepalive=1")
        try:
            uid = rustext.new_uuid()
            raw.send_text(rustext.build_sub(uid, "quiet"))
            op, payload = await raw.recv() or (0, b"")
            assert op == TEXT and json.loads(payload)["payload"]["for"] == uid  # the ACK comes first
            (conn,) = await connected(server)
            assert conn.keepalive is None  # nothing to time: no timer at all
        finally:
            await raw.aclose()
        for url, headers in ((server.url + "?juggler-keepalive=yes", None),
                             (server.url, {"Juggler-Keepalive": "true"})):
            with pytest.raises(InvalidStatus) as info:
                async with ws_connect(url, subprotocols=["juggler.0"], additional_headers=headers,
                                      open_timeout=5):
                    pass
            assert info.value.response.status_code == 400
            assert b"Invalid Juggler-Keepalive header: expected 1 or 0" in info.value.response.body


async def test_read_timeout_closes_an_idle_client_however_well_it_answers_pings() -> None:
    async with serving(ping_interval=0.05, pong_timeout=5, read_timeout=0.5) as server:
        async with ws_connect(server.url, subprotocols=["juggler.0"], ping_interval=None) as c:
            with pytest.raises(WsConnectionClosed) as info:
                await asyncio.wait_for(c.recv(), 10)
            assert info.value.rcvd is not None and (info.value.rcvd.code, info.value.rcvd.reason) == (1000, "read timeout")
        await wait_until(lambda: server.stats.closed.get("read_timeout") == 1, what="counted as read_timeout")


# --- the Python clients --------------------------------------------------------------------------


async def test_the_client_drops_a_server_that_stops_sending() -> None:
    # a long pong_timeout: the server does not drop the client first (its pongs still get through)
    async with serving(ping_interval=0.2, pong_timeout=30) as server, FaultProxy(server.port) as proxy:
        client = await connect(f"ws://127.0.0.1:{proxy.port}/ws", keepalive_grace=0.3)
        try:
            await client.sub("ka")
            assert client.keepalives >= 1
            proxy.hold_replies()  # the server's bytes stop reaching the client: no reset, no close
            with pytest.raises(ConnectionClosed, match=r"nothing from the server for .* connection considered dead"):
                await client.next_event(10)
            assert client.closed
        finally:
            await client.aclose()


async def test_the_client_waits_for_ever_on_a_server_that_sends_no_keepalive() -> None:
    async with serving(ping_interval=0) as server, connect(server.url, keepalive_grace=0.01) as client:
        await client.sub("a")  # a KEEPALIVE would have come before the ACK
        assert client.keepalives == 0 and client._watch.limit is None
    async with serving(**LIVELY) as server, connect(server.url, keepalive=False) as client:
        await client.sub("a")  # asked for none: gets none
        assert client.keepalives == 0 and client._watch.limit is None
        (conn,) = await connected(server)
        assert not conn.keepalive_messages


async def test_a_bad_keepalive_grace_is_refused_at_once() -> None:
    for grace in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="keepalive_grace must be > 0"):
            connect("ws://127.0.0.1:9/ws", keepalive_grace=grace)
        with pytest.raises(ValueError, match="keepalive_grace must be > 0"):
            reconnecting("ws://127.0.0.1:9/ws", keepalive_grace=grace)  # not at its first attempt


async def test_on_message_does_not_see_keepalives() -> None:
    seen: list[int] = []
    async with serving(**LIVELY) as server, connect(server.url, on_message=lambda m, _: seen.append(m["meta"]["type"])) as c:
        await wait_until(lambda: c.keepalives >= 2, what="two KEEPALIVEs")
        await c.sub("x")
        assert seen == [8]


async def test_middleware_sees_no_keepalive() -> None:
    out: list[int] = []

    async def record(conn: Conn, msg: Any, nxt: Any) -> None:
        if isinstance(msg, Outgoing):
            out.append(msg.type)
        await nxt(conn, msg)

    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0, **LIVELY), middleware=[record])
    try:
        await server.start()
        async with connect(server.url) as c:
            await wait_until(lambda: c.keepalives >= 3, what="three KEEPALIVEs past the middleware")
            await c.sub("x")
        assert out == [8]
    finally:
        await server.aclose()
        await broker.aclose()


async def test_the_reconnecting_client_leaves_a_paused_server_and_restores_its_subscriptions() -> None:
    port = free_port()
    proc = Proc(juggler("server", "--listen", f"127.0.0.1:{port}", "--set", "server.ping_interval=0.2",
                        "--log-level", "WARNING"))
    states: asyncio.Queue[str] = asyncio.Queue()

    async def state(want: str, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while (got := await states.get()) != want:
                pass

    try:
        wait_for_port(port, timeout=30, proc=proc.proc)
        url = f"ws://127.0.0.1:{port}/ws"
        async with reconnecting(url, keepalive_grace=0.3, on_state=states.put_nowait) as client:
            await state("open", 10)
            await client.sub("paused")
            proc.proc.send_signal(signal.SIGSTOP)  # no FIN, no reset: the server just stops answering
            try:
                await state("reconnecting", 10)
            finally:
                proc.proc.send_signal(signal.SIGCONT)
            await state("open", 20)  # the attempt made while it was stopped completes
            async with connect(url) as publisher:
                await publisher.pub("paused", "after the pause")
            event = await client.next_event(10)
            assert (event.channel, event.args) == ("paused", "after the pause")
            assert client.reconnects == 1
    except BaseException:
        print(proc.output())
        raise
    finally:
        if proc.proc.poll() is None:
            proc.proc.send_signal(signal.SIGCONT)
        assert proc.stop() == 0
