"""Soak: each server under a steady mixed load for a while, its resources sampled over time.

    python benches/soak/soak.py                              # every product, 60 s each
    python benches/soak/soak.py --product seq --duration 3600 --out benches/soak/results/seq-1h.json

What a soak finds is what a benchmark of seconds cannot: memory or
descriptors that grow with the number of requests served, latency that
creeps up, a process that dies after an hour. Each product runs as real
processes, started as an operator would (`juggler up --redis`, `juggler rpc
serve`, `juggler balancer`, a three-member `juggler seq` cluster), under an
open-loop load at a fixed rate (not as fast as possible: a soak is about
time, not throughput), and every `--sample` seconds records, per server
process, its resident memory (VmRSS), open descriptors and CPU time, and the
load's latency percentiles and errors over that window.

The summary of a product compares the first sample after the warm-up (the
first quarter of the run) with the last: growth of RSS and descriptors, and
the RSS trend of the second half in MiB per hour (a least-squares slope).
``tests/test_soak.py`` runs this for a short while in the test command and
fails on errors, dead servers or descriptors that do not come back.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benches.common import free_port, loadavg, proc_cpu_seconds, save  # noqa: E402

PRODUCTS = ("juggler", "rpc", "balancer", "seq")


# -- what is sampled -----------------------------------------------------------------


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return 0.0
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


@dataclass
class Window:
    """What the load saw since the last sample."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    last_error: str = ""

    def take(self) -> tuple[list[float], int, str]:
        out = sorted(self.latencies_ms), self.errors, self.last_error
        self.latencies_ms, self.errors, self.last_error = [], 0, ""
        return out


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per hour."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    den = sum((p[0] - mx) ** 2 for p in points)
    return 0.0 if den == 0 else 3600 * sum((p[0] - mx) * (p[1] - my) for p in points) / den


# -- the products ------------------------------------------------------------------------


def juggler_cmd() -> list[str]:
    return [sys.executable, "-P", "-m", "cli"]


def wait_port(port: int, procs: list[subprocess.Popen[bytes]], timeout: float = 60.0) -> None:
    import socket

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args!r} exited with {p.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f}s")


@dataclass
class Product:
    """Started processes, the ones whose resources are sampled, and one operation of the load."""

    name: str
    procs: list[subprocess.Popen[bytes]]
    watched: dict[str, int]  # role -> pid
    op: Callable[[], Awaitable[None]] | None = None
    close_load: Callable[[], Awaitable[None]] | None = None
    tmp: str = ""


def spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=ROOT, process_group=0)


async def start_juggler(tmp: Path) -> Product:
    """Redis, `juggler up --redis` (server + test callees); load: 3 calls to 1 publish, a subscriber reading."""
    from juggler.client import connect

    rport, wport = free_port(), free_port()
    redis = spawn([shutil.which("redis-server") or "redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                   "--save", "", "--appendonly", "no"], tmp / "redis.log")
    procs = [redis]
    wait_port(rport, procs)
    server = spawn([*juggler_cmd(), "up", "--redis", f"redis://127.0.0.1:{rport}/0",
                    "--listen", f"127.0.0.1:{wport}"], tmp / "juggler.log")
    procs.append(server)
    wait_port(wport, procs)
    url = f"ws://127.0.0.1:{wport}/ws"
    caller = await connect(url)
    subscriber = await connect(url)
    await subscriber.sub("soak.events")

    async def drain() -> None:
        async for _ in subscriber.events():
            pass

    reader = asyncio.get_running_loop().create_task(drain())
    n = 0

    async def op() -> None:
        nonlocal n
        n += 1
        k = n
        if k % 4 == 0:
            await caller.pub("soak.events", {"n": k}, timeout=10)
        else:
            res = await caller.call("test.echo", f"soak {k}", timeout=10)
            if res != f"soak {k}":
                raise RuntimeError(f"test.echo answered {res!r}")

    async def close() -> None:
        await caller.aclose()
        await subscriber.aclose()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)

    return Product("juggler", procs, {"server": server.pid, "redis": redis.pid}, op, close)


async def start_rpc(tmp: Path) -> Product:
    """`juggler rpc serve --example arith`; load: Arith.Mul and Arith.Add over two connections."""
    from rpc.client import Client
    from rpc.rpcx_client import RpcxCaller

    port = free_port()
    server = spawn([*juggler_cmd(), "rpc", "serve", "--listen", f"127.0.0.1:{port}", "--example", "arith"],
                   tmp / "rpc.log")
    wait_port(port, [server])
    clients = [Client(f"tcp@127.0.0.1:{port}", RpcxCaller(), close_caller=True, timeout=10) for _ in range(2)]
    n = 0

    async def op() -> None:
        nonlocal n
        n += 1
        a, b = random.randrange(1000), random.randrange(1000)
        method, want = ("Mul", a * b) if n % 2 else ("Add", a + b)
        got = await clients[n % 2].call("Arith", method, {"A": a, "B": b})
        if got.get("C") != want:
            raise RuntimeError(f"Arith.{method}({a}, {b}) answered {got!r}")

    async def close() -> None:
        for c in clients:
            await c.aclose()

    return Product("rpc", [server], {"server": server.pid}, op, close)


BACKEND = '''
import sys
from aiohttp import web

async def hello(request):
    body = await request.read()
    return web.Response(body=body or b"x" * 512, content_type="application/octet-stream")

app = web.Application()
app.router.add_route("*", "/{tail:.*}", hello)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
'''


async def start_balancer(tmp: Path) -> Product:
    """`juggler balancer` in front of two aiohttp backends; load: GETs and POSTs with bodies, keep-alive."""
    import aiohttp

    lport, b1, b2 = free_port(), free_port(), free_port()
    (tmp / "backend.py").write_text(BACKEND)
    backends = [spawn([sys.executable, str(tmp / "backend.py"), str(p)], tmp / f"backend{p}.log") for p in (b1, b2)]
    for p, proc in zip((b1, b2), backends):
        wait_port(p, [proc])
    # idle upstream connections are closed after 2 s (default 60 s), so that descriptors held once the
    # load is gone are leaks, not the connection pool
    (tmp / "balancer.toml").write_text(
        f'listen = "127.0.0.1:{lport}"\nworkers = 1\n'
        f'backends = ["127.0.0.1:{b1}", "127.0.0.1:{b2}"]\n[limits]\npool_idle_timeout = 2.0\n')
    lb = spawn([*juggler_cmd(), "balancer", "--config", str(tmp / "balancer.toml")], tmp / "balancer.log")
    wait_port(lport, [lb])
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
    base = f"http://127.0.0.1:{lport}"
    n = 0

    async def op() -> None:
        nonlocal n
        n += 1
        if n % 3 == 0:
            payload = os.urandom(2048)
            async with session.post(f"{base}/upload/{n}", data=payload) as r:
                if r.status != 200 or await r.read() != payload:
                    raise RuntimeError(f"POST answered {r.status}")
        else:
            async with session.get(f"{base}/item/{n}?q={n}") as r:
                if r.status != 200 or len(await r.read()) != 512:
                    raise RuntimeError(f"GET answered {r.status}")

    async def close() -> None:
        await session.close()

    return Product("balancer", [lb, *backends], {"balancer": lb.pid}, op, close)


async def start_seq(tmp: Path) -> Product:
    """A three-member cluster; load: draws with no buffer (each one a quorum write) over a few names."""
    from seq.client import RRSeq
    from seq.localcluster import LocalCluster

    (tmp / "seq").mkdir()
    cluster = LocalCluster(3, root=str(tmp / "seq"))
    cluster.start_all("--bootstrap")
    await cluster.wait_ready(timeout=60)
    seqs = [RRSeq(f"soak{i}", 0, cluster.addrs, timeout=10) for i in range(4)]
    last = [0] * len(seqs)
    n = 0

    async def op() -> None:
        nonlocal n
        n += 1
        i = n % len(seqs)
        got = await seqs[i].next()
        if got <= last[i]:
            raise RuntimeError(f"seq soak{i} went from {last[i]} to {got}")
        last[i] = got

    async def close() -> None:
        for s in seqs:
            await s.aclose()

    procs = [m.proc for m in cluster.members if m.proc is not None]
    return Product("seq", procs, {f"member{i}": p.pid for i, p in enumerate(procs)}, op, close)


STARTERS = {"juggler": start_juggler, "rpc": start_rpc, "balancer": start_balancer, "seq": start_seq}


def stop(product: Product) -> None:
    for p in product.procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in product.procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


# -- the run -------------------------------------------------------------------------------


async def soak(name: str, duration: float, rate: float, sample: float, concurrency: int) -> dict[str, Any]:
    """One product for `duration` seconds at `rate` operations per second."""
    tmp = Path(tempfile.mkdtemp(prefix=f"soak-{name}-"))
    product = await STARTERS[name](tmp)
    window = Window()
    samples: list[dict[str, Any]] = []
    ops = errors = 0
    #: errors by kind: a failed operation's exception type, or an operation the load skipped
    kinds: collections.Counter[str] = collections.Counter()
    slots = asyncio.Semaphore(concurrency)  # open loop, but never an unbounded pile of waiting operations
    tasks: set[asyncio.Task[None]] = set()
    assert product.op is not None

    async def one() -> None:
        nonlocal ops, errors
        t0 = time.perf_counter()
        try:
            await product.op()  # type: ignore[misc]
            window.latencies_ms.append((time.perf_counter() - t0) * 1000)
        except Exception as exc:  # noqa: BLE001  (counted and reported: a soak sees every kind)
            window.errors += 1
            window.last_error = f"{type(exc).__name__}: {exc}"[:200]
            kinds[type(exc).__name__] += 1
            errors += 1
        finally:
            ops += 1
            slots.release()

    def take_sample(t: float) -> None:
        lat, errs, last_error = window.take()
        row: dict[str, Any] = {"t": round(t, 1), "ops": len(lat) + errs, "errors": errs,
                               "p50_ms": round(percentile(lat, 0.50), 3), "p99_ms": round(percentile(lat, 0.99), 3),
                               "p999_ms": round(percentile(lat, 0.999), 3), "max_ms": round(lat[-1] if lat else 0.0, 3)}
        if last_error:
            row["last_error"] = last_error
        for role, pid in product.watched.items():
            try:
                row[role] = {"rss_kib": rss_kib(pid), "fds": open_fds(pid), "cpu_s": round(proc_cpu_seconds(pid), 2)}
            except (FileNotFoundError, ProcessLookupError):
                row[role] = {"dead": True}
        samples.append(row)

    # a few operations before the first sample: connections made on first use (pools, links between
    # seq members) belong to the baseline, not to what the load may leak
    for _ in range(20):
        await slots.acquire()
        await one()
    ops = errors = 0
    kinds.clear()
    window.take()
    start = time.monotonic()
    take_sample(0.0)
    next_sample = start + sample
    interval = 1.0 / rate
    due = start
    try:
        while (now := time.monotonic()) < start + duration:
            if now >= next_sample:
                take_sample(now - start)
                next_sample += sample
            if now < due:
                await asyncio.sleep(min(due, next_sample) - now)
                continue
            due += interval
            if slots.locked():  # the server is behind: the operation is skipped and counted as an error
                window.errors += 1
                window.last_error = f"more than {concurrency} operations in flight"
                kinds["skipped: too many in flight"] += 1
                errors += 1
                continue
            await slots.acquire()
            task = asyncio.get_running_loop().create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=15)
        take_sample(time.monotonic() - start)
    finally:
        if product.close_load is not None:
            await product.close_load()
        idle = await settle(product, samples[0])
        alive = {role: Path(f"/proc/{pid}").exists() for role, pid in product.watched.items()}
        stop(product)
        shutil.rmtree(tmp, ignore_errors=True)
    return {"product": name, "duration_s": duration, "rate": rate, "ops": ops, "errors": errors,
            "error_kinds": dict(kinds),
            "alive_at_end": alive, "samples": samples, "idle_after": idle,
            "summary": summarize(samples, product.watched)}


async def settle(product: Product, first: dict[str, Any], within: float = 10.0) -> dict[str, Any]:
    """Each process's descriptors once the load's connections are closed: polled until they are
    back to their level before the load, or `within` seconds (closes reach a server asynchronously)."""
    end = time.monotonic() + within
    while True:
        now: dict[str, Any] = {}
        for role, pid in product.watched.items():
            try:
                now[role] = {"fds": open_fds(pid), "rss_kib": rss_kib(pid)}
            except (FileNotFoundError, ProcessLookupError):
                now[role] = {"dead": True}
        back = all(now[r].get("fds", 1 << 30) <= first.get(r, {}).get("fds", 0) for r in now)
        if back or time.monotonic() >= end:
            return now
        await asyncio.sleep(0.2)


def summarize(samples: list[dict[str, Any]], watched: dict[str, int]) -> dict[str, Any]:
    """Per process: RSS and descriptors after the warm-up and at the end, the second half's RSS trend."""
    out: dict[str, Any] = {}
    if len(samples) < 3:
        return out
    end_t = samples[-1]["t"]
    warm = next((s for s in samples if s["t"] >= end_t / 4), samples[1])
    last = samples[-1]
    for role in watched:
        a, b = warm.get(role, {}), last.get(role, {})
        if "rss_kib" not in a or "rss_kib" not in b:
            out[role] = {"dead": True}
            continue
        half = [(s["t"], s[role]["rss_kib"] / 1024) for s in samples if s["t"] >= end_t / 2 and "rss_kib" in s.get(role, {})]
        out[role] = {"rss_mib_after_warmup": round(a["rss_kib"] / 1024, 1), "rss_mib_end": round(b["rss_kib"] / 1024, 1),
                     "rss_trend_mib_per_hour": round(slope_per_hour(half), 1),
                     "fds_after_warmup": a["fds"], "fds_end": b["fds"],
                     "cpu_s": round(b["cpu_s"] - samples[0][role]["cpu_s"], 2)}
    lat = [s for s in samples[1:] if s["ops"]]
    if lat:
        out["p99_ms_first_quarter"] = max((s["p99_ms"] for s in lat if s["t"] <= end_t / 4), default=0.0)
        out["p99_ms_last_quarter"] = max((s["p99_ms"] for s in lat if s["t"] >= 3 * end_t / 4), default=0.0)
    return out


def report(result: dict[str, Any]) -> str:
    lines = [f"{result['product']}: {result['ops']:,} operations in {result['duration_s']:.0f}s at "
             f"{result['rate']:.0f}/s, {result['errors']} errors"
             + (f" ({', '.join(f'{k}: {n}' for k, n in result['error_kinds'].items())})" if result.get("error_kinds") else "")]
    for role, s in result["summary"].items():
        if isinstance(s, dict) and "rss_mib_end" in s:
            idle = result["idle_after"].get(role, {}).get("fds", "?")
            lines.append(f"  {role:9} RSS {s['rss_mib_after_warmup']:7.1f} -> {s['rss_mib_end']:7.1f} MiB "
                         f"(trend {s['rss_trend_mib_per_hour']:+.1f} MiB/h)  fds {s['fds_after_warmup']} -> "
                         f"{s['fds_end']}, {idle} once the load closed  CPU {s['cpu_s']:.1f}s")
        elif isinstance(s, dict):
            lines.append(f"  {role:9} DIED")
    summ = result["summary"]
    if "p99_ms_last_quarter" in summ:
        lines.append(f"  p99 {summ['p99_ms_first_quarter']:.1f} ms in the first quarter, "
                     f"{summ['p99_ms_last_quarter']:.1f} ms in the last")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--product", choices=[*PRODUCTS, "all"], default="all")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per product [%(default)s]")
    ap.add_argument("--rate", type=float, default=200.0, help="operations per second [%(default)s]")
    ap.add_argument("--sample", type=float, default=5.0, help="seconds between samples [%(default)s]")
    ap.add_argument("--concurrency", type=int, default=64,
                    help="operations in flight at most; beyond, a due operation counts as an error [%(default)s]")
    ap.add_argument("--out", metavar="FILE", help="write every sample (JSON) there")
    args = ap.parse_args(argv)
    if args.duration <= 0 or args.rate <= 0 or args.sample <= 0 or args.concurrency < 1:
        ap.error("--duration, --rate, --sample and --concurrency must be positive")
    names = PRODUCTS if args.product == "all" else (args.product,)
    results = []
    for name in names:
        res = asyncio.run(soak(name, args.duration, args.rate, args.sample, args.concurrency))
        print(report(res), flush=True)
        results.append(res)
    if args.out:
        save(args.out, {"loadavg_end": loadavg(), "results": results})
    bad = [r["product"] for r in results if r["errors"] or not all(r["alive_at_end"].values())]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
