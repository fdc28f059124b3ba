"""``juggler load``: the juggler load generator (see juggler/load.py)."""

from __future__ import annotations

import argparse
from typing import Any

EXAMPLES = """examples:
  juggler load                                     # 20 connections, closed loop, test.echo, 10s
  juggler load -c 50 -d 30s --uri test.delay --payload '"10"'
  juggler load -r 5000 -d 20s --timeout 1s         # fixed total rate of 5000 calls/s
  juggler load --procs 2 --json > report.json      # spread over 2 processes, machine-readable
  juggler load --mode fanout --subscribers 1000 --rate 50 --payload-bytes 100 -d 20s --procs 2
                                                   # pub-sub: 1000 subscribers, 50 PUB/s, PUB→EVNT latency
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "load",
        help="load generator for a juggler server (calls/s, CALL→RES latency percentiles)",
        description="Open N websocket connections and send CALLs closed loop (or at a fixed rate); "
        "report calls, ACKs, NACKs, results, expired calls and CALL→RES latency "
        "(min/mean/median/p75/p90/p99/max).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mode", choices=("call", "fanout"), default="call",
                   help="call: CALLs as below; fanout: subscribers on one channel and a publisher [%(default)s]")
    p.add_argument("--subscribers", type=int, default=100, metavar="N",
                   help="fanout: websocket subscribers of the channel [%(default)s]")
    p.add_argument("--payload-bytes", type=int, default=100, metavar="B",
                   help="fanout: padding of each published message [%(default)s]")
    p.add_argument("--channel", default="bench.fanout", help="fanout: the channel [%(default)s]")
    p.add_argument("--server-pid", type=int, metavar="PID",
                   help="fanout: the server's process id (same machine): report its CPU time per delivery")
    p.add_argument("--compression", action="store_true",
                   help="fanout: the subscribers offer permessage-deflate, as browsers do")
    p.add_argument("--url", default="ws://127.0.0.1:9000/ws", help="[%(default)s]")
    p.add_argument("-c", "--connections", type=int, default=20, metavar="N", help="connections [%(default)s]")
    p.add_argument("-d", "--duration", default="10s", metavar="DURATION", help="how long, e.g. 10s, 1m [%(default)s]")
    p.add_argument("-r", "--rate", type=float, default=0.0, metavar="PER_S",
                   help="total calls per second, 0 = closed loop; fanout: PUBs per second (default 50) [%(default)s]")
    p.add_argument("--uri", default="test.echo", help="[%(default)s]")
    p.add_argument("--payload", default='"hello"', metavar="JSON", help="the args of each call, JSON [%(default)s]")
    p.add_argument("--timeout", default="5s", metavar="DURATION", help="call timeout [%(default)s]")
    p.add_argument("--procs", type=int, default=1, metavar="P",
                   help="processes to spread the connections over [%(default)s]")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no live progress line")
    p.add_argument("--tls-ca", metavar="FILE",
                   help="wss:// URLs: PEM CA certificate(s) to verify the server with (default: the system's trust store)")
    p.add_argument("--insecure", action="store_true", help="wss:// URLs: do not verify the server at all")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from juggler.load import LoadConfig, main_progress_printer, run_load
    from juggler.repl import ReplError, parse_duration

    def seconds(text: str) -> float:
        try:
            return float(text)  # a bare number is seconds
        except ValueError:
            return parse_duration(text)

    if args.mode == "fanout":
        return run_fanout_cli(args, seconds)
    try:
        cfg = LoadConfig(
            url=args.url, connections=args.connections, duration=seconds(args.duration),
            rate=args.rate, uri=args.uri, payload=args.payload, timeout=seconds(args.timeout),
            procs=args.procs, tls_ca=args.tls_ca, insecure=args.insecure,
        )
    except (ValueError, ReplError) as exc:
        print(f"juggler load: {exc}", file=sys.stderr)
        return 2
    progress = None if args.quiet else main_progress_printer(sys.stderr)
    try:
        report = run_load(cfg, progress, prog="juggler load")
    except KeyboardInterrupt:
        print("juggler load: stopped", file=sys.stderr)
        return 130
    if progress is not None and sys.stderr.isatty():
        sys.stderr.write("\n")
    if args.json:
        print(report.to_json())
    else:
        print(report.format())
    if report.interrupted:
        return 130
    if report.calls == 0:
        return 1
    return 0


def run_fanout_cli(args: argparse.Namespace, seconds: Any) -> int:
    """``juggler load --mode fanout``: see juggler/fanout.py."""
    import sys

    from juggler.fanout import FanoutConfig, run_fanout
    from juggler.repl import ReplError

    try:
        cfg = FanoutConfig(url=args.url, subscribers=args.subscribers, rate=args.rate or 50.0,
                           duration=seconds(args.duration), payload_bytes=args.payload_bytes,
                           channel=args.channel, procs=args.procs, server_pid=args.server_pid,
                           compression=args.compression)
    except (ValueError, ReplError) as exc:
        print(f"juggler load: {exc}", file=sys.stderr)
        return 2
    try:
        report = run_fanout(cfg)
    except KeyboardInterrupt:
        print("juggler load: stopped", file=sys.stderr)
        return 130
    print(report.to_json() if args.json else report.format())
    return 0 if report.published and not report.lost else 1
