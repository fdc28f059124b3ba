"""rpcx and the HTTP gateway over TLS: real handshakes on 127.0.0.1 with
certificates from the test CA (tests/tlsutil.py).

A client that trusts the CA calls; a wrong CA, an expired certificate and a
wrong host name are refused with a message naming the cause; mutual TLS
refuses a client without a certificate; a reload serves the new
certificate to new connections while an established one goes on.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rpc.client import Client
from rpc.errors import TransportError
from rpc.examples import register_example
from rpc.gateway import Gateway, GatewayServer
from rpc.gateway_client import HTTPCaller
from rpc.rpcx_client import RpcxCaller
from rpc.rpcx_server import RpcxServer
from rpc.server import Server
from rustext.tls import ClientTls, ServerTls
from tests.netutil import free_port
from tests.tlsutil import TestPKI, served_serial


def arith_server() -> Server:
    server = Server()
    register_example(server.registry, "arith")
    return server


async def mul(address: str, caller: Any) -> Any:
    async with Client(address, caller, close_caller=True) as client:
        return await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5)


async def test_rpcx_over_tls_and_https_on_the_same_port(pki: TestPKI) -> None:
    leaf = pki.leaf()
    server = arith_server()
    async with RpcxServer(server, "tcp@127.0.0.1:0", gateway=Gateway(server.dispatcher),
                          tls=ServerTls(cert=str(leaf.cert), key=str(leaf.key))) as rpcx:
        assert rpcx.tls
        assert await mul(rpcx.address, RpcxCaller(tls=ClientTls(ca=str(pki.ca)))) == {"C": 42}
        port = rpcx.endpoint.port
        assert await mul(f"https://127.0.0.1:{port}", HTTPCaller(tls=ClientTls(ca=str(pki.ca)))) == {"C": 42}
        # a plaintext rpcx client gets no answer from a TLS port
        with pytest.raises(TransportError):
            await mul(rpcx.address, RpcxCaller())
    await server.dispatcher.aclose()


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("wrong-ca", "unable to get local issuer certificate"),
        ("expired", "certificate has expired"),
        ("wrong-host", "mismatch, certificate is not valid for"),
    ],
)
async def test_a_bad_server_certificate_is_refused_with_its_reason(pki: TestPKI, tmp_path: Path, case: str,
                                                                   message: str) -> None:
    trusted = pki.ca
    if case == "wrong-ca":
        leaf = pki.leaf()
        trusted = TestPKI(tmp_path / "other").ca
    elif case == "expired":
        leaf = pki.leaf(expired=True)
    else:
        leaf = pki.leaf("elsewhere.example")
    server = arith_server()
    async with RpcxServer(server, "tcp@127.0.0.1:0", tls=ServerTls(cert=str(leaf.cert), key=str(leaf.key))) as rpcx:
        with pytest.raises(TransportError, match="server certificate refused") as err:
            await mul(rpcx.address, RpcxCaller(tls=ClientTls(ca=str(trusted))))
        assert message in str(err.value)
        # the server goes on serving clients that trust it
        if case == "wrong-ca":
            assert await mul(rpcx.address, RpcxCaller(tls=ClientTls(ca=str(pki.ca)))) == {"C": 42}
    await server.dispatcher.aclose()


async def test_mutual_tls_refuses_a_client_without_a_certificate(pki: TestPKI) -> None:
    leaf = pki.leaf()
    client_leaf = pki.leaf("client.example")
    server = arith_server()
    tls = ServerTls(cert=str(leaf.cert), key=str(leaf.key), client_ca=str(pki.ca))
    async with RpcxServer(server, "tcp@127.0.0.1:0", tls=tls) as rpcx:
        with pytest.raises(TransportError):
            await mul(rpcx.address, RpcxCaller(tls=ClientTls(ca=str(pki.ca))))
        with_cert = ClientTls(ca=str(pki.ca), cert=str(client_leaf.cert), key=str(client_leaf.key))
        assert await mul(rpcx.address, RpcxCaller(tls=with_cert)) == {"C": 42}
    await server.dispatcher.aclose()


async def test_reload_serves_the_new_certificate_while_old_connections_go_on(pki: TestPKI, tmp_path: Path) -> None:
    first, second = pki.leaf(name="first"), pki.leaf(name="second")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_bytes(first.cert.read_bytes())
    key.write_bytes(first.key.read_bytes())
    server = arith_server()
    async with RpcxServer(server, "tcp@127.0.0.1:0", tls=ServerTls(cert=str(cert), key=str(key))) as rpcx:
        port = rpcx.endpoint.port
        serial_before = await served_serial("127.0.0.1", port, pki.ca)
        async with Client(rpcx.address, RpcxCaller(tls=ClientTls(ca=str(pki.ca))), close_caller=True) as client:
            assert await client.call("Arith", "Mul", {"A": 2, "B": 3}, timeout=5) == {"C": 6}
            cert.write_bytes(second.cert.read_bytes())
            key.write_bytes(second.key.read_bytes())
            rpcx.reload_tls()
            # the established connection goes on with its session
            assert await client.call("Arith", "Mul", {"A": 3, "B": 3}, timeout=5) == {"C": 9}
            assert len(rpcx.connections) == 1
        assert await served_serial("127.0.0.1", port, pki.ca) != serial_before
        # an unusable file keeps the current certificate in service
        key.write_text("not a key")
        from rustext.tls import TlsConfigError

        with pytest.raises(TlsConfigError, match="key"):
            rpcx.reload_tls()
        assert await mul(rpcx.address, RpcxCaller(tls=ClientTls(ca=str(pki.ca)))) == {"C": 42}
    await server.dispatcher.aclose()


async def test_gateway_on_its_own_port_over_https(pki: TestPKI) -> None:
    leaf = pki.leaf()
    server = arith_server()
    ctx = ServerTls(cert=str(leaf.cert), key=str(leaf.key)).context()
    gw = GatewayServer(Gateway(server.dispatcher), "127.0.0.1", 0, ssl=ctx)
    await gw.start()
    try:
        assert await mul(f"https://localhost:{gw.port}", HTTPCaller(tls=ClientTls(ca=str(pki.ca)))) == {"C": 42}
        with pytest.raises(TransportError, match="server certificate refused"):
            await mul(f"https://localhost:{gw.port}", HTTPCaller())
    finally:
        await gw.aclose()
        await server.dispatcher.aclose()


def test_cli_serve_and_call_over_tls(pki: TestPKI) -> None:
    """``juggler rpc serve --tls-cert/--tls-key`` and ``juggler rpc call
    --tls-ca`` as real processes; a bad key file is refused in one line."""
    leaf = pki.leaf()
    port = free_port()
    juggler = [sys.executable, "-m", "cli"]
    bad = subprocess.run([*juggler, "rpc", "serve", "--listen", f"127.0.0.1:{port}", "--example", "arith",
                          "--tls-cert", str(leaf.cert), "--tls-key", str(pki.ca)],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "key" in bad.stderr and "Traceback" not in bad.stderr
    proc = subprocess.Popen([*juggler, "rpc", "serve", "--listen", f"127.0.0.1:{port}", "--example", "arith",
                             "--tls-cert", str(leaf.cert), "--tls-key", str(leaf.key)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "rpcx over TLS" in line, line
        ok = subprocess.run([*juggler, "rpc", "call", f"127.0.0.1:{port}", "Arith.Mul", '{"A":6,"B":7}',
                             "--tls-ca", str(pki.ca)], capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0 and ok.stdout.strip() == '{"C": 42}', ok.stderr
        refused = subprocess.run([*juggler, "rpc", "call", f"127.0.0.1:{port}", "Arith.Mul", '{"A":6,"B":7}',
                                  "--tls"], capture_output=True, text=True, timeout=30)
        assert refused.returncode == 1 and "server certificate refused" in refused.stderr
        assert "--tls-ca" in refused.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_client_context_defaults_are_strict() -> None:
    ctx = ClientTls().context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2


async def test_rsa_certificate(tmp_path: Path) -> None:
    rsa = TestPKI(tmp_path / "rsa", rsa=True)
    leaf = rsa.leaf()
    server = arith_server()
    async with RpcxServer(server, "tcp@127.0.0.1:0", tls=ServerTls(cert=str(leaf.cert), key=str(leaf.key))) as rpcx:
        assert await mul(rpcx.address, RpcxCaller(tls=ClientTls(ca=str(rsa.ca)))) == {"C": 42}
    await server.dispatcher.aclose()
