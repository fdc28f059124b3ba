"""Running at scale: auth, limits, drain, health and connection logs (in-memory
broker, in-process), and a real `juggler server` process drained under load."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
import urllib.request
from typing import Any

import pytest
from jugglerprocs import Proc, juggler
from prometheus_client.registry import CollectorRegistry
from test_server import call, recv, stack, ws
from websockets.exceptions import ConnectionClosed, InvalidStatus

import rustext
from tests.netutil import free_port, wait_for_port, wait_until
from juggler.auth import Auth, AuthConfig, AuthError, Rule, jwt_decode_hs256, jwt_encode_hs256
from juggler.client import ACK, NACK, RES, connect
from juggler.errors import CallNacked
from juggler.errors import ConnectionClosed as ClientClosed
from juggler.config import config_from_dict
from juggler.limits import TokenBucket
from juggler.metrics import ServerStats, StatsCollector, server_gauges

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cret"


def token(**claims: Any) -> str:
    claims.setdefault("sub", "alice")
    claims.setdefault("exp", time.time() + 600)
    return jwt_encode_hs256(claims, SECRET)


# JWT ---------------------------------------------------------------------------


def test_jwt_hs256_roundtrip_and_refusals() -> None:
    t = token(role="admin")
    assert jwt_decode_hs256(t, SECRET)["role"] == "admin"
    with pytest.raises(AuthError, match="signature"):
        jwt_decode_hs256(t, "other")
    with pytest.raises(AuthError, match="expired"):
        jwt_decode_hs256(token(exp=time.time() - 5), SECRET)
    assert jwt_decode_hs256(token(exp=time.time() - 5), SECRET, leeway=10)["sub"] == "alice"
    with pytest.raises(AuthError, match="not valid yet"):
        jwt_decode_hs256(token(nbf=time.time() + 60), SECRET)
    with pytest.raises(AuthError, match="audience"):
        jwt_decode_hs256(token(aud="a"), SECRET, audience="b")
    head, body, sig = t.split(".")
    import base64

    none_head = base64.urlsafe_b64encode(b'{"alg":"none"}').rstrip(b"=").decode()
    with pytest.raises(AuthError, match="algorithm"):
        jwt_decode_hs256(f"{none_head}.{body}.", SECRET)
    with pytest.raises(AuthError, match="malformed"):
        jwt_decode_hs256("abc", SECRET)
    tampered = body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1]
    with pytest.raises(AuthError):
        jwt_decode_hs256(f"{head}.{tampered}.{sig}", SECRET)


def test_jwt_matches_a_known_vector() -> None:
    # the HS256 example of RFC 7519 section 3.1's style, checked against a fixed signature
    t = jwt_encode_hs256({"sub": "1234567890", "name": "John Doe", "iat": 1516239022}, "your-256-bit-secret")
    assert t == (
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5"
        "MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
    )


def test_token_bucket() -> None:
    b = TokenBucket(10, 2, now=0.0)
    assert b.take(0.0) and b.take(0.0) and not b.take(0.0)
    assert not b.take(0.05)
    assert b.take(0.1)
    assert b.take(10.0) and b.take(10.0) and not b.take(10.0)  # never more than the burst


def test_auth_config_from_toml_dict() -> None:
    cfg = config_from_dict({
        "server": {"max_connections": 10, "rate_limit": 5.0, "rate_limit_action": "close",
                   "max_inflight_calls": 3, "drain_timeout": 2.0},
        "auth": {"jwt_secret": SECRET, "allowed_origins": ["https://*.example.com"],
                 "rules": [{"match": {"role": "admin"}, "call": ["*"]}]},
        "redis": {"cluster": ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]},
        "pubsub": {"url": "redis://127.0.0.1:6380/0"},
    })
    assert cfg.server.max_connections == 10 and cfg.server.rate_limit_action == "close"
    assert cfg.auth.rules == (Rule(match={"role": "admin"}, call=("*",)),)
    assert cfg.redis.cluster == ("redis://127.0.0.1:7000", "redis://127.0.0.1:7001")
    assert cfg.pubsub.url == "redis://127.0.0.1:6380/0"
    for bad in ({"server": {"rate_limit_action": "drop"}}, {"auth": {"rules": [{"allow": ["x"]}]}},
                {"auth": {"verifier": "nocolon"}}, {"server": {"max_connections": -1}}):
        with pytest.raises(ValueError):
            config_from_dict(bad)


# authentication ------------------------------------------------------------------


async def test_auth_accepts_header_and_query_token_refuses_others() -> None:
    auth = Auth(AuthConfig(jwt_secret=SECRET))
    async with stack(auth=auth) as server:
        async with ws(server, additional_headers={"Authorization": f"Bearer {token()}"}) as c:
            uid, f = call("test.echo", "hi")
            await c.send(f)
            assert (await recv(c))["meta"]["type"] == ACK
            assert (await recv(c))["payload"]["args"] == "hi"
        async with connect(server.url + "?token=" + token()) as c:
            assert await c.call("test.echo", "q", timeout=5) == "q"
        for headers in ({}, {"Authorization": "Bearer nope"},
                        {"Authorization": "Bearer " + jwt_encode_hs256({"sub": "x"}, "wrong")},
                        {"Authorization": "Bearer " + token(exp=time.time() - 1)}):
            with pytest.raises(InvalidStatus) as info:
                async with ws(server, additional_headers=headers):
                    pass
            assert info.value.response.status_code == 401
        assert server.stats.rejections["unauthenticated"] == 4


async def test_custom_verifier_and_origin_allow_list() -> None:
    def verify(tok: str, request: Any) -> dict[str, Any] | None:
        return {"sub": tok} if tok.startswith("good-") else None

    auth = Auth(AuthConfig(allowed_origins=("https://*.example.com",)), verifier=verify)
    async with stack(auth=auth) as server:
        ok = {"Authorization": "good-bob"}
        async with ws(server, additional_headers=ok, origin="https://app.example.com") as c:
            await c.send(call("test.echo", 1)[1])
            assert (await recv(c))["meta"]["type"] == ACK
        with pytest.raises(InvalidStatus) as info:
            async with ws(server, additional_headers=ok, origin="https://evil.test"):
                pass
        assert info.value.response.status_code == 403
        with pytest.raises(InvalidStatus) as info:
            async with ws(server, additional_headers={"Authorization": "bad"}, origin="https://app.example.com"):
                pass
        assert info.value.response.status_code == 401
        assert server.stats.rejections == {"origin": 1, "unauthenticated": 1}


async def test_per_message_authorization_nacks_401_and_403() -> None:
    cfg = AuthConfig(jwt_secret=SECRET, anonymous=True, rules=(
        Rule(match={"role": "admin"}, call=("*",), pub=("*",), sub=("*",)),
        Rule(match={"role": "user"}, call=("test.echo",), sub=("news.*",)),
    ))
    async with stack(auth=Auth(cfg)) as server:
        async with connect(server.url, headers={"Authorization": "Bearer " + token(role="user")}) as c:
            assert await c.call("test.echo", "ok", timeout=5) == "ok"
            with pytest.raises(Exception) as info:
                await c.call("test.reverse", "no", timeout=5)
            assert getattr(info.value, "code", None) == 403
            await c.sub("news.a")
            await c.sub("news.*", pattern=True)  # a pattern is checked as a string
            with pytest.raises(Exception) as info:
                await c.sub("*", pattern=True)
            assert getattr(info.value, "code", None) == 403
            with pytest.raises(Exception) as info:
                await c.pub("news.a", 1)
            assert getattr(info.value, "code", None) == 403
            await c.unsb("news.a")  # always allowed
        # grants carried by the token itself
        own = token(juggler={"call": ["test.rev*"]})
        async with connect(server.url, headers={"Authorization": "Bearer " + own}) as c:
            assert await c.call("test.reverse", "ab", timeout=5) == "ba"
        async with connect(server.url) as anon:  # anonymous: 401 for everything
            with pytest.raises(Exception) as info:
                await anon.call("test.echo", "x", timeout=5)
            assert getattr(info.value, "code", None) == 401
        async with connect(server.url, headers={"Authorization": "Bearer " + token(role="admin")}) as c:
            await c.pub("anything", 1)
        assert server.stats.rejections["forbidden"] == 3
        assert server.stats.rejections["unauthorized"] == 1


# limits ------------------------------------------------------------------------------


async def test_max_connections_refuses_with_503() -> None:
    async with stack(max_connections=2, callees=False) as server:
        async with ws(server), ws(server):
            with pytest.raises(InvalidStatus) as info:
                async with ws(server):
                    pass
            assert info.value.response.status_code == 503
        assert server.stats.rejections == {"max_connections": 1}


async def test_rate_limit_nacks_429_in_order() -> None:
    async with stack(rate_limit=0.001, rate_burst=3, callees=False) as server, ws(server) as c:
        uids = []
        for i in range(6):
            uid = rustext.new_uuid()
            uids.append(uid)
            await c.send(rustext.build_pub(uid, "ch", str(i).encode()).decode())
        replies = [await recv(c) for _ in range(6)]
        assert [m["payload"]["for"] for m in replies] == uids
        assert [m["meta"]["type"] for m in replies] == [ACK] * 3 + [NACK] * 3
        assert {m["payload"]["code"] for m in replies[3:]} == {429}
        assert server.stats.rejections == {"rate_limited": 3}


async def test_rate_limit_close_action() -> None:
    async with stack(rate_limit=0.001, rate_burst=2, rate_limit_action="close", callees=False) as server:
        async with ws(server) as c:
            for _ in range(4):
                await c.send(rustext.build_pub(rustext.new_uuid(), "ch", b"1").decode())
            assert (await recv(c))["meta"]["type"] == ACK
            assert (await recv(c))["meta"]["type"] == ACK
            with pytest.raises(ConnectionClosed) as info:
                await recv(c)
            assert info.value.rcvd is not None and info.value.rcvd.code == 1008
        assert server.stats.closed.get("rate_limited") == 1


async def test_max_inflight_calls_nacks_429() -> None:
    async with stack(max_inflight_calls=2) as server, ws(server) as c:
        sent = [call("test.delay", "300") for _ in range(3)]
        for _, f in sent:
            await c.send(f)
        msgs = [await recv(c) for _ in range(3)]
        assert [m["meta"]["type"] for m in msgs] == [ACK, ACK, NACK]
        assert msgs[2]["payload"]["code"] == 429
        got = {(await recv(c))["payload"]["for"] for _ in range(2)}
        assert got == {sent[0][0], sent[1][0]}
        # answered: room again
        uid, f = call("test.echo", "again")
        await c.send(f)
        assert (await recv(c))["meta"]["type"] == ACK
        assert server.stats.rejections == {"inflight_limit": 1}


async def test_slow_consumer_is_dropped_and_counted() -> None:
    async with stack(max_write_buffer=64 * 1024, callees=False) as server:
        async with ws(server, max_queue=1) as lazy, ws(server) as pub:
            await lazy.send(rustext.build_sub(rustext.new_uuid(), "flood").decode())
            await recv(lazy)
            big = json.dumps("x" * 20_000).encode()
            for _ in range(1500):  # ~30 MB: more than the socket buffers hold
                await pub.send(rustext.build_pub(rustext.new_uuid(), "flood", big).decode())
            for _ in range(1500):
                await recv(pub)
            # the lazy one is gone, the publisher is not
            await wait_until(lambda: server.stats.connections_active == 1, what="the slow consumer dropped")
            assert server.stats.rejections.get("slow_consumer") == 1
            assert server.stats.closed.get("slow_consumer") == 1


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
        "--max-subscriptions", "7", "--drain-timeout", "2.5", "--jwt-secret", "k", "--allowed-origin",
        "https://a.test", "--allowed-origin", "https://*.b.test", "--anonymous",
        "--set", "server.max_outbound=99", "--set", 'auth.issuer="me"', "--set", "redis.cluster_retry_timeout=4",
    ])
    cfg = build_config(args)
    s = cfg.server
    assert (s.max_connections, s.rate_limit, s.rate_burst, s.rate_limit_action) == (5, 10.0, 20, "close")
    assert (s.max_inflight_calls, s.max_subscriptions, s.drain_timeout, s.max_outbound) == (3, 7, 2.5, 99)
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
