"""The ACME folder: the account key and URL, the certificate and its key,
and the lock that lets one balancer process order at a time.

Files are written whole (a temporary file renamed over the old one), mode
0600, in a folder of mode 0700: a process reading the folder never sees a
half-written certificate, and a certificate never appears without its key
(the key is renamed in first, and a key that does not go with the
certificate is refused by the data plane's reload, which keeps the old
pair). Processes sharing the folder take :meth:`Storage.try_lock` (an
``flock`` on ``lock``) before ordering; the others watch ``cert.pem``'s
modification time and load what the holder stored.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

#: the subject of the certificate served until the first one is obtained
PLACEHOLDER_CN = "balancer ACME placeholder"


@dataclass(frozen=True)
class CertInfo:
    """What the renewal needs of a stored certificate."""

    not_before: float
    not_after: float
    names: frozenset[str]
    placeholder: bool


class Storage:
    """The folder ``path`` (created 0700 when missing)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        os.chmod(self.path, 0o700)
        self._lock_fd: int | None = None

    # --- files -------------------------------------------------------
    @property
    def cert_path(self) -> str:
        return os.path.join(self.path, "cert.pem")

    @property
    def key_path(self) -> str:
        return os.path.join(self.path, "key.pem")

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def write(self, name: str, data: bytes) -> None:
        """Replace ``name`` whole, mode 0600."""
        final = self._file(name)
        tmp = f"{final}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o600)
        os.replace(tmp, final)

    def read(self, name: str) -> bytes | None:
        try:
            with open(self._file(name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    # --- the account ---------------------------------------------------
    def account_key(self) -> ec.EllipticCurvePrivateKey:
        """The account key, made (P-256) and stored on first use."""
        pem = self.read("account.key")
        if pem is not None:
            key = serialization.load_pem_private_key(pem, password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise ValueError(f"{self._file('account.key')}: expected an EC (P-256) key")
            return key
        key = ec.generate_private_key(ec.SECP256R1())
        self.write("account.key", _key_pem(key))
        return key

    def account(self, directory: str) -> str | None:
        """The account URL registered at ``directory``, if any."""
        raw = self.read("account.json")
        if raw is None:
            return None
        try:
            data: Any = json.loads(raw)
        except ValueError:
            return None
        url = data.get(directory) if isinstance(data, dict) else None
        return url if isinstance(url, str) else None

    def save_account(self, directory: str, url: str) -> None:
        raw = self.read("account.json")
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {}
        data[directory] = url
        self.write("account.json", json.dumps(data, indent=1).encode())

    # --- the certificate -----------------------------------------------
    def save_certificate(self, chain_pem: bytes, key: ec.EllipticCurvePrivateKey) -> None:
        self.write("key.pem", _key_pem(key))
        self.write("cert.pem", chain_pem)

    def certificate(self) -> CertInfo | None:
        """The stored certificate's validity and names (None: none, or unreadable)."""
        pem = self.read("cert.pem")
        if pem is None:
            return None
        try:
            cert = x509.load_pem_x509_certificate(pem)
        except ValueError:
            return None
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            names = frozenset(n.lower() for n in san.get_values_for_type(x509.DNSName))
        except x509.ExtensionNotFound:
            names = frozenset()
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return CertInfo(
            not_before=cert.not_valid_before_utc.timestamp(),
            not_after=cert.not_valid_after_utc.timestamp(),
            names=names,
            placeholder=bool(cn) and cn[0].value == PLACEHOLDER_CN,
        )

    def cert_mtime(self) -> float:
        try:
            return os.stat(self.cert_path).st_mtime
        except FileNotFoundError:
            return 0.0

    def ensure_placeholder(self, names: tuple[str, ...]) -> None:
        """A self-signed certificate for ``names`` when none is stored yet,
        so that the HTTPS listener can start (and answer TLS-ALPN-01)
        before the first order completes; clients do not trust it."""
        if self.read("cert.pem") is not None and self.read("key.pem") is not None:
            return
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, PLACEHOLDER_CN)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .sign(key, hashes.SHA256())
        )
        self.save_certificate(cert.public_bytes(serialization.Encoding.PEM), key)

    # --- the lock ------------------------------------------------------
    def try_lock(self) -> bool:
        """Take the ordering lock without waiting; False when another
        process (or this one, already) holds it. Released by :meth:`unlock`
        or when the process exits."""
        if self._lock_fd is not None:
            return False
        fd = os.open(self._file("lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    @property
    def locked(self) -> bool:
        """Whether this object holds the ordering lock."""
        return self._lock_fd is not None

    def unlock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
