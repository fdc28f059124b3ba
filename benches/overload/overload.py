"""Overload: each server under ten times the load it can serve, then under half of it.

    python benches/overload/overload.py                          # every product: 5 s calm, 25 s at 10x, 10 s at 0.5x
    python benches/overload/overload.py --product juggler --overload 30 --out benches/overload/results/juggler.json

What is promised under overload is that the excess is answered, explicitly and
at once (a NACK, a 503, a "rate limit exceeded", RESOURCE_EXHAUSTED), instead
of being left to time out; that memory stays bounded; and that service is
back as soon as the load drops. Each product runs as real processes started
as an operator would, with a capacity that is known or measured:

- juggler: `juggler server --redis … --max-waiting-calls 20` and `juggler
  callee --workers 4`, the calls `test.delay` of 100 ms: 40 calls/s;
- rpc: `juggler rpc serve --example arith --rate-limit 100`: 100 calls/s;
- balancer: `juggler balancer` with `max_connections = 4` in front of a
  backend that answers after 100 ms: 40 requests/s;
- seq: a three-member cluster, NextID calls of one name to one member
  (`--no-forward`) that lets 8 wait (`--max-pending 8`). It admits by the
  number of calls waiting, not by their rate, and serves far more calls a
  second than one Python client can send ten times over: its load is closed-
  loop, callers that each send their next call once the last is answered,
  4 (half), then 80 (ten times), then 4 again; its rate with 8 callers is
  measured first.

The load is open-loop (a request is sent when due, answered or not): half the
capacity for ``--calm`` seconds (the unloaded latency), ten times it for
``--overload`` seconds, half of it again (or of what was served under
overload, when less) for ``--after`` seconds. Every second records what was
offered, served, refused, timed out or failed, the p50/p99 latency of the
served and of the refused, and the server's resident memory.
The time to recover is the end of the first second after the drop whose
requests are none refused and served with a p99 back to the calm level (at
most twice it, plus 5 ms). ``tests/test_overload_bench.py`` runs this for a
few seconds per product in the test command, with loose checks.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benches.common import free_port, loadavg, save  # noqa: E402
from benches.soak.soak import (  # noqa: E402
    PRODUCTS,
    Product,
    juggler_cmd,
    percentile,
    rss_kib,
    spawn,
    stop,
    wait_port,
)

#: seconds a request may take before it counts as timed out (every server answers well within it)
TIMEOUT = 10.0


@dataclass
class Target:
    """A started product, its capacity (requests/s) and one request: ``op()`` returns "ok" or
    "refused" (the server's explicit answer to the excess), raises TimeoutError when it timed out."""

    product: Product
    capacity: float
    op: Callable[[], Awaitable[str]]
    how: str  # what the capacity is, for the report
    refusal: str  # what the refusal looks like
    #: when set, the load is closed-loop: this many callers (what the server lets wait) is the
    #: capacity, half as many the calm load, ten times as many the overload
    callers: int = 0


# -- the products -------------------------------------------------------------------------


async def start_juggler(tmp: Path) -> Target:
    from juggler.client import connect
    from juggler.errors import CallNacked

    rport, wport = free_port(), free_port()
    redis = spawn([shutil.which("redis-server") or "redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                   "--save", "", "--appendonly", "no"], tmp / "redis.log")
    procs = [redis]
    wait_port(rport, procs)
    url = f"redis://127.0.0.1:{rport}/0"
    procs.append(spawn([*juggler_cmd(), "callee", "--redis", url, "--workers", "4"], tmp / "callee.log"))
    server = spawn([*juggler_cmd(), "server", "--redis", url, "--listen", f"127.0.0.1:{wport}",
                    "--max-waiting-calls", "20"], tmp / "juggler.log")
    procs.append(server)
    wait_port(wport, procs)
    clients = [await connect(f"ws://127.0.0.1:{wport}/ws") for _ in range(8)]
    await clients[0].call("test.delay", "1", timeout=30)  # the callee is up
    n = 0

    async def op() -> str:
        nonlocal n
        n += 1
        try:
            await clients[n % len(clients)].call("test.delay", "100", timeout=TIMEOUT)
            return "ok"
        except CallNacked as exc:
            if exc.code == 503:
                return "refused"
            raise

    async def close() -> None:
        for c in clients:
            await c.aclose()

    product = Product("juggler", procs, {"server": server.pid}, close_load=close)
    return Target(product, 40.0, op, "a callee running 4 calls of 100 ms at a time; the server lets 20 wait",
                  "NACK 503 server overloaded")


async def start_rpc(tmp: Path) -> Target:
    from rpc.client import Client
    from rpc.errors import ServiceError
    from rpc.rpcx_client import RpcxCaller

    port = free_port()
    server = spawn([*juggler_cmd(), "rpc", "serve", "--listen", f"127.0.0.1:{port}", "--example", "arith",
                    "--rate-limit", "100"], tmp / "rpc.log")
    wait_port(port, [server])
    clients = [Client(f"tcp@127.0.0.1:{port}", RpcxCaller(), close_caller=True, timeout=TIMEOUT) for _ in range(4)]
    n = 0

    async def op() -> str:
        nonlocal n
        n += 1
        k = n
        try:
            got = await clients[k % len(clients)].call("Arith", "Mul", {"A": k, "B": 3})
        except ServiceError as exc:
            if "rate limit exceeded" in str(exc):
                return "refused"
            raise
        if got.get("C") != k * 3:
            raise RuntimeError(f"Arith.Mul answered {got!r}")
        return "ok"

    async def close() -> None:
        for c in clients:
            await c.aclose()

    product = Product("rpc", [server], {"server": server.pid}, close_load=close)
    return Target(product, 100.0, op, "--rate-limit 100", "ServiceError request rate limit exceeded")


SLOW_BACKEND = '''
import asyncio, sys
from aiohttp import web

async def slow(request):
    await asyncio.sleep(0.1)
    return web.Response(body=b"x" * 512)

app = web.Application()
app.router.add_route("*", "/{tail:.*}", slow)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
'''


async def start_balancer(tmp: Path) -> Target:
    import aiohttp

    lport, bport = free_port(), free_port()
    (tmp / "backend.py").write_text(SLOW_BACKEND)
    backend = spawn([sys.executable, str(tmp / "backend.py"), str(bport)], tmp / "backend.log")
    wait_port(bport, [backend])
    (tmp / "balancer.toml").write_text(
        f'listen = "127.0.0.1:{lport}"\nworkers = 1\nbackends = ["127.0.0.1:{bport}"]\n'
        "[limits]\nmax_connections = 4\n[timeouts]\nqueue = 0.05\n")
    lb = spawn([*juggler_cmd(), "balancer", "--config", str(tmp / "balancer.toml")], tmp / "balancer.log")
    wait_port(lport, [lb])
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT),
                                    connector=aiohttp.TCPConnector(limit=0))
    base = f"http://127.0.0.1:{lport}"

    async def op() -> str:
        async with session.get(f"{base}/item") as r:
            await r.read()
            if r.status == 503:
                return "refused"
            if r.status != 200:
                raise RuntimeError(f"GET answered {r.status}")
            return "ok"

    async def close() -> None:
        await session.close()

    product = Product("balancer", [lb, backend], {"balancer": lb.pid}, close_load=close)
    return Target(product, 40.0, op, "max_connections = 4 to a backend answering in 100 ms; queue = 0.05 s",
                  "HTTP 503")


async def start_seq(tmp: Path) -> Target:
    import grpc

    from seq._proto import rrseq_pb2 as pb
    from seq.localcluster import LocalCluster
    from seq.wire import ApiStub

    (tmp / "seq").mkdir()
    cluster = LocalCluster(3, root=str(tmp / "seq"))
    cluster.start_all("--bootstrap", "--max-pending", "8", "--no-forward")
    await cluster.wait_ready(timeout=60)
    channel = grpc.aio.insecure_channel(cluster.addrs[0])
    stub = ApiStub(channel)

    async def op() -> str:
        try:
            await stub.NextID(pb.NextIDRequest(name="overload", range_size=1), timeout=TIMEOUT)
            return "ok"
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return "refused"
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(exc.details()) from None
            raise

    # the capacity: as many calls at a time as the member lets wait, back to back, for 3 s
    served = 0
    end = time.monotonic() + 3

    async def worker() -> None:
        nonlocal served
        while time.monotonic() < end:
            if await op() == "ok":
                served += 1

    await asyncio.gather(*(worker() for _ in range(8)))

    async def close() -> None:
        await channel.close()

    procs = [m.proc for m in cluster.members if m.proc is not None]
    product = Product("seq", procs, {f"member{i}": p.pid for i, p in enumerate(procs)}, close_load=close)
    return Target(product, served / 3, op, "measured: 8 callers (--max-pending 8) of one name, back to back",
                  "RESOURCE_EXHAUSTED", callers=8)


STARTERS = {"juggler": start_juggler, "rpc": start_rpc, "balancer": start_balancer, "seq": start_seq}


# -- the run ------------------------------------------------------------------------------


@dataclass
class Outcome:
    sent: float  # seconds since the start of the load
    done: float
    kind: str  # ok, refused, timeout, error


@dataclass(frozen=True)
class Callers:
    """A closed loop: `n` callers, each sending its next request once its last is answered (the load
    of a server that admits by the number of requests waiting rather than by their rate)."""

    n: int


Rate = float | Callers | Callable[[list["Outcome"], float], float]


async def drive(target: Target, phases: list[tuple[str, float, Rate]], max_outstanding: int) -> dict[str, Any]:
    """Run `phases` of (name, seconds, rate): every request, when it was sent and answered and how;
    the server's RSS twice a second. A rate may be a function of the outcomes so far and the time
    the phase begins at."""
    outcomes: list[Outcome] = []
    sent: list[float] = []
    unsent: list[float] = []  # due while `max_outstanding` were unanswered: the client's limit, not the server's
    rss: list[tuple[float, dict[str, int]]] = []
    last_error = ""
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()

    async def one() -> None:
        nonlocal last_error
        start = time.monotonic() - t0
        try:
            async with asyncio.timeout(TIMEOUT + 5):
                kind = await target.op()
        except TimeoutError:
            kind = "timeout"
        except Exception as exc:  # noqa: BLE001  (counted and reported: every kind is a finding)
            kind = "error"
            last_error = f"{type(exc).__name__}: {exc}"[:200]
        outcomes.append(Outcome(start, time.monotonic() - t0, kind))

    async def sample() -> None:
        while True:
            try:
                rss.append((time.monotonic() - t0, {r: rss_kib(p) for r, p in target.product.watched.items()}))
            except (FileNotFoundError, ProcessLookupError):
                pass
            await asyncio.sleep(0.5)

    sampler = loop.create_task(sample())
    bounds: list[dict[str, Any]] = []
    begin = 0.0
    for name, seconds, rate_of in phases:
        if isinstance(rate_of, Callers):
            bounds.append({"phase": name, "from": begin, "to": begin + seconds, "load": f"{rate_of.n} callers"})

            async def caller(stop_at: float) -> None:
                while (now := time.monotonic() - t0) < stop_at:
                    sent.append(now)
                    await one()

            await asyncio.gather(*(caller(begin + seconds) for _ in range(rate_of.n)))
            begin += seconds
            continue
        rate = rate_of if isinstance(rate_of, float) else rate_of(outcomes, begin)
        bounds.append({"phase": name, "from": begin, "to": begin + seconds, "load": f"{rate:.1f}/s"})
        due_n = 0
        while (now := time.monotonic() - t0) < begin + seconds:
            target_n = int((now - begin) * rate)
            while due_n < target_n:
                due_n += 1
                if len(tasks) >= max_outstanding:
                    unsent.append(now)
                    continue
                sent.append(now)
                task = loop.create_task(one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.sleep(0.002)
        begin += seconds
    if tasks:
        await asyncio.wait(tasks, timeout=TIMEOUT + 10)
    sampler.cancel()
    return {"bounds": bounds, "outcomes": outcomes, "sent": sent, "unsent": unsent, "rss": rss,
            "last_error": last_error, "end": time.monotonic() - t0}


def per_second(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per second of the load, of the requests sent in that second: offered, how they were
    answered, their latencies; and the server's largest RSS in that second."""
    seconds = int(run["bounds"][-1]["to"] + 0.999)
    rows: list[dict[str, Any]] = []
    for s in range(seconds):
        done = [o for o in run["outcomes"] if s <= o.sent < s + 1]
        served = sorted((o.done - o.sent) * 1000 for o in done if o.kind == "ok")
        refused = sorted((o.done - o.sent) * 1000 for o in done if o.kind == "refused")
        rss = [r for t, r in run["rss"] if s <= t < s + 1]
        phase = next((b["phase"] for b in run["bounds"] if b["from"] <= s < b["to"]), run["bounds"][-1]["phase"])
        row = {"t": s, "phase": phase, "offered": sum(1 for t in run["sent"] if s <= t < s + 1),
               "unsent": sum(1 for t in run["unsent"] if s <= t < s + 1), "served": len(served),
               "refused": len(refused), "timeouts": sum(1 for o in done if o.kind == "timeout"),
               "errors": sum(1 for o in done if o.kind == "error"),
               "served_p50_ms": round(percentile(served, 0.5), 1), "served_p99_ms": round(percentile(served, 0.99), 1),
               "refused_p50_ms": round(percentile(refused, 0.5), 1),
               "refused_p99_ms": round(percentile(refused, 0.99), 1)}
        if rss:
            row["rss_kib"] = {role: max(r[role] for r in rss) for role in rss[0]}
        rows.append(row)
    return rows


def summarize(target: Target, run: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    calm_b, over_b, after_b = run["bounds"]

    def lat(kind: str, b: dict[str, Any], q: float) -> float:
        xs = sorted((o.done - o.sent) * 1000 for o in run["outcomes"] if o.kind == kind and b["from"] <= o.sent < b["to"])
        return round(percentile(xs, q), 1)

    def count(kind: str, b: dict[str, Any]) -> int:
        return sum(1 for o in run["outcomes"] if o.kind == kind and b["from"] <= o.sent < b["to"])

    calm_p99 = lat("ok", calm_b, 0.99)
    level = 2 * calm_p99 + 5
    recovered = next((r["t"] + 1 - after_b["from"] for r in rows
                      if r["t"] >= after_b["from"] and r["refused"] == 0 and r["served"] and r["served_p99_ms"] <= level),
                     None)
    over_s = over_b["to"] - over_b["from"]
    rss: dict[str, Any] = {}
    for role in target.product.watched:
        def at(b: dict[str, Any], role: str = role) -> list[int]:
            return [r[role] for t, r in run["rss"] if b["from"] <= t < b["to"] and role in r]
        before, during, after = at(calm_b), at(over_b), at(after_b)
        rss[role] = {"before_mib": round(max(before or [0]) / 1024, 1), "during_max_mib": round(max(during or [0]) / 1024, 1),
                     "after_mib": round((after or [0])[-1] / 1024, 1)}
    timeouts = sum(1 for o in run["outcomes"] if o.kind == "timeout")
    return {
        "capacity_per_s": round(target.capacity, 1), "capacity": target.how, "refusal": target.refusal,
        "overload": {"offered_per_s": round(sum(1 for t in run["sent"] if over_b["from"] <= t < over_b["to"]) / over_s, 1),
                     "unsent_per_s": round(sum(1 for t in run["unsent"] if over_b["from"] <= t < over_b["to"]) / over_s, 1),
                     "served_per_s": round(count("ok", over_b) / over_s, 1),
                     "refused_per_s": round(count("refused", over_b) / over_s, 1),
                     "served_p50_ms": lat("ok", over_b, 0.5), "served_p99_ms": lat("ok", over_b, 0.99),
                     "refused_p50_ms": lat("refused", over_b, 0.5), "refused_p99_ms": lat("refused", over_b, 0.99)},
        "calm_load": calm_b["load"], "after_load": after_b["load"],
        "calm_p99_ms": calm_p99, "after_p99_ms": lat("ok", after_b, 0.99),
        "refused_after_drop": count("refused", after_b),
        "recovered_after_s": recovered,
        "timeouts": timeouts, "errors": sum(1 for o in run["outcomes"] if o.kind == "error"),
        "rss": rss,
    }


async def overload(name: str, calm: float, over: float, after: float, max_outstanding: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"overload-{name}-"))
    target: Target | None = None
    try:
        target = await STARTERS[name](tmp)
        cap = target.capacity

        def half(outcomes: list[Outcome], now: float) -> float:
            # half of the capacity, or of what was served under overload when that was less (a measured
            # capacity can be more than the server sustains at ten times it)
            served = sum(1 for o in outcomes if o.kind == "ok" and now - over <= o.sent < now) / over
            return min(cap, served) / 2

        phases: list[tuple[str, float, Rate]] = [("calm", calm, cap / 2), ("overload", over, 10 * cap),
                                                 ("after", after, half)]
        if target.callers:
            n = target.callers
            phases = [("calm", calm, Callers(n // 2)), ("overload", over, Callers(10 * n)),
                      ("after", after, Callers(n // 2))]
        run = await drive(target, phases, max_outstanding)
        alive = {role: Path(f"/proc/{pid}").exists() for role, pid in target.product.watched.items()}
        rows = per_second(run)
        return {"product": name, "calm_s": calm, "overload_s": over, "after_s": after, "loadavg": loadavg(),
                "alive_at_end": alive, "last_error": run["last_error"],
                "summary": summarize(target, run, rows), "seconds": rows}
    finally:
        if target is not None:
            if target.product.close_load is not None:
                await target.product.close_load()
            stop(target.product)
        shutil.rmtree(tmp, ignore_errors=True)


def report(result: dict[str, Any]) -> str:
    s = result["summary"]
    o = s["overload"]
    rec = "not within the run" if s["recovered_after_s"] is None else f"{s['recovered_after_s']} s"
    lines = [f"{result['product']}: capacity {s['capacity_per_s']}/s ({s['capacity']})",
             (f"  at 10x: offered {o['offered_per_s']}/s, served {o['served_per_s']}/s (p50 {o['served_p50_ms']} ms, "
              f"p99 {o['served_p99_ms']} ms), refused {o['refused_per_s']}/s (p50 {o['refused_p50_ms']} ms, "
              f"p99 {o['refused_p99_ms']} ms; {s['refusal']})"),
             (f"  timeouts {s['timeouts']}, errors {s['errors']}; after the drop to {s['after_load']}: "
              f"{s['refused_after_drop']} refused, "
              f"p99 {s['after_p99_ms']} ms (calm: {s['calm_p99_ms']} ms), recovered in {rec}")]
    for role, r in s["rss"].items():
        lines.append(f"  {role:9} RSS {r['before_mib']} MiB before, {r['during_max_mib']} MiB at most under 10x, "
                     f"{r['after_mib']} MiB after")
    if result["last_error"]:
        lines.append(f"  last error: {result['last_error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--product", choices=[*PRODUCTS, "all"], default="all")
    ap.add_argument("--calm", type=float, default=5.0, help="seconds at half the capacity first [%(default)s]")
    ap.add_argument("--overload", type=float, default=25.0, help="seconds at ten times the capacity [%(default)s]")
    ap.add_argument("--after", type=float, default=10.0, help="seconds at half the capacity after [%(default)s]")
    ap.add_argument("--max-outstanding", type=int, default=4000,
                    help="unanswered requests at most; beyond, a due request is counted as unsent [%(default)s]")
    ap.add_argument("--out", metavar="FILE", help="write the results (JSON) there")
    args = ap.parse_args(argv)
    if min(args.calm, args.overload, args.after) <= 0 or args.max_outstanding < 1:
        ap.error("--calm, --overload, --after and --max-outstanding must be positive")
    names = PRODUCTS if args.product == "all" else (args.product,)
    results = []
    for name in names:
        res = asyncio.run(overload(name, args.calm, args.overload, args.after, args.max_outstanding))
        print(report(res), flush=True)
        results.append(res)
    if args.out:
        save(args.out, {"loadavg_end": loadavg(), "results": results})
    bad = [r for r in results if r["summary"]["timeouts"] or r["summary"]["errors"] or not all(r["alive_at_end"].values())]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
