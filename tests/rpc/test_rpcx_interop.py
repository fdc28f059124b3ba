"""Interop with Go rpcx (github.com/smallnest/rpcx v1.9.1): our client → a Go
rpcx server, a Go rpcx client → our server. The Go peer
(``tests/rpc/interop/go``) is built into a temporary directory (the build
needs the Go module proxy or a warm module cache). Without ``go`` the tests
are skipped on a developer's machine, and fail in CI (``CI=true``), where
interop must never go untested."""

from __future__ import annotations

import os
import selectors
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rpc.client import Client
from rpc.discovery.base import StaticDiscovery
from rpc.errors import ServiceError
from rpc.message import SerializeType
from rpc.rpcx_client import RpcxCaller
from rpc.xclient import XClient, XClientOptions
from tests.netutil import free_port
from tests.rpc.gopeer import build_go_peer
from tests.rpc.test_rpcx_e2e import Served, serve


@pytest.fixture(scope="module")
def go_peer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_peer(tmp_path_factory, "go", "the rpcx interop peer")


@pytest.fixture
def go_server(go_peer: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([str(go_peer), "server", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        assert sel.select(timeout=30), "the Go server did not start"
        assert proc.stdout.readline().startswith("ready"), "the Go server did not start"
        yield f"tcp@127.0.0.1:{port}"
    finally:
        sel.close()
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


async def test_our_client_calls_a_go_server(go_server: str) -> None:
    caller = RpcxCaller(pool=2)
    async with Client(go_server, caller, close_caller=True) as client:
        assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
        mp = Client(go_server, caller, serialize_type=SerializeType.MSGPACK)
        assert await mp.call("Arith", "Add", {"A": 6, "B": 7}, timeout=5) == {"C": 13}
        with pytest.raises(ServiceError, match="can't find method Nope"):
            await client.call("Arith", "Nope", {}, timeout=5)
        conn = await caller.connection(go_server)
        hb = await conn.heartbeat(b"hb", timeout=5)  # the Go server echoes heartbeats
        assert hb.heartbeat


def test_cli_call_against_a_go_server(go_server: str) -> None:
    import sys

    res = subprocess.run([sys.executable, "-m", "cli", "rpc", "call", go_server, "Arith.Mul", '{"A":6,"B":7}',
                          "--codec", "msgpack", "--timeout", "3"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == '{"C": 42}', res.stderr


async def test_xclient_across_go_and_python_servers(go_server: str) -> None:
    ours: Served = serve("--example", "arith")
    caller = RpcxCaller()
    try:
        xc = XClient("Arith", StaticDiscovery([go_server, ours.address]), caller, options=XClientOptions())
        async with xc:
            replies = await xc.broadcast("Mul", {"A": 6, "B": 7}, timeout=5)
            assert replies == {go_server: {"C": 42}, ours.address: {"C": 42}}
    finally:
        await caller.aclose()
        ours.stop()


def test_go_client_calls_our_server(go_peer: Path) -> None:
    ours: Served = serve("--example", "arith")
    try:
        res = subprocess.run([str(go_peer), "client", ours.address.removeprefix("tcp@"), "6", "7"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == '{"C":42}'
    finally:
        ours.stop()


def test_go_http_client_calls_our_server(go_peer: Path) -> None:
    """A Go client dialing ``http@host:port`` (HTTP ``CONNECT /_rpcx_``, then
    rpcx on that connection) calls our server: on the rpcx port (where the
    HTTP gateway answers too) and on the ``--gateway`` port."""
    gateway_port = free_port()
    ours: Served = serve("--example", "arith", "--gateway", f"127.0.0.1:{gateway_port}")
    try:
        for addr in (ours.address.removeprefix("tcp@"), f"127.0.0.1:{gateway_port}"):
            res = subprocess.run([str(go_peer), "httpclient", addr, "6", "7"],
                                 capture_output=True, text=True, timeout=60)
            assert res.returncode == 0, res.stderr
            assert res.stdout.strip() == '{"C":42}'
    finally:
        ours.stop()


def test_go_client_gets_cant_find_method_for_a_method_not_in_the_allow_list(go_peer: Path) -> None:
    """A method left out of ``register(methods=[...])`` answers a Go client as
    a Go server answers an unknown method."""
    ours: Served = serve("--app", "tests.rpc.rpcx_app:setup_add_only")
    try:
        res = subprocess.run([str(go_peer), "client", ours.address.removeprefix("tcp@"), "6", "7"],
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 1
        assert res.stderr.strip() == "call failed: rpcx: can't find method Mul"
    finally:
        ours.stop()


def test_our_server_pushes_to_a_go_bidirectional_client(go_peer: Path) -> None:
    """A Go rpcx bidirectional XClient (with heartbeats every 50 ms) calls
    Probe.Push on our server and receives the pushed messages."""
    ours: Served = serve("--app", "tests.rpc.rpcx_app:setup")
    try:
        res = subprocess.run([str(go_peer), "push", ours.address.removeprefix("tcp@"), "3"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert res.stdout.splitlines() == [
            '{"pushed":3}', 'Client Event {"i":0}', 'Client Event {"i":1}', 'Client Event {"i":2}', "ok",
        ]
    finally:
        ours.stop()


# --- over TLS ------------------------------------------------------------------------


def test_go_client_calls_our_server_over_tls(go_peer: Path, pki: Any) -> None:
    """A Go rpcx client (``client.Option.TLSConfig``, verifying against the
    test CA) calls our ``juggler rpc serve --tls-cert/--tls-key``; with
    mutual TLS it presents its certificate."""
    leaf, client_leaf = pki.leaf(), pki.leaf("go-client")
    ours: Served = serve("--example", "arith", "--tls-cert", str(leaf.cert), "--tls-key", str(leaf.key),
                         "--tls-client-ca", str(pki.ca))
    env = {**os.environ, "TLS_CA": str(pki.ca)}
    try:
        addr = ours.address.removeprefix("tcp@")
        refused = subprocess.run([str(go_peer), "client", addr, "6", "7"], capture_output=True, text=True,
                                 timeout=60, env=env)
        assert refused.returncode != 0  # no client certificate
        res = subprocess.run([str(go_peer), "client", addr, "6", "7"], capture_output=True, text=True, timeout=60,
                             env={**env, "TLS_CLIENT_CERT": str(client_leaf.cert),
                                  "TLS_CLIENT_KEY": str(client_leaf.key)})
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == '{"C":42}'
    finally:
        ours.stop()


async def test_our_client_calls_a_go_server_over_tls(go_peer: Path, pki: Any) -> None:
    from rustext.tls import ClientTls

    leaf = pki.leaf()
    port = free_port()
    proc = subprocess.Popen([str(go_peer), "server", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "TLS_CERT": str(leaf.cert), "TLS_KEY": str(leaf.key)})
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        assert sel.select(timeout=30) and proc.stdout.readline().startswith("ready"), "the Go server did not start"
        address = f"tcp@127.0.0.1:{port}"
        async with Client(address, RpcxCaller(tls=ClientTls(ca=str(pki.ca))), close_caller=True) as client:
            assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
    finally:
        sel.close()
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


def test_go_client_with_auth_against_jwt_verification(go_peer: Path, tmp_path: Path) -> None:
    """``juggler rpc serve --jwt-public-key`` checks the JWT a Go rpcx client
    sends with ``XClient.Auth``: a valid one is served, an expired one or one
    signed by another key is refused."""
    import time

    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    pub = tmp_path / "issuer.pem"
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo))
    ours: Served = serve("--example", "arith", "--jwt-public-key", str(pub), "--jwt-audience", "rpc")
    now = time.time()
    good = jwt.encode({"sub": "go", "aud": "rpc", "exp": now + 60}, key, algorithm="ES256")
    expired = jwt.encode({"sub": "go", "aud": "rpc", "exp": now - 60}, key, algorithm="ES256")
    forged = jwt.encode({"sub": "go", "aud": "rpc", "exp": now + 60}, other, algorithm="ES256")
    try:
        addr = ours.address.removeprefix("tcp@")

        def call(token: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(go_peer), "client", addr, "6", "7"], capture_output=True, text=True,
                                  timeout=60, env={**os.environ, "AUTH": token})

        ok = call(good)
        assert ok.returncode == 0 and ok.stdout.strip() == '{"C":42}', ok.stderr
        for bad in (expired, forged, "not-a-jwt"):
            refused = call(bad)
            assert refused.returncode != 0 and "auth" in refused.stderr.lower(), refused.stderr
    finally:
        ours.stop()
