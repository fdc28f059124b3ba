"""Client certificates (mutual TLS) on the balancer, end to end: a real
rustext.Balancer, a real backend echoing the headers it got, and real
clients (Python's ssl, aiohttp, curl over HTTP/1.1 and HTTP/2, openssl
s_client) with certificates made here with ``cryptography``: a CA the
balancer trusts, another CA, a valid client, one of the other CA, an
expired one, a revoked one.

``tls.client_verify = "required"`` and ``"optional"``, a listener's own
``client_verify`` (``"off"`` too); a revocation list; refusals at the
handshake (a TLS alert, never an HTTP answer); the identity headers and
their formats; spoofed identity headers removed on TLS and cleartext
listeners, on the fast path and on hyper's; routes by the certificate's
subject and by its absence.
"""

from __future__ import annotations

import asyncio
import datetime
import http.client
import ipaddress
import json
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from balancer_helpers import lb_config, split_response, start_backend
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import rustext
from balancer.config import from_dict
from balancer.errors import BalancerConfigError

pytestmark = [pytest.mark.timeout(60)]

HEADERS = {"subject": "X-SSL-Client-DN", "fingerprint": "X-SSL-Client-SHA256", "verified": "X-SSL-Client-Verify",
           "serial": "X-SSL-Client-Serial", "san": "X-SSL-Client-SAN"}
SPOOF = [(name, "spoofed") for name in HEADERS.values()]
ROUTES = [
    {"client_cert": {"subject_prefix": "CN=admin,"}, "respond": {"status": 200, "body": "admin area\n"}},
    {"path": "/anonymous", "client_cert": {"verified": False}, "respond": {"status": 200, "body": "anonymous\n"}},
]


@dataclass(frozen=True)
class Cert:
    cert: Path
    key: Path
    x509: x509.Certificate


class Pki:
    """Two CAs and the certificates of the tests, as PEM files in ``dir``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.now = datetime.datetime.now(datetime.UTC)
        self.ca, self._ca_key = self._ca("test client CA")
        self.other_ca, self._other_key = self._ca("another CA")
        self.ca_file = self._write_ca(self.ca, "ca")

    def _ca(self, cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(self.now - datetime.timedelta(days=1))
                .not_valid_after(self.now + datetime.timedelta(days=30))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        return cert, key

    def crl(self, *revoked: x509.Certificate) -> Path:
        """A revocation list of the CA naming ``revoked``."""
        b = (x509.CertificateRevocationListBuilder().issuer_name(self.ca.subject)
             .last_update(self.now - datetime.timedelta(hours=1)).next_update(self.now + datetime.timedelta(days=1))
             .add_extension(x509.CRLNumber(1), critical=False)  # RFC 5280 requires it, as the verifier does
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                            critical=False))
        for c in revoked:
            b = b.add_revoked_certificate(x509.RevokedCertificateBuilder().serial_number(c.serial_number)
                                          .revocation_date(self.now - datetime.timedelta(hours=1)).build())
        path = self.dir / "crl.pem"
        path.write_bytes(b.sign(self._ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
        return path

    def _write_ca(self, cert: x509.Certificate, name: str) -> Path:
        path = self.dir / f"{name}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    def issue(self, name: str, subject: x509.Name, *, server: bool = False, other_ca: bool = False,
              expired: bool = False, serial: int | None = None,
              san: list[x509.GeneralName] | None = None) -> Cert:
        key = ec.generate_private_key(ec.SECP256R1())
        ca, ca_key = (self.other_ca, self._other_key) if other_ca else (self.ca, self._ca_key)
        start, end = ((self.now - datetime.timedelta(days=10), self.now - datetime.timedelta(days=1)) if expired
                      else (self.now - datetime.timedelta(days=1), self.now + datetime.timedelta(days=10)))
        usage = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject).public_key(key.public_key())
             .serial_number(serial or x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = b.sign(ca_key, hashes.SHA256())
        path, key_path = self.dir / f"{name}.pem", self.dir / f"{name}-key.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return Cert(path, key_path, cert)


def dn(**parts: str) -> x509.Name:
    oids = {"C": NameOID.COUNTRY_NAME, "O": NameOID.ORGANIZATION_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
            "CN": NameOID.COMMON_NAME}
    return x509.Name([x509.NameAttribute(oids[k], v) for k, v in parts.items()])


@dataclass(frozen=True)
class Certs:
    pki: Pki
    server: Cert
    admin: Cert
    bob: Cert
    stranger: Cert
    expired: Cert
    revoked: Cert
    crl: Path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    pki = Pki(tmp_path_factory.mktemp("mtls"))
    server = pki.issue("server", dn(CN="localhost"), server=True,
                       san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    # a subject needing RFC 4514 escapes, and every kind of SAN the header carries
    admin = pki.issue("admin", dn(C="DE", O="Example, Inc.", OU="ops+dev", CN="admin"), serial=0x1234ABCD,
                      san=[x509.DNSName("admin.example"), x509.RFC822Name("admin@example.com"),
                           x509.UniformResourceIdentifier("spiffe://example/admin"),
                           x509.IPAddress(ipaddress.ip_address("192.0.2.7"))])
    bob = pki.issue("bob", dn(O="Example", CN="bob"))
    stranger = pki.issue("stranger", dn(CN="admin"), other_ca=True)
    expired = pki.issue("expired", dn(CN="admin"), expired=True)
    revoked = pki.issue("revoked", dn(CN="admin"))
    return Certs(pki, server, admin, bob, stranger, expired, revoked, pki.crl(revoked.x509))


@pytest.fixture(scope="module")
def backend() -> Iterator[Any]:
    b = start_backend("b0")
    yield b
    b.kill()


def start_lb(certs: Certs, backend: Any, verify: str) -> rustext.Balancer:
    """A balancer with an HTTPS listener (client certificates ``verify``),
    a cleartext one, and HTTPS listeners of their own ``client_verify``
    (``"off"``, ``"optional"``), all with ``ROUTES``; ``certs.crl`` revokes
    ``certs.revoked``."""
    listener = {"address": "127.0.0.1:0", "default_backend": "default", "routes": ROUTES}
    lb = rustext.Balancer(lb_config(
        [backend], workers=1,
        tls={"certificates": [{"cert": str(certs.server.cert), "key": str(certs.server.key)}],
             "client_ca": str(certs.pki.ca_file), "client_verify": verify, "client_crl": str(certs.crl),
             "client_cert_headers": HEADERS},
        listeners=[{**listener, "tls": True}, listener, {**listener, "tls": True, "client_verify": "off"},
                   {**listener, "tls": True, "client_verify": "optional"}]))
    lb.start()
    return lb


@pytest.fixture(scope="module")
def required_lb(certs: Certs, backend: Any) -> Iterator[rustext.Balancer]:
    lb = start_lb(certs, backend, "required")
    yield lb
    lb.close()


@pytest.fixture(scope="module")
def required(required_lb: rustext.Balancer) -> tuple[int, int]:
    """(HTTPS port, cleartext port) of a balancer requiring certificates."""
    (_, tls_port), (_, plain_port), *_ = required_lb.addresses
    return tls_port, plain_port


@pytest.fixture(scope="module")
def optional(certs: Certs, backend: Any) -> Iterator[tuple[int, int]]:
    lb = start_lb(certs, backend, "optional")
    (_, tls_port), (_, plain_port), *_ = lb.addresses
    yield tls_port, plain_port
    lb.close()


def ctx(certs: Certs, client: Cert | None, *, version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    c = ssl.create_default_context(cafile=str(certs.pki.ca_file))
    if client is not None:
        c.load_cert_chain(str(client.cert), str(client.key))
    if version is not None:
        c.minimum_version = c.maximum_version = version
    return c


def get(port: int, context: ssl.SSLContext, path: str = "/headers",
        headers: list[tuple[str, str]] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=10)
    try:
        conn.putrequest("GET", path)
        for k, v in headers or ():
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def seen(body: bytes) -> dict[str, list[str]]:
    """The backend's echo: every value of each (lower-cased) request field."""
    out: dict[str, list[str]] = {}
    for k, v in json.loads(body)["headers"]:
        out.setdefault(k.lower(), []).append(v)
    return out


def identity(c: Cert) -> dict[str, list[str]]:
    """The headers the balancer must send for certificate ``c``."""
    serial = c.x509.serial_number.to_bytes((c.x509.serial_number.bit_length() + 8) // 8, "big").lstrip(b"\0")
    if serial[0] & 0x80:
        serial = b"\0" + serial  # as DER encodes a positive INTEGER
    out = {"x-ssl-client-dn": [c.x509.subject.rfc4514_string()],
           "x-ssl-client-sha256": [c.x509.fingerprint(hashes.SHA256()).hex()],
           "x-ssl-client-verify": ["SUCCESS"],
           "x-ssl-client-serial": [serial.hex().upper()]}
    try:
        san = c.x509.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return out
    kinds = {x509.DNSName: "DNS", x509.RFC822Name: "email", x509.UniformResourceIdentifier: "URI",
             x509.IPAddress: "IP"}
    out["x-ssl-client-san"] = [", ".join(f"{kinds[type(n)]}:{n.value}" for n in san)]
    return out


def identity_of(echo: dict[str, list[str]]) -> dict[str, list[str]]:
    return {k: v for k, v in echo.items() if k.startswith("x-ssl-client-")}


def test_a_verified_client_passes_its_identity_and_spoofing_is_removed(certs: Certs, required: tuple[int, int]) -> None:
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        status, body = get(required[0], ctx(certs, certs.bob, version=version), headers=SPOOF)
        assert status == 200
        assert identity_of(seen(body)) == identity(certs.bob)
    # the formats, spelled out once: RFC 4514 (most specific first, escapes), hex
    status, body = get(required[0], ctx(certs, certs.admin), path="/x", headers=SPOOF)
    assert (status, body) == (200, b"admin area\n")  # routed by subject (below)
    expected = identity(certs.admin)
    assert expected["x-ssl-client-dn"] == ["CN=admin,OU=ops\\+dev,O=Example\\, Inc.,C=DE"]
    assert expected["x-ssl-client-serial"] == ["1234ABCD"]
    assert expected["x-ssl-client-san"] == [
        "DNS:admin.example, email:admin@example.com, URI:spiffe://example/admin, IP:192.0.2.7"]


def test_routes_by_subject(certs: Certs, required: tuple[int, int], optional: tuple[int, int]) -> None:
    for port in (required[0], optional[0]):
        assert get(port, ctx(certs, certs.admin), "/any") == (200, b"admin area\n")
        status, body = get(port, ctx(certs, certs.bob), "/headers")  # bob is no admin: the backend
        assert status == 200 and seen(body)["x-ssl-client-dn"] == ["CN=bob,O=Example"]
        # `verified = false` holds for none of them
        assert get(port, ctx(certs, certs.bob), "/anonymous")[1] != b"anonymous\n"
    # a client without a certificate (optional) is anonymous, however it names itself
    assert get(optional[0], ctx(certs, None), "/anonymous", headers=[("X-SSL-Client-DN", "CN=admin,")]) == (
        200, b"anonymous\n")


def refused_at_handshake(port: int, context: ssl.SSLContext) -> str:
    """The TLS error a client gets; fails if any HTTP comes back. With TLS
    1.3 the client's handshake completes before the server has checked
    its certificate: the alert arrives on the first read."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"GET /headers HTTP/1.1\r\nHost: localhost\r\n\r\n")
                data = s.recv(65536)
        except ssl.SSLError as exc:
            return str(exc)
    assert not data.startswith(b"HTTP/"), data
    return "closed"


@pytest.mark.parametrize("who", ["none", "stranger", "expired", "revoked"])
def test_required_refuses_at_the_handshake(certs: Certs, required: tuple[int, int], who: str) -> None:
    client = {"none": None, "stranger": certs.stranger, "expired": certs.expired, "revoked": certs.revoked}[who]
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        err = refused_at_handshake(required[0], ctx(certs, client, version=version))
        assert "ALERT" in err.upper() or err == "closed", err


@pytest.mark.parametrize("who", ["stranger", "expired", "revoked"])
def test_optional_still_refuses_an_invalid_certificate(certs: Certs, optional: tuple[int, int], who: str) -> None:
    client = {"stranger": certs.stranger, "expired": certs.expired, "revoked": certs.revoked}[who]
    err = refused_at_handshake(optional[0], ctx(certs, client))
    assert "ALERT" in err.upper() or err == "closed", err


def test_optional_lets_a_client_without_certificate_in_without_identity(certs: Certs,
                                                                        optional: tuple[int, int]) -> None:
    status, body = get(optional[0], ctx(certs, None), headers=SPOOF)
    assert status == 200
    assert identity_of(seen(body)) == {}
    status, body = get(optional[0], ctx(certs, certs.bob), headers=SPOOF)
    assert status == 200 and identity_of(seen(body)) == identity(certs.bob)


def test_a_listener_of_its_own_client_verify(certs: Certs, required_lb: rustext.Balancer) -> None:
    """On a balancer requiring certificates, a listener with
    ``client_verify = "off"`` asks for none (a client's certificate is not
    even sent), one with ``"optional"`` lets clients without one in."""
    _, _, (_, off), (_, opt) = required_lb.addresses
    for client in (None, certs.bob):
        status, body = get(off, ctx(certs, client), headers=SPOOF)
        assert status == 200 and identity_of(seen(body)) == {}
    status, body = get(opt, ctx(certs, None), headers=SPOOF)
    assert status == 200 and identity_of(seen(body)) == {}
    status, body = get(opt, ctx(certs, certs.bob), headers=SPOOF)
    assert status == 200 and identity_of(seen(body)) == identity(certs.bob)
    for bad in (certs.stranger, certs.revoked):
        err = refused_at_handshake(opt, ctx(certs, bad))
        assert "ALERT" in err.upper() or err == "closed", err


def s_client(port: int, certs: Certs, client: Cert | None) -> subprocess.CompletedProcess[str]:
    openssl = shutil.which("openssl")
    assert openssl is not None, "openssl (the s_client of this test) is not installed"
    args = [openssl, "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost", "-tls1_2", "-ign_eof",
            "-CAfile", str(certs.pki.ca_file)]
    if client is not None:
        args += ["-cert", str(client.cert), "-key", str(client.key)]
    return subprocess.run(args, input="GET /headers HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                          check=False, capture_output=True, text=True, timeout=20)


def test_openssl_s_client_sees_the_alerts(certs: Certs, required: tuple[int, int]) -> None:
    out = s_client(required[0], certs, None)
    assert out.returncode != 0 and "alert" in out.stderr.lower(), out.stderr
    assert "HTTP/1.1" not in out.stdout
    for bad in (certs.stranger, certs.expired, certs.revoked):
        out = s_client(required[0], certs, bad)
        assert out.returncode != 0 and "alert" in out.stderr.lower(), out.stderr
        assert "HTTP/1.1" not in out.stdout
    out = s_client(required[0], certs, certs.bob)
    assert out.returncode == 0 and "HTTP/1.1 200" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
def test_curl_with_a_client_certificate(certs: Certs, required: tuple[int, int], proto: str) -> None:
    curl = shutil.which("curl")
    assert curl is not None, "curl (the HTTP/2 client of this test) is not installed"
    base = [curl, "-s", proto, "--cacert", str(certs.pki.ca_file), "-w", "\n%{http_version}",
            "-H", "X-SSL-Client-DN: spoofed", "-H", "x-ssl-client-verify: spoofed"]
    url = f"https://localhost:{required[0]}/headers"
    out = subprocess.run([*base, "--cert", str(certs.bob.cert), "--key", str(certs.bob.key), url],
                         check=False, capture_output=True, text=True, timeout=30)
    body, _, version = out.stdout.rpartition("\n")
    assert out.returncode == 0 and version == ("2" if proto == "--http2" else "1.1"), out.stderr
    assert identity_of(seen(body.encode())) == identity(certs.bob)
    out = subprocess.run([*base, "--cert", str(certs.admin.cert), "--key", str(certs.admin.key),
                          f"https://localhost:{required[0]}/"], check=False, capture_output=True, text=True, timeout=30)
    assert out.stdout.startswith("admin area\n"), out.stdout + out.stderr
    # no certificate: curl fails at TLS (35) or on the connection the alert closed (55, 56), no HTTP
    out = subprocess.run([*base, url], check=False, capture_output=True, text=True, timeout=30)
    assert out.returncode in (35, 55, 56) and out.stdout.endswith("\n0"), (out.returncode, out.stdout)


def test_aiohttp_client(certs: Certs, optional: tuple[int, int]) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"https://localhost:{optional[0]}/headers", ssl=ctx(certs, certs.admin),
                             headers=SPOOF[:1]) as r:
                assert r.status == 200
                assert await r.text() == "admin area\n"
            async with s.get(f"https://localhost:{optional[0]}/anonymous", ssl=ctx(certs, None)) as r:
                assert await r.text() == "anonymous\n"
            async with s.get(f"https://localhost:{optional[0]}/headers", ssl=ctx(certs, certs.bob)) as r:
                assert identity_of(seen(await r.read())) == identity(certs.bob)

    asyncio.run(main())


@pytest.mark.parametrize("chunked", [False, True], ids=["fast path", "hyper's path"])
def test_cleartext_listeners_remove_spoofed_identity_on_both_paths(required: tuple[int, int], chunked: bool) -> None:
    """Over cleartext there is no certificate: the headers a client sends
    are removed, and a route on a certificate's absence holds."""
    spoof = "".join(f"{k}: {v}\r\n" for k, v in SPOOF).encode()
    body = b"Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n" if chunked else b"Content-Length: 1\r\n\r\nx"
    for path, check in ((b"/headers", "echo"), (b"/anonymous", "route")):
        with socket.create_connection(("127.0.0.1", required[1]), timeout=10) as s:
            s.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + spoof + body)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        status, _, payload = split_response(data)
        assert " 200 " in status + " ", status
        if check == "echo":
            assert identity_of(seen(payload)) == {}
        else:
            assert payload == b"anonymous\n"


def test_a_reload_naming_other_headers_keeps_the_running_ones_removed(certs: Certs, backend: Any) -> None:
    """The headers the running TLS fills in are fixed until a restart: a
    reload naming others must not let clients send the running names."""
    def config(names: dict[str, str]) -> Any:
        return lb_config([backend], workers=1, listeners=[
            {"address": "127.0.0.1:0", "tls": True, "default_backend": "default"}],
            tls={"certificates": [{"cert": str(certs.server.cert), "key": str(certs.server.key)}],
                 "client_ca": str(certs.pki.ca_file), "client_verify": "optional", "client_cert_headers": names})

    lb = rustext.Balancer(config(HEADERS))
    lb.start()
    try:
        lb.update(config({**HEADERS, "subject": "X-Client-Subject"}))
        status, body = get(lb.addresses[0][1], ctx(certs, None), headers=[*SPOOF, ("X-Client-Subject", "spoofed")])
        assert status == 200
        echo = seen(body)
        assert identity_of(echo) == {} and "x-client-subject" not in echo
    finally:
        lb.close()


def test_configuration_errors(certs: Certs) -> None:
    tls = {"certificates": [{"cert": str(certs.server.cert), "key": str(certs.server.key)}],
           "client_ca": str(certs.pki.ca_file)}
    base: dict[str, Any] = {"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]}
    cases = [
        ({**tls, "client_verify": "sometimes"}, "tls.client_verify"),
        ({**tls, "client_cert_headers": {"subject": "X DN"}}, "tls.client_cert_headers.subject"),
        ({**tls, "client_cert_headers": {"subject": "X-A", "serial": "x-a"}}, "named twice"),
        ({**tls, "client_cert_headers": {"bogus": "X-A"}}, "bogus"),
        ({"certificates": tls["certificates"], "client_cert_headers": {"subject": "X-A"}}, "needs tls.client_ca"),
        ({"certificates": tls["certificates"], "client_crl": str(certs.crl)}, "needs tls.client_ca"),
        ({**tls, "client_crl": str(certs.pki.dir / "missing.pem")}, "no such file"),
    ]
    for t, message in cases:
        with pytest.raises(BalancerConfigError, match=message):
            from_dict({**base, "tls": t})
    listener = {"address": "127.0.0.1:0", "default_backend": "default"}
    for listeners, t, message in [
        ([{**listener, "tls": True, "client_verify": "maybe"}], tls, "client_verify"),
        ([{**listener, "client_verify": "optional"}], tls, "needs an HTTPS listener"),
        ([{**listener, "tls": True, "client_verify": "optional"}], {"certificates": tls["certificates"]},
         "needs tls.client_ca"),
    ]:
        with pytest.raises(BalancerConfigError, match=message):
            from_dict({"backends": ["127.0.0.1:1"], "listeners": listeners, "tls": t})
    for cond, message in [({"verified": False, "subject": "CN=x"}, "needs verified"),
                          ({"subject": "CN=x", "subject_prefix": "CN="}, "not both"),
                          ({"subject_prefix": ""}, "non-empty"), ({"verified": "yes"}, "true or false")]:
        with pytest.raises(BalancerConfigError, match=message):
            from_dict({**base, "routes": [{"client_cert": cond, "backend": "default"}]})
