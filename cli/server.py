"""``juggler server``: the juggler.0 websocket server alone."""

from __future__ import annotations

import argparse
from typing import Any

from cli.options import log_level

EXAMPLES = """examples:
  juggler server                                     # 127.0.0.1:9000/ws, in-memory broker
  juggler server --redis redis://127.0.0.1:6379/0    # with Redis (callees run elsewhere)
  juggler server --listen 0.0.0.0:8080 --path /juggler --metrics-port 9100
  juggler server --config juggler.toml               # every option: the manual's configuration reference
  juggler server --redis-cluster redis://10.0.0.1:7000,redis://10.0.0.2:7000   # Redis Cluster seeds
  juggler server --redis-rpc redis://rpc:6379/0 --redis-pubsub redis://events:6379/0
  juggler server --redis redis://127.0.0.1:6379/0 --jwt-secret "$SECRET" --allowed-origin 'https://*.example.com'
  juggler server --jwks-url https://idp.example.com/.well-known/jwks.json --jwt-audience juggler
  juggler server --tls-cert certs/cert.pem --tls-key certs/key.pem     # wss:// (juggler tls dev-cert --out certs)
  juggler server --redis rediss://redis.internal:6380/0 --redis-tls-ca redis-ca.pem
  juggler server --max-connections 20000 --rate-limit 100 --max-inflight-calls 64 --drain-timeout 15
  JUGGLER_API_KEY=$KEY juggler server --redis redis://127.0.0.1:6379/0 --api 127.0.0.1:9001   # the server HTTP API
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "server",
        help="the juggler.0 websocket server (--redis URL, --config FILE)",
        description="Serve juggler.0 websocket clients: CALL/PUB/SUB/UNSB through a broker "
        "(in-memory by default, Redis with --redis, wire- and Redis-compatible with the original).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(p)
    p.add_argument("--path", help="websocket path [/ws]")
    p.add_argument("--config", metavar="FILE", help="TOML config file (flags override it)")
    p.add_argument("--demo", action="store_true",
                   help="also serve the demo page at / and /stats.json (/juggler.js is always served)")
    p.set_defaults(func=run)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", metavar="HOST:PORT", help="listen address [127.0.0.1:9000]")
    p.add_argument("--redis", metavar="URL", help="use Redis at URL instead of the in-memory broker")
    p.add_argument("--redis-rpc", metavar="URL", help="Redis for calls and results (same as --redis)")
    p.add_argument("--redis-cluster", metavar="URLS",
                   help="Redis Cluster seed node URL(s), comma-separated, for calls and results (and pub-sub "
                   "unless --redis-pubsub*)")
    p.add_argument("--redis-pubsub", metavar="URL", help="a separate Redis for pub-sub")
    p.add_argument("--redis-pubsub-cluster", metavar="URLS", help="a separate Redis Cluster for pub-sub (seeds)")
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on this port")
    p.add_argument("--max-connections", type=int, metavar="N", help="websocket connections per process (0 = no limit)")
    p.add_argument("--rate-limit", type=float, metavar="PER_S", help="messages/s per connection (0 = no limit)")
    p.add_argument("--rate-burst", type=int, metavar="N", help="burst of --rate-limit")
    p.add_argument("--rate-limit-action", choices=("nack", "close"), help="over the rate: NACK 429 or close")
    p.add_argument("--max-inflight-calls", type=int, metavar="N", help="calls in flight per connection (0 = none)")
    p.add_argument("--max-waiting-calls", type=int, metavar="N",
                   help="calls waiting for their results, whole server (more: NACK 503; 0 = none)")
    p.add_argument("--max-subscriptions", type=int, metavar="N", help="subscriptions per connection (0 = none)")
    from cli.otel import add_otel_argument

    add_otel_argument(p)
    p.add_argument("--drain-timeout", type=float, metavar="S", help="at SIGTERM, time in-flight calls get [10]")
    p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain: serve wss:// (and the pages over https)")
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", metavar="FILE",
                   help="require client certificates signed by these PEM CA certificates (mutual TLS)")
    p.add_argument("--redis-tls-ca", metavar="FILE",
                   help="rediss:// URLs: PEM CA certificates to verify Redis with (default: the system's trust store)")
    p.add_argument("--redis-tls-cert", metavar="FILE", help="rediss:// URLs: PEM client certificate for Redis")
    p.add_argument("--redis-tls-key", metavar="FILE", help="rediss:// URLs: PEM private key of --redis-tls-cert")
    p.add_argument("--jwt-secret", metavar="SECRET", help="require a JWT signed with this HS256/384/512 secret (header or ?token=)")
    p.add_argument("--jwt-public-key", metavar="FILE", help="require a JWT signed by this PEM public key (RS*, PS*, ES*, EdDSA)")
    p.add_argument("--jwks-url", metavar="URL", help="require a JWT signed by a key of this JSON Web Key Set (an identity provider's)")
    p.add_argument("--jwt-audience", metavar="AUD", help="with JWTs: the aud claim must contain this")
    p.add_argument("--jwt-issuer", metavar="ISS", help="with JWTs: the iss claim must be this")
    p.add_argument("--auth-verifier", metavar="MODULE:FUNC", help="verify tokens with FUNC(token, request) -> claims")
    p.add_argument("--allowed-origin", action="append", metavar="GLOB", help="Origin allow-list (repeatable)")
    p.add_argument("--anonymous", action="store_true", default=None,
                   help="with auth: let connections without a token in (NACK 401 where an identity is needed)")
    p.add_argument("--api", metavar="HOST:PORT",
                   help="serve the server HTTP API here (POST /api/<method>, for backends); needs a key")
    p.add_argument("--api-key", metavar="KEY",
                   help="the key API requests must carry (default: the JUGGLER_API_KEY environment variable)")
    p.add_argument("--api-insecure", action="store_true", default=None,
                   help="serve the API without a key (only where every client that can reach it is trusted)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="any config option, VALUE in TOML syntax (repeatable), e.g. --set server.max_outbound=1000 "
                   "--set 'auth.issuer=\"me\"' --set 'redis.cluster_retry_timeout=5'")
    p.add_argument("--log-level", default="INFO", type=log_level, help="DEBUG, INFO, WARNING or ERROR [INFO]")
    p.add_argument("--gc-threshold", type=_gc_threshold, default=10_000, metavar="N",
                   help="once started, freeze the start-up objects out of Python's garbage collector and run its "
                   "first generation at N (fewer full collections while thousands of clients connect); "
                   "0 keeps Python's defaults [10000]")


def _gc_threshold(value: str) -> int:
    """An argparse type: an int of 0 or more (a bad value shows the usage, not a traceback)."""
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer of 0 or more, got {value!r}")
    return n


def apply_overrides(config: Any, items: list[str]) -> Any:
    """``SECTION.KEY=VALUE`` items (VALUE parsed as TOML, else taken as a string) on top of `config`."""
    import dataclasses
    import tomllib

    from juggler.config import config_from_dict

    data: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot or not key:
            raise ValueError(f"--set wants SECTION.KEY=VALUE, got {item!r}")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        data.setdefault(section, {})[key] = value
    out = config
    for section, values in data.items():
        current = getattr(config, section, None)
        if section not in ("server", "redis", "pubsub", "memory", "metrics", "auth", "api"):
            raise ValueError(f"unknown config section {section!r}")
        if current is None:  # not configured yet: build it from these values alone
            built = getattr(config_from_dict({section: values}), section)
        else:
            if section in ("server", "api") and "listen" in values:
                from juggler.config import parse_listen

                values["host"], values["port"] = parse_listen(values.pop("listen"))
            names = {f.name for f in dataclasses.fields(current)}
            unknown = sorted(set(values) - names)
            if unknown:
                raise ValueError(f"unknown option(s) in [{section}]: {', '.join(unknown)}")
            from rustext.fields import check_fields

            values = check_fields(type(current), values, section)
            try:
                built = dataclasses.replace(current, **values)
            except TypeError as exc:
                raise ValueError(f"[{section}]: {exc}") from exc
        out = dataclasses.replace(out, **{section: built})
    return out


def build_config(args: argparse.Namespace) -> Any:
    """The AppConfig of a config file (if any) with the flags applied on top."""
    import dataclasses

    from juggler.config import AppConfig, MetricsConfig, load_config, parse_listen

    config = load_config(args.config) if getattr(args, "config", None) else AppConfig()
    if getattr(args, "set", None):
        config = apply_overrides(config, args.set)
    server_kw: dict[str, Any] = {}
    if args.listen:
        server_kw["host"], server_kw["port"] = parse_listen(args.listen)
    if getattr(args, "path", None):
        server_kw["path"] = args.path
    for flag in ("max_connections", "rate_limit", "rate_burst", "rate_limit_action", "max_inflight_calls",
                 "max_waiting_calls", "max_subscriptions", "drain_timeout", "tls_cert", "tls_key", "tls_client_ca"):
        value = getattr(args, flag, None)
        if value is not None:
            server_kw[flag] = value
    if server_kw:
        config = dataclasses.replace(config, server=dataclasses.replace(config.server, **server_kw))
    rpc_url = getattr(args, "redis_rpc", None) or args.redis
    rpc_cluster = getattr(args, "redis_cluster", None)
    if rpc_url or rpc_cluster:
        from juggler.broker.redis import RedisBrokerConfig

        redis = config.redis or RedisBrokerConfig()
        if rpc_cluster:
            redis = dataclasses.replace(redis, cluster=rpc_cluster)
        else:
            redis = dataclasses.replace(redis, url=rpc_url, cluster=())
        config = dataclasses.replace(config, redis=redis)
    ps_url = getattr(args, "redis_pubsub", None)
    ps_cluster = getattr(args, "redis_pubsub_cluster", None)
    if ps_url or ps_cluster:
        from juggler.broker.redis import RedisBrokerConfig

        ps = config.pubsub or RedisBrokerConfig()
        ps = dataclasses.replace(ps, cluster=ps_cluster) if ps_cluster else dataclasses.replace(
            ps, url=ps_url, cluster=())
        config = dataclasses.replace(config, pubsub=ps)
    redis_tls = {k: getattr(args, f"redis_{k}", None) for k in ("tls_ca", "tls_cert", "tls_key")}
    redis_tls = {k: v for k, v in redis_tls.items() if v}
    if redis_tls:
        if config.redis is None:
            raise ValueError("--redis-tls-* options need a rediss:// Redis (--redis or --redis-cluster)")
        config = dataclasses.replace(config, redis=dataclasses.replace(config.redis, **redis_tls))
        if config.pubsub is not None:
            config = dataclasses.replace(config, pubsub=dataclasses.replace(config.pubsub, **redis_tls))
    if config.pubsub is not None and config.redis is None:
        raise ValueError("a separate pub-sub Redis needs --redis/--redis-rpc/--redis-cluster for RPC too")
    auth_kw: dict[str, Any] = {}
    for flag, key in (("jwt_secret", "jwt_secret"), ("jwt_public_key", "jwt_public_key"), ("jwks_url", "jwks_url"),
                      ("jwt_audience", "audience"), ("jwt_issuer", "issuer")):
        if getattr(args, flag, None):
            auth_kw[key] = getattr(args, flag)
    if getattr(args, "auth_verifier", None):
        auth_kw["verifier"] = args.auth_verifier
    if getattr(args, "allowed_origin", None):
        auth_kw["allowed_origins"] = tuple(args.allowed_origin)
    if getattr(args, "anonymous", None):
        auth_kw["anonymous"] = True
    if auth_kw:
        from juggler.auth import AuthConfig

        config = dataclasses.replace(config, auth=dataclasses.replace(config.auth or AuthConfig(), **auth_kw))
    config = _api_config(args, config)
    if args.metrics_port is not None:
        config = dataclasses.replace(config, metrics=dataclasses.replace(
            config.metrics or MetricsConfig(), port=args.metrics_port))
    return config


def _api_config(args: argparse.Namespace, config: Any) -> Any:
    """The [api] table with --api, --api-key, --api-insecure and JUGGLER_API_KEY on top
    (flags first, then the environment, then the file)."""
    import dataclasses
    import os

    from juggler.config import ApiConfig, parse_listen

    listen, key = getattr(args, "api", None), getattr(args, "api_key", None)
    insecure = getattr(args, "api_insecure", None)
    if key is not None and insecure:
        raise ValueError("--api-key and --api-insecure exclude each other")
    api = config.api
    if listen:
        host, port = parse_listen(listen)
        api = dataclasses.replace(api, host=host, port=port) if api is not None else ApiConfig(host=host, port=port)
    if api is None:
        if key is not None or insecure:
            raise ValueError(f"{'--api-key' if key is not None else '--api-insecure'} needs --api HOST:PORT "
                             "(or an [api] table in the config file)")
        return config
    if insecure:
        api = dataclasses.replace(api, key=None, insecure=True)
    elif key is not None:
        api = dataclasses.replace(api, key=key, insecure=False)
    elif os.environ.get("JUGGLER_API_KEY") and not api.insecure:
        api = dataclasses.replace(api, key=os.environ["JUGGLER_API_KEY"])
    return dataclasses.replace(config, api=api)


def run(args: argparse.Namespace, *, test_callees: bool = False, banner: str | None = None,
        demo: bool = False) -> int:
    import logging
    import sys

    import uvloop

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prog = f"juggler {args.command}"
    try:
        config = build_config(args)
    except (OSError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    from cli.otel import OtelSetupError, tracing_from_args

    try:
        tracing = tracing_from_args(args, "juggler-server")
    except OtelSetupError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    try:
        return uvloop.run(serve_app(prog, config, test_callees=test_callees,
                                    callee_workers=getattr(args, "workers", 200), banner=banner,
                                    demo=demo or getattr(args, "demo", False), traced=tracing is not None,
                                    gc_threshold=getattr(args, "gc_threshold", 0)))
    finally:
        if tracing is not None:
            tracing.shutdown()  # exports the spans still batched


async def serve_app(prog: str, config: Any, *, test_callees: bool, callee_workers: int, banner: str | None,
                    demo: bool, traced: bool = False, gc_threshold: int = 0) -> int:
    """Run a juggler server process under cli.lifecycle: one start-up line,
    drain on the first signal, stop on the second, SIGHUP reloads TLS."""
    import logging

    from cli.lifecycle import StartError, serve
    from juggler.broker.base import BrokerError
    from juggler.runner import Running, start_app
    from rustext.tls import TlsConfigError
    from rustext.tokens import TokenError

    log = logging.getLogger("juggler.server")
    if not logging.getLogger("juggler.conn.ws").level:
        logging.getLogger("juggler.conn.ws").setLevel(logging.WARNING)

    async def start() -> Running:
        try:
            return await start_app(config, test_callees=test_callees, callee_workers=callee_workers, demo=demo,
                                   traced=traced)
        except (TlsConfigError, ValueError) as exc:
            raise StartError(str(exc), status=2) from exc
        except (BrokerError, TokenError) as exc:
            raise StartError(str(exc)) from exc

    def ready(running: Running) -> None:
        broker_desc = f"redis {running.broker.description}" if config.redis is not None else "in-memory broker"
        if running.pubsub is not None:
            broker_desc += f", pub-sub on redis {running.pubsub.description}"
        extra = f", metrics on http://{config.metrics.host}:{running.metrics.port}/metrics" if running.metrics else ""
        if running.api is not None:
            extra += f", server API on {running.api.url}"
        callees = ", test callees test.echo/test.reverse/test.delay" if test_callees else ""
        log.info("juggler server listening on %s (%s%s%s)", running.server.url, broker_desc, callees, extra)
        if config.redis is None and not test_callees:
            log.warning("the in-memory broker reaches only callees in this process, and there are none: no "
                        "CALL can be served (each is answered NACK 404; pub-sub works). For the test callees run `juggler up`; for "
                        "callees in other processes use Redis: `juggler server --redis URL` and "
                        "`juggler callee --redis URL`")
        page = running.server.url.replace("ws", "http", 1).removesuffix(config.server.path) + "/"
        if demo:
            log.info("demo page on %s (browser client %sjuggler.js)", page, page)
        client_options, note = "", ""
        if config.server.tls_cert:
            from cli.tls import client_ca_option

            client_options, note = client_ca_option(config.server.tls_cert)
            log.info("clients verify it with: juggler client%s, then connect %s%s", client_options,
                     running.server.url, f" ({note})" if note else "")
        if banner:
            if note:
                client_options += f"      ({note})"
            if config.server.tls_cert and client_options:
                page += f"  (a browser must trust {client_options.split()[1]} first)"
            print(banner.format(url=running.server.url, page=page, client_options=client_options), flush=True)

    return await serve(prog, start, ready=ready, reload=Running.reload_tls, gc_threshold=gc_threshold)
