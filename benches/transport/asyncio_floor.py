"""What one awaited request costs in asyncio alone, on uvloop: the floor
under ``await conn.request()`` with no socket, framing, ids or deadlines.

``inflight`` tasks each loop on ``fut = loop.create_future(); await fut``;
one callback per loop turn resolves every waiting future at once, as a read
buffer of ``inflight`` responses does in the transport. Printed: CPU µs per
request (this process, ``getrusage``), median of the rounds. The transport
bench's client does this plus encoding, the deadline heap, the pending
table, the decoder and the socket; the gap between the two is what the
transport adds on the client side.

    python benches/transport/asyncio_floor.py --inflight 16 -n 500000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def one_round(inflight: int, n: int) -> float:
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future[int]] = []
    left = n
    scheduled = False

    def respond() -> None:
        nonlocal scheduled
        scheduled = False
        batch = waiting[:]
        waiting.clear()
        for f in batch:
            f.set_result(1)

    async def worker() -> None:
        nonlocal left, scheduled
        while left > 0:
            left -= 1
            fut = loop.create_future()
            waiting.append(fut)
            if not scheduled:
                scheduled = True
                loop.call_soon(respond)
            await fut

    t0 = cpu()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return (cpu() - t0) / n * 1e6


def main() -> None:
    import uvloop

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inflight", type=int, default=16)
    p.add_argument("-n", type=int, default=500_000, help="requests per round")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    per = [uvloop.run(one_round(a.inflight, a.n)) for _ in range(a.rounds)]
    print(f"asyncio floor, {a.inflight} in flight: {statistics.median(per):.2f} µs CPU per request "
          f"(rounds: {', '.join(f'{x:.2f}' for x in per)})")


if __name__ == "__main__":
    main()
