"""ns per ID: SimpleBufSeq vs RRSeq (3 servers, fsync on), buffers 0 / 2 / 1024, 1 and 32 clients.

    .venv/bin/python -m pytest benches/seq/bench_seq.py -s -q -p no:cacheprovider \
        --benchmark-json=benches/seq/results/bench_seq.json

Each round draws a fixed number of IDs from `clients` sequences, one task
each, in one process (uvloop); setup (new sequences, first range) is outside
the timing (so at buffer 1024 every round starts at the smallest fetch size
and the adaptive prefetch ramps up inside the timed part). The summary
printed at the end gives ns/ID, IDs/s, latency percentiles of one next()
(buffers 0 and 2), CPU time per ID of the client process and of the three
servers together (user + system, from getrusage and /proc/PID/stat), the
RRSeq/SimpleBufSeq ratio, and the servers' round statistics (conflicts,
attempts) that show whether coordinators livelock under contention. Every
run also checks the IDs: strictly increasing per client, unique across all.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest
import uvloop

from seq import RRSeq, SimpleBufSeq
from seq.bench import _pct, proc_cpu_seconds, self_cpu_seconds
from seq.buffered import BufferedSeq
from seq.channel import ApiChannel
from seq.localcluster import LocalCluster
from seq.simple import LocalCounter

RESULTS: dict[tuple[str, int, int], dict[str, float]] = {}
CONTENTION: list[str] = []

# IDs per round, all clients together, by (impl, buf, clients); default 1,000,000. Buffer 0 with
# 32 clients draws 1,000 per client: with 100 (before), the 32 calls every client makes at once
# when a round starts were 1 % of the samples, so the p99 measured that start-up burst.
TOTAL = {
    ("rr", 0, 1): 600, ("rr", 0, 32): 32_000, ("rr", 2, 1): 1_200, ("rr", 2, 32): 6_400,
    ("simple", 0, 1): 200_000, ("simple", 0, 32): 200_000, ("simple", 2, 1): 200_000, ("simple", 2, 32): 200_000,
}



@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = uvloop.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, loop: asyncio.AbstractEventLoop) -> Iterator[LocalCluster]:
    c = LocalCluster(3, root=str(tmp_path_factory.mktemp("seqbench")))
    c.start_all("--bootstrap")
    try:
        loop.run_until_complete(c.wait_ready(timeout=60))
        yield c
    finally:
        for i in range(3):
            c.stop(i)
        stats = [line.split("stopped: ")[1] for i in range(3) for line in c.output(i).splitlines() if "stopped: " in line]
        c.close()
        _summary(stats)


def _summary(stats: list[str]) -> None:
    print("\n\nseq benchmark summary (ns per ID, wall clock over all clients)")
    print(f"{'impl':<14}{'buf':>6}{'clients':>9}{'ns/ID':>14}{'IDs/s':>14}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'cli CPU us/ID':>15}{'srv CPU us/ID':>15}")
    for (impl, buf, clients), r in sorted(RESULTS.items()):
        name = "SimpleBufSeq" if impl == "simple" else "RRSeq"
        p50 = f"{r['p50_ms']:.3f}" if "p50_ms" in r else "-"
        p99 = f"{r['p99_ms']:.3f}" if "p99_ms" in r else "-"
        srv = f"{r['srv_cpu_us']:.3f}" if impl == "rr" else "-"
        print(f"{name:<14}{buf:>6}{clients:>9}{r['ns_per_id']:>14,.0f}{r['ids_per_s']:>14,.0f}{p50:>9}{p99:>9}"
              f"{r['cli_cpu_us']:>15.3f}{srv:>15}")
    for clients in (1, 32):
        a, b = RESULTS.get(("rr", 1024, clients)), RESULTS.get(("simple", 1024, clients))
        if a and b:
            print(f"buf 1024, {clients} client(s): RRSeq / SimpleBufSeq = {a['ns_per_id'] / b['ns_per_id']:.2f}x")
    r0 = RESULTS.get(("rr", 0, 32))
    if r0:
        print(f"buf 0, 32 clients: {r0['ids_per_s']:,.0f} IDs/s, p99 {r0['p99_ms']:.2f} ms")
    for s in stats:
        print("server:", s)
    for line in CONTENTION:
        print(line)


async def _draw(seqs: list[BufferedSeq], per_client: int, lat: list[int] | None) -> list[list[int]]:
    async def one(s: BufferedSeq) -> list[int]:
        out: list[int] = []
        nxt, app = s.next, out.append
        if lat is None:
            for _ in range(per_client):
                app(await nxt())
        else:
            pc = time.perf_counter_ns
            for _ in range(per_client):
                t0 = pc()
                app(await nxt())
                lat.append(pc() - t0)
        return out

    return await asyncio.gather(*(one(s) for s in seqs))


@pytest.mark.parametrize("clients", [1, 32])
@pytest.mark.parametrize("buf", [0, 2, 1024])
@pytest.mark.parametrize("impl", ["simple", "rr"])
def test_ns_per_id(benchmark, loop, cluster, impl: str, buf: int, clients: int) -> None:  # type: ignore[no-untyped-def]
    per_client = TOTAL.get((impl, buf, clients), 1_000_000) // clients
    cpu = [0.0, 0.0]  # client, servers (seconds, timed rounds only)
    pids = [m.proc.pid for m in cluster.members if m.proc is not None]
    record_latency = buf < 1024
    live: list[BufferedSeq] = []
    lat: list[int] = []
    seen: set[int] = set()
    counter = LocalCounter()

    channel = ApiChannel(cluster.addrs)  # one connection per server, shared by the sequences

    def make() -> BufferedSeq:
        if impl == "simple":
            return SimpleBufSeq(buf, counter=counter)
        return RRSeq(f"bench-{buf}-{clients}", buf, channel=channel, timeout=10)

    def close_live() -> None:
        seqs = list(live)
        live.clear()

        async def close() -> None:
            await asyncio.gather(*(s.aclose() for s in seqs))

        loop.run_until_complete(close())

    def setup():  # type: ignore[no-untyped-def]
        close_live()

        async def start() -> None:
            live.extend(make() for _ in range(clients))
            await asyncio.gather(*(s.next() for s in live))  # connect, first range

        loop.run_until_complete(start())
        return (list(live),), {}

    def run(seqs: list[BufferedSeq]) -> None:
        c0, s0 = self_cpu_seconds(), sum(proc_cpu_seconds(p) for p in pids)
        streams = loop.run_until_complete(_draw(seqs, per_client, lat if record_latency else None))
        cpu[0] += self_cpu_seconds() - c0
        cpu[1] += sum(proc_cpu_seconds(p) for p in pids) - s0
        for st in streams:
            assert all(a < b for a, b in zip(st, st[1:]))
            seen.update(st)

    rounds = 3 if impl == "rr" and buf < 1024 else 7
    benchmark.pedantic(run, setup=setup, rounds=rounds, iterations=1, warmup_rounds=0)
    close_live()
    loop.run_until_complete(channel.aclose())
    ids = per_client * clients
    assert len(seen) == ids * rounds, "an ID was handed out twice"
    mean = benchmark.stats.stats.mean
    r = {"ns_per_id": mean * 1e9 / ids, "ids_per_s": ids / mean,
         "cli_cpu_us": cpu[0] * 1e6 / (ids * rounds), "srv_cpu_us": cpu[1] * 1e6 / (ids * rounds)}
    if record_latency:
        lat.sort()
        r["p50_ms"], r["p99_ms"] = _pct(lat, 0.5), _pct(lat, 0.99)
    benchmark.extra_info.update(r, loadavg=[round(x, 2) for x in os.getloadavg()])
    RESULTS[(impl, buf, clients)] = r


def test_contention_without_forwarding(tmp_path_factory: pytest.TempPathFactory, loop: asyncio.AbstractEventLoop) -> None:
    """Livelock check: every member coordinates (--no-forward), 32 buf-0 clients race on one
    name. Reports throughput, latency, lost rounds (conflicts) and the most attempts a round took."""
    from seq.bench import measure

    c = LocalCluster(3, root=str(tmp_path_factory.mktemp("seqrace")))
    c.start_all("--bootstrap", "--no-forward")
    try:
        loop.run_until_complete(c.wait_ready(timeout=60))
        r = loop.run_until_complete(measure(lambda: RRSeq("race", 0, c.addrs, timeout=10), 32, per_client=150))
    finally:
        for i in range(3):
            c.stop(i)
        stats = [line.split("stopped: ")[1] for i in range(3) for line in c.output(i).splitlines() if "stopped: " in line]
        c.close()
    won = sum(int(x.split("rounds_won=")[1].split()[0]) for x in stats)
    lost = sum(int(x.split("conflicts=")[1].split()[0]) for x in stats)
    worst = max(int(x.split("max_attempts=")[1].split()[0]) for x in stats)
    CONTENTION.append(
        f"contention (--no-forward, buf 0, 32 clients): {r.ids_per_s:,.0f} IDs/s, p50 {r.p50_ms:.2f} ms, "
        f"p99 {r.p99_ms:.2f} ms, max {r.max_ms:.2f} ms; rounds won {won}, lost to conflicts {lost} "
        f"({lost / max(1, won + lost):.0%}), most attempts for one round {worst}"
    )
    assert won > 0
