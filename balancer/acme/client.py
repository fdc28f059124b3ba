"""The ACME order flow (RFC 8555 §7): account, order, authorizations,
finalization, download.

A small asyncio client on aiohttp and ``cryptography`` rather than
certbot's ``acme`` package: that one is synchronous (a thread per order),
pulls in pyOpenSSL and requests, and the balancer needs only the part of
the protocol that obtains a certificate for a few names with the two
challenges it answers itself; aiohttp and cryptography are dependencies
already. Every request is bounded (``timeout``), a ``badNonce`` is retried
with the fresh nonce the error carries (§6.5), and polling follows the
CA's ``Retry-After`` within a deadline.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from typing import Any, Self

import aiohttp
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from balancer.acme import jws
from balancer.acme.challenges import Answering, DataPlane, key_authorization
from balancer.errors import BalancerError

log = logging.getLogger("balancer.acme")


class AcmeError(BalancerError):
    """The CA refused a request or an order failed; the message says what the CA said."""


class AcmeClient:
    """One account at ``directory``; ``async with`` or :meth:`aclose`."""

    def __init__(self, directory: str, key: ec.EllipticCurvePrivateKey, *, ca_root: str | None = None,
                 timeout: float = 30.0, poll_for: float = 120.0) -> None:
        self.directory_url = directory
        self.key = key
        self.kid: str | None = None
        self.timeout = timeout
        self.poll_for = poll_for
        ctx = ssl.create_default_context(cafile=ca_root) if ca_root else ssl.create_default_context()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx), timeout=aiohttp.ClientTimeout(total=timeout),
            headers={"User-Agent": "juggler-balancer-acme"})
        self._dir: dict[str, Any] | None = None
        self._nonce: str | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._session.close()

    # --- transport -----------------------------------------------------
    async def _directory(self) -> dict[str, Any]:
        if self._dir is None:
            async with self._session.get(self.directory_url) as r:
                if r.status != 200:
                    raise AcmeError(f"ACME directory {self.directory_url}: HTTP {r.status}")
                self._dir = await r.json(content_type=None)
        return self._dir

    async def _new_nonce(self) -> str:
        url = (await self._directory())["newNonce"]
        async with self._session.head(url) as r:
            nonce = r.headers.get("Replay-Nonce")
        if not nonce:
            raise AcmeError(f"{url}: no Replay-Nonce")
        return nonce

    async def post(self, url: str, payload: Any | None, *, use_jwk: bool = False,
                   accept: str | None = None) -> tuple[int, dict[str, str], bytes]:
        """A signed POST (``payload`` None: POST-as-GET); raises AcmeError for an error document."""
        for attempt in range(5):
            nonce = self._nonce or await self._new_nonce()
            self._nonce = None
            body = jws.sign(self.key, url, nonce, payload, None if use_jwk else self.kid)
            headers = {"Content-Type": "application/jose+json"}
            if accept:
                headers["Accept"] = accept
            async with self._session.post(url, data=body, headers=headers) as r:
                self._nonce = r.headers.get("Replay-Nonce")
                data = await r.read()
                if r.status < 400:
                    return r.status, dict(r.headers), data
                try:
                    problem = json.loads(data)
                except ValueError:
                    problem = {"detail": data[:200].decode(errors="replace")}
                if problem.get("type") == "urn:ietf:params:acme:error:badNonce" and attempt < 4:
                    continue
                raise AcmeError(f"{url}: {problem.get('type', r.status)}: {problem.get('detail', '')}")
        raise AcmeError(f"{url}: refused every nonce")

    async def _get_json(self, url: str) -> tuple[dict[str, str], dict[str, Any]]:
        _, headers, data = await self.post(url, None)
        return headers, json.loads(data)

    # --- account -------------------------------------------------------
    async def account(self, email: str | None, known: str | None) -> str:
        """The account URL: ``known`` (stored), or a new account (or the
        existing one of this key, which the CA returns for newAccount)."""
        if known:
            self.kid = known
            return known
        payload: dict[str, Any] = {"termsOfServiceAgreed": True}
        if email:
            payload["contact"] = [f"mailto:{email}"]
        _, headers, _ = await self.post((await self._directory())["newAccount"], payload, use_jwk=True)
        kid = headers.get("Location")
        if not kid:
            raise AcmeError("newAccount: no account URL (Location) in the answer")
        self.kid = kid
        log.info("ACME account %s", kid)
        return kid

    # --- order ---------------------------------------------------------
    async def order(self, names: tuple[str, ...], plane: DataPlane,
                    challenges: tuple[str, ...]) -> tuple[bytes, ec.EllipticCurvePrivateKey]:
        """A certificate for ``names``: (PEM chain, its new key)."""
        assert self.kid is not None, "account() first"
        payload = {"identifiers": [{"type": "dns", "value": n} for n in names]}
        _, headers, data = await self.post((await self._directory())["newOrder"], payload)
        order_url = headers.get("Location", "")
        order = json.loads(data)
        for authz_url in order.get("authorizations", []):
            await self._authorize(authz_url, plane, challenges)
        key = ec.generate_private_key(ec.SECP256R1())
        csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .sign(key, hashes.SHA256())
        )
        order = await self._poll(order_url, {"ready", "valid"}, order)
        if order["status"] == "ready":
            _, _, data = await self.post(order["finalize"],
                                         {"csr": jws.b64(csr.public_bytes(serialization.Encoding.DER))})
            order = await self._poll(order_url, {"valid"}, json.loads(data))
        _, _, chain = await self.post(order["certificate"], None, accept="application/pem-certificate-chain")
        return chain, key

    async def _authorize(self, url: str, plane: DataPlane, challenges: tuple[str, ...]) -> None:
        _, authz = await self._get_json(url)
        if authz.get("status") == "valid":
            return
        name = authz["identifier"]["value"]
        offered = {c["type"]: c for c in authz.get("challenges", [])}
        kind = next((c for c in challenges if c in offered), None)
        if kind is None:
            raise AcmeError(f"{name}: the CA offers {', '.join(sorted(offered))}, none of acme.challenges")
        chal = offered[kind]
        key_auth = key_authorization(chal["token"], jws.thumbprint(self.key))
        with Answering(plane, kind, name, chal["token"], key_auth):
            await self.post(chal["url"], {})
            authz = await self._poll(url, {"valid"}, None)
        log.info("ACME: %s validated by %s", name, kind)

    async def _poll(self, url: str, wanted: set[str], current: dict[str, Any] | None) -> dict[str, Any]:
        """GET ``url`` until its status is in ``wanted`` (AcmeError when it becomes invalid or the time runs out)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.poll_for
        delay = 0.2
        while True:
            if current is not None:
                status = current.get("status")
                if status in wanted:
                    return current
                if status == "invalid":
                    raise AcmeError(f"{url}: invalid: {_problem(current)}")
            if loop.time() >= deadline:
                raise AcmeError(f"{url}: still {current.get('status') if current else 'unknown'} "
                                f"after {self.poll_for:g} s")
            if current is not None:
                await asyncio.sleep(delay)  # the CA's own pace: there is no event to await
                delay = min(delay * 2, 2.0)
            _, current = await self._get_json(url)


def _problem(obj: dict[str, Any]) -> str:
    if "error" in obj:
        e = obj["error"]
        return f"{e.get('type', '')}: {e.get('detail', '')}"
    for c in obj.get("challenges", []):
        if "error" in c:
            return f"{c['type']}: {c['error'].get('detail', '')}"
    return json.dumps(obj)[:300]
