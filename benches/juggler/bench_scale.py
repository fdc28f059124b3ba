"""Juggler at scale: 2 servers on a 3-master Redis Cluster vs 1 server on 1 Redis,
and the memory of idle websocket connections.

One run, everything on this machine:

1. single: a fresh redis-server, one `juggler server --redis`, one `juggler
   callee --redis --workers 200`, `juggler load -c 20` closed loop on
   test.echo;
2. cluster: a Redis Cluster (3 masters + 3 replicas, redis-server processes),
   two `juggler server --redis-cluster`, one `juggler callee --redis-cluster
   --workers 200`, and two `juggler load -c 10` at once, one per server
   (20 connections in total);
3. idle: N idle websocket connections (juggler.0 handshake done, then
   silent but for the pongs to the server's keepalive pings) opened by a
   minimal asyncio client process against one of the
   cluster servers; the server's RSS before and after gives RSS per 1,000
   idle connections. ``ulimit -n`` is raised to the hard limit first.

    .venv/bin/python benches/juggler/bench_scale.py              # 10 s loads, 10,000 idle connections
    .venv/bin/python benches/juggler/bench_scale.py -d 5s --idle 20000 --json
    .venv/bin/python benches/juggler/bench_scale.py --out benches/juggler/results/scale.json

CPU per call is the user + system time of every server, callee and
redis-server process of the setting over the load, divided by the results
(the load tools' own CPU is not included).

Not a test: it measures and prints, and exits 0 unless something failed to run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benches.common import loadavg, proc_cpu_seconds, save  # noqa: E402
from tests.netutil import free_port, wait_for_port  # noqa: E402
sys.path.insert(0, str(ROOT / "tests" / "juggler"))


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    wait_for_port(port, timeout=timeout, proc=proc)


def juggler(*args: str, log: Any = subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def stop(p: subprocess.Popen) -> int:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    return p.returncode


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def load(urls: list[str], connections: int, duration: str) -> list[dict[str, Any]]:
    procs = [
        subprocess.Popen([sys.executable, "-m", "cli", "load", "--url", u, "-c", str(connections), "-d", duration,
                          "--json", "--quiet"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        for u in urls
    ]
    return [json.loads(p.communicate(timeout=300)[0]) for p in procs]


def measured_load(urls: list[str], connections: int, duration: str, pids: list[int]) -> dict[str, Any]:
    """``load`` with the CPU time the setting's processes (``pids``) spent per call."""
    c0 = sum(proc_cpu_seconds(p) for p in pids)
    out = summarize(load(urls, connections, duration))
    results = max(1, out.pop("results"))
    out["cpu_us_per_call"] = round((sum(proc_cpu_seconds(p) for p in pids) - c0) / results * 1e6, 1)
    return out


def summarize(reports: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "results": sum(r["results"] for r in reports),
        "calls_per_s": round(sum(r["throughput"] for r in reports)),
        "median_ms": max(r["latency_ms"].get("median", 0) for r in reports),
        "p99_ms": max(r["latency_ms"].get("p99", 0) for r in reports),
        "nacks": sum(r["nacks"] for r in reports),
        "expired": sum(r["expired"] for r in reports),
        "errors": sum(r["errors"] for r in reports),
    }


# the idle-connection client ------------------------------------------------------

REQUEST = (
    "GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    "Sec-WebSocket-Protocol: juggler.0\r\n\r\n"
)


_PING, _PONG = b"\x89\x00", b"\x8a\x80\x00\x00\x00\x00"  # the server's empty ping; an empty masked pong


class _Idle(asyncio.Protocol):
    """An idle client as a browser tab is one: it sends nothing but answers
    the server's keepalive pings (the only frames it is sent)."""

    def __init__(self, done: asyncio.Future[bool], request: bytes) -> None:
        self.done = done
        self.request = request
        self.buf = b""
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.done.done():
            if b"\r\n\r\n" in self.buf:
                head, self.buf = self.buf.split(b"\r\n\r\n", 1)
                self.done.set_result(head.startswith(b"HTTP/1.1 101"))
            return
        while self.buf[:2] == _PING:
            self.buf = self.buf[2:]
            self.transport.write(_PONG)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(False)


async def idle_client(port: int, n: int) -> None:
    loop = asyncio.get_running_loop()
    request = REQUEST.format(port=port).encode()
    sem = asyncio.Semaphore(256)
    transports = []
    ok = 0

    async def one() -> None:
        nonlocal ok
        async with sem:
            done = loop.create_future()
            try:
                t, _ = await loop.create_connection(lambda: _Idle(done, request), "127.0.0.1", port)
            except OSError:
                return
            transports.append(t)
            if await asyncio.wait_for(done, 30):
                ok += 1

    await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    print(f"ready {ok}", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until the bench closes our stdin
    for t in transports:
        t.close()


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def idle(server_pid: int, port: int, n: int) -> dict[str, Any]:
    before = rss_kib(server_pid)
    client = subprocess.Popen([sys.executable, __file__, "--idle-client", str(port), str(n)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None
        line = client.stdout.readline().strip()
        held = int(line.split()[1]) if line.startswith("ready") else 0
        time.sleep(1.0)  # let the server settle (timers, logs)
        after = rss_kib(server_pid)
    finally:
        assert client.stdin is not None
        client.stdin.close()
        client.wait(60)
    per_1000 = (after - before) / max(held, 1) * 1000 / 1024
    return {"connections": held, "rss_before_mib": round(before / 1024, 1), "rss_after_mib": round(after / 1024, 1),
            "rss_per_1000_idle_mib": round(per_1000, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-d", "--duration", default="10s")
    ap.add_argument("--idle", type=int, default=10_000, help="idle connections to open [%(default)s]")
    ap.add_argument("--workers", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", metavar="FILE", help="write the raw results (JSON) there")
    ap.add_argument("--idle-client", nargs=2, type=int, metavar=("PORT", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    nofile = raise_nofile()
    if args.idle_client:
        import uvloop

        uvloop.run(idle_client(*args.idle_client))
        return 0
    from rediscluster import RedisCluster

    out: dict[str, Any] = {"ulimit_n": nofile, "loadavg_before": loadavg()}
    procs: list[subprocess.Popen] = []
    workdir = tempfile.mkdtemp(prefix="juggler-bench-")
    logs = open(os.path.join(workdir, "procs.log"), "wb")  # noqa: SIM115
    try:
        # 1. single server, single Redis
        rport = free_port()
        redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(rport), "--bind",
                                  "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir],
                                 stdout=subprocess.DEVNULL)
        procs.append(redis)
        wait_port(rport, redis)
        rurl = f"redis://127.0.0.1:{rport}/0"
        sport = free_port()
        server = juggler("server", "--redis", rurl, "--listen", f"127.0.0.1:{sport}", log=logs)
        callee = juggler("callee", "--redis", rurl, "--workers", str(args.workers), log=logs)
        procs += [server, callee]
        wait_port(sport, server)
        time.sleep(0.5)
        out["single"] = measured_load([f"ws://127.0.0.1:{sport}/ws"], 20, args.duration,
                                      [server.pid, callee.pid, redis.pid])
        for p in (server, callee, redis):
            stop(p)
        # 2. two servers on a 3-master cluster
        cluster = RedisCluster.create()
        try:
            ports = [free_port(), free_port()]
            servers = [juggler("server", "--redis-cluster", cluster.seeds, "--listen", f"127.0.0.1:{p}", log=logs)
                       for p in ports]
            callee = juggler("callee", "--redis-cluster", cluster.seeds, "--workers", str(args.workers), log=logs)
            procs += [*servers, callee]
            for p, s in zip(ports, servers, strict=True):
                wait_port(p, s)
            time.sleep(0.5)
            pids = [*(s.pid for s in servers), callee.pid, *(n.proc.pid for n in cluster.nodes if n.proc)]
            out["cluster_2_servers"] = measured_load([f"ws://127.0.0.1:{p}/ws" for p in ports], 10, args.duration,
                                                     pids)
            # 3. idle connections on one of them
            out["idle"] = idle(servers[0].pid, ports[0], args.idle)
            for p in (*servers, callee):
                stop(p)
        finally:
            cluster.stop()
    finally:
        for p in procs:
            stop(p)
        logs.close()
        shutil.rmtree(workdir, ignore_errors=True)
    out["loadavg_after"] = loadavg()
    if args.out:
        save(args.out, {"setup": {"duration": args.duration, "idle": args.idle, "workers": args.workers}, **out})
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        s, c, i = out["single"], out["cluster_2_servers"], out["idle"]
        print(f"single server + single Redis : {s['calls_per_s']:>7,} calls/s  median {s['median_ms']:.2f} ms  "
              f"p99 {s['p99_ms']:.2f} ms  CPU {s['cpu_us_per_call']} µs/call  (nacks {s['nacks']}, expired {s['expired']})")
        print(f"2 servers + 3-master cluster : {c['calls_per_s']:>7,} calls/s  median {c['median_ms']:.2f} ms  "
              f"p99 {c['p99_ms']:.2f} ms  CPU {c['cpu_us_per_call']} µs/call  (nacks {c['nacks']}, expired {c['expired']})")
        print(f"idle: {i['connections']:,} connections held by one server, RSS {i['rss_before_mib']} -> "
              f"{i['rss_after_mib']} MiB, {i['rss_per_1000_idle_mib']} MiB per 1,000 (ulimit -n {nofile})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
