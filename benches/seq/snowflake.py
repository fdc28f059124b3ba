"""One snowflake worker: IDs/s and CPU per ID over gRPC and HTTP, ranges of 1 and of 1000.

    .venv/bin/python benches/seq/snowflake.py [--clients 32] [--duration 5] [--rounds 3] [--out FILE]

Starts its own 3-member cluster (it only holds the worker-ID lease) and one
``juggler seq snowflake`` worker, then alternates, each for `duration`
seconds, round after round:

- gRPC: `clients` tasks in this process calling ``NextID`` on the worker
  back to back (the native client, one connection);
- HTTP: ``wrk -t2`` with `clients` keep-alive connections sending ``GET
  /v1/next/NAME?count=N`` back to back.

One call, one contiguous range, nothing buffered. IDs/s = calls/s × count.
CPU: user + system time of the worker (/proc) and of the load generator
(this process for gRPC, wrk's from getrusage of reaped children), over the
timed part, per call and per ID. Checks: every gRPC range starts above the
caller's previous one and no two ranges overlap; wrk saw no error and the
worker counted as many requests as wrk got answers.
"""

from __future__ import annotations

import asyncio
import itertools
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
from seq.localworker import LocalWorker

WRK_SCRIPT = r"""
function done(summary, latency, requests)
  io.write(string.format(
    'WRK {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout, latency:percentile(50), latency:percentile(99)))
end
"""


def children_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def worker_requests(w: LocalWorker) -> int:
    with urllib.request.urlopen(f"{w.url}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("seq_snowflake_requests_total "):
                return int(float(line.split()[1]))
    raise RuntimeError("no seq_snowflake_requests_total in /metrics")


async def grpc_round(channel: ApiChannel, count: int, clients: int, duration: float) -> tuple[int, float]:
    """(calls, seconds): `clients` tasks calling NextID back to back; ranges checked."""
    stop = time.perf_counter() + duration
    starts: list[list[int]] = [[] for _ in range(clients)]

    async def one(k: int) -> None:
        mine = starts[k]
        prev = 0
        while time.perf_counter() < stop:
            lo, hi = await channel.next_id(0, "bench", count, 10.0)
            assert hi - lo == count and lo > prev, (lo, hi, prev)
            mine.append(lo)
            prev = hi - 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(clients)))
    seconds = time.perf_counter() - t0
    every = sorted(x for s in starts for x in s)
    assert all(b - a >= count for a, b in itertools.pairwise(every)), "two ranges overlap"
    return len(every), seconds


async def http_round(w: LocalWorker, script: str, count: int, clients: int, duration: float) -> dict[str, Any]:
    before = worker_requests(w)
    proc = await asyncio.create_subprocess_exec(
        "wrk", "-t", "2", "-c", str(clients), "-d", f"{max(1, round(duration))}s", "--timeout", "10s", "-s", script,
        f"{w.url}/v1/next/bench?count={count}", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    line = next(x for x in out.decode().splitlines() if x.startswith("WRK "))
    r = json.loads(line[4:])
    assert r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"] == 0, out.decode()
    served = worker_requests(w) - before
    assert 0 <= served - r["requests"] <= clients, (served, r)
    return dict(r)


async def main(clients: int, duration: float, rounds: int) -> list[dict[str, Any]]:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (the HTTP load generator)")
    c = LocalCluster(3)
    c.start_all("--bootstrap")
    tmp = tempfile.mkdtemp(prefix="seq-snowflake-")
    script = os.path.join(tmp, "done.lua")
    Path(script).write_text(WRK_SCRIPT)
    w = LocalWorker(c.addrs, os.path.join(tmp, "worker.log"))
    try:
        await c.wait_ready(timeout=60)
        w.start()
        import aiohttp

        async with aiohttp.ClientSession() as http:
            await w.wait_ready(http, timeout=60)
        assert w.proc is not None
        pid = w.proc.pid
        channel = ApiChannel([w.addr])
        await grpc_round(channel, 1, clients, 1)
        await http_round(w, script, 1, clients, 1)
        out: list[dict[str, Any]] = []
        for rnd in range(1, rounds + 1):
            for count in (1, 1000):
                for api in ("grpc", "http"):
                    load = loadavg()
                    s0 = proc_cpu_seconds(pid)
                    if api == "grpc":
                        g0 = self_cpu_seconds()
                        calls, seconds = await grpc_round(channel, count, clients, duration)
                        gen = self_cpu_seconds() - g0
                        p50 = p99 = None
                    else:
                        g0 = children_cpu_seconds()
                        r = await http_round(w, script, count, clients, duration)
                        gen = children_cpu_seconds() - g0
                        calls, seconds = r["requests"], r["duration_us"] / 1e6
                        p50, p99 = r["p50_us"] / 1000, r["p99_us"] / 1000
                    srv = proc_cpu_seconds(pid) - s0
                    row = {"round": rnd, "api": api, "count": count, "clients": clients,
                           "calls_per_s": round(calls / seconds), "ids_per_s": round(calls * count / seconds),
                           "worker_cpu_us_per_call": round(srv * 1e6 / calls, 1),
                           "loadgen_cpu_us_per_call": round(gen * 1e6 / calls, 1),
                           "worker_cpu_ns_per_id": round(srv * 1e9 / (calls * count), 1),
                           "p50_ms": p50, "p99_ms": p99, "loadavg_before": load}
                    out.append(row)
                    lat = f" p50={p50:.2f} ms p99={p99:.2f} ms" if p50 is not None else ""
                    print(f"round {rnd} {api:<4} count={count:<5} {row['calls_per_s']:>8,} calls/s "
                          f"{row['ids_per_s']:>12,} IDs/s  CPU per call: worker {row['worker_cpu_us_per_call']:.0f} us"
                          f" + load generator {row['loadgen_cpu_us_per_call']:.0f} us; worker per ID "
                          f"{row['worker_cpu_ns_per_id']:,.0f} ns{lat} load={load[0]}", flush=True)
        await channel.aclose()
        return out
    finally:
        w.stop()
        c.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    a = round_args(32, "gRPC tasks, and wrk connections")
    rows = uvloop.run(main(a.clients, a.duration, a.rounds))
    if a.out:
        save(a.out, {"setup": {"clients": a.clients, "duration": a.duration, "members": 3, "workers": 1,
                               "load_generators": {"grpc": "seq.channel.ApiChannel in-process",
                                                   "http": "wrk -t2"}},
                     "results": rows})
