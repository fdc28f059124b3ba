"""Measurements shared by ``juggler seq bench`` and ``benches/seq``.

`clients` sequences, each drawn by its own task as fast as it can, in one
process and one event loop; the figures are wall-clock over all of them.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from seq.buffered import BufferedSeq


@dataclass(frozen=True)
class Result:
    clients: int
    ids: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float

    @property
    def ns_per_id(self) -> float:
        return self.seconds * 1e9 / self.ids

    @property
    def ids_per_s(self) -> float:
        return self.ids / self.seconds

    def line(self, label: str) -> str:
        return (f"{label:<28} clients={self.clients:<3} ids={self.ids:<8} {self.ns_per_id:>12,.0f} ns/ID "
                f"{self.ids_per_s:>12,.0f} IDs/s  p50={self.p50_ms:.3f} ms p99={self.p99_ms:.3f} ms "
                f"max={self.max_ms:.3f} ms")



def self_cpu_seconds() -> float:
    """User + system CPU of this process, all threads (the client side of a bench)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU of process `pid` from /proc (a server of a bench); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

def _pct(sorted_ns: list[int], q: float) -> float:
    if not sorted_ns:
        return 0.0
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e6


async def measure(
    make: Callable[[], BufferedSeq],
    clients: int,
    *,
    per_client: int | None = None,
    duration: float | None = None,
    latencies: bool = True,
    stopped: Callable[[], bool] = lambda: False,
) -> Result:
    """Draw `per_client` IDs (or for `duration` s) from each of `clients` sequences,
    or until ``stopped()`` turns true (Ctrl-C; with latencies on).

    Every ID is checked: strictly increasing per sequence, unique across all.
    """
    seqs = [make() for _ in range(clients)]
    try:
        # warm-up: connect and fill the first buffer outside the measurement
        await asyncio.gather(*(s.next() for s in seqs))
        lats: list[int] = []
        seen: list[list[int]] = [[] for _ in seqs]
        stop_at = None if duration is None else time.perf_counter() + duration

        async def one(k: int, s: BufferedSeq) -> None:
            out = seen[k]
            pc = time.perf_counter_ns
            if latencies:
                while True:
                    t0 = pc()
                    out.append(await s.next())
                    lats.append(pc() - t0)
                    if (per_client is not None and len(out) >= per_client) or (
                        len(out) % 64 == 0 and ((stop_at is not None and time.perf_counter() >= stop_at) or stopped())
                    ):
                        return
            else:
                nxt = s.next
                app = out.append
                for _ in range(per_client or 0):
                    app(await nxt())

        t0 = time.perf_counter()
        await asyncio.gather(*(one(k, s) for k, s in enumerate(seqs)))
        seconds = time.perf_counter() - t0
    finally:
        await asyncio.gather(*(s.aclose() for s in seqs))
    total = 0
    every: set[int] = set()
    for out in seen:
        assert all(a < b for a, b in zip(out, out[1:])), "a stream went backwards"
        every.update(out)
        total += len(out)
    assert len(every) == total, "an ID was handed out twice"
    lats.sort()
    return Result(clients, total, seconds, _pct(lats, 0.5), _pct(lats, 0.99), (lats[-1] / 1e6) if lats else 0.0)


async def bench_main(servers: Sequence[str], clients: int, buf: int, duration: float, name: str,
                     stopped: Callable[[], bool] = lambda: False) -> int:
    """Measure SimpleBufSeq then RRSeq, printing each line as it is done;
    ``stopped()`` (Ctrl-C) ends the current measurement early and skips the
    rest. A cluster started here is closed in any case."""
    from seq.channel import ApiChannel
    from seq.client import RRSeq
    from seq.localcluster import LocalCluster
    from seq.simple import LocalCounter, SimpleBufSeq

    cluster = None
    if not servers:
        cluster = LocalCluster(3)
        cluster.start_all("--bootstrap")
        await cluster.wait_ready()
        servers = cluster.addrs
        print(f"started a local 3-member cluster (fsync on) in {cluster.root}")
    try:
        counter = LocalCounter()
        r = await measure(lambda: SimpleBufSeq(buf, counter=counter), clients, duration=duration, stopped=stopped)
        print(r.line(f"in-process counter buf={buf}"), flush=True)
        if not stopped():
            async with ApiChannel(servers) as channel:  # the sequences share one connection per server
                r = await measure(lambda: RRSeq(name, buf, channel=channel), clients, duration=duration,
                                  stopped=stopped)
            print(r.line(f"cluster buf={buf}"), flush=True)
    finally:
        if cluster is not None:
            cluster.close()
    return 0
