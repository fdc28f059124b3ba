"""The server API's presence and presence_stats methods, on servers started
as ``juggler server`` starts them (juggler.runner): in memory, and two
servers sharing a real Redis (the API of one sees the other's subscribers)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jwt
import pytest

from juggler.auth import AuthConfig
from juggler.broker.redis import RedisBrokerConfig
from juggler.channels import ChannelOptions, ChannelRules
from juggler.client import connect
from juggler.config import ApiConfig, AppConfig, ServerConfig
from juggler.runner import Running, start_app

pytestmark = pytest.mark.timeout(60)

KEY = "k3y-for-the-presence-tests_0123"
SECRET = "a-test-secret-of-at-least-32-bytes-for-hs256"
RULES = ChannelRules([ChannelOptions(match="chat.*", presence=True, join_leave=True)])


@contextlib.asynccontextmanager
async def app(redis_url: str | None = None) -> AsyncIterator[Running]:
    cfg = AppConfig(
        server=ServerConfig(port=0, log_connections=False, close_timeout=2.0, drain_timeout=1.0),
        redis=RedisBrokerConfig(url=redis_url) if redis_url else None,
        api=ApiConfig(port=0, key=KEY),
        auth=AuthConfig(jwt_secret=SECRET, anonymous=True),
        channels=RULES,
    )
    running = await start_app(cfg)
    try:
        yield running
    finally:
        await running.drain()


def url_for(running: Running, user: str | None) -> str:
    if user is None:
        return running.server.url
    tok = jwt.encode({"sub": user, "exp": time.time() + 600}, SECRET, algorithm="HS256")
    return running.server.url + "?token=" + tok


async def post(running: Running, method: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session, \
            session.post(f"{running.api.url}/{method}", data=json.dumps(body).encode(),
                         headers={"X-API-Key": KEY}) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize("shared", [False, True])
async def test_presence_and_its_stats(shared: bool, request: pytest.FixtureRequest) -> None:
    redis_url = request.getfixturevalue("redis_url") if shared else None
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(app(redis_url))
        b = await stack.enter_async_context(app(redis_url)) if shared else a
        assert a.presence is not None
        alice1 = await stack.enter_async_context(connect(url_for(a, "alice")))
        alice2 = await stack.enter_async_context(connect(url_for(b, "alice")))
        bob = await stack.enter_async_context(connect(url_for(b, "bob")))
        for c in (alice1, alice2, bob):
            await c.sub("chat.room")

        status, answer = await post(a, "presence", {"channel": "chat.room"})
        assert status == 200
        entries = answer["result"]["presence"]
        assert sorted(e["user"] for e in entries.values()) == ["alice", "alice", "bob"]
        assert all(entries[cid]["client"] == cid for cid in entries)
        assert {c.id for c in b.server.conns} <= set(entries)
        status, answer = await post(a, "presence_stats", {"channel": "chat.room"})
        assert (status, answer) == (200, {"result": {"num_clients": 3, "num_users": 2}})

        await bob.unsb("chat.room")
        status, answer = await post(b, "presence_stats", {"channel": "chat.room"})
        assert answer == {"result": {"num_clients": 2, "num_users": 1}}
        status, answer = await post(b, "presence", {"channel": "chat.empty"})
        assert (status, answer) == (200, {"result": {"presence": {}}})

        # a channel without presence, a bad parameter
        status, answer = await post(a, "presence", {"channel": "news"})
        assert status == 400 and "keeps no presence" in answer["error"]["message"]
        status, answer = await post(a, "presence_stats", {"channel": ""})
        assert status == 400 and "channel must not be empty" in answer["error"]["message"]
        status, answer = await post(a, "presence", {"channel": "chat.room", "extra": 1})
        assert status == 400 and "unknown parameter" in answer["error"]["message"]


async def test_without_presence_rules_the_methods_say_so() -> None:
    cfg = AppConfig(server=ServerConfig(port=0, log_connections=False), api=ApiConfig(port=0, key=KEY))
    running = await start_app(cfg)
    try:
        assert running.presence is None
        status, answer = await post(running, "presence_stats", {"channel": "chat.room"})
        assert status == 400 and "keeps no presence" in answer["error"]["message"]
    finally:
        await running.drain()
