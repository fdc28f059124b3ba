"""Running at scale: drain, health, connection logs and metrics (in-memory
broker, in-process), and real `juggler server` processes drained under load."""

from __future__ import annotations

import asyncio
import logging
import signal
import urllib.request
from typing import Any

import pytest
from jugglerprocs import Proc, juggler
from prometheus_client.registry import CollectorRegistry
from test_auth import SECRET, token
from test_server import call, recv, stack, ws
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.netutil import free_port, wait_for_port, wait_until
from juggler.client import ACK, NACK, RES, connect
from juggler.errors import CallNacked
from juggler.errors import ConnectionClosed as ClientClosed
from juggler.metrics import ServerStats, StatsCollector, server_gauges

pytestmark = pytest.mark.timeout(60)


# health, logs, metrics, drain -------------------------------------------------------


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_healthz_and_connection_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="juggler.access")
    async with stack(callees=False) as server:
        base = f"http://127.0.0.1:{server.port}"
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, _get, base + "/healthz") == (200, "ok\n")
        assert (await loop.run_in_executor(None, _get, base + "/nope"))[0] == 404
        async with ws(server) as c:
            await c.send("not json")
            with pytest.raises(ConnectionClosed):
                await recv(c)
        async with ws(server):
            pass
        await wait_until(lambda: server.stats.connections_active == 0, what="both connections closed")
        server.draining = True
        assert await loop.run_in_executor(None, _get, base + "/healthz") == (503, "draining\n")
        server.draining = False
    lines = [r.getMessage() for r in caplog.records if r.name == "juggler.access"]
    opens = [m for m in lines if m.startswith("event=open")]
    closes = [m for m in lines if m.startswith("event=close")]
    assert len(opens) == 2 and len(closes) == 2
    assert "reason=bad_input" in closes[0] and "reason=peer_close" in closes[1]
    assert all("conn=" in m and "remote=127.0.0.1:" in m for m in opens + closes)


async def test_metrics_expose_rejections_and_queue_depths() -> None:
    from prometheus_client import generate_latest

    stats = ServerStats()
    async with stack(max_connections=1, callees=False, stats=stats) as server:
        registry = CollectorRegistry()
        registry.register(StatsCollector(stats, gauges=server_gauges(server)))
        async with ws(server):
            with pytest.raises(InvalidStatus):
                async with ws(server):
                    pass
            text = generate_latest(registry).decode()
    assert 'juggler_rejections_total{reason="max_connections"} 1.0' in text
    assert "juggler_pending_calls 0.0" in text and "juggler_draining 0.0" in text
    assert "juggler_tcp_connections" in text and "juggler_write_buffer_bytes" in text


async def test_drain_answers_calls_in_flight_then_closes_1001() -> None:
    async with stack(drain_timeout=5.0) as server, ws(server) as c:
        sent = [call("test.delay", "300") for _ in range(5)]
        for _, f in sent:
            await c.send(f)
        for _ in range(5):
            assert (await recv(c))["meta"]["type"] == ACK
        closing = asyncio.ensure_future(server.aclose())
        await wait_until(lambda: server.draining, what="the server draining")
        uid, f = call("test.echo", "late")
        await c.send(f)
        got: dict[str, Any] = {}
        with pytest.raises(ConnectionClosed) as info:
            while True:
                m = await recv(c)
                got[m["payload"]["for"]] = m
        assert info.value.rcvd is not None and info.value.rcvd.code == 1001
        assert {u for u, _ in sent} <= set(got)
        assert all(got[u]["meta"]["type"] == RES for u, _ in sent)
        assert got[uid]["meta"]["type"] == NACK and got[uid]["payload"]["code"] == 503
        await closing


@pytest.mark.timeout(90)
async def test_sigterm_drains_a_server_process_under_load(redis_url: str) -> None:
    """SIGTERM under load: exit 0, every ACKed call got its RES, closes are 1001."""
    port = free_port()
    callee = Proc(juggler("callee", "--redis", redis_url, "--workers", "100"))
    server = Proc(juggler("server", "--redis", redis_url, "--listen", f"127.0.0.1:{port}", "--drain-timeout", "10"))
    try:
        wait_for_port(port, timeout=30, proc=server.proc)
        url = f"ws://127.0.0.1:{port}/ws"
        acked: set[str] = set()
        answered: set[str] = set()
        nacked: set[str] = set()
        codes: list[str] = []

        def on_message(msg: dict[str, Any], _raw: str) -> None:
            t = msg["meta"]["type"]
            if t == ACK:
                acked.add(msg["payload"]["for"])
            elif t == RES:
                answered.add(msg["payload"]["for"])
            elif t == NACK:
                nacked.add(msg["payload"]["for"])

        async def worker() -> None:
            try:
                async with connect(url, on_message=on_message) as c:
                    while True:
                        try:
                            await c.call("test.delay", "50", timeout=20)
                        except CallNacked:
                            await asyncio.sleep(0.01)  # 503 while draining: until the close comes
            except ClientClosed as exc:
                codes.append(str(exc))

        workers = [asyncio.ensure_future(worker()) for _ in range(20)]
        await wait_until(lambda: len(answered) >= 200, timeout=20, interval=0.05, what=lambda: f"200 calls answered\n{server.output()}")
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.wait(workers, timeout=30)
        rc = await asyncio.get_running_loop().run_in_executor(None, server.proc.wait, 30)
        assert rc == 0, server.output()
        lost = acked - answered
        assert not lost, f"{len(lost)} acknowledged calls lost\n{server.output()}"
        assert len(codes) == 20 and all("code 1001" in c for c in codes), codes
    finally:
        server.stop()
        callee.stop()


def test_server_flags_build_the_config() -> None:
    from cli.main import build_parser
    from cli.server import build_config

    args = build_parser().parse_args([
        "server", "--redis-cluster", "redis://127.0.0.1:7000,redis://127.0.0.1:7001",
        "--redis-pubsub", "redis://127.0.0.1:6380/0", "--max-connections", "5", "--rate-limit", "10",
        "--rate-burst", "20", "--rate-limit-action", "close", "--max-inflight-calls", "3",
        "--max-waiting-calls", "50",
        "--max-subscriptions", "7", "--drain-timeout", "2.5", "--jwt-secret", "k", "--allowed-origin",
        "https://a.test", "--allowed-origin", "https://*.b.test", "--anonymous",
        "--set", "server.max_outbound=99", "--set", 'auth.issuer="me"', "--set", "redis.cluster_retry_timeout=4",
    ])
    cfg = build_config(args)
    s = cfg.server
    assert (s.max_connections, s.rate_limit, s.rate_burst, s.rate_limit_action) == (5, 10.0, 20, "close")
    assert (s.max_inflight_calls, s.max_subscriptions, s.drain_timeout, s.max_outbound) == (3, 7, 2.5, 99)
    assert s.max_waiting_calls == 50
    assert cfg.redis.cluster == ("redis://127.0.0.1:7000", "redis://127.0.0.1:7001")
    assert cfg.redis.cluster_retry_timeout == 4
    assert cfg.pubsub.url == "redis://127.0.0.1:6380/0" and cfg.pubsub.cluster == ()
    a = cfg.auth
    assert (a.jwt_secret, a.allowed_origins, a.anonymous, a.issuer) == ("k", ("https://a.test", "https://*.b.test"),
                                                                        True, "me")
    for bad in (["--set", "server.nope=1"], ["--set", "bogus"], ["--set", "server.rate_limit_action=\"x\""],
                ["--redis-pubsub", "redis://127.0.0.1:1/0"]):
        with pytest.raises(ValueError):
            build_config(build_parser().parse_args(["server", *bad]))


async def test_server_process_with_auth_limits_health_and_metrics() -> None:
    port, mport = free_port(), free_port()
    p = Proc(juggler("server", "--listen", f"127.0.0.1:{port}", "--metrics-port", str(mport), "--jwt-secret",
                     SECRET, "--max-connections", "1"))
    try:
        wait_for_port(port, timeout=30, proc=p.proc)
        wait_for_port(mport, timeout=30, proc=p.proc)
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, _get, f"http://127.0.0.1:{port}/healthz") == (200, "ok\n")
        url = f"ws://127.0.0.1:{port}/ws"
        with pytest.raises(ClientClosed, match="401"):
            await connect(url)
        async with connect(url, headers={"Authorization": "Bearer " + token()}) as c:
            await c.pub("x", 1)
            with pytest.raises(ClientClosed, match="503"):
                await connect(url + "?token=" + token())
        status, text = await loop.run_in_executor(None, _get, f"http://127.0.0.1:{mport}/metrics")
        assert status == 200
        assert 'juggler_rejections_total{reason="unauthenticated"} 1.0' in text
        assert 'juggler_rejections_total{reason="max_connections"} 1.0' in text
    finally:
        assert p.stop() == 0
