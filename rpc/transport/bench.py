"""Engine of ``juggler rpc transport-bench``: echo over one connection, client
and server in separate processes, next to a raw-socket reference.

- transport: the server (``python -m rpc.transport.bench serve``) echoes every
  request with a synchronous handler; the client keeps ``inflight`` requests
  outstanding on a single connection for ``duration`` seconds.
- raw: the same echo shape with no framing or codec: a uvloop echo server
  (``transport.write(data)`` per read) and a blocking-socket client sending
  ``inflight`` payloads then reading them all back.
- iperf3 (when installed): one-way loopback bandwidth, for scale.

Both sides of both measurements run with ``tune_malloc()`` (see
``rpc.transport.tuning``). Reported per run: requests/s, MB/s (payload bytes per second, one
direction), p50/p99 latency, CPU (% of one core) and peak RSS of each side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    kind: str  # "transport" | "raw" | "iperf3"
    channel: str
    payload: int
    inflight: int
    duration: float
    requests: int
    rps: float
    mbps: float
    p50_ms: float
    p99_ms: float
    client_cpu: float
    server_cpu: float
    client_rss_mb: float
    server_rss_mb: float


def proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def self_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def percentile(sorted_ns: list[int], q: float) -> float:
    if not sorted_ns:
        return 0.0
    i = min(len(sorted_ns) - 1, int(q * len(sorted_ns)))
    return sorted_ns[i] / 1e6


# --- server side (child process) ---------------------------------------------


async def _serve_transport(endpoint: str, protocol: str) -> None:
    from rpc.transport import ServerConfig, TransportServer

    server = TransportServer(endpoint, lambda conn, msg: msg.payload, protocol=protocol, config=ServerConfig())
    ep = await server.start()
    print(f"listening {ep}", flush=True)
    await _until_stdin_closes()
    await server.aclose(timeout=1)


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_INET:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.t.write(data)  # type: ignore[attr-defined]


async def _serve_raw(endpoint: str) -> None:
    from rpc.transport import Endpoint

    ep = Endpoint.parse(endpoint)
    loop = asyncio.get_running_loop()
    if ep.kind == "tcp":
        server = await loop.create_server(_Echo, ep.host, ep.port)
        ep = Endpoint("tcp", host=ep.host, port=server.sockets[0].getsockname()[1])
    else:
        server = await loop.create_unix_server(_Echo, ep.path)
    print(f"listening {ep}", flush=True)
    await _until_stdin_closes()
    server.close()


async def _until_stdin_closes() -> None:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)


def serve_main(argv: list[str]) -> None:
    import uvloop

    from rpc.transport.tuning import tune_malloc

    tune_malloc()  # both servers (transport and raw) run with the same tuning

    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["transport", "raw"])
    p.add_argument("endpoint")
    p.add_argument("--protocol", default="rpcx")
    a = p.parse_args(argv)
    if a.mode == "transport":
        uvloop.run(_serve_transport(a.endpoint, a.protocol))
    else:
        uvloop.run(_serve_raw(a.endpoint))


# --- client side ----------------------------------------------------------------


class _Server:
    """A bench server child process; stops when its stdin closes."""

    def __init__(self, mode: str, endpoint: str, protocol: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "rpc.transport.bench", mode, endpoint, "--protocol", protocol],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            # Ctrl-C is the parent's to handle; the server ends with its stdin. A process group, not a
            # session: autogroup scheduling would schedule a new session apart from the client.
            process_group=0,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"bench server failed to start: {line!r}")
        self.endpoint = line.split()[1]

    def stop(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _endpoint(channel: str, tmp: str) -> str:
    return "tcp://127.0.0.1:0" if channel == "tcp" else f"unix://{tmp}/bench.sock"


def _never() -> bool:
    return False


async def _client_transport(endpoint: str, protocol: str, payload: int, inflight: int, duration: float,
                            stopped: Callable[[], bool] = _never) -> tuple[int, list[int], float]:
    from rpc.transport import TransportPool

    data = os.urandom(payload)
    async with TransportPool(protocol) as pool:
        conn = await pool.get(endpoint)
        for _ in range(min(200, max(10, 2000 // max(1, payload // 4096)))):  # warm-up
            await conn.request(data)
        lat: list[int] = []
        stop = False
        perf = time.perf_counter_ns

        async def worker() -> None:
            req = conn.request
            while not stop:
                t0 = perf()
                r = await req(data)
                lat.append(perf() - t0)
                if len(r.payload) != payload:
                    raise AssertionError("echo mismatch")
            return None

        start = time.perf_counter()
        tasks = [asyncio.ensure_future(worker()) for _ in range(inflight)]
        end = start + duration
        while (left := end - time.perf_counter()) > 0 and not stopped():
            await asyncio.sleep(min(0.1, left))
        stop = True
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
        count = len(lat)
    return count, lat, elapsed


def _client_raw(endpoint: str, payload: int, inflight: int, duration: float,
                stopped: Callable[[], bool] = _never) -> tuple[int, list[int], float]:
    from rpc.transport import Endpoint

    ep = Endpoint.parse(endpoint)
    if ep.kind == "tcp":
        s = socket.create_connection((ep.host, ep.port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    else:
        s = socket.socket(socket.AF_UNIX)
        s.connect(ep.path)
    data = os.urandom(payload)
    window = data * inflight
    buf = bytearray(len(window))
    view = memoryview(buf)
    lat: list[int] = []
    error: list[BaseException] = []

    def exchange() -> None:
        # Send in a helper thread so a window larger than the socket buffers
        # cannot deadlock against our own reads.
        sender = threading.Thread(target=s.sendall, args=(window,)) if len(window) > 1 << 20 else None
        if sender is not None:
            sender.start()
        else:
            s.sendall(window)
        got = 0
        while got < len(window):
            n = s.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("raw echo server closed")
            got += n
        if sender is not None:
            sender.join()

    try:
        exchange()  # warm-up
        start = time.perf_counter()
        end = start + duration
        perf = time.perf_counter_ns
        while time.perf_counter() < end and not stopped():
            t0 = perf()
            exchange()
            dt = perf() - t0
            lat.extend([dt] * inflight)
        elapsed = time.perf_counter() - start
    except BaseException as exc:  # pragma: no cover - reported below
        error.append(exc)
        raise
    finally:
        s.close()
    return len(lat), lat, elapsed


def run_one(kind: str, channel: str, payload: int, inflight: int, duration: float, protocol: str = "rpcx",
            stopped: Callable[[], bool] = _never) -> Result:
    """One measurement (``kind`` transport or raw) with its own server
    process; ``stopped()`` turning true ends it early (Ctrl-C)."""
    import uvloop

    from rpc.transport.tuning import tune_malloc

    tune_malloc()  # the client side of both measurements alike

    tmp = tempfile.mkdtemp(prefix="tbench-")
    server = _Server(kind, _endpoint(channel, tmp), protocol)
    try:
        s_cpu0, c_cpu0 = proc_cpu_seconds(server.proc.pid), self_cpu_seconds()
        if kind == "transport":
            count, lat, elapsed = uvloop.run(
                _client_transport(server.endpoint, protocol, payload, inflight, duration, stopped))
        else:
            count, lat, elapsed = _client_raw(server.endpoint, payload, inflight, duration, stopped)
        s_cpu, c_cpu = proc_cpu_seconds(server.proc.pid) - s_cpu0, self_cpu_seconds() - c_cpu0
        s_rss = proc_peak_rss_mb(server.proc.pid)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    lat.sort()
    return Result(
        kind=kind,
        channel=channel,
        payload=payload,
        inflight=inflight,
        duration=round(elapsed, 3),
        requests=count,
        rps=count / elapsed,
        mbps=count * payload / elapsed / 1e6,
        p50_ms=percentile(lat, 0.50),
        p99_ms=percentile(lat, 0.99),
        client_cpu=100 * c_cpu / elapsed,
        server_cpu=100 * s_cpu / elapsed,
        client_rss_mb=proc_peak_rss_mb(os.getpid()),
        server_rss_mb=s_rss,
    )


def run_iperf3(duration: float) -> Result | None:
    """One-way loopback TCP bandwidth with iperf3 (None when not installed)."""
    exe = shutil.which("iperf3")
    if exe is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen([exe, "-s", "-1", "-p", str(port), "-B", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out = None
        for _ in range(50):
            r = subprocess.run(
                [exe, "-c", "127.0.0.1", "-p", str(port), "-t", str(max(1, int(duration))), "-J"],
                capture_output=True, text=True, timeout=duration + 30,
            )
            if r.returncode == 0:
                out = json.loads(r.stdout)
                break
            time.sleep(0.1)
        if out is None:
            return None
        end = out["end"]
        bps = end["sum_received"]["bits_per_second"]
        cpu = end.get("cpu_utilization_percent", {})
        return Result(
            kind="iperf3", channel="tcp", payload=0, inflight=0, duration=duration, requests=0, rps=0.0,
            mbps=bps / 8 / 1e6, p50_ms=0.0, p99_ms=0.0,
            client_cpu=float(cpu.get("host_total", 0.0)), server_cpu=float(cpu.get("remote_total", 0.0)),
            client_rss_mb=0.0, server_rss_mb=0.0,
        )
    finally:
        if srv.poll() is None:
            srv.kill()
        srv.wait(timeout=10)


def format_row(r: Result) -> str:
    if r.kind == "iperf3":
        return f"| iperf3 (one-way) | {r.channel} | - | - | - | {r.mbps:,.0f} | - | - | {r.client_cpu:.0f} / {r.server_cpu:.0f} | - |"
    return (
        f"| {r.kind} | {r.channel} | {r.payload // 1024} KiB | {r.inflight} | {r.rps:,.0f} | {r.mbps:,.0f} | "
        f"{r.p50_ms:.3f} | {r.p99_ms:.3f} | {r.client_cpu:.0f} / {r.server_cpu:.0f} | "
        f"{r.client_rss_mb:.0f} / {r.server_rss_mb:.0f} |"
    )


HEADER = (
    "| kind | channel | payload | in flight | req/s | MB/s | p50 ms | p99 ms | CPU % client / server | peak RSS MiB client / server |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def result_dict(r: Result) -> dict[str, Any]:
    return asdict(r)


if __name__ == "__main__":
    serve_main(sys.argv[1:])
