"""``juggler rpc transport-bench``: echo benchmark of rpc.transport over one
connection (client here, server in its own process), with a raw-socket echo
reference measured in the same run."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

DESCRIPTION = ("Echo benchmark of the multiplexed transport over one connection (client here, server in "
               "its own process), with a raw-socket echo measured in the same run as the reference.")

EPILOG = """examples:
  juggler rpc transport-bench --payload 4096 --inflight 16 --duration 5
  juggler rpc transport-bench --payload 262144 --inflight 4 --channel unix
  juggler rpc transport-bench --payload 4096 --inflight 1 --no-raw --json
  juggler rpc transport-bench --payload 4096 --inflight 16 --protocol frame
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "transport-bench",
        help="echo benchmark of the transport (client and server in separate processes)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--payload", type=int, default=4096, help="payload bytes per request (default 4096)")
    p.add_argument("--inflight", type=int, default=16, help="requests outstanding on the connection (default 16)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per measurement (default 5)")
    p.add_argument("--channel", choices=["tcp", "unix"], default="tcp")
    p.add_argument("--protocol", default="rpcx", help="transport protocol: rpcx (default) or frame")
    p.add_argument("--no-raw", action="store_true", help="skip the raw socket echo reference")
    p.add_argument("--iperf3", action="store_true", help="also measure one-way loopback bandwidth with iperf3")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rpc.transport import bench
    from rustext.interrupt import two_step_interrupt

    if args.payload < 0 or args.inflight < 1 or args.duration <= 0:
        print("juggler rpc transport-bench: need --payload >= 0, --inflight >= 1, --duration > 0", file=sys.stderr)
        return 2
    box = {"stop": False}
    stopped = lambda: box["stop"]  # noqa: E731
    results = []
    try:
        with two_step_interrupt(lambda: box.update(stop=True), prog="juggler rpc transport-bench"):
            results.append(bench.run_one("transport", args.channel, args.payload, args.inflight, args.duration,
                                         args.protocol, stopped))
            if not args.no_raw and not box["stop"]:
                results.append(bench.run_one("raw", args.channel, args.payload, args.inflight, args.duration,
                                             stopped=stopped))
            if args.iperf3 and not box["stop"]:
                r = bench.run_iperf3(args.duration)
                if r is not None:
                    results.append(r)
    except KeyboardInterrupt:
        print("juggler rpc transport-bench: stopped", file=sys.stderr)
        return 130
    if args.json:
        for r in results:
            print(json.dumps(bench.result_dict(r)))
    else:
        print(bench.HEADER)
        for r in results:
            print(bench.format_row(r))
        if len(results) > 1 and results[1].mbps > 0:
            print(f"\ntransport / raw bandwidth: {100 * results[0].mbps / results[1].mbps:.0f}%")
    return 130 if box["stop"] else 0
