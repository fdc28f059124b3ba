"""``juggler balancer``: the HTTP load balancer (Rust data plane)."""

from __future__ import annotations

import argparse
from typing import Any

from cli.options import log_level

EXAMPLES = """examples:
  juggler balancer --listen 0.0.0.0:8080 --backends 127.0.0.1:9001,127.0.0.1:9002
  juggler balancer --listen :8080 --backends 10.0.0.1:80=3,10.0.0.2:80=1 --algorithm weighted_round_robin
  juggler balancer --listen 127.0.0.1:8080 --backends 127.0.0.1:9001 --workers 1 --admin 127.0.0.1:9090
  juggler balancer --config balancer.toml        # SIGHUP reloads the file
  juggler balancer --config balancer.toml --handover-socket /run/lb/handover.sock
  juggler balancer --config balancer.toml --handover-socket /run/lb/handover.sock \\
      --takeover /run/lb/handover.sock           # binary upgrade: take the listeners, the old process drains
  juggler balancer --listen :8080 --backends 127.0.0.1:9001 --rate-limit 100/s   # per client address: 429 beyond
  juggler balancer --listen :8080 --backends 127.0.0.1:9001 --access-log /var/log/lb/access.log --log-format json
  juggler balancer --config balancer.toml --admin 0.0.0.0:9090 --admin-users-file admin.htpasswd \\
      --admin-public /metrics                    # users from `htpasswd -cB admin.htpasswd alice`
  juggler balancer --listen :443 --backends 127.0.0.1:9001 --tls-cert certs/cert.pem --tls-key certs/key.pem \\
      --http-redirect :80                        # HTTPS (h2 and http/1.1), HTTP redirected to it
  juggler balancer --listen :50051 --backends 10.0.0.1:50051,10.0.0.2:50051 --backend-proto h2
                                                 # gRPC: each call to the next backend (h2c both sides)

algorithms: round_robin, weighted_round_robin, least_connections, random_two, consistent_hash
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "balancer",
        help="HTTP load balancer (Rust data plane, Python control plane)",
        description="HTTP/1.1, HTTP/2 and gRPC reverse proxy and load balancer (in clear or over TLS). "
                    "Flags override the config file.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="TOML configuration (reloaded on SIGHUP)")
    p.add_argument("--check", action="store_true",
                   help="read the configuration (file and flags) as a start would, report the first mistake with "
                        "its file and line, and exit (0: valid) without serving, as `haproxy -c` and `nginx -t`")
    p.add_argument("--listen", metavar="HOST:PORT", help="where clients connect")
    p.add_argument("--backends", metavar="HOST:PORT[=W],...", help="backend servers (optional =weight)")
    p.add_argument("--algorithm", help="balancing algorithm (default round_robin)")
    p.add_argument("--hash-key", help="consistent_hash key: client_ip, path or header:NAME")
    p.add_argument("--workers", type=int, help="data plane threads (default: number of cores)")
    p.add_argument("--admin", metavar="HOST:PORT", help="admin/metrics endpoint")
    p.add_argument("--metrics-port", type=int, help="admin/metrics endpoint on 127.0.0.1:PORT")
    p.add_argument("--admin-users-file", metavar="FILE",
                   help="ask admin requests for HTTP Basic credentials: name:bcrypt-hash lines (htpasswd -B)")
    p.add_argument("--admin-token-file", metavar="FILE",
                   help="ask admin requests for this bearer token (the file's content)")
    p.add_argument("--admin-public", action="append", default=[], metavar="PATH",
                   help="a read-only admin path answered without credentials (/metrics, /healthz, ...); repeat")
    p.add_argument("--health-path", help="enable active health checks: GET this path")
    p.add_argument("--handover-socket", metavar="PATH",
                   help="Unix socket (mode 0600) where a new balancer started with --takeover takes this one's "
                        "listening sockets (a binary upgrade)")
    p.add_argument("--takeover", metavar="PATH",
                   help="take the listening sockets of the balancer serving this handover socket, then tell it "
                        "to drain and exit; it keeps serving if this start fails")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to finish in-flight requests on exit")
    p.add_argument("--tls-cert", action="append", default=[], metavar="FILE",
                   help="serve HTTPS: PEM certificate chain (repeat with --tls-key for several certificates, "
                        "picked by SNI; the first is the default); reloaded on SIGHUP")
    p.add_argument("--tls-key", action="append", default=[], metavar="FILE",
                   help="PEM private key of the --tls-cert at the same position")
    p.add_argument("--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA")
    p.add_argument("--http-redirect", metavar="HOST:PORT",
                   help="plain-HTTP listener that redirects every request to HTTPS (308)")
    p.add_argument("--backend-tls", action="store_true", help="speak TLS to the backends")
    p.add_argument("--backend-proto", choices=("h1", "h2"),
                   help="HTTP version to the backends: h1 (default) or h2 (h2c, or ALPN h2 with --backend-tls; "
                        "gRPC backends need h2)")
    p.add_argument("--backend-ca", metavar="FILE",
                   help="PEM CA to verify backends with (default: the system's trust store)")
    p.add_argument("--access-log", metavar="FILE|-",
                   help="one line per request to FILE (reopened on SIGHUP) or - (standard output)")
    p.add_argument("--log-format", metavar="FMT",
                   help="access log format: haproxy (default), combined, json, or a format of HAProxy log-format variables")
    p.add_argument("--rate-limit", metavar="N/s",
                   help="at most N requests per second (or N/m) per client address, more get 429 "
                        "(the [rate_limit] table has burst, header keys, ...)")
    p.add_argument("--log-level", default="INFO", type=log_level, help="DEBUG, INFO, WARNING or ERROR [INFO]")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace):  # -> BalancerConfig
    from balancer.config import BalancerConfig, load, parse_backends
    from balancer.errors import BalancerConfigError

    if args.listen and args.listen.startswith(":"):
        args.listen = "0.0.0.0" + args.listen
    if args.http_redirect and args.http_redirect.startswith(":"):
        args.http_redirect = "0.0.0.0" + args.http_redirect
    if args.config:
        cfg = load(args.config)
    else:
        if not args.listen or not args.backends:
            raise BalancerConfigError("give --config FILE, or --listen and --backends")
        cfg = BalancerConfig(listen=args.listen, backends=tuple(parse_backends(args.backends)))
    return apply_flags(args, cfg)


def apply_flags(args: argparse.Namespace, cfg: Any) -> Any:
    """``cfg`` with the flags' settings over it: at start, and again over the
    file at each reload (so that a reload keeps what the flags said)."""
    import dataclasses

    from balancer.config import HealthCheck, parse_backends
    from balancer.errors import BalancerConfigError

    changes: dict[str, object] = {}
    if args.listen:
        changes["listen"] = args.listen
    if args.backends and args.config:
        changes["backends"] = tuple(parse_backends(args.backends))
    if args.algorithm:
        changes["algorithm"] = args.algorithm
    if args.hash_key:
        changes["hash_key"] = args.hash_key
    if args.backend_proto:
        changes["proto"] = args.backend_proto
    if args.workers is not None:
        changes["workers"] = args.workers
    if getattr(args, "handover_socket", None):
        changes["handover_socket"] = args.handover_socket
    if args.admin:
        changes["admin"] = args.admin
    elif args.metrics_port is not None:
        changes["admin"] = f"127.0.0.1:{args.metrics_port}"
    if args.health_path:
        changes["health"] = HealthCheck(path=args.health_path)
    if getattr(args, "rate_limit", None):
        from balancer.ratelimit import RateLimit

        base_rl = cfg.rate_limit
        changes["rate_limit"] = RateLimit(rate=args.rate_limit, **(
            {k: getattr(base_rl, k) for k in ("burst", "max_keys", "status")} if base_rl else {}))
    if args.access_log or args.log_format:
        from balancer.config import AccessLog

        base_log = cfg.access_log
        path = args.access_log or (base_log.path if base_log else None)
        if path is None:
            raise BalancerConfigError("--log-format needs --access-log FILE (or an [access_log] table)")
        changes["access_log"] = AccessLog(path=path, format=args.log_format or (
            base_log.format if base_log else "haproxy"))
    if args.admin_users_file or args.admin_token_file or args.admin_public:
        from balancer.auth import AdminAuth

        base_auth = cfg.admin_auth
        changes["admin_auth"] = AdminAuth(
            users=base_auth.users if base_auth else (),
            users_file=args.admin_users_file or (base_auth.users_file if base_auth else None),
            token_file=args.admin_token_file or (base_auth.token_file if base_auth else None),
            token_env=base_auth.token_env if base_auth else None,
            public=tuple(args.admin_public) or (base_auth.public if base_auth else ()),
            **({"realm": base_auth.realm} if base_auth else {}),
        )
    if args.tls_cert or args.tls_key or args.tls_client_ca or args.http_redirect or args.backend_tls or args.backend_ca:
        from balancer.config import Certificate, Tls

        if len(args.tls_cert) != len(args.tls_key):
            raise BalancerConfigError("give one --tls-key for each --tls-cert")
        base = cfg.tls
        changes["tls"] = Tls(
            certificates=tuple(Certificate(cert=c, key=k) for c, k in zip(args.tls_cert, args.tls_key))
            or base.certificates,
            client_ca=args.tls_client_ca or base.client_ca,
            redirect=args.http_redirect or base.redirect,
            backend=args.backend_tls or bool(args.backend_ca) or base.backend,
            backend_ca=args.backend_ca or base.backend_ca,
            backend_insecure=base.backend_insecure,
        )
    return dataclasses.replace(cfg, **changes) if changes else cfg


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import sys

    from balancer.errors import BalancerConfigError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = build_config(args)
        if args.check:
            import dataclasses
            import tempfile

            from rustext import Balancer

            if cfg.acme is not None and cfg.tls is not None:
                # the certificate ACME keeps may not be obtained yet: check with a placeholder in its
                # place, and leave the folder as it is
                from balancer.acme.storage import Storage
                from balancer.config import acme_certificate

                with tempfile.TemporaryDirectory() as tmp:
                    Storage(tmp).ensure_placeholder(cfg.acme.names)
                    managed = acme_certificate(cfg.acme)
                    stand_in = acme_certificate(dataclasses.replace(cfg.acme, storage=tmp))
                    certs = tuple(stand_in if c == managed else c for c in cfg.tls.certificates)
                    Balancer(dataclasses.replace(cfg, tls=dataclasses.replace(cfg.tls, certificates=certs)))
            else:
                Balancer(cfg)  # what the data plane checks: certificates and keys readable and matching
    except BalancerConfigError as exc:
        print(f"juggler balancer: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"juggler balancer: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"juggler balancer: the configuration{' in ' + args.config if args.config else ''} is valid")
        return 0
    try:
        import uvloop

        return uvloop.run(_serve(cfg, args))
    except ImportError:
        return asyncio.run(_serve(cfg, args))


async def _serve(cfg: Any, args: argparse.Namespace) -> int:
    import asyncio

    from balancer.errors import BalancerError
    from balancer.runner import BalancerProcess
    from cli.lifecycle import StartError, serve

    async def start() -> BalancerProcess:
        try:
            process = BalancerProcess(cfg, config_path=args.config, drain_timeout=args.drain_timeout,
                                      overrides=lambda new: apply_flags(args, new))
            await process.start(takeover=getattr(args, "takeover", None))
        except BalancerError as exc:
            raise StartError(str(exc), status=2) from exc
        return process

    def ready(p: BalancerProcess) -> None:
        if p.admin_address is not None:
            import logging

            logging.getLogger("balancer").info("admin on http://%s:%d/", *p.admin_address)

    return await serve("juggler balancer", start, ready=ready, wait=lambda p: p.taken_over(),
                       reload=lambda p: asyncio.ensure_future(p.lb.reload_logged()))
