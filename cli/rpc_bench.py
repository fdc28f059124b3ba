"""``juggler rpc bench``: the benchmark client (rpcx-benchmark's report).

Wired by ``cli/rpc.py`` (``rpc_bench.register(rpc_subparsers)``); also runs
alone: ``python -m cli.rpc_bench inproc:bench -c 100 -n 100000``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from cli.otel import add_otel_argument
from cli.rpc_route import TARGET_HELP, add_route_arguments, route_of
from cli.kcp import add_kcp_arguments, kcp_options, uses_kcp
from cli.tls import add_client_tls_arguments, client_tls

DESCRIPTION = ("Benchmark client: -n calls from -c concurrent callers, then rpcx-benchmark's report "
               "(TPS; mean, median, p99, p99.9, max and min latency) and the client's CPU.")

EPILOG = """examples:
  juggler rpc bench 127.0.0.1:8972 -c 100 -n 1000000 --pool 10 --processes 2   # vs `rpc serve --example bench`
  juggler rpc bench http://127.0.0.1:8080 -c 50 -n 20000                        # through the HTTP gateway
  juggler rpc bench inproc:bench -n 200000                                     # client + service layer, no network
  juggler rpc bench etcd://127.0.0.1:2379/rpcx -c 50 -n 100000 --selector roundrobin   # the servers registered there
  juggler rpc bench redis://127.0.0.1:6379/rpcx --example arith --fail-mode failover --group canary
  juggler rpc bench dns+srv://_rpcx._tcp.arith.default.svc.cluster.local --example arith --selector weighted
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("address", metavar="ADDR|REGISTRY",
                   help=f"host:port, quic@host:port or kcp@host:port (rpcx), http://host:port (gateway), inproc:NAME, or {TARGET_HELP}")
    p.add_argument("-c", "--concurrency", type=int, default=100, help="concurrent callers (default 100)")
    p.add_argument("-n", "--total", type=int, default=100_000, help="total calls (default 100000)")
    p.add_argument("--pool", type=int, default=10, help="connections per client process (default 10)")
    p.add_argument("--processes", type=int, default=1, help="client processes sharing -c and -n (default 1)")
    p.add_argument("--example", choices=("bench", "arith"), default="bench",
                   help="bench: Hello.Say with the 581-byte protobuf message; arith: Arith.Mul JSON")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="per-call deadline (default 10 s)")
    p.add_argument("--tls", action="store_true",
                   help="rpcx over TLS, verified against the system's trust store (implied by --tls-ca, --insecure)")
    add_client_tls_arguments(p, "TLS servers (rpcx, https:// gateways)")
    add_kcp_arguments(p)
    add_route_arguments(p)
    add_otel_argument(p)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark client (TPS, latency percentiles)", description=DESCRIPTION,
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rpc.bench import BenchTarget, format_report, run_bench
    from rpc.callers import SCHEMES, scheme_of
    from rpc.message import SerializeType

    if args.concurrency < 1 or args.total < 1 or args.pool < 1 or args.processes < 1:
        print("error: -c, -n, --pool and --processes must be >= 1", file=sys.stderr)
        return 2
    from rustext.tls import TlsConfigError

    try:
        route = route_of(args, args.address)
        tls = client_tls(args, force=args.tls)
        kcp = kcp_options(args, required=uses_kcp(args.address))
    except (TlsConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if route is None and scheme_of(args.address) not in SCHEMES:
        print(f"error: no caller for {args.address!r}", file=sys.stderr)
        return 2
    if route is None and tls is not None and scheme_of(args.address) in ("inproc", "grpc"):
        print("error: TLS options apply to rpcx and https:// addresses only", file=sys.stderr)
        return 2
    setup_tracing = None
    from cli.otel import OtelSetupError, check_tracing, otel_wanted, start_tracing

    if otel_wanted(args.otel):
        import functools

        try:  # refused here, in one line, rather than in each client process
            check_tracing()
        except OtelSetupError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        setup_tracing = functools.partial(start_tracing, "juggler-rpc-bench")
    if args.example == "bench":
        from rpc.examples import benchmark_request

        target = BenchTarget(args.address, "Hello", "Say", SerializeType.PROTOBUF,
                             benchmark_request().SerializeToString(), pool=args.pool, timeout=args.timeout, tls=tls,
                             kcp=kcp, route=route, setup_tracing=setup_tracing)
    else:
        target = BenchTarget(args.address, "Arith", "Mul", SerializeType.JSON, b'{"A":7,"B":6}',
                             pool=args.pool, timeout=args.timeout, tls=tls, kcp=kcp, route=route,
                             setup_tracing=setup_tracing)
    if route is not None:
        problem = _check_route(route, target.service)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 1
    try:
        result = run_bench(target, concurrency=args.concurrency, total=args.total, processes=args.processes)
    except KeyboardInterrupt:
        print("juggler rpc bench: stopped", file=sys.stderr)
        return 130
    print(format_report(result, concurrency=args.concurrency, processes=args.processes))
    if result.interrupted:
        return 130
    if result.ok == 0 and route is None and scheme_of(args.address) == "rpcx":
        import asyncio

        from cli.tls import other_kind_hint

        hint = asyncio.run(other_kind_hint(
            args.address, tls=tls is not None, use_tls="benchmark it over TLS (--tls, or --tls-ca FILE)",
            use_plain="benchmark it without --tls / --tls-ca"))
        if hint:
            print(f"error: {hint}", file=sys.stderr)
    return 0 if result.errors == 0 else 1


def _check_route(route: Any, service: str) -> str:
    """Why the benchmark cannot run through ``route`` ("" when it can): the
    registry unreachable, or no server there for ``service``; said once here
    rather than as every call's error."""
    import uvloop

    from rpc.errors import NoServerAvailable, RegistryUnavailable

    async def check() -> str:
        try:
            async with route.xclient(service, None):
                return ""
        except (RegistryUnavailable, NoServerAvailable) as exc:
            return str(exc)

    return uvloop.run(check())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="juggler rpc bench", description=DESCRIPTION,
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
