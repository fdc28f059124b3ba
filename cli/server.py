"""``juggler server``: the juggler.0 websocket server alone."""

from __future__ import annotations

import argparse
from typing import Any

EXAMPLES = """examples:
  juggler server                                     # 127.0.0.1:9000/ws, in-memory broker
  juggler server --redis redis://127.0.0.1:6379/0    # with Redis (callees run elsewhere)
  juggler server --listen 0.0.0.0:8080 --path /juggler --metrics-port 9100
  juggler server --config juggler.toml               # every option (see README: config reference)
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
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on this port")
    p.add_argument("--log-level", default="INFO", help="[%(default)s]")


def build_config(args: argparse.Namespace) -> Any:
    """The AppConfig of a config file (if any) with the flags applied on top."""
    import dataclasses

    from juggler.config import AppConfig, MetricsConfig, load_config, parse_listen

    config = load_config(args.config) if getattr(args, "config", None) else AppConfig()
    server_kw: dict[str, Any] = {}
    if args.listen:
        server_kw["host"], server_kw["port"] = parse_listen(args.listen)
    if getattr(args, "path", None):
        server_kw["path"] = args.path
    if server_kw:
        config = dataclasses.replace(config, server=dataclasses.replace(config.server, **server_kw))
    if args.redis:
        from juggler.broker.redis import RedisBrokerConfig

        redis = config.redis or RedisBrokerConfig()
        config = dataclasses.replace(config, redis=dataclasses.replace(redis, url=args.redis))
    if args.metrics_port is not None:
        config = dataclasses.replace(config, metrics=dataclasses.replace(
            config.metrics or MetricsConfig(), port=args.metrics_port))
    return config


def run(args: argparse.Namespace, *, test_callees: bool = False, banner: str | None = None,
        demo: bool = False) -> int:
    import logging
    import sys

    import uvloop

    from juggler.runner import run_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = build_config(args)
    except (OSError, ValueError) as exc:
        print(f"juggler {args.command}: {exc}", file=sys.stderr)
        return 2
    return uvloop.run(run_app(config, test_callees=test_callees,
                              callee_workers=getattr(args, "workers", 200), banner=banner,
                              demo=demo or getattr(args, "demo", False)))
