"""Pub-sub fan-out load: N websocket subscribers on one channel, one
publisher at R messages/s, for D seconds (``juggler load --mode fanout``).

Each PUB carries its publish time (``time.time_ns()``) and a sequence
number in its ``args``, padded to ``payload_bytes``; every subscriber
records publish → delivery latency for each EVNT and checks the sequence
numbers, so lost, duplicated or reordered events are counted. Subscribers
are spread over ``procs`` processes (the load tool must not be the limit);
the publisher runs in the first. The report: events published, deliveries
expected and seen, deliveries/s, lost, duplicates, latency percentiles.

The subscribers are native (``rustext.FanoutSubscribers``: tokio tasks that
read ``t`` and ``seq`` without decoding the JSON) and the publisher uses the
load tool's minimal websocket client (juggler.load._WsClient): the measuring
side shares the machine and must cost less CPU than the server it measures.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
import uuid
from array import array
from dataclasses import asdict, dataclass, field
from typing import Any

from urllib.parse import urlparse

import rustext
from juggler.load import _percentiles, _WsClient, reap
from rustext.interrupt import ignore_sigint
from rustext.net import raise_open_files_limit



@dataclass(frozen=True, kw_only=True, slots=True)
class FanoutConfig:
    url: str = "ws://127.0.0.1:9000/ws"
    subscribers: int = 100
    rate: float = 50.0  # PUBs per second
    duration: float = 10.0
    payload_bytes: int = 100
    channel: str = "bench.fanout"
    procs: int = 1
    open_timeout: float = 10.0
    #: seconds to wait, after the last PUB, for its deliveries
    settle: float = 2.0
    #: the server's process id (on this machine): report its CPU time per delivery
    server_pid: int | None = None
    #: the subscribers offer permessage-deflate (as browsers do); the publisher never compresses
    compression: bool = False

    def __post_init__(self) -> None:
        if self.subscribers < 1:
            raise ValueError("subscribers must be >= 1")
        if self.rate <= 0:
            raise ValueError("the fan-out mode needs a publish rate > 0 (--rate)")
        if self.duration <= 0:
            raise ValueError("duration must be > 0")
        if self.payload_bytes < 0:
            raise ValueError("payload bytes must be >= 0")
        if self.procs < 1:
            raise ValueError("procs must be >= 1")
        if not self.url.startswith("ws://"):
            raise ValueError("the fan-out mode speaks ws:// only")


@dataclass(kw_only=True)
class FanoutReport:
    config: dict[str, Any]
    duration_s: float
    published: int = 0
    expected: int = 0  # published × subscribers that were subscribed
    delivered: int = 0
    lost: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    deliveries_per_s: float = 0.0
    latency_ms: dict[str, float] = field(default_factory=dict)
    #: the server's CPU time (user + system) per delivery, with --server-pid
    server_cpu_us_per_delivery: float | None = None
    server_cpu_s: float | None = None
    error_messages: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def format(self) -> str:
        c = self.config
        lines = [
            f"{c['subscribers']} subscribers ({c['procs']} process{'es' if c['procs'] > 1 else ''}) on "
            f"{c['channel']}, {c['rate']:g} PUB/s of {c['payload_bytes']} bytes, {self.duration_s:.2f}s",
            f"published {self.published}  deliveries {self.delivered} of {self.expected}  lost {self.lost}  "
            f"duplicates {self.duplicates}  out of order {self.out_of_order}",
            f"throughput {self.deliveries_per_s:,.0f} deliveries/s",
        ]
        if self.latency_ms:
            lines.append("latency PUB→EVNT (ms): " + "  ".join(f"{k} {v:.3f}" for k, v in self.latency_ms.items()))
        if self.server_cpu_us_per_delivery is not None:
            lines.append(f"server CPU {self.server_cpu_s:.2f} s: {self.server_cpu_us_per_delivery:.2f} µs per delivery")
        for m in self.error_messages[:5]:
            lines.append(f"error: {m}")
        return "\n".join(lines)


async def _worker(cfg: FanoutConfig, n: int, publish: bool, pipe: Any) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    errors: list[str] = []
    u = urlparse(cfg.url)
    subs = rustext.FanoutSubscribers(u.hostname or "127.0.0.1", u.port or 80, u.path or "/", cfg.channel, n,
                                     threads=1, deflate=cfg.compression)
    subscribed, failed = await asyncio.to_thread(subs.wait_subscribed, cfg.open_timeout + n / 250)
    if failed or subscribed < n:
        errors.append(f"{failed} of {n} subscribers failed, {n - subscribed - failed} not subscribed in time")

    async def open_ws(on_frame: Any) -> _WsClient:
        ws = _WsClient(cfg.url, "juggler.0", on_frame)
        async with asyncio.timeout(cfg.open_timeout):  # not wait_for (3.11)
            await loop.create_connection(lambda: ws, ws.host, ws.port)
        async with asyncio.timeout(cfg.open_timeout):  # not wait_for (3.11)
            await ws.opened
        return ws

    pub_ws = None
    if publish:
        try:
            pub_ws = await open_ws(lambda frame: None)
        except Exception as exc:
            errors.append(f"publisher: {exc!r}")
    # everyone subscribed (in every process) before the first PUB: the parent says when
    pipe.send(("ready", subscribed))
    if not await asyncio.to_thread(pipe.poll, cfg.open_timeout + cfg.subscribers / 250):
        errors.append("no start signal from the parent")
    else:
        pipe.recv()
    published = 0
    if pub_ws is not None:
        pad = "x" * cfg.payload_bytes
        t0 = time.perf_counter()
        end = t0 + cfg.duration
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            due = int((now - t0) * cfg.rate) + 1 - published
            for _ in range(max(0, due)):
                pub_ws.send_text(
                    '{"meta":{"type":2,"uuid":"%s"},"payload":{"channel":%s,"args":{"t":%d,"seq":%d,"pad":"%s"}}}'
                    % (uuid.uuid4(), json.dumps(cfg.channel), time.time_ns(), published, pad))
                published += 1
            await asyncio.sleep(max(0.0005, min(end, t0 + (published / cfg.rate)) - time.perf_counter()))
    else:
        await asyncio.sleep(cfg.duration)
    await asyncio.sleep(cfg.settle)  # the last events' deliveries
    lat, seen, duplicates, out_of_order, subscribed, sub_errors = await asyncio.to_thread(subs.finish)
    if pub_ws is not None:
        pub_ws.close()
    return {
        "lat": lat, "published": published, "subscribed": subscribed, "seen": seen, "duplicates": duplicates,
        "out_of_order": out_of_order, "errors": (errors + [f"subscriber: {e}" for e in sub_errors])[:20],
    }


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` (Linux /proc), None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    import os

    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _failed(why: str) -> dict[str, Any]:
    """The result of a worker that did not report."""
    return {"lat": b"", "published": 0, "subscribed": 0, "seen": 0, "duplicates": 0, "out_of_order": 0,
            "errors": [why]}


def _proc_main(cfg: FanoutConfig, n: int, publish: bool, out: Any) -> None:
    ignore_sigint()
    raise_open_files_limit()
    try:
        import uvloop

        result = uvloop.run(_worker(cfg, n, publish, out))
    except BaseException as exc:  # report, never hang the parent
        result = _failed(f"worker: {exc!r}")
    out.send(result)
    out.close()


def run_fanout(cfg: FanoutConfig) -> FanoutReport:
    """Run the fan-out load (blocking) and report."""
    procs = min(cfg.procs, cfg.subscribers)
    shares = [cfg.subscribers // procs + (1 if i < cfg.subscribers % procs else 0) for i in range(procs)]
    ctx = mp.get_context("spawn")
    pipes, workers = [], []
    for i in range(procs):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_proc_main, args=(cfg, shares[i], i == 0, child), daemon=True)
        p.start()
        child.close()
        pipes.append(parent)
        workers.append(p)
    deadline = time.time() + cfg.duration + cfg.settle + cfg.open_timeout + cfg.subscribers / 250 + 60
    cpu0 = cpu1 = None
    results: list[dict[str, Any]] = []
    try:
        # every worker's subscribers in place: the publisher starts, the CPU window opens
        waiting = []
        for pipe in pipes:
            left = max(0.1, deadline - time.time())
            msg = pipe.recv() if pipe.poll(left) else None
            if isinstance(msg, tuple) and msg[0] == "ready":
                waiting.append(pipe)
            elif isinstance(msg, dict):
                results.append(msg)  # a worker that failed before it was ready
            else:
                results.append(_failed("worker timed out"))
        if cfg.server_pid is not None:
            cpu0 = process_cpu(cfg.server_pid)
        for pipe in waiting:
            pipe.send("go")
        if cfg.server_pid is not None:
            time.sleep(cfg.duration + cfg.settle / 2)
            cpu1 = process_cpu(cfg.server_pid)
        for pipe in waiting:
            left = max(0.1, deadline - time.time())
            results.append(pipe.recv() if pipe.poll(left) else _failed("worker timed out"))
    finally:
        reap(workers)
    lat = array("q")
    for r in results:
        a = array("q")
        a.frombytes(r["lat"])
        lat.extend(a)
    published = sum(r["published"] for r in results)
    subscribed = sum(r["subscribed"] for r in results)
    seen = sum(r["seen"] for r in results)
    expected = published * subscribed
    cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    return FanoutReport(
        server_cpu_s=cpu, server_cpu_us_per_delivery=cpu * 1e6 / seen if cpu is not None and seen else None,
        config={**asdict(cfg), "procs": procs}, duration_s=cfg.duration, published=published,
        expected=expected, delivered=seen, lost=max(0, expected - seen),
        duplicates=sum(r["duplicates"] for r in results), out_of_order=sum(r["out_of_order"] for r in results),
        deliveries_per_s=seen / cfg.duration, latency_ms=_percentiles(lat),
        error_messages=[e for r in results for e in r["errors"]],
    )
