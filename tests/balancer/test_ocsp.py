"""OCSP stapling (balancer/ocsp.py): `openssl ocsp` as the CA's responder, the
balancer serving several certificates by SNI, and `openssl s_client -status`
as the client that reads the staple.

The PKI: a CA, a delegated OCSP responder certificate it issued, and leaves
naming the responder in their AIA: one good, one revoked in the responder's
index, one without OCSP URL, one naming a responder that is not running.
The responder answers with ``-nmin 1``: responses valid one minute.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import select
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from balancer_helpers import lb_config
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import ocsp
from cryptography.x509.oid import (
    AuthorityInformationAccessOID,
    ExtendedKeyUsageOID,
    NameOID,
)

import rustext
from balancer.config import from_dict
from balancer.errors import BalancerConfigError
from balancer.metrics import exposition, registry_for
from balancer.ocsp import (
    OcspError,
    OcspStapler,
    build_request,
    check_response,
    ocsp_url,
    refresh_delay,
)
from balancer.service import LoadBalancer
from tests.netutil import free_port, wait_until

pytestmark = [pytest.mark.timeout(90)]

NOW = datetime.datetime.now(datetime.UTC)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None = None,
           chain: tuple[x509.Certificate, ...] = ()) -> None:
    path.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (cert, *chain)))
    if key is not None:
        path.with_suffix(".key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


@dataclass
class Pki:
    dir: Path
    ca: x509.Certificate
    ca_key: ec.EllipticCurvePrivateKey
    port: int  # the responder's

    def issue(self, cn: str, *, url: str | None = None, responder: bool = False) -> x509.Certificate:
        """A certificate of the CA written as CN.pem (with the CA after it) and CN.key."""
        key = _key()
        b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(self.ca.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(NOW - datetime.timedelta(hours=1))
             .not_valid_after(NOW + datetime.timedelta(days=2)))
        if responder:
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.OCSP_SIGNING]), critical=False)
        else:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(cn)]), critical=False)
            if url is not None:
                b = b.add_extension(x509.AuthorityInformationAccess([x509.AccessDescription(
                    AuthorityInformationAccessOID.OCSP, x509.UniformResourceIdentifier(url))]), critical=False)
        cert = b.sign(self.ca_key, hashes.SHA256())
        _write(self.dir / f"{cn}.pem", cert, key, () if responder else (self.ca,))
        return cert

    def pair(self, cn: str) -> dict[str, str]:
        return {"cert": str(self.dir / f"{cn}.pem"), "key": str(self.dir / f"{cn}.key")}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("ocsp")
    ca_key = _key()
    ca = (x509.CertificateBuilder().subject_name(_name("test OCSP CA")).issuer_name(_name("test OCSP CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(NOW - datetime.timedelta(days=1)).not_valid_after(NOW + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    _write(d / "ca.pem", ca, ca_key)
    p = Pki(d, ca, ca_key, free_port())
    url = f"http://127.0.0.1:{p.port}/"
    p.issue("responder", responder=True)
    good, revoked = p.issue("good.test", url=url), p.issue("revoked.test", url=url)
    renewed = p.issue("renewed.test", url=url)
    p.issue("plain.test")
    p.issue("down.test", url=f"http://127.0.0.1:{free_port()}/")  # nothing listens there
    expiry = (NOW + datetime.timedelta(days=2)).strftime("%y%m%d%H%M%SZ")
    when = (NOW - datetime.timedelta(minutes=30)).strftime("%y%m%d%H%M%SZ")
    (d / "index.txt").write_text(
        f"V\t{expiry}\t\t{good.serial_number:X}\tunknown\t/CN=good.test\n"
        f"V\t{expiry}\t\t{renewed.serial_number:X}\tunknown\t/CN=renewed.test\n"
        f"R\t{expiry}\t{when}\t{revoked.serial_number:X}\tunknown\t/CN=revoked.test\n")
    return p


def start_responder(pki: Pki) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["openssl", "ocsp", "-index", str(pki.dir / "index.txt"), "-port", str(pki.port),
         "-rsigner", str(pki.dir / "responder.pem"), "-rkey", str(pki.dir / "responder.key"),
         "-CA", str(pki.dir / "ca.pem"), "-nmin", "1", "-timeout", "5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # it says so once listening; a probe connection would hold up its one-at-a-time loop
    assert proc.stderr is not None
    deadline = time.monotonic() + 10
    seen = b""
    while b"waiting for OCSP client connections" not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stderr], [], [], left)[0]:
            stop(proc)
            raise TimeoutError(f"openssl ocsp did not listen: {seen!r}")
        chunk = os.read(proc.stderr.fileno(), 4096)
        if not chunk:
            stop(proc)
            raise RuntimeError(f"openssl ocsp exited: {seen!r}")
        seen += chunk
    return proc


@pytest.fixture
def responder(pki: Pki) -> Iterator[subprocess.Popen[bytes]]:
    proc = start_responder(pki)
    yield proc
    stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(5)
    if proc.stderr is not None:
        proc.stderr.close()


def s_client(port: int, pki: Pki, name: str) -> str:
    """What `openssl s_client -status` says of the staple for ``name``; the
    handshake must verify against the CA."""
    out = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", name, "-status",
         "-CAfile", str(pki.dir / "ca.pem"), "-verify_return_error", "-verify_hostname", name],
        input=b"", capture_output=True, timeout=20, check=False)
    text = out.stdout.decode(errors="replace")
    assert out.returncode == 0, text + out.stderr.decode(errors="replace")
    assert "Verify return code: 0 (ok)" in text, text
    return text


def stapled_good(text: str) -> bool:
    return "OCSP Response Status: successful" in text and "Cert Status: good" in text


def leaf(pki: Pki, cn: str) -> bytes:
    return x509.load_pem_x509_certificates((pki.dir / f"{cn}.pem").read_bytes())[0].public_bytes(
        serialization.Encoding.DER)


def config(pki: Pki, **tls: Any) -> Any:
    names = ("good.test", "revoked.test", "plain.test", "down.test")
    return lb_config(["127.0.0.1:9"], workers=1, tls={"certificates": [pki.pair(n) for n in names], **tls})


# --- through the service: a strict client gets the staple -------------------

async def test_the_balancer_staples_good_not_revoked_not_without_url(
        pki: Pki, responder: Any, caplog: pytest.LogCaptureFixture) -> None:
    async with LoadBalancer(config(pki)) as lb:
        port = lb.address[1]
        def good_staple() -> str:
            text = s_client(port, pki, "good.test")
            return text if stapled_good(text) else ""

        text = await wait_until(lambda: asyncio.to_thread(good_staple), timeout=20, interval=0.2,
                                what="a good staple for good.test")
        assert "Responder Id: CN = responder" in text  # signed by the delegated responder
        stats = await wait_until(lambda: (s := lb.stats()["ocsp"]) and all(
            v["status"] or v["failures"] for v in s.values()) and s, timeout=20, what="every certificate asked")
        revoked = stats[pki.pair("revoked.test")["cert"]]
        assert revoked["status"] == "revoked" and not revoked["stapled"]
        assert pki.pair("plain.test")["cert"] not in stats  # no responder named: never asked
        assert stats[pki.pair("down.test")["cert"]]["failures"] >= 1
        # the certificates without a staple are still served, the handshake works
        for name in ("revoked.test", "plain.test", "down.test"):
            assert "OCSP response: no response sent" in await asyncio.to_thread(s_client, port, pki, name)
        metrics = exposition(registry_for(lb.stats)).decode()
        assert f'balancer_ocsp_stapled{{certificate="{pki.pair("good.test")["cert"]}"}} 1.0' in metrics
        assert f'balancer_ocsp_stapled{{certificate="{pki.pair("revoked.test")["cert"]}"}} 0.0' in metrics
    assert any("REVOKED" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


async def test_a_reloaded_certificate_gets_its_own_staple(pki: Pki, responder: Any, tmp_path: Path) -> None:
    served = {"cert": str(tmp_path / "served.pem"), "key": str(tmp_path / "served.key")}

    def install(cn: str) -> None:
        for kind in ("cert", "key"):
            Path(served[kind]).write_bytes(Path(pki.pair(cn)[kind]).read_bytes())

    install("good.test")
    async with LoadBalancer(lb_config(["127.0.0.1:9"], workers=1, tls={"certificates": [served]})) as lb:
        native = lb._native
        await wait_until(lambda: native.ocsp_staple(leaf(pki, "good.test")), timeout=20, what="the first staple")
        install("renewed.test")  # the renewed certificate, in place
        await lb.reload()
        staple = await wait_until(lambda: native.ocsp_staple(leaf(pki, "renewed.test")), timeout=20,
                                  what="a staple for the renewed certificate")
        single = ocsp.load_der_ocsp_response(staple)
        assert single.serial_number == _cert(pki, "renewed.test").serial_number
        assert list(lb.stats()["ocsp"]) == [served["cert"]]


async def test_off_asks_no_responder(pki: Pki, responder: Any) -> None:
    async with LoadBalancer(config(pki, ocsp_stapling="off")) as lb:
        assert lb.stats()["ocsp"] == {}
        assert "OCSP response: no response sent" in await asyncio.to_thread(s_client, lb.address[1], pki, "good.test")


def test_the_knob_is_checked() -> None:
    with pytest.raises(BalancerConfigError, match="tls.ocsp_stapling"):
        from_dict({"listen": "127.0.0.1:0", "backends": ["127.0.0.1:9"], "tls": {"ocsp_stapling": "on"}})


# --- the driver: refresh, a responder gone, expiry ---------------------------

async def test_refreshed_before_expiry_kept_while_the_responder_is_down_dropped_when_expired(pki: Pki) -> None:
    native = rustext.Balancer(config(pki))
    native.start()
    proc = start_responder(pki)
    skew = datetime.timedelta()
    # refresh 3 % into the minute-long validity (under 2 s) instead of half-way
    stapler = OcspStapler(lambda: native, refresh_fraction=0.03, min_retry=0.2, max_retry=0.5,
                          now=lambda: datetime.datetime.now(datetime.UTC) + skew)
    good = leaf(pki, "good.test")
    try:
        stapler.sync([pki.pair("good.test")["cert"]])
        first = await wait_until(lambda: native.ocsp_staple(good), timeout=20, what="a first staple")
        first_update = ocsp.load_der_ocsp_response(first).this_update_utc
        second = await wait_until(
            lambda: (s := native.ocsp_staple(good)) and ocsp.load_der_ocsp_response(s).this_update_utc > first_update
            and s, timeout=20, interval=0.1, what="a refreshed staple")
        assert "Cert Status: good" in await asyncio.to_thread(s_client, native.address[1], pki, "good.test")
        stop(proc)
        await wait_until(lambda: stapler.stats()[pki.pair("good.test")["cert"]]["failures"] >= 2,
                         timeout=20, what="refreshes failing")
        assert native.ocsp_staple(good) == second  # still valid: still served
        skew = datetime.timedelta(minutes=2)  # past nextUpdate
        await wait_until(lambda: native.ocsp_staple(good) is None, timeout=10, what="the expired staple dropped")
        assert "OCSP response: no response sent" in await asyncio.to_thread(
            s_client, native.address[1], pki, "good.test")
    finally:
        await stapler.aclose()
        stop(proc)
        native.close()


# --- the sans-I/O core: responses built here, checked there ------------------

def _response(pki: Pki, cert: x509.Certificate, *, status: ocsp.OCSPCertStatus = ocsp.OCSPCertStatus.GOOD,
              this: datetime.datetime = NOW, valid: datetime.timedelta | None = datetime.timedelta(hours=2),
              signer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None) -> bytes:
    cert_, key = signer or (pki.ca, pki.ca_key)
    b = ocsp.OCSPResponseBuilder().add_response(
        cert=cert, issuer=pki.ca, algorithm=hashes.SHA1(), cert_status=status, this_update=this,
        next_update=this + valid if valid is not None else None,
        revocation_time=this if status == ocsp.OCSPCertStatus.REVOKED else None, revocation_reason=None,
    ).responder_id(ocsp.OCSPResponderEncoding.HASH, cert_)
    if signer is not None:
        b = b.certificates([cert_])
    return b.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def _cert(pki: Pki, cn: str) -> x509.Certificate:
    return x509.load_pem_x509_certificates((pki.dir / f"{cn}.pem").read_bytes())[0]


def test_check_accepts_the_issuer_and_refuses_what_clients_would(pki: Pki) -> None:
    good, other = _cert(pki, "good.test"), _cert(pki, "revoked.test")
    assert ocsp_url(good) == f"http://127.0.0.1:{pki.port}/" and ocsp_url(_cert(pki, "plain.test")) is None
    assert ocsp.load_der_ocsp_request(build_request(good, pki.ca)).serial_number == good.serial_number
    s = check_response(_response(pki, good), good, pki.ca, NOW)
    assert s.status == "good" and s.next_update == (NOW + datetime.timedelta(hours=2)).replace(microsecond=0)
    # refreshed half-way through the validity
    assert refresh_delay(s, NOW) == pytest.approx(3600, abs=2)
    assert check_response(_response(pki, good, status=ocsp.OCSPCertStatus.REVOKED), good, pki.ca, NOW).status \
        == "revoked"
    with pytest.raises(OcspError, match="not about this certificate"):
        check_response(_response(pki, other), good, pki.ca, NOW)
    with pytest.raises(OcspError, match="expired"):
        check_response(_response(pki, good, this=NOW - datetime.timedelta(hours=3)), good, pki.ca, NOW)
    with pytest.raises(OcspError, match="future"):
        check_response(_response(pki, good, this=NOW + datetime.timedelta(hours=1)), good, pki.ca, NOW)
    # signed by a key the issuer never delegated to
    stranger = _key()
    rogue = (x509.CertificateBuilder().subject_name(_name("rogue")).issuer_name(_name("rogue"))
             .public_key(stranger.public_key()).serial_number(1).not_valid_before(NOW - datetime.timedelta(1))
             .not_valid_after(NOW + datetime.timedelta(1)).sign(stranger, hashes.SHA256()))
    with pytest.raises(OcspError, match="not issued by"):
        check_response(_response(pki, good, signer=(rogue, stranger)), good, pki.ca, NOW)
    # a certificate of the CA, but not for OCSP signing
    with pytest.raises(OcspError, match="not delegated"):
        plain_key = serialization.load_pem_private_key((pki.dir / "plain.test.key").read_bytes(), None)
        check_response(_response(pki, good, signer=(_cert(pki, "plain.test"), plain_key)),  # type: ignore[arg-type]
                       good, pki.ca, NOW)
    with pytest.raises(OcspError, match="not an OCSP response"):
        check_response(b"\x30\x00", good, pki.ca, NOW)
    unauthorized = ocsp.OCSPResponseBuilder.build_unsuccessful(ocsp.OCSPResponseStatus.UNAUTHORIZED)
    with pytest.raises(OcspError, match="unauthorized"):
        check_response(unauthorized.public_bytes(serialization.Encoding.DER), good, pki.ca, NOW)


def test_a_delegated_responder_caps_the_validity_and_no_next_update_expires_in_an_hour(pki: Pki) -> None:
    good = _cert(pki, "good.test")
    responder = _cert(pki, "responder")
    rkey = serialization.load_pem_private_key((pki.dir / "responder.key").read_bytes(), None)
    s = check_response(_response(pki, good, valid=datetime.timedelta(days=10), signer=(responder, rkey)),  # type: ignore[arg-type]
                       good, pki.ca, NOW)
    assert s.next_update == responder.not_valid_after_utc
    s = check_response(_response(pki, good, valid=None), good, pki.ca, NOW)
    assert s.next_update is None and not s.expired(NOW) and s.expired(NOW + datetime.timedelta(minutes=61))
