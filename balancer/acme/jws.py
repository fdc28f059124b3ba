"""The account key's signed requests (RFC 8555 §6.2): JWS in the flattened
JSON serialization, ES256 (P-256), with the key itself (``jwk``) before an
account exists and its URL (``kid``) after."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature


def b64(data: bytes) -> str:
    """base64url without padding."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwk(key: ec.EllipticCurvePrivateKey) -> dict[str, str]:
    nums = key.public_key().public_numbers()
    return {"crv": "P-256", "kty": "EC", "x": b64(nums.x.to_bytes(32, "big")), "y": b64(nums.y.to_bytes(32, "big"))}


def thumbprint(key: ec.EllipticCurvePrivateKey) -> str:
    """The JWK thumbprint (RFC 7638) that key authorizations end with."""
    canonical = json.dumps(jwk(key), sort_keys=True, separators=(",", ":")).encode()
    return b64(hashlib.sha256(canonical).digest())


def sign(key: ec.EllipticCurvePrivateKey, url: str, nonce: str, payload: Any | None,
         kid: str | None) -> bytes:
    """The body of a POST to ``url``; ``payload`` None is a POST-as-GET."""
    protected: dict[str, Any] = {"alg": "ES256", "nonce": nonce, "url": url}
    if kid is None:
        protected["jwk"] = jwk(key)
    else:
        protected["kid"] = kid
    p = b64(json.dumps(protected).encode())
    body = "" if payload is None else b64(json.dumps(payload).encode())
    der = key.sign(f"{p}.{body}".encode(), ec.ECDSA(hashes.SHA256()))
    r, s = decode_dss_signature(der)
    sig = b64(r.to_bytes(32, "big") + s.to_bytes(32, "big"))
    return json.dumps({"protected": p, "payload": body, "signature": sig}).encode()
