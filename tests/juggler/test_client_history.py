"""HISTORY and PRESENCE requests from clients (juggler/client_requests.py):
answered only on channels whose [[channels]] rule allows them and to
connections that may SUB to the channel; refused with a clear NACK
otherwise. Real servers on a real Redis (and the in-memory broker for a
server without the options), the Python client, hand-made frames."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import jwt
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed as WsConnectionClosed

from juggler.auth import AuthConfig
from juggler.broker.redis import RedisBrokerConfig
from juggler.channels import ChannelOptions, ChannelRules
from juggler.client import connect
from juggler.config import AppConfig, ServerConfig
from juggler.errors import CallNacked
from juggler.extensions import HISTORY, PRESENCE
from juggler.runner import Running, start_app
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.timeout(60)

SECRET = "a-test-secret-of-at-least-32-bytes-for-hs256"
RULES = ChannelRules([
    ChannelOptions(match="h.*", history_size=10, history_ttl=60, client_history=True),
    ChannelOptions(match="closed.*", history_size=10, history_ttl=60, presence=True),
    ChannelOptions(match="p.*", presence=True, client_presence=True),
])
GRANTS = {"sub": ["h.*", "p.*", "closed.*", "plain"], "pub": ["*"]}


def token(sub: str, grants: dict[str, list[str]] | None = None) -> str:
    return jwt.encode({"sub": sub, "exp": time.time() + 600, "juggler": grants or GRANTS}, SECRET,
                      algorithm="HS256")


@asynccontextmanager
async def app(redis: Any, rules: ChannelRules = RULES) -> AsyncIterator[Running]:
    cfg = AppConfig(server=ServerConfig(port=0, log_connections=False, close_timeout=2.0, drain_timeout=1.0),
                    redis=redis, auth=AuthConfig(jwt_secret=SECRET), channels=rules)
    running = await start_app(cfg)
    try:
        yield running
    finally:
        await running.drain()


def client_of(running: Running, user: str, grants: dict[str, list[str]] | None = None) -> Any:
    return connect(running.server.url + "?token=" + token(user, grants))


async def nacked(aw: Any) -> tuple[int, str]:
    with pytest.raises(CallNacked) as refused:
        await aw
    return refused.value.code, refused.value.message


def test_the_options_need_history_and_presence() -> None:
    with pytest.raises(ValueError, match="client_history needs history_size"):
        ChannelOptions(client_history=True)
    with pytest.raises(ValueError, match="client_presence needs presence"):
        ChannelOptions(client_presence=True)
    assert ChannelRules.from_toml([{"match": "a.*", "history_size": 5, "client_history": True}]).rules[0].client_history


async def test_history_allowed_with_limit_and_since(redis_url: str) -> None:
    async with app(RedisBrokerConfig(url=redis_url)) as running, client_of(running, "alice") as alice:
        uuids = [await alice.pub("h.room", {"n": i, "big": 12345678901234567890}) for i in range(1, 4)]
        page = await alice.history("h.room", timeout=5)
        epoch = page["epoch"]
        assert page["offset"] == 3 and isinstance(epoch, str) and epoch
        assert page["events"] == [{"for": u, "channel": "h.room", "args": {"n": i, "big": 12345678901234567890},
                                   "offset": i, "epoch": epoch} for i, u in enumerate(uuids, 1)]
        assert "recovered" not in page
        assert [e["offset"] for e in (await alice.history("h.room", limit=2))["events"]] == [1, 2]
        assert await alice.history("h.room", limit=0) == {"events": [], "offset": 3, "epoch": epoch}
        since = await alice.history("h.room", since=(1, epoch))
        assert ([e["offset"] for e in since["events"]], since["recovered"]) == ([2, 3], True)
        assert await alice.history("h.room", since=(1, epoch), limit=0) == {"events": [], "offset": 3, "epoch": epoch,
                                                                             "recovered": True}
        assert await alice.history("h.room", since=(3, epoch)) == {"events": [], "offset": 3, "epoch": epoch,
                                                                   "recovered": True}
        for stale in ((1, "another-epoch"), (7, epoch)):  # the epoch changed; a position never reached
            assert await alice.history("h.room", since=stale) == {"events": [], "offset": 3, "epoch": epoch,
                                                                  "recovered": False}
        # a name that JSON must escape, args as published (numbers as written)
        odd = 'h.ü"\\\n'
        await alice.pub(odd, raw_args='{"x":1.50,"y":[1e3]}')
        (ev,) = (await alice.history(odd))["events"]
        assert (ev["channel"], ev["args"]) == (odd, {"x": 1.5, "y": [1000.0]})
        # a channel with nothing published yet
        empty = await alice.history("h.empty")
        assert empty["events"] == [] and empty["offset"] == 0
        assert running.server.stats.extensions_read[HISTORY] == 10


async def test_history_refused(redis_url: str) -> None:
    async with app(RedisBrokerConfig(url=redis_url)) as running, client_of(running, "alice") as alice, \
            client_of(running, "mallory", {"sub": ["plain"], "pub": ["*"]}) as mallory:
        await alice.pub("h.room", 1)
        code, text = await nacked(mallory.history("h.room"))  # may not SUB to it
        assert (code, text) == (403, "forbidden")
        code, text = await nacked(alice.history("closed.room"))  # history kept, not for clients
        assert code == 403 and "client_history" in text
        code, text = await nacked(alice.history("plain"))  # no history at all
        assert code == 400 and "keeps no history" in text
        for payload, what in (({}, "channel"), ({"channel": ""}, "channel"), ({"channel": 5}, "channel"),
                              ({"channel": "h.room", "limit": -1}, "limit"),
                              ({"channel": "h.room", "limit": "2"}, "limit"),
                              ({"channel": "h.room", "limit": 2 ** 60}, "limit"),
                              ({"channel": "h.room", "since": {"offset": 1}}, "since"),
                              ({"channel": "h.room", "since": {"offset": 1, "epoch": ""}}, "since"),
                              ({"channel": "h.room", "since": [1, "e"]}, "since"),
                              ({"channel": "h.room", "since": {"offset": True, "epoch": "e"}}, "since"),
                              ({"channel": "h.room", "since": {"offset": 1, "epoch": "e", "x": 1}}, "since"),
                              ({"channel": "h.room", "other": 1}, "unknown field")):
            code, text = await nacked(alice.request(HISTORY, payload, timeout=5))
            assert code == 400 and what in text, (payload, text)
        # the connection goes on serving
        assert (await alice.history("h.room"))["offset"] == 1
        assert not alice.closed


async def test_presence_allowed_and_refused(redis_url: str) -> None:
    async with app(RedisBrokerConfig(url=redis_url)) as running, client_of(running, "alice") as alice, \
            client_of(running, "bob") as bob, \
            client_of(running, "mallory", {"sub": ["plain"], "pub": ["*"]}) as mallory:
        await alice.sub("p.room")
        await bob.sub("p.room")
        members = await bob.presence("p.room")
        assert sorted(m["user"] for m in members.values()) == ["alice", "bob"]
        assert all(set(m) == {"client", "user"} and m["client"] == cid for cid, m in members.items())
        assert await alice.presence("p.empty") == {}
        code, text = await nacked(mallory.presence("p.room"))
        assert (code, text) == (403, "forbidden")
        code, text = await nacked(alice.presence("closed.room"))  # presence kept, not for clients
        assert code == 403 and "client_presence" in text
        code, text = await nacked(alice.presence("h.room"))
        assert code == 400 and "keeps no presence" in text
        code, text = await nacked(alice.request(PRESENCE, {"channel": "p.room", "limit": 1}, timeout=5))
        assert code == 400 and "unknown field" in text


async def test_a_server_without_the_options_takes_neither_request() -> None:
    """Without client_history/client_presence in any rule, HISTORY and
    PRESENCE are unknown types: bad input, the connection ends (as before)."""
    rules = ChannelRules([ChannelOptions(match="h.*", history_size=10, presence=True)])
    async with app(None, rules) as running:
        assert HISTORY not in running.server.extensions and PRESENCE not in running.server.extensions
        for msg_type in (HISTORY, PRESENCE):
            async with ws_connect(running.server.url + "?token=" + token("a"),
                                  subprotocols=["juggler.0"]) as ws:  # type: ignore[list-item]
                await ws.send(json.dumps({"meta": {"type": msg_type, "uuid": "6d0c0f5e-3f0e-4a4b-8f7e-2b1f3c5d7e90"},
                                          "payload": {"channel": "h.x"}}))
                with pytest.raises(WsConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 5)


async def test_history_and_presence_on_the_memory_broker() -> None:
    async with app(None) as running, client_of(running, "alice") as alice:
        await alice.pub("h.m", "x")
        page = await alice.history("h.m")
        assert [(e["args"], e["offset"]) for e in page["events"]] == [("x", 1)]
        await alice.sub("p.m")
        assert [m["user"] for m in (await alice.presence("p.m")).values()] == ["alice"]


async def test_a_redis_failure_is_a_nack_and_the_connection_goes_on(redis_url: str) -> None:
    """Redis' replies held back past the command timeout: the HISTORY
    request is NACKed with the broker's code, the connection serves on."""
    port = int(redis_url.split(":")[2].split("/")[0])
    async with FaultProxy(port) as proxy:
        redis = RedisBrokerConfig(url=f"redis://127.0.0.1:{proxy.port}/{redis_url.rsplit('/', 1)[1]}",
                                  command_timeout=0.5)
        async with app(redis) as running, client_of(running, "alice") as alice:
            await alice.pub("h.room", 1)
            proxy.hold_replies()
            code, text = await nacked(alice.history("h.room", timeout=10))
            assert code == 504 and "outcome unknown" in text, (code, text)
            proxy.release_replies()
            assert [e["args"] for e in (await alice.history("h.room", timeout=10))["events"]] == [1]
            assert not alice.closed
