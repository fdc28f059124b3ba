"""``juggler callee``: serve the test callees (or an app) over Redis."""

from __future__ import annotations

import argparse
from typing import Any

from cli.options import log_level

EXAMPLES = """examples:
  juggler callee                                   # test.echo, test.reverse, test.delay on local Redis
  juggler callee --redis redis://10.0.0.5:6379/0 --workers 200
  juggler callee -n 4                              # also test.delay.0 .. test.delay.3
  juggler callee --app myapp.rpc:app               # a CalleeApp, or a dict URI -> function
  juggler callee --redis-cluster redis://10.0.0.1:7000,redis://10.0.0.2:7000   # on a Redis Cluster
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "callee",
        help="run callees (the test ones or --app module:object) over Redis",
        description="Pop calls from Redis, run the registered functions, store their results "
        "(juggler.0 Redis layout, interoperable with the original Go server and callee).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0", metavar="URL", help="Redis URL [%(default)s]")
    p.add_argument("--redis-cluster", metavar="URLS",
                   help="Redis Cluster seed node URL(s), comma-separated (instead of --redis); "
                   "one blocking pop per hash slot of the URIs served")
    p.add_argument("--workers", type=int, default=50, metavar="N", help="calls run at once [%(default)s]")
    p.add_argument("-n", type=int, default=0, metavar="N", help="also serve test.delay.0 .. test.delay.N-1")
    p.add_argument("--app", metavar="MODULE:OBJECT", help="serve this app instead of the test callees")
    p.add_argument("--result-cap", type=int, default=100_000, metavar="N",
                   help="max results queued per caller, 0 = unbounded [%(default)s]")
    p.add_argument("--drain-timeout", type=float, default=10.0, metavar="S",
                   help="on SIGINT/SIGTERM, seconds to let running calls finish [%(default)s]")
    p.add_argument("--metrics-port", type=int, default=0, metavar="PORT",
                   help="serve Prometheus metrics on 127.0.0.1:PORT/metrics (0 = off)")
    p.add_argument("--log-level", default="INFO", type=log_level, help="DEBUG, INFO, WARNING or ERROR [INFO]")
    from cli.otel import add_otel_argument

    add_otel_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging
    import sys

    import uvloop

    from juggler.broker.redis import RedisBrokerConfig
    from juggler.callee import load_app, make_test_app
    from rustext.appspec import AppImportError, cwd_on_path

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.workers < 1 or args.n < 0:
        print("juggler callee: --workers must be >= 1 and -n >= 0", file=sys.stderr)
        return 2
    try:
        if args.app:
            cwd_on_path()
            app = load_app(args.app)
        else:
            app = make_test_app(args.n)
        config = RedisBrokerConfig(url=args.redis, call_batch=max(1, min(args.workers, 64)), result_cap=args.result_cap,
                                   cluster=args.redis_cluster or ())
    except (AppImportError, TypeError, ValueError) as exc:
        print(f"juggler callee: {exc}", file=sys.stderr)
        return 2
    from cli.otel import OtelSetupError, tracing_from_args

    try:
        tracing = tracing_from_args(args, "juggler-callee")
    except OtelSetupError as exc:
        print(f"juggler callee: {exc}", file=sys.stderr)
        return 2
    try:
        return uvloop.run(_serve(args, app, config, traced=tracing is not None))
    finally:
        if tracing is not None:
            tracing.shutdown()  # exports the spans still batched


async def _serve(args: argparse.Namespace, app: Any, config: Any, *, traced: bool = False) -> int:
    import logging

    from cli.lifecycle import StartError, serve
    from juggler.broker.base import BrokerError
    from juggler.runner import CalleeProcess, start_callee

    async def start() -> CalleeProcess:
        try:
            return await start_callee(config, app, workers=args.workers, drain_timeout=args.drain_timeout,
                                      metrics_port=args.metrics_port or None, traced=traced)
        except BrokerError as exc:
            raise StartError(str(exc)) from exc

    def ready(r: CalleeProcess) -> None:
        uris = r.callee.uris
        logging.getLogger("juggler.callee").info(
            "serving %d URIs (%s) from %s with %d workers",
            len(uris), ", ".join(uris[:6]) + (" …" if len(uris) > 6 else ""), r.broker.description, args.workers,
        )

    return await serve("juggler callee", start, ready=ready, wait=lambda r: r.callee.wait())
