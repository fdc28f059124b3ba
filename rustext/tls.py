"""TLS for the suite's Python servers and clients: ``ssl`` contexts from PEM
files, certificates reloaded in place, and a development CA.

The native servers (the balancer, seq's gRPC) load the same PEM files with
rustls (``rustext/src/tls.rs``); this module serves the asyncio side (juggler's
``wss://``, rpcx, Redis and registry clients) through the standard library's
``ssl``, so every part accepts the same files and refuses bad ones with the
same kind of message: :class:`TlsConfigError`, naming the file.

- :class:`ServerTls` -- a certificate chain and key (ECDSA or RSA), optional
  client certificates verified against ``client_ca``. :meth:`ServerTls.reload`
  loads the files again into the *same* context: handshakes from then on get
  the new certificate, established connections keep theirs (SIGHUP).
- :class:`ClientTls` -- servers verified against the system's trust store or
  ``ca``, with host-name checking; ``insecure`` turns verification off and
  must be asked for explicitly.
- :func:`write_dev_cert` -- a local CA and a ``localhost``/``127.0.0.1``
  certificate signed by it (``juggler tls dev-cert``), made with
  ``cryptography``.
- :func:`trust_hint` -- which ``--tls-ca`` a client of a server needs, for
  the servers' start lines (the CA file beside the certificate, or none when
  the system's trust store has the issuer).
- :func:`speaks_tls` -- whether an address answers a TLS ClientHello, to
  tell a user who dialled a TLS port in clear what went wrong.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ClientTls", "DevCert", "ServerTls", "TlsConfigError", "TrustHint", "describe_ssl_error", "speaks_tls",
    "trust_hint", "write_dev_cert",
]


class TlsConfigError(ValueError):
    """TLS material that cannot be used: a missing or malformed PEM file, a
    key that does not belong to its certificate. The message names the file."""


def _readable(path: str, what: str) -> None:
    if not os.path.isfile(path):
        raise TlsConfigError(f"{what} {path}: no such file")
    if not os.access(path, os.R_OK):
        raise TlsConfigError(f"{what} {path}: not readable")


def _has_pem(path: str, kind: bytes) -> bool:
    """Whether the file holds a PEM section whose label ends with ``kind``
    (``CERTIFICATE``, ``PRIVATE KEY``: also RSA/EC ones)."""
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return False
    return any(line.startswith(b"-----BEGIN ") and line.rstrip().endswith(kind + b"-----")
               for line in data.splitlines())


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    _readable(cert, "certificate")
    _readable(key, "private key")
    # OpenSSL's own message for a wrong file is "PEM lib": name the file and what it lacks
    if not _has_pem(cert, b"CERTIFICATE"):
        raise TlsConfigError(f"{cert}: no PEM certificate in it")
    if not _has_pem(key, b"PRIVATE KEY"):
        raise TlsConfigError(f"{key}: no PEM private key in it")
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        if "KEY_VALUES_MISMATCH" in reason.upper():
            raise TlsConfigError(f"private key {key} does not go with certificate {cert}") from exc
        raise TlsConfigError(f"cannot use certificate {cert} with key {key}: {reason}") from exc


def _load_ca(ctx: ssl.SSLContext, ca: str, what: str) -> None:
    _readable(ca, what)
    try:
        ctx.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise TlsConfigError(f"{what} {ca}: no usable PEM certificate ({exc.reason or exc})") from exc


@dataclass(frozen=True, kw_only=True)
class ServerTls:
    """A server's certificate chain (leaf first) and private key, PEM files.

    With ``client_ca``, clients must present a certificate signed by it
    (mutual TLS).
    """

    #: PEM certificate chain: the server's certificate first, then intermediates
    cert: str
    #: PEM private key (PKCS#8, or PKCS#1 RSA / SEC1 EC)
    key: str
    #: PEM CA certificates that client certificates must chain to (mutual TLS); none = no client certificates
    client_ca: str | None = None

    def context(self, alpn: Sequence[str] = ()) -> ssl.SSLContext:
        """A server context (TLS 1.2 and 1.3) with the certificate loaded;
        raises :class:`TlsConfigError` naming a bad file."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_chain(ctx, self.cert, self.key)
        if self.client_ca:
            _load_ca(ctx, self.client_ca, "client CA")
            ctx.verify_mode = ssl.CERT_REQUIRED
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx

    def reload(self, ctx: ssl.SSLContext) -> None:
        """Read the files again into ``ctx``: new handshakes get the new
        certificate, established connections are untouched. On error the
        previous certificate stays in service and :class:`TlsConfigError`
        is raised."""
        # check on a scratch context first: a half-loaded context must never serve
        self.context()
        _load_chain(ctx, self.cert, self.key)
        if self.client_ca:
            _load_ca(ctx, self.client_ca, "client CA")


@dataclass(frozen=True, kw_only=True)
class ClientTls:
    """How a client checks the servers it connects to, and the certificate
    it presents if a server asks for one."""

    #: PEM CA certificates to verify servers against; none = the system's trust store
    ca: str | None = None
    #: PEM client certificate chain, for servers that require one
    cert: str | None = None
    #: PEM private key of ``cert``
    key: str | None = None
    #: no verification of the server at all (certificate and host name): only for trying things out
    insecure: bool = False

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise TlsConfigError("a client certificate needs both a certificate file and a key file")

    def context(self, alpn: Sequence[str] = ()) -> ssl.SSLContext:
        """A client context (TLS 1.2 and 1.3, host names checked unless
        ``insecure``); raises :class:`TlsConfigError` naming a bad file."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca:
            _load_ca(ctx, self.ca, "CA file")
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if self.cert is not None and self.key is not None:
            _load_chain(ctx, self.cert, self.key)
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx

    def redis_kwargs(self) -> dict[str, object]:
        """The same checks as keyword arguments of redis-py's clients
        (``rediss://`` URLs, Redis Cluster)."""
        return {
            "ssl_ca_certs": self.ca, "ssl_certfile": self.cert, "ssl_keyfile": self.key,
            "ssl_cert_reqs": "none" if self.insecure else "required", "ssl_check_hostname": not self.insecure,
        }


def describe_ssl_error(exc: BaseException) -> str:
    """One line a user can act on for a failed handshake (wrong CA, expired
    certificate, wrong host name), instead of OpenSSL's error stack."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        msg = exc.verify_message or exc.reason or str(exc)
        hint = ""
        if exc.verify_code in (19, 20, 21):  # self-signed in chain, unknown issuer, unable to verify leaf
            hint = " (pass the CA that signed it with --tls-ca FILE)"
        elif exc.verify_code == 10:  # expired
            hint = " (renew the server's certificate)"
        elif exc.verify_code in (62, 64):  # host name or IP address mismatch
            hint = " (connect with a name the certificate lists)"
        return f"server certificate refused: {msg}{hint}"
    if isinstance(exc, ssl.SSLError):
        if exc.reason in _CLEAR_ANSWERS:
            return ("TLS handshake failed: the server answered in clear, it does not speak TLS on this port "
                    "(use ws:// or http://, or leave out --tls)")
        return f"TLS handshake failed: {exc.reason or exc}"
    return str(exc)


#: OpenSSL's reasons for a handshake whose answer was not TLS at all (a plain HTTP or rpcx server)
_CLEAR_ANSWERS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
                            "UNKNOWN_PROTOCOL", "HTTP_REQUEST", "UNEXPECTED_EOF_WHILE_READING"})


async def speaks_tls(host: str, port: int, *, timeout: float = 2.0) -> bool | None:
    """Whether ``host:port`` answers a TLS ClientHello with TLS: True (a
    handshake record or an alert came back), False (something accepted the
    connection and answered otherwise, or closed it), None (nothing
    accepted it within ``timeout``). Asked after a connection there failed
    in a way that a port of the other kind causes, so the error can say
    "use wss:// / --tls" or "it does not speak TLS"; it opens one
    connection, so it is for diagnosing failures, never for a working path.
    Never raises."""
    import asyncio

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=None)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    hello = outgoing.read()
    writer = None
    try:
        async with asyncio.timeout(timeout):
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                return None
            writer.write(hello)
            head = await reader.readexactly(3)
    except (OSError, asyncio.IncompleteReadError, TimeoutError):
        return False if writer is not None else None
    finally:
        if writer is not None:
            writer.close()
    # a TLS record: content type 22 (handshake) or 21 (alert), then version 3.x
    return head[0] in (21, 22) and head[1] == 3 and head[2] <= 4


@dataclass(frozen=True)
class TrustHint:
    """How a client verifies a server using a given certificate chain (:func:`trust_hint`)."""

    #: the file to pass as ``--tls-ca``; None when nothing is needed (``system``) or none was found
    ca_file: str | None
    #: the system's trust store has the issuer: clients need no option
    system: bool
    #: the issuer of the chain's last certificate (RFC 4514), to name the CA when no file was found
    issuer: str


def trust_hint(cert: str | os.PathLike[str]) -> TrustHint:
    """What a client needs to verify a server using the certificate chain
    in ``cert``: nothing when the system's trust store has the issuer; else
    the CA certificate beside it that issued the chain (``juggler tls
    dev-cert`` writes ``ca.pem`` there), or the certificate itself when it
    is self-signed; else only the issuer's name."""
    from cryptography import x509

    path = Path(cert).resolve()
    try:
        chain = x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError):
        return TrustHint(ca_file=None, system=False, issuer="")
    top = chain[-1]
    issuer = top.issuer.rfc4514_string()
    if top.issuer == top.subject:
        return TrustHint(ca_file=str(path), system=False, issuer=issuer)
    if top.issuer in _system_issuers():
        return TrustHint(ca_file=None, system=True, issuer=issuer)
    for candidate in sorted(path.parent.glob("*.pem")) + sorted(path.parent.glob("*.crt")):
        if candidate == path:
            continue
        try:
            certs = x509.load_pem_x509_certificates(candidate.read_bytes()[: 1 << 20])
        except (OSError, ValueError):
            continue
        if any(c.subject == top.issuer for c in certs):
            return TrustHint(ca_file=str(candidate), system=False, issuer=issuer)
    return TrustHint(ca_file=None, system=False, issuer=issuer)


def _system_issuers() -> set[object]:
    """Subjects of the CA certificates of the system's trust store (the
    file OpenSSL reads by default)."""
    import warnings

    from cryptography import x509

    paths = ssl.get_default_verify_paths()
    for name in (paths.cafile, paths.openssl_cafile):
        if name and os.path.isfile(name):
            try:
                with warnings.catch_warnings():  # old roots with odd serial numbers: not ours to judge
                    warnings.simplefilter("ignore")
                    return {c.subject for c in x509.load_pem_x509_certificates(Path(name).read_bytes())}
            except ValueError:
                continue
    return set()


# --- a development CA ---------------------------------------------------------


@dataclass(frozen=True)
class DevCert:
    """The files :func:`write_dev_cert` wrote."""

    #: the local CA's certificate: what clients trust (``--tls-ca``)
    ca: Path
    #: the local CA's private key: keep it private; it signs further certificates
    ca_key: Path
    #: the server certificate, signed by the CA
    cert: Path
    #: the server certificate's private key
    key: Path
    #: whether the CA already existed and was reused
    ca_reused: bool


_DEFAULT_NAMES = ("localhost", "127.0.0.1", "::1")


def write_dev_cert(
    out_dir: str | os.PathLike[str],
    *,
    names: Iterable[str] = _DEFAULT_NAMES,
    key_type: str = "ec",
    days: int = 825,
) -> DevCert:
    """A local CA (created once, reused afterwards, so it is trusted once)
    and a certificate for ``names`` (host names and IP addresses) signed by
    it, in ``out_dir``: ``ca.pem``, ``ca-key.pem``, ``cert.pem``, ``key.pem``. Keys are ECDSA P-256
    (``key_type="ec"``) or RSA 2048 (``"rsa"``) and written readable by
    their owner only."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if key_type not in ("ec", "rsa"):
        raise TlsConfigError(f"key type must be 'ec' or 'rsa', got {key_type!r}")
    if days < 1:
        raise TlsConfigError(f"days must be >= 1, got {days}")
    names = list(dict.fromkeys(names))
    if not names:
        raise TlsConfigError("at least one host name or IP address is needed")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def new_key() -> ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey:
        if key_type == "rsa":
            return rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return ec.generate_private_key(ec.SECP256R1())

    def write_key(path: Path, key: object) -> None:
        pem = key.private_bytes(  # type: ignore[attr-defined]
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_path, ca_key_path = out / "ca.pem", out / "ca-key.pem"
    reused = ca_path.exists() and ca_key_path.exists()
    if reused:
        try:
            ca_cert = x509.load_pem_x509_certificate(ca_path.read_bytes())
            ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        except ValueError as exc:
            raise TlsConfigError(f"{ca_path}: an existing CA that cannot be read ({exc}); remove it to start afresh") from exc
    else:
        ca_key = new_key()
        ca_name = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "juggler development CA"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"juggler development CA {now:%Y-%m-%d %H:%M:%S}"),
        ])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        )
        write_key(ca_key_path, ca_key)
        ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    key = new_key()
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    cert_path, key_path = out / "cert.pem", out / "key.pem"
    write_key(key_path, key)
    cert_path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    return DevCert(ca=ca_path, ca_key=ca_key_path, cert=cert_path, key=key_path, ca_reused=reused)
