"""Certificates for TLS tests, made with trustme: a CA, an intermediate, and
leaf certificates written as PEM files, valid, expired, or for other names.

Import as ``from tests.tlsutil import TestPKI`` (or use the ``pki`` fixture
of tests/conftest.py): every test gets its own CA, so nothing is shared or
left behind.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import trustme

__all__ = ["Leaf", "TestPKI"]


@dataclass(frozen=True)
class Leaf:
    """A certificate chain and its key on disk."""

    #: the chain: the leaf, then the intermediate CA
    cert: Path
    key: Path


class TestPKI:
    """A root CA, an intermediate CA under it, and leaves issued by the
    intermediate (so every served chain has two certificates, as with a
    public CA). ``ca`` is the file clients trust."""

    __test__ = False  # not a test class, despite the name

    def __init__(self, directory: Path, *, rsa: bool = False) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        key_type = trustme.KeyType.RSA if rsa else trustme.KeyType.ECDSA
        self._key_type = key_type
        self.root = trustme.CA(key_type=key_type, organization_name="test root")
        self.intermediate = self.root.create_child_ca(key_type=key_type)
        self.ca = self.dir / "ca.pem"
        self.root.cert_pem.write_to_path(str(self.ca))
        self._n = 0

    def leaf(
        self,
        *names: str,
        expired: bool = False,
        not_yet_valid: bool = False,
        name: str | None = None,
    ) -> Leaf:
        """A certificate for ``names`` (default ``localhost``, ``127.0.0.1``,
        ``::1``), written as ``NAME.pem`` (chain) and ``NAME-key.pem``."""
        self._n += 1
        name = name or f"leaf{self._n}"
        now = datetime.datetime.now(datetime.timezone.utc)
        not_before = not_after = None
        if expired:
            not_before, not_after = now - datetime.timedelta(days=10), now - datetime.timedelta(days=1)
        elif not_yet_valid:
            not_before, not_after = now + datetime.timedelta(days=1), now + datetime.timedelta(days=10)
        cert = self.intermediate.issue_cert(
            *(names or ("localhost", "127.0.0.1", "::1")),
            not_before=not_before,
            not_after=not_after,
            key_type=self._key_type,
        )
        chain = self.dir / f"{name}.pem"
        key = self.dir / f"{name}-key.pem"
        chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key))
        return Leaf(cert=chain, key=key)


async def served_serial(host: str, port: int, ca: Path, alpn: list[str] | None = None) -> int:
    """The serial number of the certificate a new TLS connection to
    ``host:port`` is served (to see a reload take effect)."""
    import asyncio

    from cryptography import x509

    from rustext.tls import ClientTls

    ctx = ClientTls(ca=str(ca)).context(alpn=alpn or ())
    _, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname=host)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
