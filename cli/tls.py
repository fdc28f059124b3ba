"""``juggler tls …``: TLS helpers. ``dev-cert`` writes a local CA and a
certificate for ``localhost`` / ``127.0.0.1`` signed by it, to try the
suite's TLS options out (see rustext/tls.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXAMPLES = """examples:
  juggler tls dev-cert --out certs                       # certs/ca.pem, certs/cert.pem, certs/key.pem
  juggler tls dev-cert --out certs --name app.test --name 10.0.0.5
  juggler up --tls-cert certs/cert.pem --tls-key certs/key.pem
  juggler client --tls-ca certs/ca.pem                   # then: connect wss://localhost:9000/ws
"""


def add_client_tls_arguments(p: argparse.ArgumentParser, servers: str) -> None:
    """--tls-ca / --tls-cert / --tls-key / --insecure, for clients of TLS
    servers (``servers`` names them in the help)."""
    p.add_argument("--tls-ca", metavar="FILE",
                   help=f"PEM CA certificate(s) to verify {servers} with (default: the system's trust store)")
    p.add_argument("--tls-cert", metavar="FILE", help="PEM client certificate, for servers that require one")
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    p.add_argument("--insecure", action="store_true",
                   help=f"do not verify {servers} at all (only for trying things out)")


def client_tls(args: argparse.Namespace, *, force: bool = False) -> Any:
    """The rustext.tls.ClientTls of the client TLS flags, or None when none
    is given (unless ``force``: then the system's trust store); raises
    TlsConfigError naming a bad file."""
    from rustext.tls import ClientTls

    if not force and not (args.tls_ca or args.tls_cert or args.tls_key or args.insecure):
        return None
    tls = ClientTls(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, insecure=args.insecure)
    tls.context()  # a bad file is reported now, naming it
    return tls


def add_server_tls_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """--tls-cert / --tls-key / --tls-client-ca, for servers (``what`` says
    what TLS serves, in the help)."""
    p.add_argument("--tls-cert", metavar="FILE",
                   help=f"PEM certificate chain (the server's first): {what}; reloaded on SIGHUP")
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert (ECDSA or RSA)")
    p.add_argument("--tls-client-ca", metavar="FILE",
                   help="require client certificates signed by these PEM CA certificates (mutual TLS)")


def client_ca_option(cert: str) -> tuple[str, str]:
    """What a client of a server using the certificate chain ``cert`` adds
    to its command line, for the servers' start lines: (``" --tls-ca
    FILE"``, or ``""`` when the system's trust store has the issuer; a note
    naming the CA when its file was not found beside the certificate)."""
    from rustext.tls import trust_hint

    hint = trust_hint(cert)
    if hint.system:
        return "", ""
    if hint.ca_file is not None:
        return f" --tls-ca {hint.ca_file}", ""
    return " --tls-ca CA.pem", f"CA.pem: the certificate of the CA that issued {cert} ({hint.issuer or 'unknown'})"


async def other_kind_hint(address: str, *, tls: bool, use_tls: str, use_plain: str) -> str:
    """After a client command failed to reach ``address`` (``HOST:PORT`` or
    ``tcp@HOST:PORT``): the line saying its port is of the other kind than
    the command dialled (``"HOST:PORT speaks TLS: " + use_tls`` when dialled
    in clear, ``"HOST:PORT does not speak TLS on this port: " + use_plain``
    when dialled with TLS), or "" when that is not it. Probes the port once
    (rustext.tls.speaks_tls): for the failure path of commands only."""
    from rustext.tls import speaks_tls

    if address.startswith(("quic@", "quic://", "kcp@", "kcp://")):
        return ""  # QUIC is always TLS and KCP never is, both on UDP: there is no other kind to probe for
    hostport = address.removeprefix("tcp@")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return ""
    answer = await speaks_tls(host.strip("[]"), int(port))
    if not tls and answer:
        return f"{hostport} speaks TLS: {use_tls}"
    if tls and answer is False:
        return f"{hostport} does not speak TLS on this port: {use_plain}"
    return ""


def server_tls(args: argparse.Namespace) -> Any:
    """The rustext.tls.ServerTls of the server TLS flags, or None; raises
    TlsConfigError (a bad file, named) or ValueError (flags that do not go
    together)."""
    from rustext.tls import ServerTls

    if not (args.tls_cert or args.tls_key or args.tls_client_ca):
        return None
    if not (args.tls_cert and args.tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    tls = ServerTls(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca)
    tls.context()
    return tls


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tls",
        help="TLS helpers: a local CA and a localhost certificate for trying TLS out",
        description="TLS helpers.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="tls_command", metavar="SUBCOMMAND")
    p = sub.add_parser(
        "dev-cert",
        help="write a local CA and a certificate for localhost/127.0.0.1 signed by it",
        description="Write a local certificate authority (ca.pem, ca-key.pem) and a server certificate "
        "(cert.pem, key.pem) signed by it, valid for localhost, 127.0.0.1 and ::1 plus any --name. "
        "An existing CA in the directory is reused, so clients that trust it keep trusting the "
        "certificates made later. For development only: keep ca-key.pem private.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write the files to (created if missing)")
    p.add_argument("--name", action="append", default=[], metavar="NAME",
                   help="another host name or IP address for the certificate (repeatable)")
    p.add_argument("--key-type", choices=("ec", "rsa"), default="ec",
                   help="ECDSA P-256 or RSA 2048 keys [%(default)s]")
    p.add_argument("--days", type=int, default=825, metavar="N", help="validity of the certificate [%(default)s]")
    p.set_defaults(func=run_dev_cert)
    parser.set_defaults(func=lambda args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run_dev_cert(args: argparse.Namespace) -> int:
    from rustext.tls import TlsConfigError, write_dev_cert

    names = ["localhost", "127.0.0.1", "::1", *args.name]
    try:
        made = write_dev_cert(args.out, names=names, key_type=args.key_type, days=args.days)
    except (TlsConfigError, OSError) as exc:
        print(f"juggler tls dev-cert: {exc}", file=sys.stderr)
        return 2
    ca = "reused the CA in" if made.ca_reused else "created a CA in"
    print(f"{ca} {made.ca}")
    print(f"certificate {made.cert} (key {made.key}) for {', '.join(dict.fromkeys(names))}")
    print(f"serve with:  --tls-cert {made.cert} --tls-key {made.key}")
    print(f"trust with:  --tls-ca {made.ca}   (or add it to your system's or browser's trust store)")
    return 0
