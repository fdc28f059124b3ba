"""juggler/proxy through a real server: the application's backend (a real
HTTP and a real gRPC server, each its own process: tests/juggler/proxybackend.py)
decides connects, subscribes and publishes and answers RPCs; the real
client (juggler.client) talks to the juggler server. Every kind over both
transports, the allow-lists, the refusal codes, a backend that is down,
slow or answers garbage, and the metrics."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from test_server import stack, ws
from websockets.exceptions import InvalidStatus

from juggler.auth import Identity
from juggler.client import connect
from juggler.errors import CallNacked, ConnectionClosed
from juggler.proxy import (
    ProxyCollector,
    ProxyConfig,
    ProxySet,
    ProxyTimeout,
    ProxyUnavailable,
)
from juggler.server import Server
from tests.juggler.jugglerprocs import ROOT
from tests.netutil import free_port, wait_for_port, wait_until

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 0.5  # every proxy's; the backend's slow answers take 3 s


class Backends:
    """The test application, over HTTP and over gRPC (one process each)."""

    def __init__(self) -> None:
        self.ports = {"http": free_port(), "grpc": free_port()}
        self.procs = [
            subprocess.Popen([sys.executable, "-m", "tests.juggler.proxybackend", t, str(port)], cwd=ROOT)
            for t, port in self.ports.items()
        ]
        for proc, port in zip(self.procs, self.ports.values(), strict=True):
            wait_for_port(port, timeout=20, proc=proc)

    def endpoint(self, transport: str, kind: str) -> str:
        port = self.ports[transport]
        return f"http://127.0.0.1:{port}/juggler/{kind}" if transport == "http" else f"grpc://127.0.0.1:{port}"

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@pytest.fixture(scope="module")
def backends() -> Iterator[Backends]:
    b = Backends()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(params=["http", "grpc"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def configs(endpoint: Any, kinds: tuple[str, ...] = ("connect", "refresh", "subscribe", "publish", "rpc"),
            ) -> list[ProxyConfig]:
    extra: dict[str, dict[str, Any]] = {
        "connect": {"headers": ("Authorization", "X-Request-Id"), "cookies": ("sessionid",)},
        "subscribe": {"match": ("chat:*",)}, "publish": {"match": ("chat:*",)}, "rpc": {"match": ("app.*",)},
        "refresh": {},
    }
    return [ProxyConfig(kind=k, endpoint=endpoint(k), timeout=TIMEOUT, **extra[k]) for k in kinds]


@asynccontextmanager
async def proxied(cfgs: list[ProxyConfig], **server_kw: Any) -> AsyncIterator[tuple[Server, ProxySet]]:
    proxies = ProxySet(cfgs)
    await proxies.start()
    try:
        async with stack(proxies=proxies, **server_kw) as server:
            yield server, proxies
    finally:
        await proxies.aclose()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def only_conn(server: Server) -> Any:
    (conn,) = server.conns
    return conn


def stats(proxies: ProxySet, kind: str) -> Any:
    (s,) = [s for s in proxies.stats() if s.kind == kind]
    return s


async def refused(server: Server, headers: dict[str, str]) -> tuple[int, str, float]:
    """The status, body and time of a refused handshake."""
    t0 = time.monotonic()
    with pytest.raises(InvalidStatus) as info:
        async with ws(server, additional_headers=headers):
            pass
    response = info.value.response
    return response.status_code, response.body.decode(), time.monotonic() - t0


# connect --------------------------------------------------------------------------------------


async def test_connect_makes_the_identity(backends: Backends, transport: str) -> None:
    async with proxied(configs(lambda k: backends.endpoint(transport, k))) as (server, proxies):
        headers = {**bearer("alice"), "X-Request-Id": "r-1", "X-Secret": "not passed",
                   "Cookie": "sessionid=s3cr3t; tracking=no"}
        async with connect(server.url + "?x=1", headers=headers) as client:
            identity = only_conn(server).identity
            assert identity.user == "alice" and identity.name == "alice"
            assert identity.channels == ("news", "user#alice")
            assert identity.exp is not None and 3500 < identity.exp - time.time() <= 3600
            data = identity.data
            assert data["headers"] == {"Authorization": "Bearer alice", "X-Request-Id": "r-1"}
            assert data["cookies"] == {"sessionid": "s3cr3t"}
            assert data["path"] == "/ws" and data["client"] == only_conn(server).id
            assert data["remote"].startswith("127.0.0.1:")
            # a URI no proxy matches still goes to its Redis callee
            assert await client.call("test.echo", "via the broker", timeout=5) == "via the broker"
        async with connect(server.url + "?token=alice"):  # the token from the query (browsers)
            await wait_until(lambda: len(server.conns) == 1)
        assert stats(proxies, "connect").calls == 2


async def test_connect_refusals_and_failures(backends: Backends, transport: str) -> None:
    async with proxied(configs(lambda k: backends.endpoint(transport, k), ("connect",))) as (server, proxies):
        cases = [({}, 401, "who are you?"), (bearer("banned"), 403, "connect refused for banned"),
                 (bearer("teapot"), 403, "short and stout"),  # a 4xx other than 401: 403
                 (bearer("garbage"), 502, "invalid answer"), (bearer("crash"), 502, "invalid answer"),
                 (bearer("badcode"), 502, "invalid answer"), (bearer("slow"), 504, "in time")]
        if transport == "http":
            cases.append((bearer("wrongtype"), 502, "invalid answer"))
        for headers, status, text in cases:
            got, body, took = await refused(server, headers)
            assert (got, text in body) == (status, True), (headers, got, body)
            assert took < TIMEOUT + 1.5
        assert "127.0.0.1" not in body  # the backend's address stays in the logs
        s = stats(proxies, "connect")
        assert s.refusals == 3 and s.errors["timeout"] == 1 and s.errors["bad_answer"] == len(cases) - 4
        assert server.stats.rejections == {"proxy_refused": 3, "proxy_error": len(cases) - 3}
        # and the server serves the others meanwhile: a slow handshake does not hold a good one
        slow = asyncio.ensure_future(refused(server, bearer("slow")))
        async with connect(server.url, headers=bearer("alice")) as client:
            assert await client.call("test.echo", "x", timeout=5) == "x"
        assert not slow.done()
        assert (await slow)[0] == 504


async def test_connect_backend_down(transport: str) -> None:
    port = free_port()  # nothing listens there
    endpoint = f"http://127.0.0.1:{port}/c" if transport == "http" else f"grpc://127.0.0.1:{port}"
    async with proxied([ProxyConfig(kind="connect", endpoint=endpoint, timeout=2.0)]) as (server, proxies):
        status, body, took = await refused(server, bearer("alice"))
        assert status == 503 and "unavailable" in body and took < 2.5
        assert stats(proxies, "connect").errors == {"unavailable": 1}


# subscribe and publish ------------------------------------------------------------------------


async def test_subscribe(backends: Backends, transport: str) -> None:
    async with proxied(configs(lambda k: backends.endpoint(transport, k))) as (server, proxies):
        async with connect(server.url, headers=bearer("alice")) as client:
            await client.sub("chat:ok")
            await client.sub("news")  # no proxy matches: no question asked
            await client.sub("chat:*", pattern=True)  # the pattern itself is what the proxy decides
            for channel, code, text in [("chat:no", 403, "subscribe refused for chat:no"),
                                        ("chat:teapot", 418, "short and stout"),
                                        ("chat:garbage", 502, "invalid answer"), ("chat:crash", 502, "invalid answer"),
                                        ("chat:badcode", 502, "invalid answer"),
                                        ("chat:slow", 503, "did not answer in time"),
                                        ("chat:e504", 503, "upstream of the application timed out")]:
                t0 = time.monotonic()
                with pytest.raises(CallNacked) as info:
                    await client.sub(channel, timeout=5)
                assert (info.value.code, text in info.value.message) == (code, True), info.value
                assert time.monotonic() - t0 < TIMEOUT + 1.5
            # the connection is fine after all that
            assert await client.call("test.echo", "still here", timeout=5) == "still here"
        s = stats(proxies, "subscribe")
        assert (s.calls, s.refusals) == (9, 3)
        assert s.errors == {"bad_answer": 3, "timeout": 1}


async def test_publish(backends: Backends, transport: str) -> None:
    async with proxied(configs(lambda k: backends.endpoint(transport, k))) as (server, proxies):
        async with connect(server.url, headers=bearer("alice")) as reader, \
                connect(server.url, headers=bearer("bob")) as writer:
            await reader.sub("chat:*", pattern=True)
            await writer.pub("chat:ok", {"text": "hi"})
            ev = await reader.next_event(timeout=5)
            assert (ev.channel, ev.args) == ("chat:ok", {"text": "hi"})
            await writer.pub("chat:replace", {"text": "raw"})
            ev = await reader.next_event(timeout=5)
            assert (ev.channel, ev.args) == ("chat:replace", {"replaced": {"text": "raw"}, "by": "bob"})
            for channel, code in [("chat:no", 403), ("chat:slow", 503), ("chat:garbage", 502)]:
                with pytest.raises(CallNacked) as info:
                    await writer.pub(channel, {"text": "x"}, timeout=5)
                assert info.value.code == code
            await writer.pub("chat:ok", "last")
            ev = await reader.next_event(timeout=5)
            assert ev.args == "last"  # nothing refused was published
        s = stats(proxies, "publish")
        assert (s.calls, s.refusals, s.errors) == (6, 1, {"timeout": 1, "bad_answer": 1})


# rpc ------------------------------------------------------------------------------------------


async def test_rpc(backends: Backends, transport: str) -> None:
    async with proxied(configs(lambda k: backends.endpoint(transport, k))) as (server, proxies):
        async with connect(server.url, headers=bearer("alice")) as client:
            assert await client.call("app.echo", {"n": 1}, timeout=5) == {
                "echo": {"n": 1}, "user": "alice", "uri": "app.echo"}
            assert await client.call("app.echo", timeout=5) == {"echo": None, "user": "alice", "uri": "app.echo"}
            assert await client.call("app.no", 1, timeout=5) == {
                "error": {"code": 403, "message": "rpc refused for app.no"}}
            result = await client.call("app.garbage", 1, timeout=5)
            assert result["error"]["code"] == 502
            assert (await client.call("app.crash", 1, timeout=5))["error"]["code"] == 502
            t0 = time.monotonic()
            result = await client.call("app.slow", 1, timeout=5)  # the proxy's timeout
            assert result["error"]["code"] == 504 and time.monotonic() - t0 < TIMEOUT + 1.5
            assert await client.call("test.echo", "broker", timeout=5) == "broker"
            assert await client.call("app.big", timeout=5) == "x" * 300_000
            assert (await client.call("app.huge", timeout=5))["error"]["code"] == 502
            assert server.pending_calls == 0
        s = stats(proxies, "rpc")
        assert (s.calls, s.refusals, s.errors) == (8, 1, {"bad_answer": 3, "timeout": 1})


async def test_rpc_call_timeout_bounds_the_backend(backends: Backends, transport: str) -> None:
    cfg = ProxyConfig(kind="rpc", endpoint=backends.endpoint(transport, "rpc"), timeout=10.0, match=("app.*",))
    async with proxied([cfg], call_timeout_ms=60_000) as (server, proxies):
        async with connect(server.url) as client:
            uid = await client.send(1, {"uri": "app.slow", "timeout": 300_000_000}, raw_args="1")
            t0 = time.monotonic()
            frames: list[dict[str, Any]] = []

            async def res() -> bool:
                return any(f.get("meta", {}).get("type") == 9 for f in frames)

            client.on_message = lambda msg, frame: frames.append(msg)
            await wait_until(res, timeout=5, what="the RES of the proxied call")
            took = time.monotonic() - t0
            (msg,) = [f for f in frames if f["meta"]["type"] == 9]
            assert msg["payload"]["for"] == uid and msg["payload"]["args"]["error"]["code"] == 504
            assert took < 1.5
        assert stats(proxies, "rpc").errors == {"timeout": 1}


async def test_rpc_backend_down_and_others_served(backends: Backends, transport: str) -> None:
    port = free_port()
    down = f"http://127.0.0.1:{port}/r" if transport == "http" else f"grpc://127.0.0.1:{port}"
    cfgs = [ProxyConfig(kind="rpc", endpoint=down, timeout=2.0, match=("down.*",)),
            ProxyConfig(kind="rpc", endpoint=backends.endpoint(transport, "rpc"), timeout=TIMEOUT, match=("app.*",))]
    async with proxied(cfgs) as (server, proxies):
        async with connect(server.url) as client:
            slow = asyncio.ensure_future(client.call("app.slow", 1, timeout=5))
            result = await client.call("down.x", 1, timeout=5)
            assert result["error"]["code"] == 503
            assert await client.call("app.echo", 2, timeout=5) == {"echo": 2, "user": "", "uri": "app.echo"}
            assert not slow.done()
            assert (await slow)["error"]["code"] == 504
        by_name = {s.name: s for s in proxies.stats()}
        assert by_name[down].errors == {"unavailable": 1}


# refresh --------------------------------------------------------------------------------------


async def test_refresh(backends: Backends, transport: str) -> None:
    proxies = ProxySet(configs(lambda k: backends.endpoint(transport, k), ("refresh",)))
    await proxies.start()
    try:
        alice = Identity({"sub": "alice", "exp": 100}, None, user="alice", data={"plan": "pro"})
        result = await proxies.refresh(alice, client="c-1")
        assert not result.expired and result.expire_at == 2_000_000_000
        assert result.data == {"refreshed": "alice", "had": {"plan": "pro"}}
        assert (await proxies.refresh(Identity({"sub": "gone"}, None))).expired
        refused = await proxies.refresh(Identity({}, None, user="banned"))
        assert refused.expired and refused.refusal is not None and refused.refusal.code == 403
        t0 = time.monotonic()
        with pytest.raises(ProxyTimeout):
            await proxies.refresh(Identity({}, None, user="slow"))
        assert time.monotonic() - t0 < TIMEOUT + 1
        s = stats(proxies, "refresh")
        assert (s.calls, s.refusals, s.errors) == (4, 1, {"timeout": 1})
    finally:
        await proxies.aclose()
    down = ProxySet([ProxyConfig(kind="refresh", endpoint=f"http://127.0.0.1:{free_port()}/r")])
    await down.start()
    try:
        with pytest.raises(ProxyUnavailable):
            await down.refresh(alice)
    finally:
        await down.aclose()
    with pytest.raises(LookupError):
        await ProxySet([]).refresh(alice)


# metrics --------------------------------------------------------------------------------------


async def test_metrics_values(backends: Backends, transport: str) -> None:
    async with proxied(configs(lambda k: backends.endpoint(transport, k))) as (server, proxies):
        async with connect(server.url, headers=bearer("alice")) as client:
            await client.sub("chat:ok")
            with pytest.raises(CallNacked):
                await client.sub("chat:no")
            await client.call("app.echo", 1, timeout=5)
        registry = CollectorRegistry()
        registry.register(ProxyCollector(proxies.stats))
        text = generate_latest(registry).decode()
    name = backends.endpoint(transport, "subscribe")
    assert f'juggler_proxy_calls_total{{kind="subscribe",name="{name}"}} 2.0' in text
    assert f'juggler_proxy_refusals_total{{kind="subscribe",name="{name}"}} 1.0' in text
    assert f'juggler_proxy_duration_seconds_count{{kind="subscribe",name="{name}"}} 2.0' in text
    assert f'juggler_proxy_errors_total{{error="timeout",kind="subscribe",name="{name}"}} 0.0' in text
    name = backends.endpoint(transport, "rpc")
    assert f'juggler_proxy_calls_total{{kind="rpc",name="{name}"}} 1.0' in text
    name = backends.endpoint(transport, "connect")
    assert f'juggler_proxy_calls_total{{kind="connect",name="{name}"}} 1.0' in text


# the configured server --------------------------------------------------------------------------


async def test_configured_server_runs_its_proxies(backends: Backends, tmp_path: Any) -> None:
    """[[proxy]] tables in a configuration file: start_app opens the proxies,
    the server asks them, the metrics endpoint exports them, drain closes them."""
    import aiohttp

    from juggler.config import load_config
    from juggler.runner import start_app

    http, grpc_port = backends.ports["http"], backends.ports["grpc"]
    metrics_port = free_port()
    path = tmp_path / "juggler.toml"
    path.write_text(f"""
[server]
listen = "127.0.0.1:0"

[metrics]
port = {metrics_port}

[[proxy]]
kind = "connect"
endpoint = "http://127.0.0.1:{http}/juggler/connect"
name = "app-connect"
timeout = 0.5
headers = ["X-Request-Id"]

[[proxy]]
kind = "rpc"
endpoint = "grpc://127.0.0.1:{grpc_port}"
name = "app-rpc"
match = ["app.*"]
""")
    running = await start_app(load_config(str(path)), test_callees=True)
    try:
        url = running.server.url
        async with connect(url, headers={**bearer("carol"), "X-Request-Id": "r-9"}) as client:
            assert only_conn(running.server).identity.data["headers"] == {"X-Request-Id": "r-9"}
            assert await client.call("app.echo", [1], timeout=5) == {"echo": [1], "user": "carol", "uri": "app.echo"}
        status, _, _ = await refused(running.server, bearer("banned"))
        assert status == 403
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
            text = await resp.text()
        assert 'juggler_proxy_calls_total{kind="connect",name="app-connect"} 2.0' in text
        assert 'juggler_proxy_refusals_total{kind="connect",name="app-connect"} 1.0' in text
        assert 'juggler_proxy_calls_total{kind="rpc",name="app-rpc"} 1.0' in text
        assert 'juggler_rejections_total{reason="proxy_refused"} 1.0' in text
    finally:
        await running.drain(2.0)
    assert running.proxies is not None
    with pytest.raises(ProxyUnavailable):  # closed with the server
        await running.proxies.pick("connect").transport.ask("connect", {}, 1.0)


async def test_auth_checks_first_then_the_application(backends: Backends) -> None:
    """[auth] (origins here) refuses before the backend is asked; what it lets
    through, the connect proxy decides."""
    from juggler.auth import Auth, AuthConfig

    auth = Auth(AuthConfig(allowed_origins=("https://app.example",)))
    cfgs = configs(lambda k: backends.endpoint("http", k), ("connect",))
    async with proxied(cfgs, auth=auth) as (server, proxies):
        status, _, _ = await refused(server, {**bearer("alice"), "Origin": "https://evil.example"})
        assert status == 403 and stats(proxies, "connect").calls == 0
        assert server.stats.rejections == {"origin": 1}
        async with connect(server.url, headers={**bearer("alice"), "Origin": "https://app.example"}):
            assert only_conn(server).identity.user == "alice"
        assert stats(proxies, "connect").calls == 1


async def test_juggler_server_with_proxies_in_its_config(backends: Backends, tmp_path: Any) -> None:
    """The command line: `juggler server --config FILE` asks the backend (over
    gRPC here), which answers RPCs with no callee anywhere."""
    from tests.juggler.jugglerprocs import juggler_listening

    grpc_port = backends.ports["grpc"]
    path = tmp_path / "juggler.toml"
    path.write_text(f'[[proxy]]\nkind = "connect"\nendpoint = "grpc://127.0.0.1:{grpc_port}"\n\n'
                    f'[[proxy]]\nkind = "rpc"\nendpoint = "grpc://127.0.0.1:{grpc_port}"\nmatch = ["app.*"]\n')
    with juggler_listening("server", "--config", str(path), exits_clean=True) as url:
        async with connect(url, headers=bearer("dave")) as client:
            assert await client.call("app.echo", "x", timeout=5) == {"echo": "x", "user": "dave", "uri": "app.echo"}
        with pytest.raises(Exception, match="401"):
            async with connect(url):
                pass


def test_juggler_server_config_mistake(tmp_path: Any) -> None:
    from tests.juggler.jugglerprocs import juggler

    path = tmp_path / "juggler.toml"
    path.write_text('[[proxy]]\nkind = "rpc"\nendpoint = "grpc://127.0.0.1:1"\n')
    out = subprocess.run([*juggler("server", "--config", str(path)), "--listen", f"127.0.0.1:{free_port()}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 2, out.stderr
    assert "juggler.toml:1: [[proxy]] #1: kind = \"rpc\" needs match" in out.stderr


async def _configured(tmp_path: Any, tables: str) -> Any:
    from juggler.config import load_config
    from juggler.runner import start_app

    path = tmp_path / "juggler.toml"
    path.write_text('[server]\nlisten = "127.0.0.1:0"\n' + tables)
    return await start_app(load_config(str(path)))


@pytest.mark.parametrize("with_refresh", [True, False])
async def test_expiring_connect_answers_are_renewed_by_the_refresh_proxy_or_closed(
        backends: Backends, tmp_path: Any, with_refresh: bool) -> None:
    """A connect answer's expire_at is kept: the refresh proxy, when there is
    one, is asked before it and its new expiry keeps the connection; without
    one, or when the backend says expired, the connection is closed with 4001."""
    http = backends.ports["http"]
    tables = f"""
[[proxy]]
kind = "connect"
endpoint = "http://127.0.0.1:{http}/juggler/connect"
"""
    if with_refresh:
        tables += f"""
[[proxy]]
kind = "refresh"
endpoint = "http://127.0.0.1:{http}/juggler/refresh"
"""
    running = await _configured(tmp_path, tables)
    try:
        url = running.server.url
        async with connect(url, headers=bearer("alice.short")) as kept, \
                connect(url, headers=bearer("gone.short")) as gone:
            with pytest.raises(ConnectionClosed, match="4001: token expired"):
                async with asyncio.timeout(10):
                    await gone.wait_closed()
                    await gone.pub("x", 1)
            if with_refresh:
                assert stats(running.proxies, "refresh").calls >= 2  # both were asked
                await kept.pub("still", 1)  # renewed: past its first expiry, it stays
                identity = next(c for c in running.server.conns if not c.closed).identity
                assert identity.exp == 2_000_000_000
                assert identity.data["refreshed"] == "alice.short"
            else:
                with pytest.raises(ConnectionClosed, match="4001: token expired"):
                    async with asyncio.timeout(10):
                        await kept.wait_closed()
                        await kept.pub("x", 1)
        assert running.server.stats.closed["token_expired"] == (1 if with_refresh else 2)
    finally:
        await running.drain(2.0)
