"""The HTTP fallback transport (juggler/fallback.py) against a real server:
a Redis broker, test callees, aiohttp as the client (SSE down, POST up),
raw sockets for what aiohttp would not send, and a websocket client beside."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import jwt
import pytest
from stacks import redis_stack

import rustext
from juggler.auth import Auth, AuthConfig
from juggler.client import connect
from juggler.keepalive import KEEPALIVE
from juggler.server import Server
from tests.jwks import JwksServer, SigningKey
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)

CALL, PUB, SUB, NACK, ACK, RES, EVNT = 1, 2, 3, 7, 8, 9, 10
SECRET = "a-test-secret-of-at-least-32-bytes-for-hs256"
T = 10.0  # s: every wait of this file


def token(sub: str = "alice") -> str:
    return jwt.encode({"sub": sub, "exp": time.time() + 600}, SECRET, algorithm="HS256")


def msg(type_: int, **payload: Any) -> tuple[str, str]:
    uid = rustext.new_uuid()
    return uid, json.dumps({"meta": {"type": type_, "uuid": uid}, "payload": payload})


def base(server: Server) -> str:
    return f"http://127.0.0.1:{server.port}{server.config.path}"


class Sse:
    """One fallback session seen from aiohttp: the stream and the POSTs."""

    def __init__(self, server: Server, http: aiohttp.ClientSession, query: str = "",
                 headers: dict[str, str] | None = None) -> None:
        self.url = base(server)
        self.http = http
        self.query = query
        self.headers = headers or {}
        self.resp: aiohttp.ClientResponse | None = None
        self.session = ""
        self.last_id = 0

    async def open(self, *, resume: bool = False) -> None:
        q = f"session={self.session}&" if resume else ""
        headers = dict(self.headers)
        if resume:
            headers["Last-Event-ID"] = str(self.last_id)
        self.resp = await self.http.get(f"{self.url}/sse?{q}{self.query}", headers=headers)
        assert self.resp.status == 200, await self.resp.text()
        assert self.resp.headers["Content-Type"] == "text/event-stream"
        name, _, data = await self.event()
        assert name == "session"
        info = json.loads(data)
        assert info["grace_ms"] > 0
        if resume:
            assert info["session"] == self.session
        self.session = info["session"]

    async def event(self) -> tuple[str, str | None, str]:
        """The next event (comment lines skipped): (name, id, data)."""
        assert self.resp is not None
        name, eid, data = "message", None, []
        async with asyncio.timeout(T):
            while True:
                line = (await self.resp.content.readline()).decode()
                if line == "":
                    raise EOFError("the stream ended")
                line = line.rstrip("\n")
                if line == "":
                    if data:
                        if eid is not None:
                            self.last_id = int(eid)
                        return name, eid, "\n".join(data)
                    continue
                if line.startswith(":"):
                    continue
                field, _, value = line.partition(": ")
                if field == "event":
                    name = value
                elif field == "id":
                    eid = value
                elif field == "data":
                    data.append(value)

    async def message(self, skip_keepalive: bool = True) -> dict[str, Any]:
        while True:
            name, _, data = await self.event()
            assert name == "message", (name, data)
            m = json.loads(data)
            if not (skip_keepalive and m["meta"]["type"] == KEEPALIVE):
                return m

    async def post(self, *lines: str, session: str | None = None, headers: dict[str, str] | None = None,
                   query: str | None = None) -> tuple[int, str]:
        sid = self.session if session is None else session
        async with self.http.post(f"{self.url}/send?session={sid}&{self.query if query is None else query}",
                                  data="\n".join(lines).encode(),
                                  headers={"Content-Type": "text/plain", **self.headers, **(headers or {})}) as r:
            return r.status, await r.text()

    def drop(self) -> None:
        assert self.resp is not None
        self.resp.close()  # the TCP connection goes: the server sees the stream end


@asynccontextmanager
async def stack(redis_url: str, **server_kw: Any) -> AsyncIterator[tuple[Server, aiohttp.ClientSession]]:
    async with (redis_stack(url=redis_url, workers=4, server_kw=server_kw) as server,
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=T)) as http):
        yield server, http


async def raw(server: Server, request: bytes) -> bytes:
    """Send raw bytes, read the whole answer (the server closes after it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(T):
            return await reader.read()
    finally:
        writer.close()


async def test_calls_and_pubsub_over_sse_and_post(redis_url: str) -> None:
    async with stack(redis_url) as (server, http):
        s = Sse(server, http)
        await s.open()
        assert server.stats.connections_active == 1  # a session counts as a connection
        c1, call1 = msg(CALL, uri="test.echo", args="héllo\nwörld")
        c2, call2 = msg(CALL, uri="test.reverse", args="abc")
        assert await s.post(call1, call2) == (204, "")  # two messages, one POST
        got: dict[tuple[int, str], Any] = {}
        while len(got) < 4:
            m = await s.message()
            got[(m["meta"]["type"], m["payload"]["for"])] = m["payload"].get("args")
        assert got == {(ACK, c1): None, (ACK, c2): None, (RES, c1): "héllo\nwörld", (RES, c2): "cba"}

        sub, subm = msg(SUB, channel="news")
        assert (await s.post(subm))[0] == 204
        m = await s.message()
        assert (m["meta"]["type"], m["payload"]["for"]) == (ACK, sub)
        async with connect(server.url) as ws:
            await ws.sub("from-sse")
            await ws.pub("news", {"hello": "sse"})
            m = await s.message()
            assert m["meta"]["type"] == EVNT and m["payload"]["channel"] == "news"
            assert m["payload"]["args"] == {"hello": "sse"}
            # a PUB whose raw args span lines reaches both sides whole
            p, pubm = msg(PUB, channel="from-sse", args=1)
            pubm = pubm.replace('"args": 1', '"args": {"a":\r 1}')
            assert (await s.post(pubm))[0] == 204
            m = await s.message()
            assert (m["meta"]["type"], m["payload"]["for"]) == (ACK, p)
            assert (await ws.next_event(timeout=T)).args == {"a": 1}
        # a NACK comes on the stream like any reply
        bad, badm = msg(CALL, uri="test.echo", timeout=-1)
        assert (await s.post(badm))[0] == 204
        m = await s.message()
        assert (m["meta"]["type"], m["payload"]["for"]) == (NACK, bad)
        s.drop()


async def test_sessions_are_unguessable_and_checked(redis_url: str) -> None:
    async with stack(redis_url) as (server, http):
        s = Sse(server, http)
        await s.open()
        assert len(s.session) == 32
        other = Sse(server, http)
        await other.open()
        assert other.session != s.session
        _, m = msg(CALL, uri="test.echo")
        assert await s.post(m, session="A" * 32) == (404, "unknown or expired session\n")
        for bad in ("../../etc", "short", "x" * 33, ""):
            assert (await s.post(m, session=bad))[0] == 400
        async with http.post(f"{s.url}/send", data=b"{}") as r:  # no session at all
            assert r.status == 400
        async with http.get(f"{s.url}/sse?session={'B' * 32}") as r:
            assert r.status == 404
        async with http.get(f"{s.url}/send?session={s.session}") as r:
            assert r.status == 405 and "POST" in r.headers["Allow"]
        async with http.put(f"{s.url}/sse", data=b"") as r:
            assert r.status == 405
        assert server.stats.rejections["unknown_session"] == 2
        s.drop()
        other.drop()


async def test_hostile_input_ends_only_its_session(redis_url: str) -> None:
    async with stack(redis_url, read_limit=1000, fallback_max_body=4000, max_pending=8) as (server, http):
        # a body over fallback_max_body: 413, the session goes on
        s = Sse(server, http)
        await s.open()
        status, _ = await s.post("x" * 5000)
        assert status == 413
        _, m = msg(CALL, uri="test.echo", args="still here")
        assert (await s.post(m))[0] == 204
        assert (await s.message())["meta"]["type"] == ACK
        assert (await s.message())["payload"]["args"] == "still here"
        # more messages in one POST than max_pending: 413, the session goes on
        status, text = await s.post(*[m] * 9)
        assert status == 413 and "max_pending" in text
        # one message over read_limit: 413 and the session closes with 1009, as a websocket would
        status, text = await s.post('{"meta":' + " " * 1200 + "}")
        assert status == 413 and "read_limit" in text
        name, _, data = await s.event()
        assert name == "close" and json.loads(data)["code"] == 1009
        assert (await s.post(m))[0] == 404

        # garbage: 400, the session ends (a websocket connection would be dropped)
        for garbage in ("not json", '{"meta":{"type":9,"uuid":"x"}}', "\x00\xff", '{"meta":{"type":1}}'):
            g = Sse(server, http)
            await g.open()
            status, text = await g.post(garbage)
            assert status == 400 and "bad_input" in text, (garbage, status, text)
            name, _, data = await g.event()
            assert name == "close" and json.loads(data)["code"] == 1006
            with pytest.raises(EOFError):
                await g.event()
        # what aiohttp would not send: straight on a socket
        path = server.config.path
        for request, status in [
            (f"POST {path}/send?session={'A' * 32} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
            (f"POST {path}/send?session={'A' * 32} HTTP/1.1\r\nHost: x\r\n\r\n", 411),
            (f"POST {path}/send HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413),
            (f"GET {path}/sse HTTP/1.1\r\nX: " + "a" * 20000 + "\r\n\r\n", 431),
            (f"GET {path}/sse HTTP/1.1\r\nbad header\r\n\r\n", 400),
            (f"GET {path}/sse?juggler-allowed-messages=NOPE HTTP/1.1\r\n\r\n", 400),
        ]:
            answer = await raw(server, request.encode())
            assert answer.startswith(f"HTTP/1.1 {status} ".encode()), (request[:60], answer[:80])
        # a request that never completes holds nobody up (it is dropped after handshake_timeout)
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(f"POST {path}/send?session=x HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc".encode())
        async with connect(server.url) as ws:
            assert await ws.call("test.echo", "ws fine", timeout=5) == "ws fine"
        fresh = Sse(server, http)
        await fresh.open()
        _, m = msg(CALL, uri="test.reverse", args="ok")
        assert (await fresh.post(m))[0] == 204
        assert (await fresh.message())["meta"]["type"] == ACK
        assert (await fresh.message())["payload"]["args"] == "ko"
        writer.close()
        assert server.stats.closed.get("bad_input") == 4
        fresh.drop()


async def test_auth_origin_and_identity(redis_url: str) -> None:
    async with stack(redis_url) as (server, http):
        server.auth = Auth(AuthConfig(jwt_secret=SECRET, allowed_origins=("https://app.example",)))
        url = base(server)
        async with http.get(f"{url}/sse") as r:
            assert r.status == 401
        async with http.get(f"{url}/sse?token=nope") as r:
            assert r.status == 401
        async with http.get(f"{url}/sse", headers={"Authorization": f"Bearer {token()}",
                                                   "Origin": "https://evil.example"}) as r:
            assert r.status == 403
        # the preflight of a cross-origin client from an allowed origin
        async with http.options(f"{url}/send", headers={"Origin": "https://app.example"}) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == "https://app.example"
            assert "Last-Event-ID" in r.headers["Access-Control-Allow-Headers"]
        s = Sse(server, http, query=f"token={token('alice')}", headers={"Origin": "https://app.example"})
        await s.open()
        assert s.resp is not None and s.resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
        _, m = msg(CALL, uri="test.echo", args="one")
        status, _ = await s.post(m)
        assert status == 204
        # the session id alone is not enough: another identity, or none, is refused
        assert (await s.post(m, query=f"token={token('mallory')}"))[0] == 403
        assert (await s.post(m, query=""))[0] == 401
        async with http.get(f"{url}/sse?session={s.session}&token={token('mallory')}") as r:
            assert r.status == 403
        assert (await s.message())["meta"]["type"] == ACK
        assert (await s.message())["payload"]["args"] == "one"
        s.drop()


async def test_a_dropped_stream_reopened_within_the_grace_gets_what_it_missed(redis_url: str) -> None:
    async with stack(redis_url, fallback_grace=5.0) as (server, http):
        s = Sse(server, http)
        await s.open()
        _, subm = msg(SUB, channel="feed")
        assert (await s.post(subm))[0] == 204
        assert (await s.message())["meta"]["type"] == ACK
        s.drop()
        # while it is gone: events and the reply to a call are kept for it
        for i in range(3):
            await server.publish("feed", json.dumps(i).encode())
        _, m = msg(CALL, uri="test.echo", args="while away")
        assert (await s.post(m))[0] == 204
        fallback = server.fallback
        assert fallback is not None
        await wait_until(lambda: len(fallback.sessions[s.session]._replay) >= 6, what="the replies buffered")
        await s.open(resume=True)
        got = [await s.message() for _ in range(5)]
        assert [m["payload"].get("args") for m in got if m["meta"]["type"] == EVNT] == [0, 1, 2]
        assert {m["meta"]["type"] for m in got} == {EVNT, ACK, RES}
        # the same stream again from an older id: the same events again (the client dedupes by id)
        first_evnt_id = s.last_id - 4
        s.drop()
        s.last_id = first_evnt_id - 1
        await s.open(resume=True)
        assert (await s.message())["payload"]["args"] == 0
        assert server.stats.connections_active == 1
        s.drop()


async def test_grace_expiry_and_replay_gaps_end_the_session(redis_url: str) -> None:
    async with stack(redis_url, fallback_grace=0.3, fallback_replay=2) as (server, http):
        fallback = server.fallback
        assert fallback is not None
        s = Sse(server, http)
        await s.open()
        s.drop()
        await wait_until(lambda: not fallback.sessions, what="the session's grace over")
        assert server.stats.connections_active == 0 and server.stats.closed["peer_gone"] == 1
        _, m = msg(CALL, uri="test.echo")
        assert (await s.post(m))[0] == 404
        # more missed than fallback_replay keeps: 410, and the session is over
        g = Sse(server, http)
        await g.open()
        _, subm = msg(SUB, channel="gap")
        assert (await g.post(subm))[0] == 204
        assert (await g.message())["meta"]["type"] == ACK
        g.drop()
        for i in range(4):
            await server.publish("gap", b"1")
        await wait_until(lambda: fallback.sessions[g.session]._next_id >= 6, what="the events")
        async with http.get(f"{g.url}/sse?session={g.session}", headers={"Last-Event-ID": str(g.last_id)}) as r:
            assert r.status == 410
        assert not fallback.sessions and server.stats.closed["replay_gap"] == 1


async def test_a_client_that_leaves_ends_its_session_at_once(redis_url: str) -> None:
    async with stack(redis_url, fallback_grace=30.0) as (server, http):
        s = Sse(server, http)
        await s.open()
        _, subm = msg(SUB, channel="bye")
        assert (await s.post(subm))[0] == 204
        assert (await s.message())["meta"]["type"] == ACK
        assert server.subscriptions.subscribers("bye")
        s.drop()
        assert await s.post(query="close=1") == (204, "")
        assert not server.fallback.sessions  # type: ignore[union-attr]
        assert server.stats.closed["peer_close"] == 1 and server.stats.connections_active == 0
        await wait_until(lambda: not server.subscriptions.subscribers("bye"), what="its subscription dropped")
        assert (await s.post(subm))[0] == 404


async def test_new_sessions_are_refused_as_handshakes_are(redis_url: str) -> None:
    async with stack(redis_url, max_connections=1) as (server, http):
        s = Sse(server, http)
        await s.open()
        async with http.get(f"{base(server)}/sse") as r:
            assert r.status == 503 and "too many connections" in await r.text()
        assert server.stats.rejections["max_connections"] == 1
        s.drop()
        server.draining = True  # as during a drain: new sessions 503, a known one may still POST
        async with http.get(f"{base(server)}/sse") as r:
            assert r.status == 503
        c, m = msg(CALL, uri="test.echo", args="late")
        assert (await s.post(m))[0] == 204
        await s.open(resume=True)  # a known session reopens its stream; the CALL got what a draining server says
        m = await s.message()
        assert (m["meta"]["type"], m["payload"]["for"], m["payload"]["code"]) == (NACK, c, 503)
        server.draining = False
        s.drop()


async def test_keepalive_over_sse_and_drain(redis_url: str) -> None:
    async with stack(redis_url, ping_interval=0.2, read_timeout=0) as (server, http):
        s = Sse(server, http, query="juggler-keepalive=1")
        await s.open()
        m = await s.message(skip_keepalive=False)
        assert m["meta"]["type"] == KEEPALIVE and m["payload"]["interval_ms"] == 200
        m = await s.message(skip_keepalive=False)  # and again after ping_interval
        assert m["meta"]["type"] == KEEPALIVE
        assert s.resp is not None
        comment = await asyncio.wait_for(s.resp.content.readline(), T)
        while not comment.startswith(b":"):  # comment lines keep proxies from timing the stream out
            comment = await asyncio.wait_for(s.resp.content.readline(), T)
        # a session is drained like a websocket connection: a close event with 1001
        await server.drain(timeout=0)
        while True:
            name, _, data = await s.event()
            if name == "close":
                assert json.loads(data)["code"] == 1001
                break
        assert server.stats.closed["shutdown"] == 1 and not server.fallback.sessions  # type: ignore[union-attr]


async def test_a_request_half_read_does_not_hold_the_shutdown(redis_url: str) -> None:
    async with stack(redis_url, handshake_timeout=30.0) as (server, _http):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(f"POST {server.config.path}/send?session={'A' * 32} HTTP/1.1\r\nContent-Length: 10\r\n\r\nab".encode())
        await writer.drain()
        fallback = server.fallback
        assert fallback is not None
        await wait_until(lambda: len(fallback.wires) == 1, what="the request taken by the fallback")
        async with asyncio.timeout(T):
            await server.drain(timeout=0)
            assert await reader.read() == b""  # dropped, not left until handshake_timeout
        writer.close()
        assert not fallback.wires


async def test_a_token_of_a_key_not_fetched_yet_waits_for_it(redis_url: str) -> None:
    """JWKS rotated: the request waits for the refetch, as a handshake does, then goes on."""
    old, new = SigningKey("RS256", kid="k1"), SigningKey("ES256", kid="k2")
    async with JwksServer([old]) as idp, stack(redis_url) as (server, http):
        auth = Auth(AuthConfig(jwks_url=idp.url, audience="juggler", issuer="https://idp.test", jwks_refresh=3600,
                               jwks_min_interval=0))
        await auth.start()
        try:
            server.auth = auth
            claims = {"sub": "carol", "aud": "juggler", "iss": "https://idp.test", "exp": time.time() + 600}
            idp.keys = [old, new]
            fetches = idp.fetches
            s = Sse(server, http, headers={"Authorization": "Bearer " + new.sign(claims)})
            await s.open()
            assert idp.fetches == fetches + 1
            _, m = msg(CALL, uri="test.echo", args="jwks")
            assert (await s.post(m))[0] == 204
            assert (await s.message())["meta"]["type"] == ACK
            assert (await s.message())["payload"]["args"] == "jwks"
            wrong = {"Authorization": "Bearer " + new.sign({**claims, "sub": "mallory"})}
            assert (await s.post(m, headers=wrong))[0] == 403
            s.drop()
        finally:
            await auth.aclose()
