"""Soak: each server under a steady mixed load for a given time, sampled as it goes.

    .venv/bin/python benches/soak/soak.py --duration 120            # minutes in CI
    .venv/bin/python benches/soak/soak.py --duration 3600 --interval 30   # an hour, by hand
    .venv/bin/python benches/soak/soak.py --only rpc --clients 16

For each product (the balancer in front of a backend, ``juggler rpc serve``, a
three-member seq cluster) it starts real processes, runs ``--clients`` client
tasks for ``--duration`` seconds, and every ``--interval`` seconds samples the
servers' resident memory and open descriptors and the latency percentiles and
errors of the requests completed in that interval. A leak shows as memory or
descriptors that keep climbing from sample to sample; a stall as a p99 or max
that grows. The samples go to ``benches/soak/results/soak-<product>.json``
and a table is printed; nothing is asserted (benchmarks measure).

The load mixes requests: GETs of 1 KiB and 64 KiB and POST echoes of 4 KiB
through the balancer; Arith.Mul and Arith.Add calls over one pooled rpcx
client; unbuffered and buffered draws of several sequence names from seq.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benches.common import free_port, loadavg, save, wait_port

RESULTS = ROOT / "benches" / "soak" / "results"
PRODUCTS = ("balancer", "rpc", "seq")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def pct(sorted_ms: list[float], p: float) -> float:
    if not sorted_ms:
        return 0.0
    return round(sorted_ms[min(len(sorted_ms) - 1, int(p / 100 * len(sorted_ms)))], 3)


class Window:
    """Latencies and errors of the requests completed since the last sample."""

    def __init__(self) -> None:
        self.ms: list[float] = []
        self.errors = 0

    def take(self) -> tuple[list[float], int]:
        ms, errors = sorted(self.ms), self.errors
        self.ms, self.errors = [], 0
        return ms, errors


async def drive(one: Callable[[int], Awaitable[None]], pids: Callable[[], list[int]], args: argparse.Namespace,
                product: str) -> list[dict[str, Any]]:
    """``args.clients`` tasks calling ``one(i)`` in a loop; a sample every interval."""
    window = Window()
    stop = asyncio.Event()

    async def client(k: int) -> None:
        i = k
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                await one(i)
                window.ms.append((time.perf_counter() - t0) * 1000)
            except Exception:  # noqa: BLE001 - counted: a soak goes on through errors
                window.errors += 1
                await asyncio.sleep(0.01)
            i += args.clients

    tasks = [asyncio.create_task(client(k)) for k in range(args.clients)]
    samples: list[dict[str, Any]] = []
    start = time.monotonic()
    try:
        while (elapsed := time.monotonic() - start) < args.duration:
            await asyncio.sleep(min(args.interval, args.duration - elapsed))
            ms, errors = window.take()
            live = pids()
            s = {"t": round(time.monotonic() - start, 1), "ok": len(ms), "errors": errors,
                 "p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "max_ms": round(ms[-1], 3) if ms else 0.0,
                 "rss_kib": sum(rss_kib(p) for p in live), "fds": sum(fds(p) for p in live),
                 "load": loadavg()[0]}
            samples.append(s)
            print(f"{product:9} {s['t']:7.1f}s ok {s['ok']:7} err {s['errors']:4}  p50 {s['p50_ms']:8.2f} ms"
                  f"  p99 {s['p99_ms']:8.2f} ms  max {s['max_ms']:8.2f} ms  rss {s['rss_kib']:8} KiB"
                  f"  fds {s['fds']:5}", flush=True)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return samples


def spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


async def http_exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes,
                        body: bytes = b"") -> bytes:
    writer.write(head + body)
    await writer.drain()
    status = await reader.readline()
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    data = await reader.readexactly(length)
    if not status.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(status.decode("latin-1").strip())
    return data


async def soak_balancer(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    bport, lport = free_port(), free_port()
    backend = spawn([sys.executable, str(ROOT / "tests" / "balancer" / "backend.py"), f"127.0.0.1:{bport}", "b0"],
                    work / "backend.log")
    cfg = work / "lb.toml"
    cfg.write_text(f'listen = "127.0.0.1:{lport}"\nworkers = 2\nbackends = ["127.0.0.1:{bport}"]\n')
    lb = spawn([sys.executable, "-m", "cli", "balancer", "--config", str(cfg)], work / "lb.log")
    conns: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
    try:
        wait_port(bport, 60)
        wait_port(lport, 60)
        payload = b"x" * 4096

        async def one(i: int) -> None:
            k = i % args.clients
            if k not in conns:
                conns[k] = await asyncio.open_connection("127.0.0.1", lport)
            r, w = conns[k]
            try:
                kind = i % 3
                if kind == 0:
                    await http_exchange(r, w, b"GET /size/1024 HTTP/1.1\r\nHost: soak\r\n\r\n")
                elif kind == 1:
                    await http_exchange(r, w, b"GET /size/65536 HTTP/1.1\r\nHost: soak\r\n\r\n")
                else:
                    await http_exchange(r, w, b"POST /echo HTTP/1.1\r\nHost: soak\r\nContent-Length: 4096\r\n\r\n",
                                        payload)
            except BaseException:
                del conns[k]
                w.close()
                raise

        return await drive(one, lambda: [lb.pid], args, "balancer")
    finally:
        for _, w in conns.values():
            w.close()
        stop(lb)
        stop(backend)


async def soak_rpc(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    from rpc.client import Client
    from rpc.rpcx_client import RpcxCaller

    port = free_port()
    server = spawn([sys.executable, "-m", "cli", "rpc", "serve", "--listen", f"127.0.0.1:{port}",
                    "--example", "arith"], work / "rpc.log")
    try:
        wait_port(port, 60)
        async with Client(f"tcp@127.0.0.1:{port}", RpcxCaller(pool=2), close_caller=True) as c:
            async def one(i: int) -> None:
                method = "Mul" if i % 2 else "Add"
                await c.call("Arith", method, {"A": i, "B": 3}, timeout=5)

            return await drive(one, lambda: [server.pid], args, "rpc")
    finally:
        stop(server)


async def soak_seq(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    from seq import RRSeq
    from seq.localcluster import LocalCluster

    (work / "seq").mkdir()
    cluster = LocalCluster(3, root=str(work / "seq"))
    cluster.start_all("--bootstrap")
    try:
        await cluster.wait_ready(timeout=60)
        seqs = [RRSeq(f"soak{k % 4}", 0 if k % 2 else 64, cluster.addrs, timeout=5) for k in range(args.clients)]

        async def one(i: int) -> None:
            await seqs[i % args.clients].next()

        try:
            return await drive(one, lambda: [m.proc.pid for m in cluster.members if m.proc and m.alive], args, "seq")
        finally:
            for s in seqs:
                await s.aclose()
    finally:
        cluster.close()


SOAKS = {"balancer": soak_balancer, "rpc": soak_rpc, "seq": soak_seq}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=120.0, help="seconds of load per product (default 120)")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between samples (default 10)")
    p.add_argument("--clients", type=int, default=8, help="concurrent client tasks (default 8)")
    p.add_argument("--only", choices=PRODUCTS, action="append", help="soak only this product (repeatable)")
    p.add_argument("--results", type=Path, default=RESULTS, help="folder of the JSON results")
    args = p.parse_args(argv)
    for product in args.only or PRODUCTS:
        with tempfile.TemporaryDirectory(prefix=f"soak-{product}-") as work:
            samples = asyncio.run(SOAKS[product](args, Path(work)))
        out = save(args.results / f"soak-{product}.json", {
            "product": product, "duration_s": args.duration, "interval_s": args.interval,
            "clients": args.clients, "samples": samples})
        print(f"{product}: {len(samples)} samples -> {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
