"""``juggler callee``: serve the test callees (or an app) over Redis."""

from __future__ import annotations

import argparse
from typing import Any

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
    p.add_argument("--log-level", default="INFO", help="[%(default)s]")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal
    import sys

    import uvloop

    from juggler.broker.redis import RedisBroker, RedisBrokerConfig
    from juggler.callee import Callee, load_app, make_test_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.workers < 1 or args.n < 0:
        print("juggler callee: --workers must be >= 1 and -n >= 0", file=sys.stderr)
        return 2
    try:
        app = load_app(args.app) if args.app else make_test_app(args.n)
        config = RedisBrokerConfig(url=args.redis, call_batch=max(1, min(args.workers, 64)), result_cap=args.result_cap,
                                   cluster=args.redis_cluster or ())
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        print(f"juggler callee: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        broker = RedisBroker(config)
        try:
            await broker.start()
        except Exception as exc:
            print(f"juggler callee: cannot use Redis at {broker.description}: {exc}", file=sys.stderr)
            await broker.aclose()
            return 1
        callee = Callee(broker, app, workers=args.workers)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        metrics = None
        if args.metrics_port:
            metrics = _serve_metrics(callee, broker, args.metrics_port)
        await callee.start()
        logging.getLogger("juggler.callee").info(
            "serving %d URIs (%s) from %s with %d workers",
            len(callee.uris), ", ".join(callee.uris[:6]) + (" …" if len(callee.uris) > 6 else ""),
            broker.description, args.workers,
        )
        waiter = asyncio.create_task(callee.wait())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        code = 0
        if waiter.done() and not waiter.cancelled() and waiter.exception() is not None:
            code = 1
        await callee.drain(timeout=args.drain_timeout)
        waiter.cancel()
        await asyncio.wait([waiter])
        await callee.aclose()
        await broker.aclose()
        if metrics is not None:
            metrics.close()
        s = callee.stats
        logging.getLogger("juggler.callee").info(
            "stopped: %d calls, %d results, %d errors, %d expired", s.calls, s.results, s.errors, s.expired
        )
        return code

    return uvloop.run(main())


def _serve_metrics(callee: Any, broker: Any, port: int) -> Any:
    """Prometheus metrics of one callee process, read from its counters at scrape time."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector, CollectorRegistry

    from juggler.metrics import serve_metrics

    class CalleeCollector(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            s = callee.stats
            b = broker.stats
            yield CounterMetricFamily("juggler_callee_calls", "Calls taken from the broker", value=s.calls)
            yield CounterMetricFamily("juggler_callee_results", "Results stored", value=s.results)
            yield CounterMetricFamily("juggler_callee_errors", "Results that are errors", value=s.errors)
            yield CounterMetricFamily(
                "juggler_callee_expired", "Calls skipped or results dropped because the TTL ran out",
                value=s.expired + b.expired_calls,
            )
            yield CounterMetricFamily("juggler_callee_store_failures", "Results the broker failed to store",
                                      value=s.store_failures)
            yield GaugeMetricFamily("juggler_callee_running", "Calls running now", value=s.running)

    registry = CollectorRegistry()
    registry.register(CalleeCollector())
    return serve_metrics(registry, port)
