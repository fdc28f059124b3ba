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
import base64
import json
import math
import multiprocessing as mp
import os
import ssl
import sys
import time
import uuid as uuidlib
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlparse

from rustext.interrupt import ignore_sigint, two_step_interrupt

__all__ = ["LoadConfig", "LoadReport", "run_load"]

# counter slots shared with the parent for the live progress line
_CALLS, _ACKS, _NACKS, _RESULTS, _EXPIRED, _ERRORS = range(6)
_STOP = 6  # set to 1 by the parent: stop sending (Ctrl-C), finish the calls in flight
_NSLOTS = 7
_COUNTED = 6  # slots that are counters


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
    #: wss:// URLs: PEM CA certificates to verify the server with (None: the system's trust store)
    tls_ca: str | None = None
    #: wss:// URLs: no verification of the server (only for trying things out)
    insecure: bool = False

    def __post_init__(self) -> None:
        if self.connections < 1:
            raise ValueError("connections must be >= 1")
        if self.duration <= 0 or self.timeout <= 0:
            raise ValueError("duration and timeout must be > 0")
        if self.rate < 0:
            raise ValueError("rate must be >= 0")
        if self.procs < 1:
            raise ValueError("procs must be >= 1")
        if not self.url.startswith(("ws://", "wss://")):
            raise ValueError(f"the URL must be ws:// or wss://, got {self.url!r}")
        if (self.tls_ca or self.insecure) and not self.url.startswith("wss://"):
            raise ValueError("--tls-ca and --insecure need a wss:// URL")
        try:
            json.loads(self.payload)
        except ValueError as exc:
            raise ValueError(f"the payload must be JSON, e.g. '\"hello\"' for a string ({exc})") from None
        self.tls_context()  # a bad CA file is reported now, naming it

    def tls_context(self) -> ssl.SSLContext | None:
        """The client TLS context of a wss:// URL, else None."""
        if not self.url.startswith("wss://"):
            return None
        from rustext.tls import ClientTls

        return ClientTls(ca=self.tls_ca, insecure=self.insecure).context()


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
    #: stopped early (Ctrl-C): the figures cover ``duration_s`` only
    interrupted: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def format(self) -> str:
        c = self.config
        mode = "closed loop" if not c["rate"] else f"{c['rate']:g} calls/s"
        lat = self.latency_ms
        lines = [
            f"{c['connections']} connections ({c['procs']} process{'es' if c['procs'] > 1 else ''}), {mode}, "
            f"{c['uri']} args {c['payload'][:40]}, timeout {c['timeout']:g}s, {self.duration_s:.2f}s"
            + (" (stopped early)" if self.interrupted else ""),
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


class _WsClient(asyncio.Protocol):
    """A minimal websocket client (RFC 6455) for the load tool only.

    Why not the ``websockets`` package here: the load tool must cost less
    CPU than what it measures. Text frames out (masked with a zero key, so
    masking is free), text frames in, ping → pong, close; the closed loop
    runs inside ``data_received`` with no task or future per call.
    """

    def __init__(self, url: str, subprotocol: str, on_frame: Callable[[str], None]) -> None:
        u = urlparse(url)
        if u.scheme not in ("ws", "wss"):
            raise ValueError("the load tool speaks ws:// and wss:// only")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if u.scheme == "wss" else 80)
        self.path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self.subprotocol = subprotocol
        self.on_frame = on_frame
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buf = bytearray()
        self._handshake = True
        self._frag: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        key = base64.b64encode(os.urandom(16)).decode()
        self.transport.write((
            f"GET {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Protocol: {self.subprotocol}\r\n\r\n"
        ).encode())

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        if self._handshake:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).decode("latin-1").lower()
            del buf[: end + 4]
            if not head.startswith("http/1.1 101") or f"sec-websocket-protocol: {self.subprotocol}" not in head:
                if not self.opened.done():
                    self.opened.set_exception(ConnectionError(f"handshake refused: {head.splitlines()[0]!r}"))
                self.transport.close()  # type: ignore[union-attr]
                return
            self._handshake = False
            if not self.opened.done():
                self.opened.set_result(None)
        while True:
            n = len(buf)
            if n < 2:
                return
            b0, b1 = buf[0], buf[1]
            length = b1 & 0x7F
            pos = 2
            if length == 126:
                if n < 4:
                    return
                length = int.from_bytes(buf[2:4], "big")
                pos = 4
            elif length == 127:
                if n < 10:
                    return
                length = int.from_bytes(buf[2:10], "big")
                pos = 10
            if b1 & 0x80:
                pos += 4  # a masked server frame: not expected, unmasked below
            if n < pos + length:
                return
            payload = bytes(buf[pos : pos + length])
            if b1 & 0x80:
                mask = buf[pos - 4 : pos]
                payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
            del buf[: pos + length]
            opcode = b0 & 0x0F
            if opcode in (1, 0):
                self._frag.append(payload)
                if b0 & 0x80:
                    text = b"".join(self._frag).decode("utf-8", "replace")
                    self._frag.clear()
                    self.on_frame(text)
            elif opcode == 9:
                self._send(0xA, payload)
            elif opcode == 8:
                self._send(0x8, payload[:2])
                self.transport.close()  # type: ignore[union-attr]
                return

    def _send(self, opcode: int, payload: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        n = len(payload)
        if n < 126:
            head = bytes((0x80 | opcode, 0x80 | n))
        elif n < 65536:
            head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
        else:
            head = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
        self.transport.write(head + b"\x00\x00\x00\x00" + payload)

    def send_text(self, text: str) -> None:
        self._send(0x1, text.encode())

    def close(self) -> None:
        self._send(0x8, (1000).to_bytes(2, "big"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError(f"connection lost: {exc or 'closed'}"))
        if not self.closed.done():
            self.closed.set_result(None)

    @property
    def is_open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing() and not self._handshake


class _Conn:
    """One connection's calls: classifies server frames by string search."""

    __slots__ = ("ws", "pending", "lat", "counters", "late", "template", "end", "timeout",
                 "closed_loop", "current", "timer", "done", "loop")

    def __init__(self, counters: Any, lat: array, template: str, end: float, timeout: float, closed_loop: bool) -> None:
        self.ws: _WsClient | None = None
        self.pending: dict[str, float] = {}
        self.lat = lat
        self.counters = counters
        self.late = 0
        self.template = template
        self.end = end
        self.timeout = timeout
        self.closed_loop = closed_loop
        self.current: str | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self.loop.create_future()

    def send_call(self) -> None:
        ws = self.ws
        if ws is None or not ws.is_open:
            self._finish()
            return
        u = str(uuidlib.uuid4())
        self.pending[u] = time.perf_counter()
        ws.send_text(self.template % u)
        self.counters[_CALLS] += 1
        if self.closed_loop:
            self.current = u
            self.timer = self.loop.call_later(self.timeout, self._expire, u)

    def _expire(self, u: str) -> None:
        if self.pending.pop(u, None) is not None:
            self.counters[_EXPIRED] += 1
            self._next()

    def _next(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if time.perf_counter() < self.end:
            self.send_call()
        else:
            self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def _settled(self, for_uuid: str) -> None:
        if self.closed_loop and for_uuid == self.current:
            self.current = None
            self._next()

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
        elif t == "9,":
            self._result(for_uuid)
        elif t == "7,":
            self._nack(for_uuid)
        else:
            self._slow(frame)

    def _result(self, for_uuid: str) -> None:
        t0 = self.pending.pop(for_uuid, None)
        if t0 is None:
            self.late += 1
            return
        self.lat.append(int((time.perf_counter() - t0) * 1e6))
        self.counters[_RESULTS] += 1
        self._settled(for_uuid)

    def _nack(self, for_uuid: str) -> None:
        self.counters[_NACKS] += 1
        if self.pending.pop(for_uuid, None) is not None:
            self._settled(for_uuid)

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
            self._result(for_uuid)
        elif t == 7:
            self._nack(for_uuid)


async def _worker(cfg: LoadConfig, nconns: int, rate: float, counters: Any, start_at: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    lat = array("q")
    errors: list[str] = []
    template = (
        '{"meta":{"type":1,"uuid":"%s"},"payload":{"uri":'
        + json.dumps(cfg.uri).replace("%", "%%")
        + ',"timeout":' + str(int(cfg.timeout * 1e9))
        + ',"args":' + json.dumps(json.loads(cfg.payload), separators=(",", ":")).replace("%", "%%")
        + "}}"
    )
    closed_loop = rate <= 0
    conns: list[_Conn] = []
    tls = cfg.tls_context()

    async def open_one() -> None:
        c = _Conn(counters, lat, template, float("inf"), cfg.timeout, closed_loop)
        try:
            ws = _WsClient(cfg.url, "juggler.0", c.on_frame)
            async with asyncio.timeout(cfg.open_timeout):  # not wait_for (3.11)
                await loop.create_connection(
                    lambda: ws, ws.host, ws.port, ssl=tls, server_hostname=ws.host if tls is not None else None,
                )
            async with asyncio.timeout(cfg.open_timeout):  # not wait_for (3.11)
                await ws.opened
        except Exception as exc:
            counters[_ERRORS] += 1
            if isinstance(exc, ssl.SSLError):
                from rustext.tls import describe_ssl_error

                exc = describe_ssl_error(exc)  # type: ignore[assignment]
            errors.append(f"connect: {exc}")
            return
        c.ws = ws
        ws.closed.add_done_callback(lambda _f, c=c: c._finish())
        conns.append(c)

    await asyncio.gather(*(open_one() for _ in range(nconns)))
    if not conns:
        from rustext.tls import speaks_tls

        u = urlparse(cfg.url)
        if tls is None and await speaks_tls(u.hostname or "127.0.0.1", u.port or 80):
            errors.insert(0, f"connect: this server speaks TLS: use wss://{cfg.url.removeprefix('ws://')}")
        return {"lat": lat.tobytes(), "late": 0, "errors": errors}

    # everyone starts together (the parent sets start_at after all processes are up)
    delay = start_at - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    end = time.perf_counter() + cfg.duration
    for c in conns:
        c.end = end

    async def watch_stop() -> None:  # the parent's Ctrl-C: stop sending now
        nonlocal end
        while time.perf_counter() < end:
            if counters[_STOP]:
                end = time.perf_counter()
                for c in conns:
                    c.end = end
                return
            await asyncio.sleep(0.05)

    stopper = asyncio.ensure_future(watch_stop())

    if closed_loop:
        for c in conns:
            c.send_call()
        await asyncio.gather(*(c.done for c in conns))
        for c in conns:  # a connection that dropped mid-call
            if c.pending:
                counters[_ERRORS] += 1
                errors.append("connection closed with a call pending")
                c.pending.clear()
    else:
        sent = 0
        t0 = time.perf_counter()
        i = 0
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            due = int((now - t0) * rate) - sent
            for _ in range(max(0, due)):
                c = conns[i % len(conns)]
                i += 1
                c.send_call()
                sent += 1
            limit = time.perf_counter() - cfg.timeout
            for c in conns:
                if c.pending:
                    for u in [u for u, ts in c.pending.items() if ts < limit]:
                        del c.pending[u]
                        counters[_EXPIRED] += 1
            await asyncio.sleep(0.002)
        # let the last calls finish or expire
        while any(c.pending for c in conns):
            limit = time.perf_counter() - cfg.timeout
            for c in conns:
                for u in [u for u, ts in c.pending.items() if ts < limit]:
                    del c.pending[u]
                    counters[_EXPIRED] += 1
            await asyncio.sleep(0.01)
    stopper.cancel()
    late = sum(c.late for c in conns)
    for c in conns:
        if c.ws is not None:
            c.ws.close()
    closing = [c.ws.closed for c in conns if c.ws is not None]
    if closing:
        await asyncio.wait(closing, timeout=2)
    for c in conns:
        if c.ws is not None and c.ws.transport is not None:
            c.ws.transport.abort()
    return {"lat": lat.tobytes(), "late": late, "errors": errors[:20]}


def _proc_main(cfg: LoadConfig, nconns: int, rate: float, counters: Any, start_at: float, out: Any) -> None:
    ignore_sigint()  # Ctrl-C reaches the whole process group: the parent decides (stop flag, or kill)
    try:
        import uvloop

        result = uvloop.run(_worker(cfg, nconns, rate, counters, start_at))
    except BaseException as exc:  # report, never hang the parent
        result = {"lat": b"", "late": 0, "errors": [f"worker: {exc!r}"]}
    out.send(result)
    out.close()


def run_load(cfg: LoadConfig, progress: Callable[[str], None] | None = None,
             prog: str | None = None) -> LoadReport:
    """Run the load (blocking); `progress` gets a status line about once a second.

    In the main thread, the first Ctrl-C (or SIGTERM) stops sending: the
    calls in flight finish and the report covers the time until then
    (``interrupted``; with ``prog``, stderr is told); the second ends the
    workers at once and raises KeyboardInterrupt. No worker process outlives it."""
    stop_box: dict[str, Any] = {}

    def stop() -> None:
        stop_box["at"] = time.perf_counter()

    with two_step_interrupt(stop, prog=prog):
        return _run_load(cfg, progress, stop_box)


def _run_load(cfg: LoadConfig, progress: Callable[[str], None] | None,
              stop_box: dict[str, Any] | None) -> LoadReport:
    ctx = mp.get_context("spawn") if cfg.procs > 1 else None
    procs = min(cfg.procs, cfg.connections)
    counters_all = [mp.Array("q", _NSLOTS, lock=False) if ctx is None else ctx.Array("q", _NSLOTS, lock=False)
                    for _ in range(procs)]
    shares = [cfg.connections // procs + (1 if i < cfg.connections % procs else 0) for i in range(procs)]
    start_at = time.time() + (1.5 if procs > 1 else 0.3)
    results: list[dict[str, Any]] = []
    t_start = time.perf_counter() + (start_at - time.time())  # when the calls start

    def totals() -> list[int]:
        return [sum(c[i] for c in counters_all) for i in range(_COUNTED)]

    stop_sent = False

    def check_stop() -> None:
        nonlocal stop_sent
        if stop_box is not None and "at" in stop_box and not stop_sent:
            stop_sent = True
            for c in counters_all:
                c[_STOP] = 1

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
            th.join(0.1)
            check_stop()
            el = time.perf_counter() - t_start
            if progress is not None and th.is_alive() and el > 0 and el - last_t >= 1.0:
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
        pending = list(range(procs))
        got: dict[int, dict[str, Any]] = {}
        deadline = time.time() + cfg.duration + cfg.timeout + 60
        try:
            _collect(pipes, pending, got, deadline, check_stop, progress, line, t_start, totals)
        except BaseException:  # a second Ctrl-C: stop now
            for p in workers:
                p.kill()
            raise
        finally:
            reap(workers)
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
    interrupted = stop_box is not None and "at" in stop_box
    if interrupted:
        duration = max(1e-3, min(cfg.duration, stop_box["at"] - t_start))  # type: ignore[index]
    report = LoadReport(
        config={**asdict(cfg), "procs": procs},
        duration_s=duration,
        interrupted=interrupted,
        calls=t[_CALLS], acks=t[_ACKS], nacks=t[_NACKS], results=t[_RESULTS], expired=t[_EXPIRED],
        late_results=late, errors=t[_ERRORS], throughput=t[_RESULTS] / duration,
        latency_ms=_percentiles(lat), error_messages=errs,
    )
    return report


def reap(workers: list[Any]) -> None:
    """Join the worker processes, killing any still alive after 5 s: no
    worker outlives a run."""
    for p in workers:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)


def _collect(pipes: list[Any], pending: list[int], got: dict[int, dict[str, Any]], deadline: float,
             check_stop: Callable[[], None], progress: Callable[[str], None] | None,
             line: Callable[[float, list[int], float], str], t_start: float,
             totals: Callable[[], list[int]]) -> None:
    """Gather the workers' results as they come, with progress lines."""
    last, last_t = totals(), 0.0
    while pending and time.time() < deadline:
        check_stop()
        for i in list(pending):
            if pipes[i].poll(0 if len(pending) > 1 else 0.2):
                try:
                    got[i] = pipes[i].recv()
                except EOFError:
                    got[i] = {"lat": b"", "late": 0, "errors": ["worker died"]}
                pending.remove(i)
        if pending and len(pending) > 1:
            time.sleep(0.2)
        el = time.perf_counter() - t_start
        if progress is not None and el - last_t >= 1.0 and pending and el > 0:
            progress(line(el, last, last_t))
            last, last_t = totals(), el


def main_progress_printer(stream: Any = sys.stderr) -> Callable[[str], None]:
    tty = stream.isatty()

    def show(text: str) -> None:
        if tty:
            stream.write("\r\x1b[K" + text)
        else:
            stream.write(text + "\n")
        stream.flush()

    return show

