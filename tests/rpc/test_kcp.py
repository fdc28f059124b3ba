"""rpcx over KCP (``kcp@host:port``, rpc/transport/kcpchannel.py): our client
and our server on real UDP sockets on 127.0.0.1.

Calls, pooled and concurrent, in both send modes, with AES and with the
"none" crypt, with and without FEC headers; another key gets no answer; a
listener without a block crypt is refused; back-pressure on a large write;
idle sessions are dropped; a server process killed in the middle of a call
makes the call fail within its deadline; ``juggler rpc serve|call`` over KCP.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest

from rpc.client import Client
from rpc.errors import CallTimeout, TransportError
from rpc.examples import register_example
from rpc.rpcx_client import RpcxCaller
from rpc.rpcx_server import RpcxServer, address_of, endpoint_of
from rpc.server import Server
from rpc.transport.endpoint import Endpoint
from rpc.transport.kcp import KcpSettings
from rpc.transport.kcpchannel import KcpOptions
from rpc.transport.kcpwire import KcpCrypt
from tests.netutil import wait_until
from tests.rpc.test_rpcx_e2e import Served, serve

pytestmark = pytest.mark.timeout(60)

RPCX = KcpOptions(crypt=KcpCrypt.from_passphrase("rpcx-key"))


def arith_server() -> Server:
    server = Server()
    register_example(server.registry, "arith")
    return server


def test_kcp_addresses_and_endpoints() -> None:
    ep = Endpoint.parse("kcp://127.0.0.1:8972")
    assert (ep.kind, ep.host, ep.port) == ("kcp", "127.0.0.1", 8972)
    assert str(ep) == "kcp://127.0.0.1:8972"
    assert endpoint_of("kcp@127.0.0.1:8972") == ep
    assert address_of(Endpoint.parse("kcp://[::1]:9")) == "kcp@[::1]:9"
    with pytest.raises(ValueError, match="kcp://host:port"):
        Endpoint.parse("kcp://nowhere")


@pytest.mark.parametrize("options", [
    RPCX,
    KcpOptions(crypt=KcpCrypt.from_passphrase("rpcx-key"), settings=KcpSettings(stream=True)),
    KcpOptions(crypt=KcpCrypt(cipher="none"), data_shards=0, parity_shards=0),
    KcpOptions(crypt=KcpCrypt(key=bytes(range(16))), settings=KcpSettings(ack_nodelay=False, nodelay=False,
                                                                          no_cwnd=False, interval=20)),
], ids=["aes-message", "aes-stream", "none-nofec", "aes128-delayed-acks-cwnd"])
async def test_our_client_calls_our_server_over_kcp(options: KcpOptions) -> None:
    server = arith_server()
    async with RpcxServer(server, "kcp@127.0.0.1:0", kcp=options) as rpcx:
        assert rpcx.address.startswith("kcp@127.0.0.1:")
        caller = RpcxCaller(pool=2, kcp=options)
        async with Client(rpcx.address, caller, close_caller=True) as client:
            assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
            replies = await asyncio.gather(*(client.call("Arith", "Add", {"A": i, "B": 1}, timeout=10)
                                             for i in range(300)))
            assert replies == [{"C": i + 1} for i in range(300)]
            big = "x" * 300_000  # hundreds of KCP segments, one rpcx message
            assert await client.call("Arith", "Mul", {"A": 2, "B": 3, "pad": big}, timeout=10) == {"C": 6}
            conn = await caller.connection(rpcx.address)
            assert (await conn.heartbeat(b"hb", timeout=5)).heartbeat
            assert len(rpcx.connections) == 2  # one session per pooled connection
    await server.dispatcher.aclose()


async def test_another_key_gets_no_answer() -> None:
    server = arith_server()
    async with RpcxServer(server, "kcp@127.0.0.1:0", kcp=RPCX) as rpcx:
        other = KcpOptions(crypt=KcpCrypt.from_passphrase("rpcx-key", "another-salt"))
        caller = RpcxCaller(kcp=other)
        async with Client(rpcx.address, caller, close_caller=True) as client:
            conn = await caller.connection(rpcx.address)
            with pytest.raises(CallTimeout):
                await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=1)
        assert not rpcx.connections  # its datagrams did not even open a session
        # closed, the session lingers for acknowledgements that never come, then is forgotten
        assert conn.transport is not None
        await asyncio.wait_for(conn.transport.wait_closed(), 5)  # type: ignore[attr-defined]
    await server.dispatcher.aclose()


async def test_kcp_needs_a_block_crypt() -> None:
    with pytest.raises(ValueError, match="block crypt"):
        await RpcxServer(arith_server(), "kcp@127.0.0.1:0").start()
    with pytest.raises(ValueError, match="block crypt"):  # a configuration mistake, not a transport failure
        async with Client("kcp@127.0.0.1:9", RpcxCaller(), close_caller=True) as client:
            await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5)


def test_cli_refuses_kcp_without_a_key_and_mixed_flags() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli", "rpc", *args], capture_output=True, text=True,
                              timeout=60, check=False)

    res = run("serve", "--listen", "kcp@127.0.0.1:0", "--example", "arith")
    assert res.returncode == 2 and "give --kcp-key PASSPHRASE" in res.stderr, res.stderr
    res = run("serve", "--listen", "127.0.0.1:0", "--example", "arith", "--kcp-key", "k")
    assert res.returncode == 2 and "kcp@HOST:PORT listener" in res.stderr, res.stderr
    res = run("call", "kcp@127.0.0.1:9", "Arith.Mul", "{}", "--kcp-key-hex", "abcd")
    assert res.returncode == 2 and "2 bytes, expected 16, 24 or 32" in res.stderr, res.stderr


def test_cli_serve_and_call_over_kcp() -> None:
    ours: Served = serve("--example", "arith", "--kcp-key", "s3cret", listen="kcp@127.0.0.1:0")
    try:
        assert ours.address.startswith("kcp@127.0.0.1:")
        res = subprocess.run([sys.executable, "-m", "cli", "rpc", "call", ours.address, "Arith.Mul", '{"A":6,"B":7}',
                              "--kcp-key", "s3cret", "--timeout", "5"], capture_output=True, text=True, timeout=60,
                             check=False)
        assert res.returncode == 0 and res.stdout.strip() == '{"C": 42}', res.stderr
        res = subprocess.run([sys.executable, "-m", "cli", "rpc", "call", ours.address, "Arith.Mul", '{"A":6,"B":7}',
                              "--kcp-key", "wrong", "--timeout", "1"], capture_output=True, text=True, timeout=60,
                             check=False)
        assert res.returncode == 1 and "another --kcp-key" in res.stderr, res.stderr
        ours.signal(signal.SIGTERM)
        assert ours.wait() == 0
    finally:
        ours.stop()


async def test_a_server_killed_mid_call_fails_the_call_within_its_deadline() -> None:
    ours: Served = serve("--app", "tests.rpc.rpcx_app:setup", "--kcp-key", "rpcx-key", listen="kcp@127.0.0.1:0")
    try:
        caller = RpcxCaller(kcp=RPCX)
        async with Client(ours.address, caller, close_caller=True) as client:
            conn = await caller.connection(ours.address)
            call = asyncio.ensure_future(client.call("Probe", "Sleep", {"ms": 30_000}, timeout=3))

            async def sleeping() -> bool:
                return (await client.call("Probe", "Stats", {}, timeout=5))["active"] == 1

            await wait_until(sleeping, timeout=10)
            started = time.monotonic()
            ours.proc.kill()
            ours.proc.wait(timeout=10)
            with pytest.raises((CallTimeout, TransportError)):
                await asyncio.wait_for(call, 10)
            assert time.monotonic() - started < 3.5  # the call's own deadline: KCP has no FIN to wait for
        # closed, the session lingers for the dead server's acknowledgements, then is forgotten
        assert conn.transport is not None
        await asyncio.wait_for(conn.transport.wait_closed(), 5)  # type: ignore[attr-defined]
    finally:
        ours.stop()


async def test_writes_past_the_send_queue_wait_for_acknowledgements() -> None:
    """A 3 MiB payload with a 256 KiB send queue: the writer is paused until
    the peer acknowledges, then resumes; the call completes intact."""
    from rpc.transport.config import ConnectionConfig, PoolConfig

    server = arith_server()
    async with RpcxServer(server, "kcp@127.0.0.1:0", kcp=RPCX) as rpcx:
        config = PoolConfig(connection=ConnectionConfig(default_timeout=None, send_queue_bytes=256 << 10))
        caller = RpcxCaller(config=config, kcp=RPCX)
        async with Client(rpcx.address, caller, close_caller=True) as client:
            conn = await caller.connection(rpcx.address)
            assert conn.transport is not None
            assert conn.transport.get_write_buffer_limits()[1] == 256 << 10
            pad = "y" * (3 << 20)
            call = asyncio.ensure_future(client.call("Arith", "Mul", {"A": 2, "B": 3, "pad": pad}, timeout=30))
            await wait_until(lambda: conn.transport.get_write_buffer_size() > 256 << 10, timeout=10, interval=0)
            assert conn._write_paused  # the connection was told to stop writing
            assert await call == {"C": 6}
            assert conn.transport.get_write_buffer_size() < 256 << 10
    await server.dispatcher.aclose()


async def test_silent_sessions_are_dropped_after_the_idle_timeout() -> None:
    options = KcpOptions(crypt=KcpCrypt(cipher="none"), idle_timeout=0.5)
    server = arith_server()
    async with RpcxServer(server, "kcp@127.0.0.1:0", kcp=options) as rpcx:
        caller = RpcxCaller(kcp=options)
        async with Client(rpcx.address, caller, close_caller=True) as client:
            assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
            conn = await caller.connection(rpcx.address)
            assert len(rpcx.connections) == 1
            await wait_until(lambda: not rpcx.connections and not conn.is_open, timeout=5)

            async def called() -> bool:  # the pool reconnects: a new session, a new conversation
                try:
                    return await client.call("Arith", "Mul", {"A": 2, "B": 7}, timeout=5) == {"C": 14}
                except TransportError:
                    return False

            await wait_until(called, timeout=10)
            assert len(rpcx.connections) == 1
    await server.dispatcher.aclose()


async def test_a_session_the_server_forgot_resumes_where_the_client_is() -> None:
    """The server drops an idle session (or restarts) while the client keeps
    it, as a Go client without heartbeats does: the client's next request
    opens a session resumed at the client's sequence numbers."""
    crypt = KcpCrypt(cipher="none")
    server = arith_server()
    async with RpcxServer(server, "kcp@127.0.0.1:0", kcp=KcpOptions(crypt=crypt, idle_timeout=0.3)) as rpcx:
        caller = RpcxCaller(kcp=KcpOptions(crypt=crypt, idle_timeout=60))
        async with Client(rpcx.address, caller, close_caller=True) as client:
            for i in range(20):
                assert await client.call("Arith", "Mul", {"A": 6, "B": i}, timeout=5) == {"C": 6 * i}
            conn = await caller.connection(rpcx.address)
            await wait_until(lambda: not rpcx.connections, timeout=5)
            assert conn.is_open
            assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
            assert await caller.connection(rpcx.address) is conn  # the same client session
            (resumed,) = rpcx.connections
            assert resumed.transport is not None
            assert resumed.transport.session.rcv_nxt > 20  # type: ignore[attr-defined]
    await server.dispatcher.aclose()


async def test_garbage_datagrams_are_dropped_and_the_server_keeps_serving() -> None:
    """Random datagrams, datagrams of another key, and well-sealed datagrams
    (right key, right checksum) carrying random segments, from many source
    ports: none opens a working session or stops the listener."""
    import random
    import socket

    from rpc.transport.kcpwire import PacketCodec

    rng = random.Random(7)
    server = arith_server()
    async with RpcxServer(server, "kcp@127.0.0.1:0", kcp=RPCX) as rpcx:
        target = (rpcx.endpoint.host, rpcx.endpoint.port)
        sealed = PacketCodec(RPCX.crypt)
        foreign = PacketCodec(KcpCrypt.from_passphrase("other"))
        socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(8)]
        try:
            for i in range(600):
                body = rng.randbytes(rng.randrange(0, 200))
                kind = i % 3
                dgram = body if kind == 0 else (foreign if kind == 1 else sealed).encode(body)
                socks[i % len(socks)].sendto(dgram, target)
        finally:
            for s in socks:
                s.close()
        async with Client(rpcx.address, RpcxCaller(kcp=RPCX), close_caller=True) as client:
            assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
    await server.dispatcher.aclose()


async def test_nobody_listening_fails_the_call_at_once() -> None:
    """No handshake, but a connected UDP socket hears the port unreachable:
    the call fails long before its deadline."""
    from tests.netutil import free_port

    async with Client(f"kcp@127.0.0.1:{free_port()}", RpcxCaller(kcp=RPCX), close_caller=True) as client:
        started = time.monotonic()
        with pytest.raises(TransportError):
            await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5)
        assert time.monotonic() - started < 2


async def test_kcp_over_ipv6() -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    server = arith_server()
    async with RpcxServer(server, "kcp@[::1]:0", kcp=RPCX) as rpcx:
        assert rpcx.address.startswith("kcp@[::1]:")
        async with Client(rpcx.address, RpcxCaller(kcp=RPCX), close_caller=True) as client:
            assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
    await server.dispatcher.aclose()
