"""The juggler load generator (``juggler load``).

N websocket connections send CALLs to one URI, either closed loop (each
connection sends its next CALL when the previous one got its RES, NACK or
expired) or at a fixed total rate. It counts calls, ACKs, NACKs, results and
expired calls (no RES within the call timeout: the client's local expiry),
and measures CALL→RES latency.

Light on CPU by design: frames are built from a template, server frames are
classified by a few string searches (``json`` only as a fallback), one task
per connection, no task per call; ``procs`` > 1 spreads the connections over
several processes (each its own event loop) and merges the figures.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing as mp
import sys
import time
import uuid as uuidlib
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["LoadConfig", "LoadReport", "run_load"]

# counter slots shared with the parent for the live progress line
_CALLS, _ACKS, _NACKS, _RESULTS, _EXPIRED, _ERRORS = range(6)
_NSLOTS = 6


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadConfig:
    url: str = "ws://127.0.0.1:9000/ws"
    connections: int = 20
    duration: float = 10.0
    rate: float = 0.0  # total calls/s; 0 = closed loop
    uri: str = "test.echo"
    payload: str = '"hello"'  # raw JSON args
    timeout: float = 5.0  # call timeout (sent to the server and used locally)
    procs: int = 1
    open_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.connections < 1:
            raise ValueError("connections must be >= 1")
        if self.duration <= 0 or self.timeout <= 0:
            raise ValueError("duration and timeout must be > 0")
        if self.rate < 0:
            raise ValueError("rate must be >= 0")
        if self.procs < 1:
            raise ValueError("procs must be >= 1")
        json.loads(self.payload)  # ValueError when not JSON


@dataclass(kw_only=True)
class LoadReport:
    config: dict[str, Any]
    duration_s: float
    calls: int = 0
    acks: int = 0
    nacks: int = 0
    results: int = 0
    expired: int = 0
    late_results: int = 0
    errors: int = 0
    throughput: float = 0.0  # results per second
    latency_ms: dict[str, float] = field(default_factory=dict)
    error_messages: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def format(self) -> str:
        c = self.config
        mode = "closed loop" if not c["rate"] else f"{c['rate']:g} calls/s"
        lat = self.latency_ms
        lines = [
            f"{c['connections']} connections ({c['procs']} process{'es' if c['procs'] > 1 else ''}), {mode}, "
            f"{c['uri']} args {c['payload'][:40]}, timeout {c['timeout']:g}s, {self.duration_s:.2f}s",
            f"calls {self.calls}  acks {self.acks}  nacks {self.nacks}  results {self.results}  "
            f"expired {self.expired}  late {self.late_results}  errors {self.errors}",
            f"throughput {self.throughput:,.0f} results/s",
        ]
        if lat:
            lines.append(
                "latency CALL→RES (ms): " + "  ".join(f"{k} {v:.3f}" for k, v in lat.items())
            )
        for m in self.error_messages[:5]:
            lines.append(f"error: {m}")
        return "\n".join(lines)


def _percentiles(lat_us: array) -> dict[str, float]:
    if not lat_us:
        return {}
    s = sorted(lat_us)
    n = len(s)

    def pct(p: float) -> float:
        return s[min(n - 1, max(0, math.ceil(p / 100 * n) - 1))] / 1000

    return {
        "min": s[0] / 1000,
        "mean": sum(s) / n / 1000,
        "median": pct(50),
        "p75": pct(75),
        "p90": pct(90),
        "p99": pct(99),
        "max": s[-1] / 1000,
    }


class _Conn:
    """One connection: sends CALLs, classifies server frames cheaply."""

    __slots__ = ("ws", "pending", "lat", "counters", "late", "waiter", "template")

    def __init__(self, ws: Any, counters: Any, lat: array, template: str) -> None:
        self.ws = ws
        self.pending: dict[str, float] = {}
        self.lat = lat
        self.counters = counters
        self.late = 0
        self.waiter: asyncio.Future[None] | None = None
        self.template = template

    def new_frame(self) -> tuple[str, str]:
        u = str(uuidlib.uuid4())
        return u, self.template % u

    def on_frame(self, frame: str) -> None:
        # {"meta":{"type":9,"uuid":"..."},"payload":{"for":"<uuid>",...}} — both
        # upstream and ours write this field order; anything else goes to json.
        i = frame.find('"type":')
        j = frame.find('"for":"')
        if i < 0 or j < 0:
            self._slow(frame)
            return
        t = frame[i + 7 : i + 9]
        for_uuid = frame[j + 7 : j + 43]
        if t == "8,":
            self.counters[_ACKS] += 1
            return
        if t == "9,":
            t0 = self.pending.pop(for_uuid, None)
            if t0 is None:
                self.late += 1
                return
            self.lat.append(int((time.perf_counter() - t0) * 1e6))
            self.counters[_RESULTS] += 1
            self._wake()
            return
        if t == "7,":
            self.counters[_NACKS] += 1
            if self.pending.pop(for_uuid, None) is not None:
                self._wake()
            return
        self._slow(frame)

    def _slow(self, frame: str) -> None:
        try:
            msg = json.loads(frame)
            t = msg["meta"]["type"]
            for_uuid = msg["payload"].get("for", "")
        except (ValueError, KeyError, TypeError, AttributeError):
            return
        if t == 8:
            self.counters[_ACKS] += 1
        elif t == 9:
            t0 = self.pending.pop(for_uuid, None)
            if t0 is None:
                self.late += 1
            else:
                self.lat.append(int((time.perf_counter() - t0) * 1e6))
                self.counters[_RESULTS] += 1
                self._wake()
        elif t == 7:
            self.counters[_NACKS] += 1
            if self.pending.pop(for_uuid, None) is not None:
                self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


async def _worker(cfg: LoadConfig, nconns: int, rate: float, counters: Any, start_at: float) -> dict[str, Any]:
    from websockets.asyncio.client import connect as ws_connect

    lat = array("q")
    errors: list[str] = []
    conns: list[_Conn] = []
    template = (
        '{"meta":{"type":1,"uuid":"%s"},"payload":{"uri":'
        + json.dumps(cfg.uri).replace("%", "%%")
        + ',"timeout":' + str(int(cfg.timeout * 1e9))
        + ',"args":' + json.dumps(json.loads(cfg.payload), separators=(",", ":")).replace("%", "%%")
        + "}}"
    )

    async def open_one() -> None:
        try:
            ws = await ws_connect(cfg.url, subprotocols=["juggler.0"], compression=None,  # type: ignore[list-item]
                                  open_timeout=cfg.open_timeout, ping_interval=None, max_size=None)
        except Exception as exc:
            counters[_ERRORS] += 1
            errors.append(f"connect: {exc}")
            return
        conns.append(_Conn(ws, counters, lat, template))

    await asyncio.gather(*(open_one() for _ in range(nconns)))
    if not conns:
        return {"lat": lat.tobytes(), "late": 0, "errors": errors}

    # everyone starts together (the parent sets start_at after all processes are up)
    delay = start_at - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    end = time.perf_counter() + cfg.duration

    async def reader(c: _Conn) -> None:
        try:
            async for frame in c.ws:
                if isinstance(frame, str):
                    c.on_frame(frame)
        except Exception as exc:  # connection dropped
            counters[_ERRORS] += 1
            errors.append(f"receive: {exc}")
        finally:
            c._wake()

    async def closed_loop(c: _Conn) -> None:
        loop = asyncio.get_running_loop()
        timeout = cfg.timeout
        while time.perf_counter() < end:
            u, frame = c.new_frame()
            c.waiter = loop.create_future()
            c.pending[u] = time.perf_counter()
            try:
                await c.ws.send(frame)
            except Exception as exc:
                counters[_ERRORS] += 1
                errors.append(f"send: {exc}")
                return
            counters[_CALLS] += 1
            handle = loop.call_later(timeout, c._wake)
            await c.waiter
            handle.cancel()
            if c.pending.pop(u, None) is not None:
                counters[_EXPIRED] += 1
                if c.ws.state.name != "OPEN":
                    return

    async def open_loop(cs: list[_Conn]) -> None:
        sent = 0
        t0 = time.perf_counter()
        i = 0
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            due = int((now - t0) * rate) - sent
            for _ in range(max(0, due)):
                c = cs[i % len(cs)]
                i += 1
                u, frame = c.new_frame()
                c.pending[u] = time.perf_counter()
                try:
                    await c.ws.send(frame)
                except Exception as exc:
                    counters[_ERRORS] += 1
                    errors.append(f"send: {exc}")
                    c.pending.pop(u, None)
                    continue
                counters[_CALLS] += 1
                sent += 1
            # expire what is overdue
            limit = time.perf_counter() - cfg.timeout
            for c in cs:
                old = [u for u, ts in c.pending.items() if ts < limit] if c.pending else ()
                for u in old:
                    del c.pending[u]
                    counters[_EXPIRED] += 1
            await asyncio.sleep(0.002)
        # let the last calls finish or expire
        while any(c.pending for c in cs):
            limit = time.perf_counter() - cfg.timeout
            for c in cs:
                for u in [u for u, ts in c.pending.items() if ts < limit]:
                    del c.pending[u]
                    counters[_EXPIRED] += 1
            await asyncio.sleep(0.01)

    readers = [asyncio.create_task(reader(c)) for c in conns]
    if rate > 0:
        await open_loop(conns)
    else:
        await asyncio.gather(*(closed_loop(c) for c in conns))
    late = sum(c.late for c in conns)
    for c in conns:
        try:
            await asyncio.wait_for(c.ws.close(), 2)
        except Exception:
            pass
    for r in readers:
        r.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    return {"lat": lat.tobytes(), "late": late, "errors": errors[:20]}


def _proc_main(cfg: LoadConfig, nconns: int, rate: float, counters: Any, start_at: float, out: Any) -> None:
    try:
        import uvloop

        result = uvloop.run(_worker(cfg, nconns, rate, counters, start_at))
    except BaseException as exc:  # report, never hang the parent
        result = {"lat": b"", "late": 0, "errors": [f"worker: {exc!r}"]}
    out.send(result)
    out.close()


def run_load(cfg: LoadConfig, progress: Callable[[str], None] | None = None) -> LoadReport:
    """Run the load (blocking); `progress` gets a status line about once a second."""
    ctx = mp.get_context("spawn") if cfg.procs > 1 else None
    procs = min(cfg.procs, cfg.connections)
    counters_all = [mp.Array("q", _NSLOTS, lock=False) if ctx is None else ctx.Array("q", _NSLOTS, lock=False)
                    for _ in range(procs)]
    shares = [cfg.connections // procs + (1 if i < cfg.connections % procs else 0) for i in range(procs)]
    start_at = time.time() + (1.5 if procs > 1 else 0.3)
    results: list[dict[str, Any]] = []
    t_start = time.perf_counter()

    def totals() -> list[int]:
        return [sum(c[i] for c in counters_all) for i in range(_NSLOTS)]

    def line(elapsed: float, last: list[int], last_t: float) -> str:
        t = totals()
        rate = (t[_RESULTS] - last[_RESULTS]) / max(1e-6, elapsed - last_t)
        return (f"[{elapsed:5.1f}s] calls {t[_CALLS]}  acks {t[_ACKS]}  nacks {t[_NACKS]}  "
                f"results {t[_RESULTS]}  expired {t[_EXPIRED]}  errors {t[_ERRORS]}  {rate:,.0f}/s")

    if ctx is None:
        import threading

        box: dict[str, Any] = {}

        def target() -> None:
            import uvloop

            box["r"] = uvloop.run(_worker(cfg, cfg.connections, cfg.rate, counters_all[0], start_at))

        th = threading.Thread(target=target, daemon=True)
        th.start()
        last, last_t = totals(), 0.0
        while th.is_alive():
            th.join(1.0)
            if progress is not None and th.is_alive():
                el = time.perf_counter() - t_start
                progress(line(el, last, last_t))
                last, last_t = totals(), el
        results.append(box.get("r") or {"lat": b"", "late": 0, "errors": ["worker failed"]})
    else:
        pipes = []
        workers = []
        for i in range(procs):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_proc_main, args=(cfg, shares[i], cfg.rate * shares[i] / cfg.connections,
                                                     counters_all[i], start_at, child), daemon=True)
            p.start()
            child.close()
            pipes.append(parent)
            workers.append(p)
        last, last_t = totals(), 0.0
        pending = list(range(procs))
        got: dict[int, dict[str, Any]] = {}
        deadline = time.time() + cfg.duration + cfg.timeout + 60
        while pending and time.time() < deadline:
            for i in list(pending):
                if pipes[i].poll(0 if len(pending) > 1 else 1.0):
                    try:
                        got[i] = pipes[i].recv()
                    except EOFError:
                        got[i] = {"lat": b"", "late": 0, "errors": ["worker died"]}
                    pending.remove(i)
            if pending and len(pending) > 1:
                time.sleep(0.2)
            el = time.perf_counter() - t_start
            if progress is not None and el - last_t >= 1.0 and pending:
                progress(line(el, last, last_t))
                last, last_t = totals(), el
        for p in workers:
            p.join(5)
            if p.is_alive():
                p.kill()
        results = [got.get(i, {"lat": b"", "late": 0, "errors": ["worker timed out"]}) for i in range(procs)]

    t = totals()
    lat = array("q")
    late = 0
    errs: list[str] = []
    for r in results:
        a = array("q")
        a.frombytes(r["lat"])
        lat.extend(a)
        late += r["late"]
        errs.extend(r["errors"])
    duration = cfg.duration
    report = LoadReport(
        config={**asdict(cfg), "procs": procs},
        duration_s=duration,
        calls=t[_CALLS], acks=t[_ACKS], nacks=t[_NACKS], results=t[_RESULTS], expired=t[_EXPIRED],
        late_results=late, errors=t[_ERRORS], throughput=t[_RESULTS] / duration,
        latency_ms=_percentiles(lat), error_messages=errs,
    )
    return report


def main_progress_printer(stream: Any = sys.stderr) -> Callable[[str], None]:
    tty = stream.isatty()

    def show(text: str) -> None:
        if tty:
            stream.write("\r\x1b[K" + text)
        else:
            stream.write(text + "\n")
        stream.flush()

    return show

