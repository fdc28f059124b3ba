"""The HTTP fallback with the application in charge: a session opened over
SSE is decided by the connect proxy (a real backend process), gets the
server-side subscriptions of its identity, and is closed with 4001 when its
token expires, as a websocket connection is. aiohttp speaks the fallback."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import jwt
import pytest
from test_fallback import SECRET, Sse, msg
from test_proxy_server import backends, configs  # noqa: F401  (backends: the fixture)

from juggler.auth import Auth, AuthConfig
from juggler.broker.memory import MemoryBroker
from juggler.channels import ChannelRules
from juggler.client import connect
from juggler.config import ServerConfig
from juggler.proxy import ProxySet
from juggler.refreshing import CLOSE_CODE, TokenRefresh
from juggler.server import Server
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)

SUB, ACK, EVNT = 3, 8, 10


@asynccontextmanager
async def serving(*, proxies: ProxySet | None = None, auth: bool = True) -> AsyncIterator[Server]:
    broker = MemoryBroker()
    await broker.start()
    a = Auth(AuthConfig(jwt_secret=SECRET, refresh_warning=0.5)) if auth else None
    server = Server(broker, ServerConfig(port=0), auth=a, proxies=proxies)
    TokenRefresh(a, ChannelRules(), proxied=proxies is not None).install(server)
    try:
        await server.start()
        yield server
    finally:
        await server.aclose()
        await broker.aclose()


def token(lifetime: float = 600, **claims: Any) -> str:
    return jwt.encode({"sub": "alice", "exp": time.time() + lifetime, **claims}, SECRET, algorithm="HS256")


async def test_a_session_gets_the_server_side_subscriptions_of_its_token() -> None:
    async with serving() as server, aiohttp.ClientSession() as http:
        sse = Sse(server, http, headers={"Authorization": "Bearer " + token(channels=["news"])})
        await sse.open()
        # the first POSTed message is answered once the subscription is in effect
        uid, sub = msg(SUB, channel="other")
        assert (await sse.post(sub))[0] == 204
        ack = await sse.message()
        assert (ack["meta"]["type"], ack["payload"]["for"]) == (ACK, uid)
        async with connect(server.url, headers={"Authorization": "Bearer " + token()}) as publisher:
            await publisher.pub("news", {"n": 1})
        evnt = await sse.message()
        assert evnt["meta"]["type"] == EVNT
        assert (evnt["payload"]["channel"], evnt["payload"]["args"]) == ("news", {"n": 1})


async def test_a_session_whose_token_expires_is_closed_with_4001() -> None:
    async with serving() as server, aiohttp.ClientSession() as http:
        sse = Sse(server, http, query="juggler-refresh=1", headers={"Authorization": "Bearer " + token(1.5)})
        await sse.open()
        warned = await sse.message()
        assert warned["meta"]["type"] == 258  # EXPIRING: it asked
        while True:
            name, _, data = await sse.event()
            if name == "close":
                break
        assert json.loads(data) == {"code": CLOSE_CODE, "reason": "token expired"}
        assert server.stats.closed["token_expired"] == 1


async def test_the_connect_proxy_decides_new_sessions(backends: Any) -> None:  # noqa: F811
    proxies = ProxySet(configs(lambda kind: backends.endpoint("http", kind), ("connect",)))
    await proxies.start()
    try:
        async with serving(proxies=proxies, auth=False) as server, aiohttp.ClientSession() as http:
            # the backend names the user after the token and subscribes it to "news"
            sse = Sse(server, http, headers={"Authorization": "Bearer carol", "X-Request-Id": "r-1"})
            await sse.open()
            (conn,) = [c for c in server.conns if getattr(c, "sid", None) == sse.session]
            assert conn.identity.user == "carol"
            assert conn.identity.data["headers"] == {"Authorization": "Bearer carol", "X-Request-Id": "r-1"}
            assert conn.identity.data["client"] == conn.id  # the id the backend was told
            async with connect(server.url, headers={"Authorization": "Bearer dave"}) as publisher:
                await publisher.pub("news", 7)
            evnt = await sse.message()
            assert (evnt["payload"]["channel"], evnt["payload"]["args"]) == ("news", 7)
            # a refusal is the backend's, as at a websocket handshake
            async with http.get(f"{sse.url}/sse", headers={"Authorization": "Bearer banned"}) as refused:
                assert refused.status == 403
            await wait_until(lambda: server.stats.rejections.get("proxy_refused", 0) >= 1)
    finally:
        await proxies.aclose()
