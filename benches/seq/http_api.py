"""The HTTP API against gRPC: ranges of 1 and of 1000 IDs, one call per range, in one run.

    .venv/bin/python benches/seq/http_api.py [--clients 33] [--duration 5] [--rounds 3] [--out FILE]

Starts its own 3-member cluster (fsync on, ``--http`` on every member) and
alternates, each for `duration` seconds, round after round:

- gRPC: `clients` tasks in this process, each calling ``NextID`` (the
  native client, one connection per member shared by all, members taken in
  turn) back to back;
- HTTP: ``wrk`` with 3 threads, one per member, `clients` connections in
  all, each sending ``GET /v1/next/NAME?count=N`` back to back (keep-alive).

Both sides do the same thing: one call, one range, nothing buffered. IDs/s
= ranges/s × count. CPU per request: user + system time of the load
generator (this process for gRPC, wrk from getrusage of reaped children for
HTTP) and of the three members (/proc), over the timed part, divided by the
ranges served. Every HTTP run checks that the members' ``/v1/names`` count
as many IDs as wrk received 200s times the count (a request wrk counted is a
range the cluster served), and that wrk saw no error.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benches.common import loadavg, round_args, save
from seq.bench import proc_cpu_seconds, self_cpu_seconds
from seq.channel import ApiChannel
from seq.localcluster import LocalCluster

# One thread per member (setup() is called once per thread, in order); the summary as JSON.
WRK_SCRIPT = r"""
local members = {}
for hp in string.gmatch(os.getenv("SEQ_HTTP_MEMBERS"), "[^,]+") do table.insert(members, hp) end
local k = 0
function setup(thread)
  local host, port = members[k % #members + 1]:match("^(.+):(%d+)$")
  thread.addr = wrk.lookup(host, port)[1]
  k = k + 1
end
function done(summary, latency, requests)
  io.write(string.format(
    'WRK {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout, latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def children_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def served_ids(c: LocalCluster, name: str) -> int:
    total = 0
    for u in c.http_urls:
        with urllib.request.urlopen(f"{u}/v1/names?limit=10000", timeout=10) as r:
            total += sum(row["ids_served"] for row in json.load(r)["names"] if row["name"] == name)
    return total


async def grpc_round(c: LocalCluster, channel: ApiChannel, name: str, count: int, clients: int,
                     duration: float) -> tuple[int, float]:
    """(ranges, seconds): `clients` tasks calling NextID back to back."""
    stop = time.perf_counter() + duration
    done = [0]

    async def one(k: int) -> None:
        i = k
        while time.perf_counter() < stop:
            lo, hi = await channel.next_id(i % c.n, name, count, 10.0)
            assert hi - lo == count and lo > 0, (lo, hi)
            done[0] += 1
            i += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(clients)))
    return done[0], time.perf_counter() - t0


async def http_round(c: LocalCluster, script: str, name: str, count: int, clients: int,
                     duration: float) -> dict[str, Any]:
    env = dict(os.environ, SEQ_HTTP_MEMBERS=",".join(m.http_addr or "" for m in c.members))
    url = f"{c.http_urls[0]}/v1/next/{name}?count={count}"
    before = served_ids(c, name)
    proc = await asyncio.create_subprocess_exec(
        "wrk", "-t", str(c.n), "-c", str(clients), "-d", f"{max(1, round(duration))}s", "--timeout", "10s", "-s", script, url,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    line = next(x for x in out.decode().splitlines() if x.startswith("WRK "))
    r = json.loads(line[4:])
    errors = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
    assert errors == 0, out.decode()
    served = served_ids(c, name) - before
    # A request wrk sent when its time ran out may be served after it stopped counting: at most one a connection.
    assert 0 <= served - r["requests"] * count <= clients * count, (served, r)
    return r


async def main(clients: int, duration: float, rounds: int) -> list[dict[str, Any]]:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (the HTTP load generator)")
    c = LocalCluster(3, http=True)
    c.start_all("--bootstrap")
    tmp = tempfile.mkdtemp(prefix="seq-wrk-")
    script = os.path.join(tmp, "next.lua")
    Path(script).write_text(WRK_SCRIPT)
    try:
        await c.wait_ready(timeout=60)
        pids = [m.proc.pid for m in c.members if m.proc is not None]
        channel = ApiChannel(c.addrs)
        await grpc_round(c, channel, "warm", 1, clients, 1)
        await http_round(c, script, "warm-http", 1, clients, 1)
        out: list[dict[str, Any]] = []
        for rnd in range(1, rounds + 1):
            for count in (1, 1000):
                for api in ("grpc", "http"):
                    name = f"{api}-{count}"
                    load = loadavg()
                    s0 = sum(proc_cpu_seconds(p) for p in pids)
                    if api == "grpc":
                        g0 = self_cpu_seconds()
                        ranges, seconds = await grpc_round(c, channel, name, count, clients, duration)
                        gen = self_cpu_seconds() - g0
                        p50 = p99 = None
                    else:
                        g0 = children_cpu_seconds()
                        r = await http_round(c, script, name, count, clients, duration)
                        gen = children_cpu_seconds() - g0
                        ranges, seconds = r["requests"], r["duration_us"] / 1e6
                        p50, p99 = r["p50_us"] / 1000, r["p99_us"] / 1000
                    srv = sum(proc_cpu_seconds(p) for p in pids) - s0
                    row = {"round": rnd, "api": api, "count": count, "clients": clients,
                           "requests_per_s": round(ranges / seconds), "ids_per_s": round(ranges * count / seconds),
                           "loadgen_cpu_us_per_request": round(gen * 1e6 / ranges, 1),
                           "servers_cpu_us_per_request": round(srv * 1e6 / ranges, 1),
                           "p50_ms": p50, "p99_ms": p99, "loadavg_before": load}
                    out.append(row)
                    lat = f" p50={p50:.2f} ms p99={p99:.2f} ms" if p50 is not None else ""
                    print(f"round {rnd} {api:<4} count={count:<5} {row['requests_per_s']:>8,} req/s "
                          f"{row['ids_per_s']:>12,} IDs/s  CPU us/req: load generator "
                          f"{row['loadgen_cpu_us_per_request']:.0f} + 3 members {row['servers_cpu_us_per_request']:.0f}"
                          f"{lat} load={load[0]}", flush=True)
        await channel.aclose()
        return out
    finally:
        c.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    a = round_args(33, "gRPC tasks, and wrk connections (11 per member)")
    rows = uvloop.run(main(a.clients, a.duration, a.rounds))
    if a.out:
        save(a.out, {"setup": {"clients": a.clients, "duration": a.duration, "members": 3,
                               "load_generators": {"grpc": "seq.channel.ApiChannel in-process",
                                                   "http": "wrk -t3 (one thread per member)"}},
                     "results": rows})
