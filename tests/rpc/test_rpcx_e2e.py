"""The rpcx protocol end to end: real `juggler rpc serve` processes over TCP
and unix sockets, driven by Client / XClient over ``RpcxCaller``."""

from __future__ import annotations

import asyncio
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rpc.client import Client
from rpc.discovery.base import StaticDiscovery
from rpc.discovery.redis import RedisDiscovery
from rpc.errors import CallTimeout, NoServerAvailable, RpcError, ServiceError, TransportError
from rpc.failmode import FailMode
from rpc.message import Message, SerializeType
from rpc.rpcx_client import RpcxCaller
from rpc.selector import RoundRobinSelector
from rpc.xclient import XClient, XClientOptions
from tests.netutil import wait_until


@dataclass
class Served:
    proc: subprocess.Popen
    address: str
    log: Any

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 20) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()

    def stderr(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()


def serve(*args: str, listen: str = "127.0.0.1:0") -> Served:
    """Start `juggler rpc serve --listen LISTEN ARGS` and wait until it listens."""
    log = tempfile.NamedTemporaryFile("w+", prefix="rpc-serve-", suffix=".log")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "rpc", "serve", "--listen", listen, *args],
        stdout=subprocess.PIPE, stderr=log, text=True, cwd=os.getcwd(),
    )
    served = Served(proc, "", log)
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout=30):
            err = served.stderr()  # before stop() closes the log
            served.stop()
            pytest.fail(f"rpc serve did not start: {err}")
        line = proc.stdout.readline()
    finally:
        sel.close()
    found = re.match(r"rpc serve: rpcx(?: over TLS)? on ([^,;\s]+)", line)
    if found is None:
        if not line:  # stdout closed: it is exiting, its last words are in the log
            proc.wait(timeout=10)
        err = served.stderr()  # before stop() closes the log
        served.stop()
        pytest.fail(f"rpc serve failed: {line!r} {err}")
    served.address = found.group(1)
    return served


@pytest.fixture
def servers() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.stop()


APP = ("--app", "tests.rpc.rpcx_app:setup")


@pytest.mark.parametrize("kind", ["tcp", "unix"])
async def test_call_go_oneway_push_heartbeat(kind: str, servers: list[Served]) -> None:
    if kind == "unix":
        listen = f"unix@{tempfile.mkdtemp(prefix='rpcx-')}/s.sock"
    else:
        listen = "127.0.0.1:0"
    s = serve(*APP, listen=listen)
    servers.append(s)
    assert s.address.startswith(f"{kind}@")
    pushed: asyncio.Queue[Message] = asyncio.Queue()
    caller = RpcxCaller(pool=2, heartbeat_interval=0.05, on_push=pushed.put_nowait)
    async with Client(s.address, caller, close_caller=True) as client:
        assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
        tasks = [client.go("Arith", "Add", {"A": i, "B": 1}, timeout=5) for i in range(50)]
        assert [t["C"] for t in await asyncio.gather(*tasks)] == [i + 1 for i in range(50)]
        # oneway: nothing comes back, the server ran it (the connection orders it before Notes)
        await client.oneway("Probe", "Note", "hello")
        assert await client.call("Probe", "Notes", None, timeout=5) == ["hello"]
        # server push to this connection
        assert await client.call("Probe", "Push", {"n": 3}, timeout=5) == {"pushed": 3}
        events = [await asyncio.wait_for(pushed.get(), 5) for _ in range(3)]
        assert [(m.service_path, m.service_method, m.oneway) for m in events] == [("Client", "Event", True)] * 3
        assert [m.payload for m in events] == [b'{"i":0}', b'{"i":1}', b'{"i":2}']
        # metadata both ways, msgpack, errors
        res = await client.call_message("Probe", "Meta", None, metadata={"k": "v"}, timeout=5)
        assert res.metadata == {"echo": "v"}
        mp = Client(s.address, caller, serialize_type=SerializeType.MSGPACK)
        assert await mp.call("Arith", "Add", {"A": 2, "B": 3}, timeout=5) == {"C": 5}
        with pytest.raises(ServiceError, match="can't find service Nope"):
            await client.call("Nope", "X", {}, timeout=5)
        with pytest.raises(ServiceError, match="A must be an integer"):
            await client.call("Arith", "Mul", {"A": "x"}, timeout=5)
        # heartbeats answered by the server (several intervals pass)
        conn = await caller.connection(s.address)
        hb = await conn.heartbeat(b"ping", timeout=5)
        assert hb.heartbeat and hb.payload == b"ping"
        for _ in range(5):
            await conn.heartbeat(timeout=5)
        assert conn.is_open


async def test_deadline_propagates_and_cancels_the_handler(servers: list[Served]) -> None:
    s = serve(*APP)
    servers.append(s)
    async with Client(s.address, RpcxCaller(), close_caller=True) as client:
        rem = (await client.call("Probe", "Remaining", None, timeout=2.0))["remaining"]
        assert 0 < rem <= 2.0
        with pytest.raises((CallTimeout, ServiceError)):
            await client.call("Probe", "Sleep", {"ms": 5000}, timeout=0.3)
        async def stats() -> Any:
            return await client.call("Probe", "Stats", None, timeout=5)

        async def cancelled() -> bool:
            return (await stats())["cancelled"] > 0

        await wait_until(cancelled, what="the server cancelling the handler at its deadline")
        assert await stats() == {"active": 0, "cancelled": 1, "finished": 0}


async def answers(client: Client) -> bool:
    """True once ``client`` gets a right answer; False while its pool reconnects."""
    try:
        return await client.call("Arith", "Mul", {"A": 3, "B": 4}, timeout=5) == {"C": 12}
    except TransportError:
        return False


async def test_auth_failure_closes_the_connection(servers: list[Served]) -> None:
    s = serve(*APP, "--auth", "sesame")
    servers.append(s)
    caller = RpcxCaller()
    try:
        bad = Client(s.address, caller, auth="wrong")
        conn = await caller.connection(s.address)
        with pytest.raises(ServiceError, match="auth failed"):
            await bad.call("Arith", "Mul", {"A": 1, "B": 2}, timeout=5)
        await asyncio.wait_for(conn.wait_closed(), 5)  # the server closed it
        assert not conn.is_open
        good = Client(s.address, caller, auth="sesame")
        await wait_until(lambda: answers(good), what="a reconnect after the auth failure")
        assert await good.call("Arith", "Mul", {"A": 3, "B": 4}, timeout=5) == {"C": 12}
    finally:
        await caller.aclose()


async def test_request_rate_limit(servers: list[Served]) -> None:
    s = serve(*APP, "--rate-limit", "5")
    servers.append(s)
    async with Client(s.address, RpcxCaller(), close_caller=True) as client:
        results = await asyncio.gather(
            *(client.call("Arith", "Add", {"A": 1, "B": 1}, timeout=5) for _ in range(40)), return_exceptions=True
        )
    limited = [r for r in results if isinstance(r, ServiceError)]
    assert limited and all("rate limit" in str(r) for r in limited)
    assert any(r == {"C": 2} for r in results)


async def test_connection_rate_limit(servers: list[Served]) -> None:
    s = serve(*APP, "--conn-rate-limit", "0.001")
    servers.append(s)
    first, second = RpcxCaller(), RpcxCaller(connect_timeout=2)
    try:
        # burst allows the first connection; the next one is closed at accept
        assert await Client(s.address, first).call("Arith", "Add", {"A": 1, "B": 1}, timeout=5) == {"C": 2}
        with pytest.raises(TransportError):
            await Client(s.address, second).call("Arith", "Add", {"A": 1, "B": 1}, timeout=5)
    finally:
        await first.aclose()
        await second.aclose()


def _xclient(addresses: list[str], mode: FailMode, caller: RpcxCaller, **kw: Any) -> XClient:
    return XClient(
        "Probe", StaticDiscovery(addresses), caller, selector=RoundRobinSelector(),
        options=XClientOptions(fail_mode=mode, retries=3, breaker=None, **kw),
    )


async def test_broadcast_fork_and_a_killed_server(servers: list[Served]) -> None:
    a, b, c = (serve(*APP) for _ in range(3))
    servers += [a, b, c]
    addresses = [a.address, b.address, c.address]
    caller = RpcxCaller(pool=2, connect_timeout=2)
    failover = _xclient(addresses, FailMode.FAILOVER, caller)
    failfast = _xclient(addresses, FailMode.FAILFAST, caller)
    try:
        async with failover, failfast:
            pids = await failover.broadcast("Who", None, timeout=5)
            assert sorted(pids) == sorted(addresses)
            assert len({p["pid"] for p in pids.values()}) == 3
            assert (await failover.fork("Who", None, timeout=5))["pid"] in {p["pid"] for p in pids.values()}

            async def load(xc: XClient, n: int) -> list[Any]:
                out = []
                for _ in range(n):
                    try:
                        out.append(await xc.call("Who", None, timeout=5))
                    except RpcError as exc:
                        out.append(exc)
                return out

            before = await load(failover, 30)
            assert not [r for r in before if isinstance(r, Exception)]
            b.proc.kill()  # mid-run: its connections die
            b.wait()
            after = await load(failover, 60)
            assert not [r for r in after if isinstance(r, Exception)], after
            assert b.address not in {p for p in pids if pids[p]["pid"] in {r["pid"] for r in after}}
            t0 = time.monotonic()
            fast = await load(failfast, 30)
            failed = [r for r in fast if isinstance(r, Exception)]
            assert failed and all(isinstance(r, TransportError) for r in failed)
            assert time.monotonic() - t0 < 10  # failing fast: no per-call timeout waited out
            with pytest.raises(RpcError):
                await failover.broadcast("Who", None, timeout=5)
            assert (await failover.fork("Who", None, timeout=5))["pid"] != pids[b.address]["pid"]
    finally:
        await caller.aclose()


async def test_redis_registry_drives_an_xclient(redis_url: str, servers: list[Served]) -> None:
    reg = ("--redis", redis_url, "--ttl", "5")
    a = serve(*APP, *reg)
    servers.append(a)
    discovery = RedisDiscovery(redis_url, "Probe", refresh_interval=0.1)
    caller = RpcxCaller(pool=1, connect_timeout=2)
    xc = XClient("Probe", discovery, caller, selector=RoundRobinSelector(),
                 options=XClientOptions(fail_mode=FailMode.FAILOVER, retries=3))

    async def until(pred: Any) -> None:
        await wait_until(lambda: pred(xc.servers), what="discovery reaching the expected servers")

    try:
        await discovery.start()
        async with xc:
            await until(lambda s: set(s) == {a.address})
            pid_a = (await xc.call("Who", None, timeout=5))["pid"]
            assert pid_a == a.proc.pid
            b = serve(*APP, *reg)
            servers.append(b)
            await until(lambda s: set(s) == {a.address, b.address})
            pids = {(await xc.call("Who", None, timeout=5))["pid"] for _ in range(10)}
            assert pids == {pid_a, b.proc.pid}
            a.signal(signal.SIGTERM)  # graceful: unregisters first
            assert a.wait() == 0
            await until(lambda s: set(s) == {b.address})
            for _ in range(10):
                assert (await xc.call("Who", None, timeout=5))["pid"] != pid_a
            b.signal(signal.SIGTERM)
            assert b.wait() == 0
            await until(lambda s: not s)
            with pytest.raises(NoServerAvailable):
                await xc.call("Who", None, timeout=1)
    finally:
        await caller.aclose()
        await discovery.aclose()


async def test_etcd_registry_drives_an_xclient(etcd_endpoint: str, servers: list[Served]) -> None:
    from rpc.discovery.etcd import EtcdDiscovery

    reg = ("--etcd", etcd_endpoint, "--base", "/rpcx-e2e", "--ttl", "5")
    a, b = serve(*APP, *reg), serve(*APP, *reg)
    servers += [a, b]
    discovery = EtcdDiscovery(etcd_endpoint, "Probe", base="/rpcx-e2e", refresh_interval=0.1)
    caller = RpcxCaller(connect_timeout=2)
    xc = XClient("Probe", discovery, caller, selector=RoundRobinSelector(),
                 options=XClientOptions(fail_mode=FailMode.FAILOVER, retries=3))
    try:
        await discovery.start()
        async with xc:
            await wait_until(lambda: set(xc.servers) == {a.address, b.address}, what="both servers discovered")
            assert {(await xc.call("Who", None, timeout=5))["pid"] for _ in range(6)} == {a.proc.pid, b.proc.pid}
            a.signal(signal.SIGTERM)
            assert a.wait() == 0
            await wait_until(lambda: set(xc.servers) == {b.address}, what="the stopped server gone")
            assert {(await xc.call("Who", None, timeout=5))["pid"] for _ in range(4)} == {b.proc.pid}
    finally:
        await caller.aclose()
        await discovery.aclose()


async def test_graceful_shutdown_loses_no_accepted_call(servers: list[Served]) -> None:
    s = serve(*APP, "--shutdown-timeout", "10")
    servers.append(s)
    caller = RpcxCaller(pool=2)
    client = Client(s.address, caller)
    try:
        calls = [asyncio.ensure_future(client.call("Probe", "Sleep", {"ms": 500}, timeout=20)) for _ in range(40)]
        async def all_started() -> bool:
            return (await client.call("Probe", "Stats", None, timeout=5))["active"] == 40

        await wait_until(all_started, what="every call in a handler on the server")
        s.signal(signal.SIGTERM)
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert results == [{"slept": 500, "pid": s.proc.pid}] * 40
        assert s.wait() == 0
        assert "juggler rpc serve: draining 40 requests for up to 10 s; Ctrl-C again to stop now" in s.stderr()
        with pytest.raises(TransportError):  # and then it is gone
            await client.call("Probe", "Who", None, timeout=2)
    finally:
        await caller.aclose()


async def test_http_gateway_on_the_same_port(servers: list[Served]) -> None:
    s = serve(*APP)
    servers.append(s)
    host, port = s.address.removeprefix("tcp@").rsplit(":", 1)
    from rpc.gateway_client import HTTPCaller

    http = HTTPCaller()
    try:
        client = Client(f"http://{host}:{port}", http)
        assert await client.call("Arith", "Mul", {"A": 6, "B": 7}, timeout=5) == {"C": 42}
    finally:
        await http.aclose()
    async with Client(s.address, RpcxCaller(), close_caller=True) as rpcx:  # and rpcx alongside
        assert await rpcx.call("Arith", "Mul", {"A": 2, "B": 7}, timeout=5) == {"C": 14}


def test_cli_call_and_bench_over_rpcx(servers: list[Served]) -> None:
    s = serve("--example", "bench")
    servers.append(s)
    t = serve("--example", "arith")
    servers.append(t)
    run = [sys.executable, "-m", "cli", "rpc"]
    out = subprocess.run([*run, "call", t.address, "Arith.Mul", '{"A":6,"B":7}'],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == '{"C": 42}', out.stderr
    out = subprocess.run([*run, "call", t.address.removeprefix("tcp@"), "Arith.Add", '{"A":1,"B":2}',
                          "--codec", "msgpack", "--timeout", "3"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == '{"C": 3}', out.stderr
    out = subprocess.run([*run, "call", t.address, "Arith.Nope", "{}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "can't find method Nope" in out.stderr
    out = subprocess.run([*run, "bench", s.address, "-c", "20", "-n", "2000", "--pool", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "received requests_OK : 2000" in out.stdout


async def test_oversized_message_closes_the_connection(servers: list[Served]) -> None:
    s = serve(*APP, "--max-message", "4096")
    servers.append(s)
    async with Client(s.address, RpcxCaller(), close_caller=True) as client:
        with pytest.raises(TransportError):
            await client.call("Probe", "Note", "x" * 10_000, timeout=5)
        # a fresh connection serves normal calls
        await wait_until(lambda: answers(client), what="a reconnect after the oversized message")
        assert await client.call("Arith", "Add", {"A": 1, "B": 1}, timeout=5) == {"C": 2}


async def test_metrics_and_access_log_over_rpcx(servers: list[Served]) -> None:
    import urllib.request

    from tests.netutil import free_port

    port = free_port()
    s = serve(*APP, "--metrics-port", str(port), "--metrics-host", "127.0.0.1", "--access-log")
    servers.append(s)
    async with Client(s.address, RpcxCaller(), close_caller=True) as client:
        for i in range(3):
            await client.call("Arith", "Mul", {"A": i, "B": 2}, timeout=5)
        with pytest.raises(ServiceError):
            await client.call("Arith", "Mul", {"A": "x"}, timeout=5)

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                return resp.read().decode()

        text = await asyncio.to_thread(scrape)
    assert 'rpc_server_requests_total{method="Mul",service="Arith"} 4.0' in text
    assert 'rpc_server_errors_total{method="Mul",service="Arith"} 1.0' in text
    assert "rpc_server_connections 1.0" in text
    s.signal(signal.SIGTERM)
    assert s.wait() == 0
    assert "Arith.Mul" in s.stderr()  # access log lines


async def test_rolling_shutdown_under_load_loses_nothing(servers: list[Served]) -> None:
    """Two servers under steady load through a failover XClient; one is shut
    down gracefully (SIGTERM) mid-run: every call succeeds — in-flight ones
    drain, refused ones are retried on the other server."""
    a, b = serve(*APP), serve(*APP)
    servers += [a, b]
    caller = RpcxCaller(pool=2, connect_timeout=2)
    xc = _xclient([a.address, b.address], FailMode.FAILOVER, caller)
    stop = asyncio.Event()
    results: list[Any] = []

    async def worker() -> None:
        while not stop.is_set():
            try:
                results.append(await xc.call("Sleep", {"ms": 5}, timeout=10))
            except RpcError as exc:
                results.append(exc)

    try:
        async with xc:
            workers = [asyncio.ensure_future(worker()) for _ in range(20)]
            await wait_until(lambda: len(results) >= 200, timeout=30, what="200 calls before the stop")
            a.signal(signal.SIGTERM)
            assert await asyncio.to_thread(a.wait) == 0
            n = len(results)
            await wait_until(lambda: len(results) >= n + 200, timeout=30, what="200 calls after the stop")
            stop.set()
            await asyncio.gather(*workers)
    finally:
        await caller.aclose()
    failed = [r for r in results if isinstance(r, Exception)]
    assert not failed, failed[:3]
    assert {r["pid"] for r in results[-100:]} == {b.proc.pid}
