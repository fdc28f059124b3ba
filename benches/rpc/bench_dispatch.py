"""Cost of the service layer alone (no network, no wire codec): requests/s of
``ServiceDispatcher.dispatch`` for rpcx's benchmark ``Hello.Say`` (protobuf,
581 bytes) and a JSON ``Arith.Mul``, with and without the metrics plugin.

    python benches/rpc/bench_dispatch.py [--n 200000]

It bounds what the full server can reach: the transport and the rpcx codec
add their own cost on top of this per request.
"""

from __future__ import annotations

import argparse
import time

import uvloop

from rpc.examples import register_example, benchmark_request
from rpc.message import Message, SerializeType
from rpc.plugins import MetricsPlugin, PluginContainer
from rpc.service import Peer, ServiceDispatcher


async def run(n: int, msg: Message, plugins: list[object]) -> float:
    d = ServiceDispatcher(plugins=PluginContainer(plugins))
    register_example(d.registry, "bench")
    register_example(d.registry, "arith")
    peer = Peer(address="bench")
    dispatch = d.dispatch
    for _ in range(1000):
        await dispatch(msg, peer)
    start = time.perf_counter()
    for _ in range(n):
        await dispatch(msg, peer)
    elapsed = time.perf_counter() - start
    await d.aclose()
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000)
    args = parser.parse_args()
    say = Message(service_path="Hello", service_method="Say", serialize_type=SerializeType.PROTOBUF,
                  payload=benchmark_request().SerializeToString(), metadata={"__ServerTimeout": "5000"})
    mul = Message(service_path="Arith", service_method="Mul", serialize_type=SerializeType.JSON,
                  payload=b'{"A":7,"B":6}')
    print(f"{'case':<40} {'req/s':>10} {'us/req':>8}")
    for name, msg, plugins in (
        ("Hello.Say protobuf 581 B", say, []),
        ("Hello.Say protobuf 581 B + metrics", say, [MetricsPlugin()]),
        ("Arith.Mul JSON", mul, []),
    ):
        rate = uvloop.run(run(args.n, msg, plugins))
        print(f"{name:<40} {rate:>10,.0f} {1e6 / rate:>8.2f}")


if __name__ == "__main__":
    main()
