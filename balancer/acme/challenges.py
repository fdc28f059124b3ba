"""Answering challenges through the balancer's data plane.

HTTP-01 (RFC 8555 §8.3): the key authorization at
``/.well-known/acme-challenge/TOKEN`` on the plain-HTTP listeners, answered
before any routing. TLS-ALPN-01 (RFC 8737): a self-signed certificate for
the name carrying the critical id-pe-acmeIdentifier extension (the SHA-256
of the key authorization), served to handshakes offering only
``acme-tls/1``. Both are set on the data plane for the time of a
validation and removed afterwards, whatever its outcome.
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Protocol, Self

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID, ObjectIdentifier

#: id-pe-acmeIdentifier (RFC 8737 §6.1)
ACME_IDENTIFIER = ObjectIdentifier("1.3.6.1.5.5.7.1.31")


class DataPlane(Protocol):
    """What of ``rustext.Balancer`` answers challenges."""

    def acme_http01_set(self, token: str, key_authorization: str) -> None: ...
    def acme_http01_remove(self, token: str) -> None: ...
    def acme_tls_alpn_set(self, name: str, cert_pem: bytes, key_pem: bytes) -> None: ...
    def acme_tls_alpn_remove(self, name: str) -> None: ...


def key_authorization(token: str, thumbprint: str) -> str:
    return f"{token}.{thumbprint}"


def tls_alpn_certificate(name: str, key_auth: str) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) answering TLS-ALPN-01 for ``name``."""
    key = ec.generate_private_key(ec.SECP256R1())
    digest = hashlib.sha256(key_auth.encode()).digest()
    # the extension's value is the DER OCTET STRING of the digest
    value = b"\x04\x20" + digest
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.UnrecognizedExtension(ACME_IDENTIFIER, value), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


class Answering:
    """One challenge set on the data plane while a ``with`` block runs."""

    def __init__(self, plane: DataPlane, kind: str, name: str, token: str, key_auth: str) -> None:
        self.plane, self.kind, self.name, self.token, self.key_auth = plane, kind, name, token, key_auth

    def __enter__(self) -> Self:
        if self.kind == "http-01":
            self.plane.acme_http01_set(self.token, self.key_auth)
        else:
            cert, key = tls_alpn_certificate(self.name, self.key_auth)
            self.plane.acme_tls_alpn_set(self.name, cert, key)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.kind == "http-01":
            self.plane.acme_http01_remove(self.token)
        else:
            self.plane.acme_tls_alpn_remove(self.name)
