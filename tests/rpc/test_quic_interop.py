"""rpcx over QUIC with Go rpcx v1.9.1 built with its ``quic`` tag
(``tests/rpc/interop/go-quic``, quic-go through smallnest/quick):
a Go client → our server and our client → a Go server, both directions
verified against the test CA, plus the Go client's default (no TLS
configuration: it skips verification) and a Go server killed mid-call.
Without ``go`` the tests are skipped on a developer's machine and fail in
CI (``CI=true``)."""

from __future__ import annotations

import asyncio
import os
import selectors
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rpc.client import Client
from rpc.errors import CallTimeout, TransportError
from rpc.rpcx_client import RpcxCaller
from rustext.tls import ClientTls
from tests.netutil import free_port
from tests.rpc.gopeer import build_go_peer
from tests.rpc.test_rpcx_e2e import Served, serve
from tests.tlsutil import TestPKI


@pytest.fixture(scope="module")
def go_peer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_peer(tmp_path_factory, "go-quic", "the rpcx QUIC interop peer", tags="quic")


@pytest.fixture
def go_quic_server(go_peer: Path, pki: TestPKI) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    leaf = pki.leaf()
    addr = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([str(go_peer), "server", "quic", addr], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env={**os.environ, "TLS_CERT": str(leaf.cert), "TLS_KEY": str(leaf.key)})
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        assert sel.select(timeout=30) and proc.stdout.readline().startswith("ready"), "the Go server did not start"
        yield f"quic@{addr}", proc
    finally:
        sel.close()
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


def go_client(go_peer: Path, addr: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(go_peer), "client", "quic", addr, *args], capture_output=True, text=True, timeout=60,
                          check=False, env={**os.environ, **(env or {})})


def test_go_quic_client_calls_our_server(go_peer: Path, pki: TestPKI) -> None:
    leaf = pki.leaf()
    ours: Served = serve("--example", "arith", "--tls-cert", str(leaf.cert), "--tls-key", str(leaf.key),
                         listen="quic@127.0.0.1:0")
    try:
        addr = ours.address.removeprefix("quic@")
        res = go_client(go_peer, addr, "6", "7", "300", env={"TLS_CA": str(pki.ca)})  # 300 calls, one connection
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == '{"C":42}'
        # rpcx's default without a TLS configuration: no verification (the test CA is not trusted here)
        res = go_client(go_peer, addr, "6", "7")
        assert res.returncode == 0 and res.stdout.strip() == '{"C":42}', res.stderr
        # verifying against another CA fails the handshake
        other = TestPKI(pki.dir / "other")
        res = go_client(go_peer, addr, "6", "7", env={"TLS_CA": str(other.ca)})
        assert res.returncode != 0
    finally:
        ours.stop()


async def test_our_client_calls_a_go_quic_server(go_quic_server: tuple[str, subprocess.Popen[str]],
                                                 pki: TestPKI) -> None:
    address, _ = go_quic_server
    async with Client(address, RpcxCaller(pool=2, tls=ClientTls(ca=str(pki.ca))), close_caller=True) as client:
        for i in range(300):
            assert await client.call("Arith", "Mul", {"A": 6, "B": i}, timeout=5) == {"C": 6 * i}
        assert await client.call("Arith", "Add", {"A": 6, "B": 7}, timeout=5) == {"C": 13}
    # an explicit insecure client, like Go rpcx's default
    async with Client(address, RpcxCaller(tls=ClientTls(insecure=True)), close_caller=True) as client:
        assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}


async def test_a_go_quic_server_killed_fails_the_next_call_within_its_deadline(
        go_quic_server: tuple[str, subprocess.Popen[str]], pki: TestPKI) -> None:
    address, proc = go_quic_server
    caller = RpcxCaller(tls=ClientTls(ca=str(pki.ca)))
    async with Client(address, caller, close_caller=True) as client:
        assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
        conn = await caller.connection(address)
        proc.kill()
        proc.wait(timeout=10)
        started = time.monotonic()
        with pytest.raises((CallTimeout, TransportError)):
            await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=2)
        assert time.monotonic() - started < 2.5
    # closed, the connection waits a little for the dead server to acknowledge the request, then gives up
    assert conn.transport is not None
    await asyncio.wait_for(conn.transport.wait_closed(), 5)  # type: ignore[attr-defined]
