"""Cost of the service layer alone (no network, no wire codec): requests/s of
``ServiceDispatcher.dispatch`` for rpcx's benchmark ``Hello.Say`` (protobuf,
581 bytes) and a JSON ``Arith.Mul``, with and without the metrics plugin.

    python benches/rpc/bench_dispatch.py [--n 200000] [--rounds 5] [--out benches/rpc/results/dispatch.json]

The cases run in interleaved rounds; the median of the rounds is printed.

It bounds what the full server can reach: the transport and the rpcx codec
add their own cost on top of this per request.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rpc.examples import register_example, benchmark_request
from rpc.message import Message, SerializeType
from rpc.plugins import MetricsPlugin, PluginContainer
from rpc.service import Peer, ServiceDispatcher

from benches.common import loadavg, save


async def run(n: int, msg: Message, plugins: list[object]) -> tuple[float, float]:
    """Requests per second of wall clock, and CPU µs per request."""
    d = ServiceDispatcher(plugins=PluginContainer(plugins))
    register_example(d.registry, "bench")
    register_example(d.registry, "arith")
    peer = Peer(address="bench")
    dispatch = d.dispatch
    for _ in range(1000):
        await dispatch(msg, peer)
    start, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        await dispatch(msg, peer)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    await d.aclose()
    return n / elapsed, cpu / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", metavar="FILE", help="write the results (JSON) there")
    args = parser.parse_args()
    say = Message(service_path="Hello", service_method="Say", serialize_type=SerializeType.PROTOBUF,
                  payload=benchmark_request().SerializeToString(), metadata={"__ServerTimeout": "5000"})
    mul = Message(service_path="Arith", service_method="Mul", serialize_type=SerializeType.JSON,
                  payload=b'{"A":7,"B":6}')
    cases = (
        ("Hello.Say protobuf 581 B", say, False),
        ("Hello.Say protobuf 581 B + metrics", say, True),
        ("Arith.Mul JSON", mul, False),
    )
    load0 = loadavg()
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in cases}
    for _ in range(args.rounds):
        for name, msg, metrics in cases:
            rounds[name].append(uvloop.run(run(args.n, msg, [MetricsPlugin()] if metrics else [])))
    print(f"{'case':<40} {'req/s':>10} {'CPU us/req':>11}")
    results = {}
    for name, rs in rounds.items():
        rate, cpu = statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)
        results[name] = {"req_per_s": round(rate), "cpu_us_per_req": round(cpu, 2), "rounds": rs}
        print(f"{name:<40} {rate:>10,.0f} {cpu:>11.2f}")
    if args.out:
        save(args.out, {"n": args.n, "rounds": args.rounds, "loadavg_before": load0, "loadavg_after": loadavg(),
                        "cases": results})


if __name__ == "__main__":
    main()
