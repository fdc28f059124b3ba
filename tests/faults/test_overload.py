"""Servers under ten times the load they can serve: the excess is answered
explicitly and at once (the balancer's 503, the rpc server's "request rate limit exceeded",
the juggler server's NACK 503), never left to time out; memory stays bounded;
service is back as soon as the load drops. Real processes: a balancer in front
of a slow backend, a ``juggler rpc serve`` with a rate limit, a ``juggler
server`` on a real redis-server with a slow callee."""

from __future__ import annotations

import asyncio
import http.client
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from juggler.client import connect
from juggler.errors import CallNacked
from rpc.client import Client
from rpc.errors import ServiceError
from rpc.rpcx_client import RpcxCaller
from tests.balancer.balancer_helpers import start_backend
from tests.faults.conftest import rss_kib
from tests.netutil import free_port, wait_for_port

pytestmark = [pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]
SLACK = 3.0


def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def test_balancer_at_ten_times_its_backend_capacity_answers_503_at_once(tmp_path: Path) -> None:
    # capacity: 2 requests at a time of 300 ms each (about 7/s); the load: 20 clients back to back
    backend = start_backend("slow")
    port = free_port()
    cfg = tmp_path / "lb.toml"
    cfg.write_text(f'listen = "127.0.0.1:{port}"\nworkers = 1\nbackends = ["{backend.address}"]\n'
                   "[limits]\nmax_connections = 2\n[timeouts]\nqueue = 0.3\n")
    lb = spawn([sys.executable, "-m", "cli", "balancer", "--config", str(cfg)])
    try:
        wait_for_port(port, timeout=30, proc=lb)
        rss0 = rss_kib(lb.pid)
        outcomes: Counter[int | str] = Counter()
        slowest = [0.0]
        stop_load = threading.Event()
        lock = threading.Lock()

        def client() -> None:
            while not stop_load.is_set():
                t0 = time.monotonic()
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                try:
                    c.request("GET", "/slow?ms=300")
                    r = c.getresponse()
                    r.read()
                    got: int | str = r.status
                except (OSError, http.client.HTTPException) as exc:
                    got = type(exc).__name__
                finally:
                    c.close()
                with lock:
                    outcomes[got] += 1
                    slowest[0] = max(slowest[0], time.monotonic() - t0)

        threads = [threading.Thread(target=client) for _ in range(20)]
        for t in threads:
            t.start()
        time.sleep(3)  # the load's duration: what is measured is the balancer under it for this long
        grown = rss_kib(lb.pid) - rss0
        stop_load.set()
        for t in threads:
            t.join(timeout=15)
        assert set(outcomes) <= {200, 503}, outcomes  # nothing but served or refused
        assert outcomes[503] > outcomes[200], outcomes  # the excess refused...
        assert slowest[0] < 0.3 + 0.3 + SLACK, slowest  # ...at once: queue, then the backend's own time
        assert grown < 32_000, f"grew by {grown} KiB under overload"
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        t0 = time.monotonic()
        c.request("GET", "/whoami")
        assert c.getresponse().status == 200 and time.monotonic() - t0 < 1  # back at once
        c.close()
        assert lb.poll() is None
    finally:
        stop(lb)
        backend.kill()


async def test_rpc_server_at_ten_times_its_rate_limit_refuses_the_excess_at_once() -> None:
    port = free_port()
    server = spawn([sys.executable, "-m", "cli", "rpc", "serve", "--listen", f"127.0.0.1:{port}",
                    "--example", "arith", "--rate-limit", "50"])
    try:
        wait_for_port(port, timeout=30, proc=server)
        async with Client(f"tcp@127.0.0.1:{port}", RpcxCaller(), close_caller=True) as c:
            await c.call("Arith", "Mul", {"A": 1, "B": 2}, timeout=5)
            rss0 = rss_kib(server.pid)
            outcomes: Counter[str] = Counter()
            slowest = 0.0
            end = time.monotonic() + 2

            async def client() -> None:
                nonlocal slowest
                while time.monotonic() < end:
                    t0 = time.monotonic()
                    try:
                        await c.call("Arith", "Mul", {"A": 2, "B": 3}, timeout=5)
                        outcomes["ok"] += 1
                    except ServiceError as exc:  # the rate limit's answer, as rpcx carries it: its text
                        assert "rate limit exceeded" in str(exc), exc
                        outcomes["limited"] += 1
                    slowest = max(slowest, time.monotonic() - t0)
                    await asyncio.sleep(0.02)  # each client about 50 calls/s; 10 of them: 10x the limit

            await asyncio.gather(*(client() for _ in range(10)))
            assert outcomes["limited"] > outcomes["ok"] > 0, outcomes  # any other error fails the test
            assert slowest < SLACK, slowest  # refused at once, never left to time out
            assert rss_kib(server.pid) - rss0 < 32_000
            await asyncio.sleep(0.1)  # the limiter's bucket refills: 5 calls' worth at 50/s
            await c.call("Arith", "Mul", {"A": 1, "B": 2}, timeout=5)  # back at once
        assert server.poll() is None
    finally:
        stop(server)


async def test_juggler_server_at_ten_times_its_callees_capacity_nacks_503_at_once(redis_url: str) -> None:
    # capacity: a callee running 2 calls at a time of 100 ms each (20/s); the server lets 20 calls
    # wait (a second of the callee's work); the load: 200 calls/s for 3 s over 10 connections
    port = free_port()
    callee = spawn([sys.executable, "-m", "cli", "callee", "--redis", redis_url, "--workers", "2"])
    server = spawn([sys.executable, "-m", "cli", "server", "--redis", redis_url, "--listen", f"127.0.0.1:{port}",
                    "--max-waiting-calls", "20"])
    url = f"ws://127.0.0.1:{port}/ws"
    try:
        wait_for_port(port, timeout=30, proc=server)
        async with connect(url) as warm:
            assert await warm.call("test.delay", "1", timeout=10) == 1  # the callee is up
        rss0 = rss_kib(server.pid)
        outcomes: Counter[str] = Counter()
        slowest_refusal = 0.0
        clients = [await connect(url) for _ in range(10)]
        try:
            async def one(c: Any) -> None:
                nonlocal slowest_refusal
                t0 = time.monotonic()
                try:
                    await c.call("test.delay", "100", timeout=10)
                    outcomes["ok"] += 1
                except CallNacked as exc:
                    outcomes[f"NACK {exc.code}"] += 1
                    slowest_refusal = max(slowest_refusal, time.monotonic() - t0)
                except Exception as exc:  # noqa: BLE001  (a timeout or anything else fails the test below)
                    outcomes[type(exc).__name__] += 1

            tasks = []
            end = time.monotonic() + 3
            while time.monotonic() < end:  # open loop: 10 calls every 50 ms, answered or not
                tasks += [asyncio.ensure_future(one(c)) for c in clients]
                await asyncio.sleep(0.05)
            grown = rss_kib(server.pid) - rss0
            async with asyncio.timeout(20):
                await asyncio.gather(*tasks)
            assert set(outcomes) <= {"ok", "NACK 503"}, outcomes  # every ACKed call got its result
            assert outcomes["NACK 503"] > outcomes["ok"] > 0, outcomes  # the excess refused...
            assert slowest_refusal < SLACK, slowest_refusal  # ...at once
            assert grown < 32_000, f"grew by {grown} KiB under overload"
            t0 = time.monotonic()
            assert await clients[0].call("test.delay", "1", timeout=10) == 1
            assert time.monotonic() - t0 < 1  # back at once
        finally:
            for c in clients:
                await c.aclose()
        assert server.poll() is None and callee.poll() is None
    finally:
        stop(server)
        stop(callee)

