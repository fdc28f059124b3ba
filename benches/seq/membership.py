"""A membership change under load: the longest pause in IDs served while a member is replaced.

    .venv/bin/python benches/seq/membership.py [--clients 16] [--rounds 3] [--out FILE]

Starts its own 3-member cluster; `clients` tasks in this process draw IDs
with ``RRSeq(buf_size=0)`` (one NextID per ID, the worst case for a pause)
from every member's address, the new one included. Each round: steady
load for `settle` seconds, then ``Admin.add`` of a fresh member started
with ``--join``, steady load again, then ``Admin.remove`` of an old member
(stopped and wiped afterwards). For each phase it reports the longest gap
between two consecutive IDs served to any client (all clients together:
the time during which the cluster served nothing), the p99 and max latency
of one ``next()``, and how long the change call took. Checks: every client's
IDs increase, none is served twice.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benches.common import loadavg, save
from seq import RRSeq, SeqError
from seq.localcluster import LocalCluster
from seq.membership import Admin


class Phase:
    def __init__(self, name: str) -> None:
        self.name = name
        self.served: list[float] = []  # completion times, all clients
        self.latencies: list[float] = []
        self.change_s = 0.0

    def report(self) -> dict[str, Any]:
        ts = sorted(self.served)
        gaps = [b - a for a, b in itertools.pairwise(ts)]
        lat = sorted(self.latencies)
        return {
            "phase": self.name, "ids": len(ts), "longest_gap_ms": round(1000 * max(gaps, default=0.0), 2),
            "p99_latency_ms": round(1000 * lat[int(0.99 * (len(lat) - 1))], 2) if lat else None,
            "max_latency_ms": round(1000 * lat[-1], 2) if lat else None,
            "change_s": round(self.change_s, 3),
        }


async def run(clients: int, rounds: int, settle: float) -> dict[str, Any]:
    c = LocalCluster(3)
    results: list[dict[str, Any]] = []
    try:
        c.start_all("--bootstrap")
        await c.wait_ready(timeout=60)
        live = [0, 1, 2]
        for r in range(rounds):
            new = c.add_member()
            c.start(new, "--join")
            addrs = [c.addrs[i] for i in (*live, new)]
            seqs = [RRSeq("bench", 0, addrs, timeout=5.0) for _ in range(clients)]
            streams: list[list[int]] = [[] for _ in seqs]
            phase = Phase("steady")
            current = [phase]  # the phase the clients record into (switched by the loop below)
            stop = asyncio.Event()

            async def client(s: RRSeq, out: list[int], stop: asyncio.Event, current: list[Phase]) -> None:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    try:
                        out.append(await s.next())
                    except SeqError:
                        continue
                    t1 = time.perf_counter()
                    current[0].served.append(t1)
                    current[0].latencies.append(t1 - t0)

            tasks = [asyncio.ensure_future(client(s, out, stop, current)) for s, out in zip(seqs, streams, strict=True)]
            phases = []
            async with Admin() as admin:
                for what, member in (("add", new), ("remove", live[0])):
                    await asyncio.sleep(settle)
                    phases.append(phase)
                    phase = current[0] = Phase(f"{what} member")
                    t0 = time.perf_counter()
                    if what == "add":
                        await admin.add(addrs, c.addrs[member])
                    else:
                        await admin.remove(addrs, c.addrs[member])
                    phase.change_s = time.perf_counter() - t0
                    await asyncio.sleep(0.5)  # the change and what follows it
                    phases.append(phase)
                    phase = current[0] = Phase("steady")
            await asyncio.sleep(settle)
            phases.append(phase)
            stop.set()
            await asyncio.gather(*tasks)
            await asyncio.gather(*(s.aclose() for s in seqs))
            for k, st in enumerate(streams):
                assert all(a < b for a, b in itertools.pairwise(st)), f"client {k} went backwards"
            every = [i for st in streams for i in st]
            assert len(every) == len(set(every)), "an ID was served twice"
            old = live.pop(0)
            c.stop(old)
            c.wipe(old)
            live.append(new)
            for p in phases:
                rep = p.report()
                rep["round"] = r + 1
                results.append(rep)
                took = f", change took {rep['change_s']} s" if rep["change_s"] else ""
                print(f"round {r + 1} {rep['phase']:>13}: {rep['ids']:>7} IDs, longest gap "
                      f"{rep['longest_gap_ms']:>8.2f} ms, p99 {rep['p99_latency_ms']} ms, max "
                      f"{rep['max_latency_ms']} ms{took}", flush=True)
    finally:
        c.close()
    return {"clients": clients, "rounds": rounds, "settle_s": settle, "load": loadavg(), "phases": results}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of steady load around each change")
    ap.add_argument("--out", default="benches/seq/results/membership.json")
    args = ap.parse_args()
    import uvloop

    doc = uvloop.run(run(args.clients, args.rounds, args.settle))
    print(save(args.out, doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
