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
