"""Buffer 0 (one quorum write per ID), N clients, for D seconds: IDs/s, latency, CPU per ID per process.

    .venv/bin/python benches/seq/buf0.py [--clients 32] [--duration 5] [--rounds 1] [--out FILE]

Starts its own 3-member cluster (fsync on). CPU per ID: user + system time of
this (client) process from getrusage and of each server from /proc, over the
timed part only, divided by the IDs drawn. Runs whatever `seq` package is
first on sys.path, so the same file measures another checkout (PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from seq import RRSeq
from seq.channel import ApiChannel
from seq.bench import measure, proc_cpu_seconds, self_cpu_seconds
from seq.localcluster import LocalCluster

from benches.common import loadavg, save


async def main(clients: int, duration: float, rounds: int, label: str,
               server_flags: list[str]) -> list[dict[str, Any]]:
    c = LocalCluster(3)
    c.start_all("--bootstrap", *server_flags)
    try:
        await c.wait_ready(timeout=60)
        pids = [m.proc.pid for m in c.members if m.proc is not None]
        channel = ApiChannel(c.addrs)  # one connection per server, shared by the clients
        await measure(lambda: RRSeq("warm", 0, channel=channel, timeout=10), clients, duration=0.5)
        out: list[dict[str, Any]] = []
        for _ in range(rounds):
            load = os.getloadavg()[0]
            load0 = loadavg()
            c0, s0 = self_cpu_seconds(), [proc_cpu_seconds(p) for p in pids]
            r = await measure(lambda: RRSeq("b0", 0, channel=channel, timeout=10), clients, duration=duration)
            cli = (self_cpu_seconds() - c0) * 1e6 / r.ids
            srv = [(proc_cpu_seconds(p) - s) * 1e6 / r.ids for p, s in zip(pids, s0)]
            print(f"{label} {time.strftime('%H:%M:%S')} load={load:.1f} clients={clients} "
                  f"{r.ids_per_s:,.0f} IDs/s p50={r.p50_ms:.2f} ms p99={r.p99_ms:.2f} ms max={r.max_ms:.1f} ms "
                  f"CPU us/ID client={cli:.0f} servers={'+'.join(f'{x:.0f}' for x in srv)} "
                  f"total={cli + sum(srv):.0f}", flush=True)
            out.append({"ids": r.ids, "seconds": r.seconds, "ids_per_s": round(r.ids_per_s), "p50_ms": r.p50_ms,
                        "p99_ms": r.p99_ms, "max_ms": r.max_ms, "client_cpu_us_per_id": round(cli, 1),
                        "servers_cpu_us_per_id": [round(x, 1) for x in srv], "loadavg_before": load0,
                        "loadavg_after": loadavg()})
        await channel.aclose()
        return out
    finally:
        c.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--label", default="")
    ap.add_argument("--server-flag", action="append", default=[], help="extra flag for the servers (repeat)")
    ap.add_argument("--out", metavar="FILE", help="write every round (JSON) there")
    a = ap.parse_args()
    rounds = uvloop.run(main(a.clients, a.duration, a.rounds, a.label, a.server_flag))
    if a.out:
        save(a.out, {"setup": {"clients": a.clients, "duration": a.duration, "buffer": 0,
                               "server_flags": a.server_flag}, "rounds": rounds})
