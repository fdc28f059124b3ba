"""OCSP stapling: the balancer fetches its certificates' revocation status
from the CA's responder and sends it in the handshake, so clients need not
ask the CA themselves (faster, private, and required by "must-staple"
certificates and strict clients).

Two layers:

- the sans-I/O core — :func:`ocsp_url`, :func:`build_request`,
  :func:`check_response` (status, serial and issuer, signature by the issuer
  or a responder it delegated to, ``thisUpdate``/``nextUpdate``) and
  :func:`refresh_delay` (when to ask again: half-way through the validity,
  as Caddy does). No socket, no clock: ``now`` is passed in.
- :class:`OcspStapler`, the driver: one task per served certificate whose
  AIA names a responder, POSTing with aiohttp, stapling through the data
  plane's ``set_ocsp_staple``, retrying with backoff on failure. A staple
  still valid is kept while the responder is unreachable; an expired one is
  dropped (a handshake without staple works, one with a stale staple fails
  at strict clients). A "revoked" answer is logged as an error and the
  staple removed; the certificate stays in service (Caddy's behaviour: the
  operator replaces it), a "revoked" response is never stapled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
from cryptography.x509 import ocsp
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID

from balancer.errors import BalancerError

if TYPE_CHECKING:
    import aiohttp
from rustext.backoff import Backoff, BackoffPolicy

__all__ = ["OcspError", "OcspStapler", "Staple", "build_request", "check_response", "ocsp_url", "refresh_delay"]

log = logging.getLogger("balancer.ocsp")

#: clocks of the responder and the balancer may differ this much
CLOCK_SKEW = datetime.timedelta(minutes=5)
#: how long a response without nextUpdate is used before asking again
NO_NEXT_UPDATE = datetime.timedelta(hours=1)


class OcspError(BalancerError):
    """An OCSP response that cannot be stapled, or a responder that did not answer."""


@dataclasses.dataclass(frozen=True)
class Staple:
    """A checked OCSP response about one certificate."""

    der: bytes
    #: "good", "revoked" or "unknown"
    status: str
    this_update: datetime.datetime
    #: when the response stops being valid (nextUpdate, or the delegated
    #: responder certificate's end if earlier; None: the response gives none)
    next_update: datetime.datetime | None
    revocation_time: datetime.datetime | None = None

    def expired(self, now: datetime.datetime) -> bool:
        """Past its validity: a client would refuse it."""
        end = self.next_update if self.next_update is not None else self.this_update + NO_NEXT_UPDATE
        return now >= end


def ocsp_url(cert: x509.Certificate) -> str | None:
    """The first http(s) OCSP responder named in the certificate's AIA, or None."""
    try:
        aia = cert.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value
    except x509.ExtensionNotFound:
        return None
    for desc in aia:
        if desc.access_method == AuthorityInformationAccessOID.OCSP and isinstance(
                desc.access_location, x509.UniformResourceIdentifier):
            url = desc.access_location.value
            if url.lower().startswith(("http://", "https://")):
                return url
    return None


def build_request(cert: x509.Certificate, issuer: x509.Certificate) -> bytes:
    """The DER OCSP request for ``cert`` (SHA-1 CertID, what every responder
    understands, as Caddy and HAProxy send)."""
    builder = ocsp.OCSPRequestBuilder().add_certificate(cert, issuer, hashes.SHA1())
    return builder.build().public_bytes(serialization.Encoding.DER)


def _verify(key: Any, signature: bytes, data: bytes, algorithm: hashes.HashAlgorithm | None) -> None:
    if isinstance(key, rsa.RSAPublicKey):
        if algorithm is None:
            raise OcspError("RSA signature without a hash algorithm")
        key.verify(signature, data, padding.PKCS1v15(), algorithm)
    elif isinstance(key, ec.EllipticCurvePublicKey):
        if algorithm is None:
            raise OcspError("ECDSA signature without a hash algorithm")
        key.verify(signature, data, ec.ECDSA(algorithm))
    elif isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        key.verify(signature, data)
    else:
        raise OcspError(f"unsupported responder key type {type(key).__name__}")


def _responder(resp: ocsp.OCSPResponse, issuer: x509.Certificate,
               now: datetime.datetime) -> x509.Certificate:
    """The certificate that signed ``resp``: the issuer itself, or a
    responder certificate in the response that the issuer made for OCSP
    signing (RFC 6960 §4.2.2.2)."""
    def names(c: x509.Certificate) -> bool:
        if resp.responder_name is not None:
            return c.subject == resp.responder_name
        try:
            ski = x509.SubjectKeyIdentifier.from_public_key(c.public_key()).digest  # type: ignore[arg-type]
        except (ValueError, TypeError):
            return False
        return ski == resp.responder_key_hash

    if names(issuer):
        return issuer
    for c in resp.certificates:
        if not names(c):
            continue
        try:
            c.verify_directly_issued_by(issuer)
        except (ValueError, TypeError, InvalidSignature) as exc:
            raise OcspError("the responder certificate is not issued by the certificate's issuer") from exc
        try:
            eku = c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            eku = None
        if eku is None or ExtendedKeyUsageOID.OCSP_SIGNING not in eku:
            raise OcspError("the responder certificate is not delegated OCSP signing (extended key usage)")
        if not c.not_valid_before_utc - CLOCK_SKEW <= now <= c.not_valid_after_utc:
            raise OcspError("the responder certificate is outside its validity")
        return c
    raise OcspError("the response is signed neither by the issuer nor by a responder it delegated to")


def check_response(der: bytes, cert: x509.Certificate, issuer: x509.Certificate,
                   now: datetime.datetime) -> Staple:
    """``der`` checked as a response about ``cert`` from ``issuer``'s responder
    at ``now``; raises OcspError saying what is wrong. A "revoked" or
    "unknown" status is returned, not raised: the caller decides."""
    try:
        resp = ocsp.load_der_ocsp_response(der)
    except ValueError as exc:
        raise OcspError(f"not an OCSP response: {exc}") from exc
    if resp.response_status != ocsp.OCSPResponseStatus.SUCCESSFUL:
        raise OcspError(f"the responder answered {resp.response_status.name.lower()}")
    signer = _responder(resp, issuer, now)
    try:
        _verify(signer.public_key(), resp.signature, resp.tbs_response_bytes, resp.signature_hash_algorithm)
    except InvalidSignature as exc:
        raise OcspError("the response's signature does not verify") from exc
    for single in resp.responses:
        if single.serial_number != cert.serial_number:
            continue
        # the CertID of the answer, in the hash the responder chose
        expected = ocsp.OCSPRequestBuilder().add_certificate(cert, issuer, single.hash_algorithm).build()
        if (single.issuer_name_hash, single.issuer_key_hash) == (expected.issuer_name_hash,
                                                                  expected.issuer_key_hash):
            break
    else:
        raise OcspError(f"the response is not about this certificate (serial {cert.serial_number:x})")
    this_update = single.this_update_utc
    next_update = single.next_update_utc
    if this_update > now + CLOCK_SKEW:
        raise OcspError(f"the response is from the future (thisUpdate {this_update:%Y-%m-%d %H:%M:%S} UTC)")
    if next_update is not None:
        if next_update < this_update:
            raise OcspError("the response's nextUpdate is before its thisUpdate")
        if signer is not issuer and signer.not_valid_after_utc < next_update:
            next_update = signer.not_valid_after_utc  # the response is worth no more than its signer
        if next_update <= now:
            raise OcspError(f"the response expired at {next_update:%Y-%m-%d %H:%M:%S} UTC")
    status = single.certificate_status.name.lower()
    revoked_at = single.revocation_time_utc if single.certificate_status == ocsp.OCSPCertStatus.REVOKED else None
    return Staple(der=der, status=status, this_update=this_update, next_update=next_update,
                  revocation_time=revoked_at)


def refresh_delay(staple: Staple, now: datetime.datetime, *, fraction: float = 0.5) -> float:
    """Seconds until asking again: ``fraction`` of the way from thisUpdate to
    nextUpdate (Caddy asks half-way), at least one second."""
    end = staple.next_update if staple.next_update is not None else staple.this_update + NO_NEXT_UPDATE
    at = staple.this_update + (end - staple.this_update) * fraction
    return max(1.0, (at - now).total_seconds())


class StapleTarget(Protocol):
    """What the stapler staples to (``rustext.Balancer``)."""

    def set_ocsp_staple(self, certificate: bytes, response: bytes | None) -> bool: ...


@dataclasses.dataclass
class _Cert:
    """A served certificate the stapler follows, and what it knows of it."""

    path: str
    cert: x509.Certificate
    issuer: x509.Certificate
    url: str
    #: the response stapled now
    staple: Staple | None = None
    #: the status the responder last gave ("good", "revoked", "unknown")
    status: str | None = None
    failures: int = 0
    last_error: str | None = None
    task: asyncio.Task[None] | None = None

    @property
    def der(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.DER)


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class OcspStapler:
    """Keeps an OCSP staple on each served certificate that names a
    responder (see the module doc). :meth:`sync` (at start and after each
    certificate reload) follows the files; :meth:`aclose` stops; both are
    idempotent. ``target`` is called from the event loop only."""

    def __init__(self, target: Callable[[], StapleTarget], *, timeout: float = 10.0,
                 refresh_fraction: float = 0.5, min_retry: float = 1.0, max_retry: float = 600.0,
                 now: Callable[[], datetime.datetime] = _utcnow) -> None:
        """``target`` gives the data plane to staple to (it may be replaced
        before start); ``timeout``: per request to a responder;
        ``refresh_fraction``: how far into a response's validity to ask again;
        failures are retried after ``min_retry`` s, doubling up to ``max_retry`` (jittered)."""
        self._target = target
        self._timeout = timeout
        self._fraction = refresh_fraction
        self._retry = BackoffPolicy(initial=min_retry, maximum=max_retry)
        self._now = now
        self._certs: dict[bytes, _Cert] = {}
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def sync(self, paths: Sequence[str]) -> None:
        """Follow the certificates in the PEM chain files ``paths`` (leaf then
        issuer): new ones get a task, gone ones lose theirs."""
        if self._closed:
            return
        wanted: dict[bytes, tuple[str, list[x509.Certificate]]] = {}
        for path in paths:
            try:
                with open(path, "rb") as f:
                    chain = x509.load_pem_x509_certificates(f.read())
            except (OSError, ValueError) as exc:
                log.warning("ocsp: %s: cannot read the certificate: %s", path, exc)
                continue
            wanted.setdefault(chain[0].public_bytes(serialization.Encoding.DER), (path, chain))
        for der in list(self._certs):
            if der not in wanted:
                c = self._certs.pop(der)
                if c.task is not None:
                    c.task.cancel()
        for der, (path, chain) in wanted.items():
            if der in self._certs:
                continue
            url = ocsp_url(chain[0])
            if url is None:
                log.debug("ocsp: %s names no OCSP responder: not stapled", path)
                continue
            issuer = next((c for c in chain[1:] if c.subject == chain[0].issuer), None)
            if issuer is None:
                log.warning("ocsp: %s: the issuer's certificate is not in the file after the certificate: "
                            "cannot ask %s, not stapled", path, url)
                continue
            c = self._certs[der] = _Cert(path=path, cert=chain[0], issuer=issuer, url=url)
            c.task = asyncio.create_task(self._follow(c), name=f"ocsp {path}")

    async def aclose(self) -> None:
        """Stop every task; the staples stay on the certificates. Idempotent."""
        self._closed = True
        tasks = [c.task for c in self._certs.values() if c.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per certificate file: the responder, the status it last gave,
        whether a staple is sent, its thisUpdate/nextUpdate (Unix time),
        failed fetches and the last error."""
        out = {}
        for c in self._certs.values():
            s = c.staple
            out[c.path] = {
                "responder": c.url,
                "status": c.status,
                "stapled": s is not None,
                "this_update": s.this_update.timestamp() if s is not None else None,
                "next_update": s.next_update.timestamp() if s is not None and s.next_update else None,
                "failures": c.failures,
                "last_error": c.last_error,
            }
        return out

    async def _fetch(self, c: _Cert) -> bytes:
        import aiohttp  # only when a certificate names a responder: a second of start-up otherwise

        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.post(
                    c.url, data=build_request(c.cert, c.issuer),
                    headers={"Content-Type": "application/ocsp-request", "Accept": "application/ocsp-response"},
                    timeout=aiohttp.ClientTimeout(total=self._timeout)) as r:
                if r.status != 200:
                    raise OcspError(f"{c.url} answered HTTP {r.status}")
                return await r.content.read(1 << 20)  # responses are a few KB; a bound against a runaway body
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise OcspError(f"{c.url}: {str(exc) or type(exc).__name__}") from exc

    def _set(self, c: _Cert, staple: Staple | None) -> None:
        c.staple = staple
        if not self._target().set_ocsp_staple(c.der, staple.der if staple is not None else None):
            log.warning("ocsp: %s changed on disk and is not served yet (reload to serve it)", c.path)

    async def _follow(self, c: _Cert) -> None:
        backoff = Backoff(self._retry)
        while True:
            try:
                staple = check_response(await self._fetch(c), c.cert, c.issuer, self._now())
            except (OcspError, ValueError, UnsupportedAlgorithm) as exc:  # cryptography's refusals too
                c.failures += 1
                c.last_error = str(exc)
                now = self._now()
                if c.staple is not None and c.staple.expired(now):
                    log.error("ocsp: %s: the staple expired and no new response came: dropped (%s)", c.path, exc)
                    self._set(c, None)
                kept = " (the current staple is kept while valid)" if c.staple is not None else ""
                delay = backoff.next_delay()
                log.warning("ocsp: %s: %s; retrying in %.1f s%s", c.path, exc, delay, kept)
                if c.staple is not None:  # wake when it expires to drop it
                    end = c.staple.next_update or c.staple.this_update + NO_NEXT_UPDATE
                    delay = max(0.0, min(delay, (end - now).total_seconds()))
                await asyncio.sleep(delay)  # the retry period, not a synchronisation
                continue
            backoff.reset()
            c.last_error = None
            c.status = staple.status
            if staple.status == "good":
                if c.staple is None or c.staple.status != "good":
                    log.info("ocsp: %s: stapling the responder's \"good\" status (valid until %s)", c.path,
                             f"{staple.next_update:%Y-%m-%d %H:%M:%S} UTC" if staple.next_update else "unspecified")
                self._set(c, staple)
            elif staple.status == "revoked":
                log.error("ocsp: %s: THE CERTIFICATE IS REVOKED (since %s) according to %s: no staple is sent; "
                          "it is still served: replace it", c.path,
                          f"{staple.revocation_time:%Y-%m-%d %H:%M:%S} UTC" if staple.revocation_time else "?",
                          c.url)
                self._set(c, None)
            else:
                log.warning("ocsp: %s: the responder does not know the certificate (status unknown): "
                            "not stapled", c.path)
                self._set(c, None)
            await asyncio.sleep(refresh_delay(staple, self._now(), fraction=self._fraction))  # the refresh period
