"""Signing keys of every JWT family and a local JWKS endpoint (aiohttp), for
token tests: what an identity provider publishes, with key rotation."""

from __future__ import annotations

import json
from typing import Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

__all__ = ["JwksServer", "SigningKey"]


class SigningKey:
    """A private key for ``alg`` (RS*/PS* RSA 2048, ES256/384/512, EdDSA, HS*),
    its public JWK (with ``kid``), and tokens signed by it."""

    def __init__(self, alg: str, kid: str | None = None, *, jwk_alg: bool = False) -> None:
        self.alg, self.kid = alg, kid
        if alg.startswith(("RS", "PS")):
            self.private: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            algo: Any = jwt.algorithms.RSAAlgorithm
        elif alg.startswith("ES"):
            curve = {"ES256": ec.SECP256R1(), "ES384": ec.SECP384R1(), "ES512": ec.SECP521R1()}[alg]
            self.private = ec.generate_private_key(curve)
            algo = jwt.algorithms.ECAlgorithm
        elif alg == "EdDSA":
            self.private = ed25519.Ed25519PrivateKey.generate()
            algo = jwt.algorithms.OKPAlgorithm
        else:
            self.private = b"a-shared-secret-long-enough-for-hs512-" * 2
            algo = jwt.algorithms.HMACAlgorithm
        public = self.private if isinstance(self.private, bytes) else self.private.public_key()
        self.public = public
        self.jwk: dict[str, Any] = json.loads(algo.to_jwk(public))
        if kid is not None:
            self.jwk["kid"] = kid
        if jwk_alg:
            self.jwk["alg"] = alg

    def sign(self, claims: dict[str, Any], *, alg: str | None = None, kid: str | None = "same") -> str:
        headers = {"kid": self.kid if kid == "same" else kid} if (kid != "same" or self.kid) else None
        if headers is not None and headers["kid"] is None:
            headers = None
        return jwt.encode(claims, self.private, algorithm=alg or self.alg, headers=headers)

    def public_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


class JwksServer:
    """``async with JwksServer(keys) as idp``: serves ``{"keys": [...]}`` at
    :attr:`url`; assign :attr:`keys` to rotate, set :attr:`status` to fail."""

    def __init__(self, keys: list[SigningKey]) -> None:
        self.keys = keys
        self.status = 200
        self.fetches = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _jwks(self, request: web.Request) -> web.Response:
        self.fetches += 1
        if self.status != 200:
            return web.Response(status=self.status, text="unavailable")
        return web.json_response({"keys": [k.jwk for k in self.keys]})

    async def __aenter__(self) -> JwksServer:
        app = web.Application()
        app.router.add_get("/.well-known/jwks.json", self._jwks)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/.well-known/jwks.json"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
