"""rpcx over QUIC (``quic@host:port``, rpc/transport/quic.py): our client and
our server on real UDP sockets on 127.0.0.1, certificates from the test CA.

Calls, pooled and concurrent; verification (a wrong CA refused, an explicit
insecure client accepted); a listener without a certificate refused; a
server process killed in the middle of a call makes the call fail within
its deadline; the ``juggler rpc call`` command over QUIC.
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
from rustext.tls import ClientTls, ServerTls, TlsConfigError
from tests.netutil import wait_until
from tests.rpc.test_rpcx_e2e import Served, serve
from tests.tlsutil import TestPKI


def arith_server() -> Server:
    server = Server()
    register_example(server.registry, "arith")
    return server


def test_quic_addresses_and_endpoints() -> None:
    ep = Endpoint.parse("quic://127.0.0.1:8972")
    assert (ep.kind, ep.host, ep.port) == ("quic", "127.0.0.1", 8972)
    assert str(ep) == "quic://127.0.0.1:8972"
    assert endpoint_of("quic@127.0.0.1:8972") == ep
    assert address_of(Endpoint.parse("quic://[::1]:9")) == "quic@[::1]:9"
    with pytest.raises(ValueError, match="quic://host:port"):
        Endpoint.parse("quic://nowhere")


async def test_our_client_calls_our_server_over_quic(pki: TestPKI) -> None:
    leaf = pki.leaf()
    server = arith_server()
    async with RpcxServer(server, "quic@127.0.0.1:0", tls=ServerTls(cert=str(leaf.cert), key=str(leaf.key))) as rpcx:
        assert rpcx.address.startswith("quic@127.0.0.1:")
        caller = RpcxCaller(pool=2, tls=ClientTls(ca=str(pki.ca)))
        async with Client(rpcx.address, caller, close_caller=True) as client:
            assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
            replies = await asyncio.gather(*(client.call("Arith", "Add", {"A": i, "B": 1}, timeout=10)
                                             for i in range(300)))
            assert replies == [{"C": i + 1} for i in range(300)]
            big = "x" * 300_000  # many QUIC packets, one rpcx message
            assert await client.call("Arith", "Mul", {"A": 2, "B": 3, "pad": big}, timeout=10) == {"C": 6}
            conn = await caller.connection(rpcx.address)
            assert (await conn.heartbeat(b"hb", timeout=5)).heartbeat
            assert len(rpcx.connections) >= 1
    await server.dispatcher.aclose()


async def test_quic_verifies_the_server_unless_told_not_to(pki: TestPKI) -> None:
    leaf = pki.leaf()
    other = TestPKI(pki.dir / "other")
    server = arith_server()
    async with RpcxServer(server, "quic@127.0.0.1:0", tls=ServerTls(cert=str(leaf.cert), key=str(leaf.key))) as rpcx:
        with pytest.raises(TransportError):
            async with Client(rpcx.address, RpcxCaller(tls=ClientTls(ca=str(other.ca))),
                              close_caller=True) as client:
                await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5)
        with pytest.raises(TransportError):  # the system's trust store does not know the test CA
            async with Client(rpcx.address, RpcxCaller(), close_caller=True) as client:
                await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5)
        async with Client(rpcx.address, RpcxCaller(tls=ClientTls(insecure=True)), close_caller=True) as client:
            assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
    await server.dispatcher.aclose()


async def test_a_quic_listener_needs_a_certificate() -> None:
    with pytest.raises(ValueError, match="needs a certificate"):
        await RpcxServer(arith_server(), "quic@127.0.0.1:0").start()


def test_serve_refuses_quic_without_a_certificate() -> None:
    res = subprocess.run([sys.executable, "-m", "cli", "rpc", "serve", "--listen", "quic@127.0.0.1:0",
                          "--example", "arith"], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2
    assert "give --tls-cert and --tls-key" in res.stderr, res.stderr


def test_cli_serve_and_call_over_quic(pki: TestPKI) -> None:
    leaf = pki.leaf()
    ours: Served = serve("--example", "arith", "--tls-cert", str(leaf.cert), "--tls-key", str(leaf.key),
                         listen="quic@127.0.0.1:0")
    try:
        assert ours.address.startswith("quic@127.0.0.1:")
        res = subprocess.run([sys.executable, "-m", "cli", "rpc", "call", ours.address, "Arith.Mul", '{"A":6,"B":7}',
                              "--tls-ca", str(pki.ca), "--timeout", "5"], capture_output=True, text=True, timeout=60,
                             check=False)
        assert res.returncode == 0 and res.stdout.strip() == '{"C": 42}', res.stderr
        ours.signal(signal.SIGTERM)
        assert ours.wait() == 0
    finally:
        ours.stop()


async def test_a_server_killed_mid_call_fails_the_call_within_its_deadline(pki: TestPKI) -> None:
    leaf = pki.leaf()
    ours: Served = serve("--app", "tests.rpc.rpcx_app:setup", "--tls-cert", str(leaf.cert), "--tls-key", str(leaf.key),
                         listen="quic@127.0.0.1:0")
    try:
        caller = RpcxCaller(tls=ClientTls(ca=str(pki.ca)))
        async with Client(ours.address, caller, close_caller=True) as client:
            conn = await caller.connection(ours.address)
            call = asyncio.ensure_future(client.call("Probe", "Sleep", {"ms": 30_000}, timeout=3))
            await wait_until(lambda: client.call("Probe", "Stats", {}, timeout=5), timeout=10)

            async def sleeping() -> bool:
                return (await client.call("Probe", "Stats", {}, timeout=5))["active"] == 1

            await wait_until(sleeping, timeout=10)
            started = time.monotonic()
            ours.proc.kill()
            ours.proc.wait(timeout=10)
            with pytest.raises((CallTimeout, TransportError)):
                await asyncio.wait_for(call, 10)
            assert time.monotonic() - started < 3.5  # the call's own deadline, not QUIC's idle timeout
        # closed, the connection waits a little for the dead server to acknowledge the request, then gives up
        assert conn.transport is not None
        await asyncio.wait_for(conn.transport.wait_closed(), 5)  # type: ignore[attr-defined]
    finally:
        ours.stop()


async def test_mutual_tls_over_quic_is_refused_not_ignored(pki: TestPKI) -> None:
    """aioquic's server cannot ask for a client certificate: a listener told
    to require one refuses to start rather than let everyone in."""
    leaf = pki.leaf()
    rpcx = RpcxServer(arith_server(), "quic@127.0.0.1:0",
                      tls=ServerTls(cert=str(leaf.cert), key=str(leaf.key), client_ca=str(pki.ca)))
    with pytest.raises(TlsConfigError, match="mutual TLS"):
        await rpcx.start()
    res = subprocess.run([sys.executable, "-m", "cli", "rpc", "serve", "--listen", "quic@127.0.0.1:0", "--example",
                          "arith", "--tls-cert", str(leaf.cert), "--tls-key", str(leaf.key),
                          "--tls-client-ca", str(pki.ca)], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "mutual TLS is not available over QUIC" in res.stderr, res.stderr


async def test_writes_past_the_send_queue_wait_for_acknowledgements(pki: TestPKI) -> None:
    """A 3 MiB payload with a 256 KiB send queue: the writer is paused until
    the peer acknowledges, then resumes; the call completes intact."""
    from rpc.transport.config import ConnectionConfig, PoolConfig

    leaf = pki.leaf()
    server = arith_server()
    async with RpcxServer(server, "quic@127.0.0.1:0", tls=ServerTls(cert=str(leaf.cert), key=str(leaf.key))) as rpcx:
        config = PoolConfig(connection=ConnectionConfig(default_timeout=None, send_queue_bytes=256 << 10))
        caller = RpcxCaller(config=config, tls=ClientTls(ca=str(pki.ca)))
        async with Client(rpcx.address, caller, close_caller=True) as client:
            conn = await caller.connection(rpcx.address)
            assert conn.transport is not None
            assert conn.transport.get_write_buffer_limits()[1] == 256 << 10
            pad = "y" * (3 << 20)
            call = asyncio.ensure_future(client.call("Arith", "Mul", {"A": 2, "B": 3, "pad": pad}, timeout=30))
            # 3 MiB take aioquic thousands of datagrams: the backlog is seen before the reply
            await wait_until(lambda: conn.transport.get_write_buffer_size() > 256 << 10, timeout=10, interval=0)
            assert conn._write_paused  # the connection was told to stop writing
            assert await call == {"C": 6}
            assert conn.transport.get_write_buffer_size() < 256 << 10
    await server.dispatcher.aclose()
