"""The original Go programs against our server and our client against the
original server, with this version's extensions on, through one real Redis.

Each test runs when the environment names the Go binaries it needs
(``JUGGLER_GO_SERVER``, ``JUGGLER_GO_CLIENT``, ``JUGGLER_GO_CALLEE``,
``JUGGLER_GO_LOAD``: built from PuerkitoBio/juggler with mna/redisc, which
are not on the Go module proxy) and is skipped otherwise. What each one
shows: the original sees none of the extensions it did not ask for, and
what it does see (websocket pings, a close with 4001, EVNTs of channels
it never subscribed) it handles as any juggler.0 peer would.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
import websockets
from goprocs import (
    GO_CALLEE,
    GO_CLIENT,
    GO_LOAD,
    GO_SERVER,
    GoRepl,
    go_callee,
    go_load,
    go_server,
    load_counts,
    load_server_diffs,
)
from jugglerprocs import ROOT, Proc, juggler, juggler_server

from juggler.client import connect
from tests.netutil import free_port, wait_for_port

pytestmark = pytest.mark.timeout(90)

SECRET = "interop-secret-of-at-least-32-bytes!"


def _needs(**binaries: str | None) -> pytest.MarkDecorator:
    missing = [name for name, path in binaries.items() if not path]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} (original Go juggler binaries) not set")


def _token(sub: str, ttl: float = 3600, **claims: object) -> str:
    return jwt.encode({"sub": sub, "exp": int(time.time() + ttl), **claims}, SECRET, algorithm="HS256")


@pytest.fixture
def repls() -> Iterator[list[GoRepl]]:
    """Go clients opened by a test; each must exit 0 at Ctrl-D, whatever happened to its connections."""
    opened: list[GoRepl] = []
    yield opened
    codes = [r.exit() for r in opened]
    for r in opened:
        print(r.text())  # shown when the test fails
    assert codes == [0] * len(codes), [r.text() for r in opened]


@pytest.fixture
def proxy_config(tmp_path: Path) -> Iterator[Path]:
    """A server configuration with connect, subscribe (chat:*) and rpc (app.*)
    proxies to the test backend (tests/juggler/proxybackend.py, over HTTP)."""
    port = free_port()
    backend = subprocess.Popen([sys.executable, "-m", "tests.juggler.proxybackend", "http", str(port)], cwd=ROOT)
    try:
        wait_for_port(port, timeout=30, proc=backend)
        base = f"http://127.0.0.1:{port}/juggler"
        config = tmp_path / "proxies.toml"
        config.write_text(
            f'[[proxy]]\nkind = "connect"\nendpoint = "{base}/connect"\ntimeout = 2.0\n\n'
            f'[[proxy]]\nkind = "subscribe"\nendpoint = "{base}/subscribe"\nmatch = ["chat:*"]\ntimeout = 2.0\n\n'
            f'[[proxy]]\nkind = "rpc"\nendpoint = "{base}/rpc"\nmatch = ["app.*"]\ntimeout = 2.0\n')
        yield config
    finally:
        backend.terminate()
        backend.wait(10)


async def _first_answer(repl: GoRepl) -> None:
    """The answer to the connection's first message: the server-side
    subscriptions are in effect once it comes (juggler.serversubs)."""
    repl.send("sub 1 first")
    await repl.expect(r"\[1\] <<< ACK  message: \S+ for SUB")


# The Go load tool and the Go client against our server ---------------------------------


@_needs(JUGGLER_GO_LOAD=GO_LOAD, JUGGLER_GO_CALLEE=GO_CALLEE)
def test_go_load_through_our_server_to_the_go_callee_with_pings_and_auth(redis_url: str) -> None:
    """Every call of the original load tool is answered, by the original
    callee behind our server, while the server pings every 0.2 s and
    requires a token (given as ?token=, the only way the tool has)."""
    with go_callee(redis_url), juggler_server(redis_url, "--jwt-secret", SECRET,
                                              "--set", "server.ping_interval=0.2",
                                              "--set", "server.pong_timeout=1") as url:
        report = go_load(f"{url}?token={_token('load')}", "-V", "-c", "4", "-d", "2s", "-r", "50ms", "-p", "5", "-w", "10s")
    counts = load_counts(report)
    assert counts["Calls"] > 20, report
    assert counts["Results"] == counts["Calls"] == counts["Acks"] and counts["Nacks"] == counts["Expired"] == 0, report


@_needs(JUGGLER_GO_LOAD=GO_LOAD, JUGGLER_GO_CALLEE=GO_CALLEE)
def test_go_load_reads_our_debug_vars_page(redis_url: str) -> None:
    """Without -V the tool reads the server's /debug/vars before and after
    its run: with ``debug_vars = true`` ours answers, in the original's names."""
    with go_callee(redis_url), juggler_server(redis_url, "--set", "server.debug_vars=true") as url:
        report = go_load(url, "-c", "2", "-d", "1s", "-r", "50ms", "-p", "1")
    counts, diffs = load_counts(report), load_server_diffs(report)
    assert counts["Calls"] > 5 and counts["Results"] == counts["Calls"], report
    assert diffs["MsgsCALL"] == diffs["MsgsACK"] == diffs["MsgsRES"] == counts["Calls"], report
    assert diffs["TotalConns"] == 2, report


@_needs(JUGGLER_GO_LOAD=GO_LOAD)
def test_go_load_is_refused_without_a_token(redis_url: str) -> None:
    """The tool's connections fail at the handshake (HTTP 401), which it reports."""
    with juggler_server(redis_url, "--jwt-secret", SECRET) as url:
        out = subprocess.run([str(GO_LOAD), "-addr", url, "-V", "-c", "1", "-d", "1s"],
                             check=False, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "bad handshake" in out.stdout + out.stderr


@_needs(JUGGLER_GO_LOAD=GO_LOAD)
def test_go_load_stops_when_its_token_expires(redis_url: str) -> None:
    """Closed with 4001 mid-run, the tool stops at its next call and says why
    (as it stops at any close): its tokens must outlive the run."""
    with juggler_server(redis_url, "--jwt-secret", SECRET) as url:
        out = subprocess.run([str(GO_LOAD), "-addr", f"{url}?token={_token('load', ttl=2)}", "-V", "-c", "1",
                              "-d", "10s", "-r", "50ms", "-u", "no.callee"],
                             check=False, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "Call failed: websocket: close 4001: token expired" in out.stdout + out.stderr


@_needs(JUGGLER_GO_CLIENT=GO_CLIENT, JUGGLER_GO_CALLEE=GO_CALLEE)
async def test_go_client_with_a_jwt_channels_claim_and_a_short_token(redis_url: str, repls: list[GoRepl]) -> None:
    """The Go client gets plain EVNTs of the channels its token names (it
    never SUBscribed them), answers pings, calls the Go callee through our
    server, and is closed with 4001 when its token expires: its next
    command reports the close, and the program goes on."""
    with go_callee(redis_url), juggler_server(redis_url, "--jwt-secret", SECRET,
                                              "--set", "server.ping_interval=0.2",
                                              "--set", "server.pong_timeout=1") as url:
        exp = time.time() + 4
        repl = GoRepl(f"{url}?token={_token('gopher', ttl=4, channels=['news'])}")
        repls.append(repl)
        repl.send("connect")
        await repl.expect(r"\[1\] connected to")
        await _first_answer(repl)
        async with connect(f"{url}?token={_token('pub')}") as ours:
            await ours.pub("news", "from-ours")
            await repl.expect(r'\[1\] <<< EVNT message: \S+ for PUB \S+ \("from-ours"\)')
        repl.send("call 1 test.reverse 2s gopher")
        await repl.expect(r'\[1\] <<< RES  message: \S+ for CALL \S+ \("rehpog"\)')
        # the connection stays up across pings (every 0.2 s, 1 s to answer): the
        # original answers them (a span of time is what is tested here)
        await asyncio.sleep(1.5)
        repl.send("call 1 test.echo 2s still-here")
        await repl.expect(r'<<< RES  message: \S+ for CALL \S+ \("still-here"\)')
        # at expiry: closed with 4001, seen by the Go client as its connection's error
        deadline = time.monotonic() + 10
        while "close 4001" not in repl.text():
            assert time.monotonic() < deadline, repl.text()
            repl.send("pub 1 news tick")
            await repl.expect(r"(>>> PUB  message|Pub failed: .*)", timeout=5)
            await asyncio.sleep(0.2)  # the poll's period: the token's expiry is a time
        assert time.time() >= exp - 1.5
        assert "Pub failed: websocket: close 4001" in repl.text()
        assert "<<< ACK" in repl.text() and "KEEPALIVE" not in repl.text() and "EXPIRING" not in repl.text()


@_needs(JUGGLER_GO_CLIENT=GO_CLIENT, JUGGLER_GO_CALLEE=GO_CALLEE)
async def test_go_client_through_our_proxies(redis_url: str, proxy_config: Path, repls: list[GoRepl]) -> None:
    """With connect, subscribe and rpc proxies to an application (the test
    backend): the connect answer's channels reach the Go client as plain
    EVNTs, a refused SUB is an ordinary NACK, the rpc proxy's answer an
    ordinary RES, and a URI no proxy matches still reaches the Go callee."""
    with go_callee(redis_url), juggler_server(redis_url, "--config", str(proxy_config)) as url:
        repl = GoRepl(f"{url}?token=alice")
        repls.append(repl)
        repl.send("connect")
        await repl.expect(r"\[1\] connected to")
        await _first_answer(repl)
        async with connect(f"{url}?token=bob") as ours:
            await ours.pub("user#alice", "for-alice")
            await repl.expect(r'<<< EVNT message: \S+ for PUB \S+ \("for-alice"\)')
        repl.send("sub 1 chat:no")
        await repl.expect(r"<<< NACK message: \S+ for SUB \S+ \(subscribe refused for chat:no\)")
        repl.send("sub 1 chat:room")
        await repl.expect(r"<<< ACK  message: \S+ for SUB")
        repl.send("pub 1 chat:room hi-room")
        await repl.expect(r'<<< EVNT message: \S+ for PUB \S+ \("hi-room"\)')
        repl.send("call 1 app.greet 2s hello")
        m = await repl.expect(r"<<< RES  message: \S+ for CALL \S+ \((.*)\)")
        assert json.loads(m.group(1)) == {"echo": "hello", "user": "alice", "uri": "app.greet"}
        repl.send("call 1 test.echo 2s via-redis")
        await repl.expect(r'<<< RES  message: \S+ for CALL \S+ \("via-redis"\)')
        assert "Failed" not in repl.text()


# Our client against the original server -------------------------------------------------


@_needs(JUGGLER_GO_SERVER=GO_SERVER, JUGGLER_GO_CALLEE=GO_CALLEE)
async def test_our_client_with_its_extension_headers_against_the_go_server(redis_url: str) -> None:
    """Our client asks for KEEPALIVE and EXPIRING (it has get_token): the
    original ignores both headers and the connection is plain juggler.0."""
    tokens = 0

    async def get_token() -> str:
        nonlocal tokens
        tokens += 1
        return "opaque-to-the-original"

    with go_callee(redis_url), go_server(redis_url) as url:
        async with connect(url, get_token=get_token) as c, connect(url) as other:
            assert tokens == 1
            assert await c.call("test.reverse", "abc", timeout=5) == "cba"
            await c.sub("room")
            await other.pub("room", {"n": 1})
            got = await c.next_event(5)
            assert got.channel == "room" and got.args == {"n": 1} and got.offset is None
            await c.sub("r.*", pattern=True)
            await other.pub("r.x", [1, 2])
            assert (await c.next_event(5)).args == [1, 2]


@_needs(JUGGLER_GO_SERVER=GO_SERVER)
async def test_extension_requests_and_sub_options_on_the_go_server(redis_url: str) -> None:
    """SUB's extension fields (since, join_leave) are ignored by the original
    (a plain ACK); a HISTORY request, a type it does not know, gets that
    connection closed at once, a ConnectionClosed rather than a wait, and the
    server goes on serving the others."""
    from juggler.errors import ConnectionClosed

    with go_server(redis_url) as url:
        async with connect(url) as c, connect(url) as other:
            ack = await c.sub("h.x", since=(0, "some-epoch"), join_leave=True)
            assert ack["channel"] == "h.x" and "recovered" not in ack and "offset" not in ack
            started = time.monotonic()
            with pytest.raises(ConnectionClosed):
                await c.history("h.x", timeout=10)
            assert time.monotonic() - started < 5
            assert await other.sub("still") is not None


@_needs(JUGGLER_GO_SERVER=GO_SERVER)
async def test_the_go_server_declines_a_permessage_deflate_offer(redis_url: str) -> None:
    """A client offering permessage-deflate (as the websockets library does by
    default) gets juggler.0 without compression, and is served."""
    with go_server(redis_url) as url:
        async with websockets.connect(url, subprotocols=[websockets.Subprotocol("juggler.0")],
                                      compression="deflate",
                                      additional_headers={"Juggler-Keepalive": "1", "Juggler-Refresh": "1"},
                                      open_timeout=5) as ws:
            assert ws.subprotocol == "juggler.0"
            assert ws.response is not None and "Sec-WebSocket-Extensions" not in ws.response.headers
            sub = str(uuid.uuid4())
            await ws.send(json.dumps({"meta": {"type": 3, "uuid": sub}, "payload": {"channel": "z", "pattern": False}}))
            ack = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert ack["meta"]["type"] == 8 and ack["payload"]["for"] == sub


# Both servers on one Redis ---------------------------------------------------------------


@_needs(JUGGLER_GO_SERVER=GO_SERVER, JUGGLER_GO_CLIENT=GO_CLIENT)
async def test_both_servers_side_by_side(redis_url: str, repls: list[GoRepl]) -> None:
    """Calls through the Go server are answered by our callee, and pub-sub
    crosses between the servers both ways, the Go client on our server
    (pings on by default) and our client on the Go server."""
    callee = Proc(juggler("callee", "--redis", redis_url, "--workers", "4"))
    try:
        with go_server(redis_url) as go_url, juggler_server(redis_url) as our_url:
            async with connect(go_url) as on_go:
                assert await on_go.call("test.echo", "answered-by-ours", timeout=10) == "answered-by-ours"
                repl = GoRepl(our_url)
                repls.append(repl)
                repl.send("connect")
                await repl.expect(r"\[1\] connected to")
                repl.send("sub 1 cross")
                await repl.expect(r"<<< ACK  message: \S+ for SUB")
                await on_go.pub("cross", "go-to-ours")
                await repl.expect(r'<<< EVNT message: \S+ for PUB \S+ \("go-to-ours"\)')
                await on_go.sub("back")
                repl.send("pub 1 back ours-to-go")
                got = await on_go.next_event(5)
                assert got.channel == "back" and got.args == "ours-to-go"
                repl.send("call 1 test.echo 5s ours-to-ours")
                await repl.expect(r'<<< RES  message: \S+ for CALL \S+ \("ours-to-ours"\)')
    finally:
        callee.stop()


# What the original client's handshake gets from our server, frame by frame ---------------


async def test_a_plain_juggler0_client_sees_only_juggler0_messages(redis_url: str, tmp_path: Path) -> None:
    """The Go client drops message types it does not know without a word, so
    its silence proves nothing: this client makes the original's handshake
    (the subprotocol, no extension header or query, no deflate offer) and
    checks every frame it gets, through pings, a history channel, server-side
    subscriptions and token expiry: only NACK/ACK/RES/EVNT, then close 4001."""
    config = tmp_path / "h.toml"
    config.write_text('[[channels]]\nmatch = "h.*"\nhistory_size = 10\n')
    with juggler_server(redis_url, "--jwt-secret", SECRET, "--config", str(config),
                        "--set", "server.ping_interval=0.2", "--set", "server.pong_timeout=1") as url:
        token = _token("plain", ttl=3, channels=["h.news"])
        async with websockets.connect(f"{url}?token={token}", subprotocols=[websockets.Subprotocol("juggler.0")],
                                      compression=None, open_timeout=5) as ws:
            assert ws.response is not None and "Sec-WebSocket-Extensions" not in ws.response.headers
            sub = str(uuid.uuid4())
            await ws.send(json.dumps({"meta": {"type": 3, "uuid": sub}, "payload": {"channel": "h.own", "pattern": False}}))
            frames = [json.loads(await asyncio.wait_for(ws.recv(), 5))]  # the ACK: server-side subscriptions in effect
            async with connect(f"{url}?token={_token('pub')}") as ours:
                await ours.pub("h.news", "a")
                await ours.pub("h.own", "b")
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    frames.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001
        assert {f["meta"]["type"] for f in frames} == {8, 10}, frames
        assert sorted(f["payload"]["args"] for f in frames if f["meta"]["type"] == 10) == ["a", "b"]
