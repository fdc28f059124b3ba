"""HTTPS on the balancer: real handshakes against a real rustext.Balancer
and real backend processes, certificates from the test CA.

TLS 1.2 and 1.3 termination, SNI with several certificates, ALPN h2 (curl
as the HTTP/2 client) and http/1.1, X-Forwarded-Proto, the HTTP-to-HTTPS
redirect listener, reload of the certificate files while a connection goes
on, TLS to backends verified against a CA, a client stalling in its
handshake, bad certificate files refused at start.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from balancer_helpers import raw_exchange, split_response, start_backend

import rustext
from balancer.config import from_dict
from tests.tlsutil import TestPKI

pytestmark = [pytest.mark.timeout(120)]


def client_ctx(ca: Path, *, version: ssl.TLSVersion | None = None, alpn: list[str] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def get(port: int, path: str, ctx: ssl.SSLContext, host: str = "localhost") -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read(), {k.lower(): v for k, v in r.getheaders()}
    finally:
        conn.close()


def peer_names(port: int, ca: Path, server_name: str) -> list[str]:
    """The DNS names of the certificate a handshake naming ``server_name`` gets."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_name) as s:
            cert = s.getpeercert()
    return [v for k, v in cert.get("subjectAltName", ()) if k == "DNS"]


@pytest.fixture
def https_proxy(proxy: Any, backends: Any, pki: TestPKI) -> Any:
    leaf = pki.leaf("localhost", "127.0.0.1")
    bks = backends(1)
    lb = proxy(bks, tls={"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}]}, workers=1)
    return lb


def test_https_termination_tls12_and_tls13(https_proxy: Any, pki: TestPKI) -> None:
    port = https_proxy.address[1]
    assert https_proxy.tls
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        status, body, _ = get(port, "/headers", client_ctx(pki.ca, version=version))
        assert status == 200
        seen = json.loads(body)
        headers = {k.lower(): v for k, v in seen["headers"]}
        assert headers["x-forwarded-proto"] == "https"
        assert "proto=https" in headers["forwarded"]
    # a plaintext request to the TLS port gets no HTTP answer
    raw = raw_exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", timeout=10)
    assert not raw.startswith(b"HTTP/")


def test_sni_picks_the_certificate(proxy: Any, backends: Any, pki: TestPKI) -> None:
    default = pki.leaf("localhost", "127.0.0.1")
    a = pki.leaf("a.example")
    wild = pki.leaf("*.b.example")
    lb = proxy(backends(1), workers=1,
               tls={"certificates": [{"cert": str(c.cert), "key": str(c.key)} for c in (default, a, wild)]})
    port = lb.address[1]
    assert peer_names(port, pki.ca, "a.example") == ["a.example"]
    assert peer_names(port, pki.ca, "x.b.example") == ["*.b.example"]
    assert peer_names(port, pki.ca, "localhost") == ["localhost"]
    # an unknown name gets the default certificate, which the client then refuses
    with pytest.raises(ssl.SSLCertVerificationError):
        peer_names(port, pki.ca, "unknown.example")


def test_http2_through_curl(https_proxy: Any, pki: TestPKI) -> None:
    curl = shutil.which("curl")
    assert curl is not None, "curl (the HTTP/2 client of this test) is not installed"
    port = https_proxy.address[1]
    out = subprocess.run([curl, "-s", "--http2", "--cacert", str(pki.ca), "-w", "\n%{http_version}",
                          f"https://localhost:{port}/headers"], capture_output=True, text=True, timeout=30)
    body, _, version = out.stdout.rpartition("\n")
    assert out.returncode == 0 and version == "2", out.stderr
    headers = {k.lower(): v for k, v in json.loads(body)["headers"]}
    assert headers["host"] == f"localhost:{port}"  # from :authority
    assert headers["x-forwarded-proto"] == "https"
    posted = subprocess.run([curl, "-s", "--http2", "--cacert", str(pki.ca), "--data-binary", "@-",
                             f"https://localhost:{port}/echo"], input="x" * 100_000, capture_output=True,
                            text=True, timeout=30)
    assert posted.returncode == 0 and posted.stdout == "x" * 100_000
    # several streams on one connection
    sizes = (1, 5000, 200_000)
    many = subprocess.run([curl, "-s", "--http2", "--cacert", str(pki.ca), "-w", "%{http_code} ",
                           *[a for n in sizes for a in ("-o", "/dev/null", f"https://localhost:{port}/size/{n}")]],
                          capture_output=True, text=True, timeout=30)
    assert many.stdout.split() == ["200", "200", "200"]


def test_redirect_listener(proxy: Any, backends: Any, pki: TestPKI) -> None:
    leaf = pki.leaf()
    lb = proxy(backends(1), workers=1,
               tls={"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}], "redirect": "127.0.0.1:0"})
    rport = lb.redirect_address[1]
    status, headers, _ = split_response(
        raw_exchange(rport, b"GET /a/b?c=1 HTTP/1.1\r\nHost: example.com:8080\r\nConnection: close\r\n\r\n"))
    assert "308" in status
    assert headers["location"] == f"https://example.com:{lb.address[1]}/a/b?c=1"
    status, _, _ = split_response(raw_exchange(rport, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"))
    assert "400" in status
    with pytest.raises(rustext.BalancerConfigError, match="redirect"):
        from_dict({"listen": "127.0.0.1:0", "backends": [], "tls": {"redirect": "127.0.0.1:0"}})


def test_reload_serves_new_certificates_and_keeps_connections(proxy: Any, backends: Any, pki: TestPKI,
                                                              tmp_path: Path) -> None:
    old, new = pki.leaf("localhost", name="old"), pki.leaf("localhost", "new.example", name="new")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    shutil.copy(old.cert, cert)
    shutil.copy(old.key, key)
    lb = proxy(backends(1), workers=1, tls={"certificates": [{"cert": str(cert), "key": str(key)}]})
    port = lb.address[1]
    conn = http.client.HTTPSConnection("localhost", port, context=client_ctx(pki.ca), timeout=10)
    conn.request("GET", "/whoami")
    assert conn.getresponse().read() == b"b0"
    shutil.copy(new.cert, cert)
    shutil.copy(new.key, key)
    lb.reload_tls()
    conn.request("GET", "/whoami")  # the established connection goes on
    assert conn.getresponse().read() == b"b0"
    conn.close()
    assert "new.example" in peer_names(port, pki.ca, "localhost")
    key.write_text("garbage")
    with pytest.raises(rustext.BalancerConfigError, match=str(key)):
        lb.reload_tls()
    assert "new.example" in peer_names(port, pki.ca, "localhost")  # still the last good one


def test_tls_to_backends(proxy: Any, pki: TestPKI, tmp_path: Path) -> None:
    leaf = pki.leaf("127.0.0.1")
    b = start_backend("tls-b", tls=(str(leaf.cert), str(leaf.key)))
    other = TestPKI(tmp_path / "other")
    stranger = other.leaf("127.0.0.1")
    s = start_backend("stranger", tls=(str(stranger.cert), str(stranger.key)))
    try:
        lb = proxy([b], workers=1, tls={"backend": True, "backend_ca": str(pki.ca)})
        status, headers, body = split_response(
            raw_exchange(lb.address[1], b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
        assert "200" in status and body == b"tls-b"
        # a backend whose certificate does not verify is not used
        lb2 = proxy([s], workers=1, tls={"backend": True, "backend_ca": str(pki.ca)}, retries=0)
        status, _, _ = split_response(
            raw_exchange(lb2.address[1], b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
        assert status.split()[1] in ("502", "503")
    finally:
        b.kill()
        s.kill()


def test_a_client_stalling_in_its_handshake_is_dropped(proxy: Any, backends: Any, pki: TestPKI) -> None:
    leaf = pki.leaf()
    lb = proxy(backends(1), workers=1, timeouts={"header": 1}, tls={"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}]})
    with socket.create_connection(("127.0.0.1", lb.address[1]), timeout=10) as s:
        s.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
        # closed by the balancer (header_timeout 1 s) well before this socket's own 10 s timeout
        assert s.recv(1024) == b""
    # others are served meanwhile and after
    assert get(lb.address[1], "/whoami", client_ctx(pki.ca))[0] == 200


def test_bad_certificate_files_are_refused_naming_them(pki: TestPKI, tmp_path: Path) -> None:
    leaf, other = pki.leaf(), pki.leaf(name="other")
    with pytest.raises(rustext.BalancerConfigError, match="does not go with"):
        rustext.Balancer(from_dict({"listen": "127.0.0.1:0", "backends": [],
                                    "tls": {"certificates": [{"cert": str(leaf.cert), "key": str(other.key)}]}}))
    missing = tmp_path / "missing.pem"
    with pytest.raises(rustext.BalancerConfigError, match="missing.pem"):  # balancer.config finds out
        from_dict({"listen": "127.0.0.1:0", "backends": [],
                   "tls": {"certificates": [{"cert": str(missing), "key": str(leaf.key)}]}})
    # a file gone after the configuration was checked: the data plane names it
    shutil.copy(leaf.cert, missing)
    cfg = from_dict({"listen": "127.0.0.1:0", "backends": [],
                     "tls": {"certificates": [{"cert": str(missing), "key": str(leaf.key)}]}})
    missing.unlink()
    with pytest.raises(rustext.BalancerConfigError, match=r"tls\.certificates: .*missing\.pem"):
        rustext.Balancer(cfg)


def test_cli_https_with_redirect_and_sighup(backends: Any, pki: TestPKI, tmp_path: Path) -> None:
    from tests.netutil import free_port, wait_for_port

    bk = backends(1)[0]
    old, new = pki.leaf("localhost", name="old"), pki.leaf("localhost", "reloaded.example", name="new")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    shutil.copy(old.cert, cert)
    shutil.copy(old.key, key)
    port, rport = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "balancer", "--listen", f"127.0.0.1:{port}",
                             "--backends", bk.address, "--workers", "1", "--tls-cert", str(cert), "--tls-key", str(key),
                             "--http-redirect", f"127.0.0.1:{rport}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        wait_for_port(port, proc=proc)
        wait_for_port(rport, proc=proc)
        assert get(port, "/whoami", client_ctx(pki.ca))[1] == b"b0"
        status, headers, _ = split_response(
            raw_exchange(rport, b"GET /x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"))
        assert "308" in status and headers["location"] == f"https://localhost:{port}/x"
        shutil.copy(new.cert, cert)
        shutil.copy(new.key, key)
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "reloaded.example" not in peer_names(port, pki.ca, "localhost"):
            assert time.monotonic() < deadline, "SIGHUP did not reload the certificate"
            time.sleep(0.05)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "https://127.0.0.1" in err and "TLS certificates reloaded" in err


def test_rsa_certificates(proxy: Any, backends: Any, tmp_path: Path) -> None:
    """RSA keys as well as ECDSA ones (the test CA's chains: leaf + intermediate)."""
    rsa = TestPKI(tmp_path / "rsa", rsa=True)
    leaf = rsa.leaf()
    lb = proxy(backends(1), workers=1, tls={"certificates": [{"cert": str(leaf.cert), "key": str(leaf.key)}]})
    assert get(lb.address[1], "/whoami", client_ctx(rsa.ca))[1] == b"b0"
