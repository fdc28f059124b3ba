"""juggler/api.py (the server HTTP API) and juggler/control.py (its commands
between servers): real servers started by juggler.runner.start_app, real
websocket clients, real Redis and Redis Cluster, real HTTP requests; the
CLI flags through real `juggler` subprocesses."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st

import rustext
from juggler.api import ApiServer
from juggler.auth import AuthConfig
from juggler.broker.glob import glob_match
from juggler.broker.redis import RedisBrokerConfig
from juggler.client import Client, connect
from juggler.config import ApiConfig, AppConfig, ServerConfig, config_from_dict
from juggler.control import (
    BROADCAST,
    NodeRegistry,
    decode_message,
    encode_message,
    glob_filter,
    inbox,
)
from juggler.runner import Running, start_app
from tests.netutil import free_port, wait_for_port, wait_until

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
KEY = "k3y-for-the-tests_0123456789"
SECRET = "a-test-secret-of-at-least-32-bytes-for-hs256"
HEADERS = {"X-API-Key": KEY}


def token(sub: str) -> str:
    return jwt.encode({"sub": sub, "exp": time.time() + 600}, SECRET, algorithm="HS256")


@asynccontextmanager
async def app(*, redis: Any = None, api: bool = True, auth: bool = False, **api_kw: Any) -> AsyncIterator[Running]:
    """One juggler server process (in this process) with the server API."""
    api_kw.setdefault("key", KEY)
    cfg = AppConfig(
        server=ServerConfig(port=0, log_connections=False, close_timeout=2.0, drain_timeout=1.0),
        redis=redis,
        api=ApiConfig(port=0, **api_kw) if api else None,
        auth=AuthConfig(jwt_secret=SECRET) if auth else None,
    )
    running = await start_app(cfg)
    try:
        yield running
    finally:
        await running.drain()


async def post(target: Running | str, path: str, body: Any = None, *, headers: dict[str, str] | None = None,
               data: bytes | None = None) -> tuple[int, Any]:
    """POST to the API; (status, decoded JSON answer)."""
    url = target if isinstance(target, str) else target.api.url
    if data is None and body is not None:
        data = json.dumps(body).encode()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session, \
            session.post(url + path, data=data, headers=HEADERS if headers is None else headers) as resp:
        assert resp.content_type == "application/json"
        return resp.status, await resp.json()


async def ok(target: Running | str, path: str, body: Any = None) -> dict[str, Any]:
    status, answer = await post(target, path, body)
    assert status == 200, answer
    return answer["result"]


async def error(target: Running | str, path: str, body: Any = None, **kw: Any) -> tuple[int, str]:
    status, answer = await post(target, path, body, **kw)
    assert answer["error"]["code"] == status, answer
    return status, answer["error"]["message"]


def conn_of(running: Running, client: Client) -> Any:
    """The server side of `client` (matched by the client's local port)."""
    port = client.ws.local_address[1]
    (conn,) = [c for c in running.server.conns if c.remote[1] == port]
    return conn


async def closed_with(client: Client) -> tuple[int | None, str | None]:
    async with asyncio.timeout(10):
        await client.wait_closed()
    return client.ws.close_code, client.ws.close_reason


# configuration ------------------------------------------------------------------------------------


def test_api_config_from_toml_and_its_errors() -> None:
    cfg = config_from_dict({"api": {"listen": "0.0.0.0:9123", "key": "abc", "max_body": 4096, "survey_timeout": 1}})
    assert cfg.api == ApiConfig(host="0.0.0.0", port=9123, key="abc", max_body=4096, survey_timeout=1.0)
    assert config_from_dict({}).api is None
    for bad, said in (({"key": "has space"}, "visible ASCII"), ({"key": ""}, "must not be empty"),
                      ({"key": "k", "insecure": True}, "exclude each other"), ({"port": 70000}, "0..65535"),
                      ({"max_body": 0}, "max_body"), ({"survey_timeout": 0}, "survey_timeout"),
                      ({"bogus": 1}, "bogus"), ({"key": 5}, "api.key")):
        with pytest.raises(ValueError, match=said):
            config_from_dict({"api": bad})
    with pytest.raises(ValueError, match="needs a key: --api-key KEY, the JUGGLER_API_KEY"):
        ApiConfig().check_key()
    ApiConfig(insecure=True).check_key()


async def test_refuses_to_start_without_a_key() -> None:
    with pytest.raises(ValueError, match="server API needs a key"):
        await start_app(AppConfig(server=ServerConfig(port=0), api=ApiConfig(port=0)))
    with pytest.raises(ValueError, match="server API needs a key"):
        ApiServer(object(), ApiConfig(port=0))


async def test_insecure_serves_without_a_key() -> None:
    async with app(key=None, insecure=True) as running:
        status, answer = await post(running, "/info", {}, headers={})
        assert status == 200 and len(answer["result"]["nodes"]) == 1


# auth -----------------------------------------------------------------------------------------------


async def test_key_in_either_header_else_401() -> None:
    async with app() as running:
        for headers in ({"X-API-Key": KEY}, {"Authorization": f"apikey {KEY}"}, {"Authorization": f"APIKEY  {KEY}"},
                        {"Authorization": f"apikey {KEY}", "X-API-Key": KEY}):
            status, _ = await post(running, "/info", {}, headers=headers)
            assert status == 200, headers
        status, message = await error(running, "/info", {}, headers={})
        assert status == 401 and "missing API key" in message and "X-API-Key" in message
        for headers in ({"X-API-Key": KEY + "x"}, {"X-API-Key": ""}, {"Authorization": f"Bearer {KEY}"},
                        {"Authorization": "apikey"}, {"Authorization": f"apikey {KEY[:-1]}"},
                        # both headers: each must carry the key
                        {"Authorization": f"apikey {KEY}", "X-API-Key": "wrong"},
                        {"Authorization": "apikey wrong", "X-API-Key": KEY},
                        {"X-API-Key": "kéy"}):
            status, message = await error(running, "/info", {}, headers=headers)
            assert (status, message) == (401, "invalid API key"), headers
        # refused before the body is looked at, and before the method is
        assert (await error(running, "/nope", data=b"{", headers={}))[0] == 401


# errors -------------------------------------------------------------------------------------------


async def test_request_errors() -> None:
    async with app(max_body=1000) as running:
        url = running.api.url
        status, message = await error(running, "/info", data=b"{")
        assert status == 400 and message.startswith("invalid JSON")
        for body in (b"[]", b"null", b"1", b'"x"'):
            assert await error(running, "/info", data=body) == (400, "the body must be a JSON object")
        assert await error(running, "/info", data=b'{"a":"\xff"}') == (400, "invalid JSON: message is not valid UTF-8")
        status, message = await error(running, "/nope", {})
        assert status == 404 and "unknown method 'nope'" in message and "publish" in message
        status, message = await error(running, "", {"method": "nope", "params": {}})
        assert status == 404 and "unknown method 'nope'" in message
        assert (await error(url.removesuffix("/api"), "/other", {}))[0] == 404
        status, message = await error(running, "/info", data=b" " * 1001)
        assert (status, message) == (413, "request body over 1000 bytes (max_body)")
        assert (await error(running, "/info", {"unknown": 1}))[1].startswith("unknown parameter: unknown")
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/info", headers=HEADERS) as resp:
                assert resp.status == 405 and resp.headers["Allow"] == "POST"
                assert (await resp.json())["error"]["code"] == 405

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: cut off while reading
                for _ in range(20):
                    yield b" " * 100

            async with session.post(url + "/info", data=chunks(), headers=HEADERS) as resp:
                assert resp.status == 413
        # still serving
        assert len((await ok(running, "/info"))["nodes"]) == 1


async def test_envelope_form_and_empty_bodies() -> None:
    async with app() as running:
        assert len((await ok(running, "", {"method": "info"}))["nodes"]) == 1
        assert len((await ok(running, "", {"method": "info", "params": {}}))["nodes"]) == 1
        assert len((await ok(running, "", {"method": "info", "params": None}))["nodes"]) == 1
        status, answer = await post(running, "/info", data=b"  \n")
        assert status == 200 and len(answer["result"]["nodes"]) == 1
        for body, said in (({"params": {}}, "method is required"), ({"method": 1}, "method: expected a string"),
                           ({"method": "info", "params": []}, "params: expected an object, got an array"),
                           ({"method": "info", "x": 1}, "unknown member 'x'")):
            status, message = await error(running, "", body)
            assert status == 400 and said in message, (body, message)


# publish and broadcast -----------------------------------------------------------------------------


async def test_publish_reaches_subscribers() -> None:
    async with app() as running, connect(running.server.url) as sub:
        await sub.sub("news")
        await sub.sub("news.*", pattern=True)
        data = {"html": "<b>&</b>", "n": 1.50, "big": 12345678901234567890, "list": [None, True, "é"]}
        result = await ok(running, "/publish", {"channel": "news", "data": data})
        assert rustext.canonical_uuid(result["uuid"]) == result["uuid"] and "offset" not in result
        event = await sub.next_event(timeout=5)
        assert (event.channel, event.pattern, event.for_uuid, event.args) == ("news", None, result["uuid"], data)
        # the UUID given, in canonical form; any JSON value as data
        given = "6BA7B810-9DAD-11D1-80B4-00C04FD430C8"
        result = await ok(running, "/publish", {"channel": "news.a", "data": "text", "uuid": given})
        assert result["uuid"] == given.lower()
        event = await sub.next_event(timeout=5)
        assert (event.channel, event.pattern, event.for_uuid, event.args) == ("news.a", "news.*", given.lower(), "text")
        await ok(running, "/publish", {"channel": "news", "data": None})
        assert (await sub.next_event(timeout=5)).args is None


async def test_publish_and_broadcast_validation() -> None:
    async with app() as running:
        for body, said in (
            ({"data": 1}, "channel is required"),
            ({"channel": "a"}, "data is required"),
            ({"channel": "", "data": 1}, "channel must not be empty"),
            ({"channel": 5, "data": 1}, "channel: expected a string, got a number"),
            ({"channel": None, "data": 1}, "channel: expected a string, got null"),
            ({"channel": ["a"], "data": 1}, "channel: expected a string, got an array"),
            ({"channel": "a", "data": 1, "uuid": "nope"}, "uuid: expected a UUID, got 'nope'"),
            ({"channel": "a", "data": 1, "uuid": 7}, "uuid: expected a string, got a number"),
            ({"channel": "a", "data": 1, "extra": 1}, "unknown parameter: extra"),
        ):
            status, message = await error(running, "/publish", body)
            assert status == 400 and message.startswith(said), (body, message)
        for body, said in (
            ({"data": 1}, "channels is required"),
            ({"channels": [], "data": 1}, "channels must not be empty"),
            ({"channels": "a", "data": 1}, "channels: expected an array of strings, got a string"),
            ({"channels": ["a", 1], "data": 1}, "channels[1]: expected a string, got a number"),
            ({"channels": ["a", ""], "data": 1}, "channels[1] must not be empty"),
            ({"channels": ["a"] * 10_001, "data": 1}, "channels: at most 10000 per broadcast, got 10001"),
        ):
            assert await error(running, "/broadcast", body) == (400, said), body


async def test_broadcast_publishes_to_each_channel() -> None:
    async with app() as running, connect(running.server.url) as sub:
        await sub.sub("a")
        await sub.sub("b")
        result = await ok(running, "/broadcast", {"channels": ["a", "b", "c"], "data": {"x": 1}})
        assert [list(r) for r in result["responses"]] == [["result"]] * 3
        uuids = [r["result"]["uuid"] for r in result["responses"]]
        assert len(set(uuids)) == 3
        got = {(e.channel, e.for_uuid) for e in [await sub.next_event(timeout=5) for _ in range(2)]}
        assert got == {("a", uuids[0]), ("b", uuids[1])}


async def test_publish_with_history_gives_offset_and_epoch(redis_url: str) -> None:
    from juggler.channels import ChannelOptions, ChannelRules

    cfg = AppConfig(server=ServerConfig(port=0, log_connections=False), redis=RedisBrokerConfig(url=redis_url),
                    api=ApiConfig(port=0, key=KEY),
                    channels=ChannelRules([ChannelOptions(match="h.*", history_size=5)]))
    running = await start_app(cfg)
    try:
        first = await ok(running, "/publish", {"channel": "h.1", "data": 1})
        second = await ok(running, "/publish", {"channel": "h.1", "data": 2})
        assert second["offset"] == first["offset"] + 1 and second["epoch"] == first["epoch"]
        plain = await ok(running, "/publish", {"channel": "other", "data": 1})
        assert "offset" not in plain and "epoch" not in plain
    finally:
        await running.drain()


# disconnect and unsubscribe (one server) -------------------------------------------------------------


async def test_disconnect_by_client_and_by_user() -> None:
    async with app(auth=True) as running, AsyncExitStack() as stack:
        url = running.server.url
        alice1 = await stack.enter_async_context(connect(url + "?token=" + token("alice")))
        alice2 = await stack.enter_async_context(connect(url + "?token=" + token("alice")))
        bob = await stack.enter_async_context(connect(url + "?token=" + token("bob")))
        info = (await ok(running, "/info"))["nodes"][0]
        assert (info["connections"], info["users"]) == (3, 2)
        result = await ok(running, "/disconnect", {"client": conn_of(running, alice1).id.upper(), "code": 4001,
                                                   "reason": "kicked"})
        assert result == {"disconnected": 1}
        assert await closed_with(alice1) == (4001, "kicked")
        assert not alice2.closed and not bob.closed
        assert await ok(running, "/disconnect", {"user": "alice"}) == {"disconnected": 1}
        assert await closed_with(alice2) == (4000, "")
        assert await ok(running, "/disconnect", {"user": "carol"}) == {"disconnected": 0}
        # both given: both must match
        bob_id = conn_of(running, bob).id
        assert await ok(running, "/disconnect", {"user": "alice", "client": bob_id}) == {"disconnected": 0}
        assert await ok(running, "/disconnect", {"user": "bob", "client": bob_id, "code": 1000}) == {"disconnected": 1}
        assert await closed_with(bob) == (1000, "")


async def test_disconnect_validation() -> None:
    async with app() as running:
        uid = rustext.new_uuid()
        for body, said in (
            ({}, "client or user is required (a connection id, a user, or both)"),
            ({"user": ""}, "user must not be empty"),
            ({"client": "x"}, "client: expected a UUID, got 'x'"),
            ({"client": uid, "code": 999}, "code must be 1000 or in 3000..4999, got 999"),
            ({"client": uid, "code": 1001}, "code must be 1000 or in 3000..4999, got 1001"),
            ({"client": uid, "code": 5000}, "code must be 1000 or in 3000..4999, got 5000"),
            ({"client": uid, "code": 4000.5}, "code: expected an integer, got a number"),
            ({"client": uid, "code": True}, "code: expected an integer, got a boolean"),
            ({"client": uid, "reason": "é" * 62},
             "reason: at most 123 bytes of UTF-8 (a websocket close frame's limit)"),
            ({"client": uid, "reason": 1}, "reason: expected a string, got a number"),
        ):
            assert await error(running, "/disconnect", body) == (400, said), body
        assert await ok(running, "/disconnect", {"client": uid, "reason": "é" * 61}) == {"disconnected": 0}


async def test_unsubscribe_channel_or_pattern_of_matching_connections() -> None:
    async with app(auth=True) as running, AsyncExitStack() as stack:
        url = running.server.url
        alice = await stack.enter_async_context(connect(url + "?token=" + token("alice")))
        bob = await stack.enter_async_context(connect(url + "?token=" + token("bob")))
        for c in (alice, bob):
            await c.sub("room")
            await c.sub("room*", pattern=True)
        assert await ok(running, "/unsubscribe", {"channel": "room", "user": "alice"}) == {"unsubscribed": 1}
        channels = await ok(running, "/channels")
        assert channels == {"channels": {"room": {"subscribers": 1}}, "patterns": {"room*": {"subscribers": 2}}}
        await ok(running, "/publish", {"channel": "room", "data": 1})
        # alice gets it through her pattern only, bob through both
        event = await alice.next_event(timeout=5)
        assert event.pattern == "room*"
        assert {(await bob.next_event(timeout=5)).pattern for _ in range(2)} == {None, "room*"}
        # nobody named: every subscriber of it
        assert await ok(running, "/unsubscribe", {"channel": "room*", "pattern": True}) == {"unsubscribed": 2}
        assert await ok(running, "/unsubscribe", {"channel": "room*", "pattern": True}) == {"unsubscribed": 0}
        assert await ok(running, "/channels") == {"channels": {"room": {"subscribers": 1}}, "patterns": {}}
        # the connection stays usable, and may subscribe again
        await alice.sub("room")
        assert (await ok(running, "/channels"))["channels"] == {"room": {"subscribers": 2}}
        for body, said in (({}, "channel is required"), ({"channel": ""}, "channel must not be empty"),
                           ({"channel": "a", "pattern": "yes"}, "pattern: expected true or false, got a string"),
                           ({"channel": "a", "client": "x"}, "client: expected a UUID, got 'x'")):
            assert await error(running, "/unsubscribe", body) == (400, said), body


async def test_channels_and_their_filter() -> None:
    async with app() as running, connect(running.server.url) as a, connect(running.server.url) as b:
        for c in (a, b):
            await c.sub("chat.1")
        await a.sub("chat.2")
        await a.sub("news")
        await b.sub("chat.*", pattern=True)
        assert await ok(running, "/channels") == {
            "channels": {"chat.1": {"subscribers": 2}, "chat.2": {"subscribers": 1}, "news": {"subscribers": 1}},
            "patterns": {"chat.*": {"subscribers": 1}},
        }
        assert await ok(running, "/channels", {"pattern": "chat.[1]"}) == {
            "channels": {"chat.1": {"subscribers": 2}}, "patterns": {}}
        assert (await ok(running, "/channels", {"pattern": "*"}))["patterns"] == {"chat.*": {"subscribers": 1}}
        assert await error(running, "/channels", {"pattern": "x" * 257}) == (400, "pattern: at most 256 characters")
        assert await error(running, "/channels", {"pattern": 1}) == (400, "pattern: expected a string, got a number")


async def test_info_of_one_server() -> None:
    async with app() as running, connect(running.server.url) as c:
        await c.sub("x")
        (node,) = (await ok(running, "/info"))["nodes"]
        assert set(node) == {"id", "name", "version", "uptime", "connections", "users", "subscriptions", "channels"}
        assert node["name"].endswith(f":{running.server.port}")
        assert (node["connections"], node["users"], node["subscriptions"], node["channels"]) == (1, 0, 1, 1)
        assert node["uptime"] >= 0 and node["version"]


# hostile bodies ---------------------------------------------------------------------------------------

UID = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
HOSTILE: list[tuple[str, bytes]] = [
    ("/publish", b'{"channel": ["' + b"x" * 500_000 + b'"], "data": 1}'),
    ("/publish", b'{"channel": {"a": {"b": {}}}, "data": 1}'),
    ("/publish", b'{"channel": "a", "data": ' + b"[" * 600 + b"]" * 600 + b"}"),
    ("/publish", b'{"channel": "a", "data": ' + b'{"a":' * 600 + b"1" + b"}" * 600 + b"}"),
    ("/publish", b'{"channel": "a", "data": NaN}'),
    ("/publish", b'{"channel": "a", "data": Infinity}'),
    ("/publish", b'{"channel": 1e999, "data": 1}'),
    ("/publish", b'{"channel": "a", "channel": "b", "data": 1}'),
    ("/publish", b'{"channel": "\\ud800", "data": 1}'),
    ("/publish", b'{"channel": "a", "data": 1, "uuid": "' + b"f" * 300_000 + b'"}'),
    ("/publish", b'{"channel": "a", "data": 1,}'),
    ("/publish", b'{"channel": "a" "data": 1}'),
    ("/publish", b"{'channel': 'a'}"),
    ("/publish", b'\xef\xbb\xbf{"channel": "a", "data": 1}'),
    ("/publish", b'{"channel": "a", "data": 1}\x00'),
    ("/publish", b'{"channel": "a\xff", "data": 1}'),
    ("/publish", b'{"' + b"k" * 100_000 + b'": 1}'),
    ("/publish", b"{" + b",".join(b'"k%d":0' % i for i in range(20_000)) + b"}"),
    ("/broadcast", b'{"channels": [' + b",".join([b"1"] * 50_000) + b'], "data": 1}'),
    ("/broadcast", b'{"channels": ' + b"[" * 500 + b"]" * 500 + b', "data": 1}'),
    ("/disconnect", b'{"client": "' + UID.encode() + b'", "code": 100000000000000000000000000000}'),
    ("/disconnect", b'{"client": "' + UID.encode() + b'", "code": -1}'),
    ("/disconnect", b'{"client": "' + UID.encode() + b'", "code": "4000"}'),
    ("/disconnect", b'{"user": "alice", "reason": "' + b"r" * 200_000 + b'"}'),
    ("/disconnect", b'{"user": ["alice"]}'),
    ("/disconnect", b'{"user": null, "client": null}'),
    ("/unsubscribe", b'{"channel": "a", "pattern": 1}'),
    ("/unsubscribe", b'{"channel": "a", "pattern": null, "user": {"$ne": 1}}'),
    ("/channels", b'{"pattern": "' + b"*a" * 1000 + b'b"}'),
    ("/channels", b'{"pattern": ["*"]}'),
    ("", b'{"method": "' + b"m" * 100_000 + b'", "params": {}}'),
    ("", b'{"method": "publish", "params": "' + b"p" * 100_000 + b'"}'),
    ("", b'{"method": ["publish"]}'),
    ("", b'{"method": "publish", "params": {"channel": "a", "data": 1}, "method": "info"}'),
]


async def test_hostile_bodies_get_400_and_the_api_keeps_serving() -> None:
    async with app(max_body=1 << 20) as running, connect(running.server.url) as sub:
        await sub.sub("a")
        for path, body in HOSTILE:
            status, answer = await post(running, path, data=body)
            assert status in (400, 404), (path, body[:80], answer)
            assert answer["error"]["code"] == status
            assert len(answer["error"]["message"]) < 300, (path, body[:80])
        # nothing got through, and both the API and the websocket server still serve
        result = await ok(running, "/publish", {"channel": "a", "data": "after"})
        event = await sub.next_event(timeout=5)
        assert (event.for_uuid, event.args) == (result["uuid"], "after")
        # deep, but within the 512 levels any juggler message may have: fine
        deep = b'{"channel": "a", "data": ' + b"[" * 500 + b"]" * 500 + b"}"
        status, _ = await post(running, "/publish", data=deep)
        assert status == 200
        assert (await sub.next_event(timeout=5)).for_uuid != result["uuid"]


# several servers: one Redis, a Redis Cluster ------------------------------------------------------------


async def both_know_each_other(*apps: Running) -> None:
    await wait_until(lambda: all(len(r.control.nodes()) == len(apps) for r in apps), timeout=10,
                     what="the servers to know each other")


async def test_two_servers_over_one_redis(redis_url: str) -> None:
    redis_cfg = RedisBrokerConfig(url=redis_url)
    async with app(redis=redis_cfg, auth=True) as a, AsyncExitStack() as stack:
        # b serves no API of its own: the control plane still reaches it
        b = await stack.enter_async_context(app(redis=redis_cfg, auth=True, api=False))
        assert b.api is None and b.control is not None
        await both_know_each_other(a, b)
        on_a = await stack.enter_async_context(connect(a.server.url + "?token=" + token("alice")))
        on_b = await stack.enter_async_context(connect(b.server.url + "?token=" + token("alice")))
        bob = await stack.enter_async_context(connect(b.server.url + "?token=" + token("bob")))
        for c in (on_a, on_b, bob):
            await c.sub("room")
        await on_b.sub("room.*", pattern=True)

        info = await ok(a, "/info")
        assert "missing_nodes" not in info
        by_name = {n["name"]: n for n in info["nodes"]}
        assert set(by_name) == {a.control.node["name"], b.control.node["name"]}
        assert info["nodes"][0]["id"] == a.control.id  # the server answering first
        node_b = by_name[b.control.node["name"]]
        assert (node_b["connections"], node_b["users"], node_b["subscriptions"], node_b["channels"]) == (2, 2, 3, 2)

        assert await ok(a, "/channels") == {"channels": {"room": {"subscribers": 3}},
                                            "patterns": {"room.*": {"subscribers": 1}}}
        # a message published through a's API reaches subscribers on both servers
        result = await ok(a, "/publish", {"channel": "room", "data": "hi"})
        for c in (on_a, on_b, bob):
            assert (await c.next_event(timeout=5)).for_uuid == result["uuid"]

        assert await ok(a, "/unsubscribe", {"channel": "room", "user": "alice"}) == {"unsubscribed": 2}
        assert (await ok(a, "/channels"))["channels"] == {"room": {"subscribers": 1}}

        # alice is disconnected from both servers
        assert await ok(a, "/disconnect", {"user": "alice", "code": 4003, "reason": "banned"}) == {"disconnected": 2}
        assert await closed_with(on_a) == (4003, "banned")
        assert await closed_with(on_b) == (4003, "banned")
        assert not bob.closed
        # by connection id, on the other server
        bob_id = conn_of(b, bob).id
        assert await ok(a, "/disconnect", {"client": bob_id}) == {"disconnected": 1}
        assert await closed_with(bob) == (4000, "")

        # a server that leaves is forgotten at once
        await stack.aclose()
        await wait_until(lambda: len(a.control.nodes()) == 1, timeout=5, what="b to leave")
        assert [n["id"] for n in (await ok(a, "/info"))["nodes"]] == [a.control.id]


async def test_a_silent_server_is_named_missing_then_forgotten(redis_url: str) -> None:
    """A server that stopped without leaving (crashed): requests wait for it
    up to survey_timeout and name it; once its heartbeats are overdue it is
    forgotten."""
    async with app(redis=RedisBrokerConfig(url=redis_url), survey_timeout=0.5) as running:
        ghost = {"id": rustext.new_uuid(), "name": "ghost:1", "version": "0"}
        r = aioredis.from_url(redis_url)
        try:
            await r.execute_command("SPUBLISH", BROADCAST, encode_message("heartbeat", ghost))
        finally:
            await r.aclose()
        await wait_until(lambda: len(running.control.nodes()) == 2, what="the ghost's heartbeat")
        t0 = time.monotonic()
        info = await ok(running, "/info")
        assert 0.4 < time.monotonic() - t0 < 5
        assert info["missing_nodes"] == ["ghost:1"] and len(info["nodes"]) == 1
        assert (await ok(running, "/disconnect", {"user": "x"}))["missing_nodes"] == ["ghost:1"]
        # three heartbeat periods later
        await wait_until(lambda: len(running.control.nodes()) == 1, timeout=3 * running.control.heartbeat_interval + 5,
                         interval=0.2, what="the ghost to be forgotten")
        assert "missing_nodes" not in await ok(running, "/info")


async def test_control_messages_cannot_be_forged_by_clients(redis_url: str) -> None:
    """A juggler client publishing on the control channel's name (classic
    pub-sub), or anything malformed on the shard channel itself, changes nothing."""
    async with app(redis=RedisBrokerConfig(url=redis_url), auth=True) as running, \
            connect(running.server.url + "?token=" + token("alice")) as alice:
        forged = encode_message("request", {"id": rustext.new_uuid(), "name": "evil"}, id=rustext.new_uuid(),
                                op="disconnect", params={"user": "alice", "code": 4000, "reason": ""})
        await alice.sub("{juggler.control}")  # what a client can see of it: nothing of the control plane
        await alice.pub(BROADCAST, json.loads(forged))
        await alice.pub(inbox(running.control.id), json.loads(forged))
        assert (await alice.next_event(timeout=5)).channel == BROADCAST  # its own message, as any channel
        r = aioredis.from_url(redis_url)
        try:
            assert await r.execute_command("PUBLISH", BROADCAST, forged) == 1  # alice's subscription only
            for junk in (b"", b"{", b"[]", b'{"v":1}', b'{"v":2,"type":"request"}', b"\xff" * 10,
                         encode_message("reply", {"id": "x"}, id="nobody-asked", result={})):
                await r.execute_command("SPUBLISH", BROADCAST, junk)
        finally:
            await r.aclose()
        node = (await ok(running, "/info"))["nodes"][0]
        assert node["connections"] == 1 and not alice.closed


async def test_two_servers_over_a_redis_cluster(cluster_seeds: str) -> None:
    cluster = RedisBrokerConfig(cluster=tuple(cluster_seeds.split(",")))
    async with app(redis=cluster, auth=True) as a, app(redis=cluster, auth=True) as b:
        await both_know_each_other(a, b)
        async with connect(a.server.url + "?token=" + token("alice")) as on_a, \
                connect(b.server.url + "?token=" + token("alice")) as on_b:
            await on_b.sub("c")
            info = await ok(b, "/info")
            assert sorted(n["connections"] for n in info["nodes"]) == [1, 1]
            assert (await ok(a, "/channels"))["channels"] == {"c": {"subscribers": 1}}
            assert await ok(b, "/disconnect", {"user": "alice"}) == {"disconnected": 2}
            assert (await closed_with(on_a))[0] == (await closed_with(on_b))[0] == 4000


# lifecycle --------------------------------------------------------------------------------------------


async def test_drain_closes_the_api_listener() -> None:
    running = await start_app(AppConfig(server=ServerConfig(port=0), api=ApiConfig(port=0, key=KEY)))
    url = running.api.url
    await ok(url, "/info")
    await running.drain()
    await running.drain()  # idempotent
    with pytest.raises(aiohttp.ClientConnectionError):
        await post(url, "/info", {})


async def test_a_busy_api_port_fails_the_start_and_closes_the_rest() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ws_port = free_port()
        from rustext.net import ListenError

        with pytest.raises(ListenError, match=f"cannot listen on 127.0.0.1:{port}: address already in use"):
            await start_app(AppConfig(server=ServerConfig(port=ws_port), api=ApiConfig(port=port, key=KEY)))
    # the websocket server it had started is closed again
    with socket.socket() as s:
        s.bind(("127.0.0.1", ws_port))


async def test_abort_cuts_a_request_in_flight_short(redis_url: str) -> None:
    """A request waiting for a server that does not answer: a drain waits for
    it, an abort (the second Ctrl-C) ends it at once."""
    running = await start_app(AppConfig(server=ServerConfig(port=0, log_connections=False),
                                        redis=RedisBrokerConfig(url=redis_url),
                                        api=ApiConfig(port=0, key=KEY, survey_timeout=30)))
    try:
        r = aioredis.from_url(redis_url)
        try:
            ghost = {"id": rustext.new_uuid(), "name": "ghost:1"}
            await r.execute_command("SPUBLISH", BROADCAST, encode_message("heartbeat", ghost))
        finally:
            await r.aclose()
        await wait_until(lambda: len(running.control.nodes()) == 2, what="the ghost's heartbeat")
        request = asyncio.ensure_future(post(running, "/info", {}))
        await wait_until(lambda: running.api._inflight, what="the request to be in flight")
        drain = asyncio.ensure_future(running.drain())
        done, _ = await asyncio.wait([drain], timeout=0.3)
        assert not done  # the drain waits for the request
        t0 = time.monotonic()
        running.abort()
        await asyncio.wait_for(drain, 10)
        assert time.monotonic() - t0 < 5
        with pytest.raises(aiohttp.ClientError):
            await request
    finally:
        await running.drain()


async def test_an_unreachable_broker_is_503() -> None:
    from tests.netutil import start_redis

    redis_server = start_redis()
    try:
        running = await start_app(AppConfig(server=ServerConfig(port=0, log_connections=False),
                                            redis=RedisBrokerConfig(url=redis_server.url, connect_timeout=1.0),
                                            api=ApiConfig(port=0, key=KEY)))
    except BaseException:
        redis_server.stop()
        raise
    try:
        await ok(running, "/publish", {"channel": "a", "data": 1})
        redis_server.stop()
        status, message = await error(running, "/publish", {"channel": "a", "data": 1})
        assert status == 503 and message.startswith("broker unavailable: "), message
        result = await ok(running, "/broadcast", {"channels": ["a", "b"], "data": 1})
        assert [r["error"]["code"] for r in result["responses"]] == [503, 503]
        # the other servers cannot be reached either: no answer rather than a partial one
        status, message = await error(running, "/info", {})
        assert status == 503 and message.startswith("cannot reach the other servers: "), message
    finally:
        await running.drain()


# the control plane's parts (no sockets) ----------------------------------------------------------------


def test_node_registry_expires_silent_nodes() -> None:
    reg = NodeRegistry(ttl=6.0)
    assert reg.seen({"id": "a", "name": "A", "version": "1", "extra": 1}, now=100.0)
    assert not reg.seen({"id": "a", "name": "A", "version": "1"}, now=103.0)
    assert reg.seen({"id": "b"}, now=104.0)
    assert reg.live(now=108.9) == {"a": {"id": "a", "name": "A", "version": "1"}, "b": {"id": "b"}}
    assert list(reg.live(now=109.0)) == ["b"]
    reg.leave("b")
    assert reg.live(now=109.0) == {} and len(reg) == 0


def test_control_messages_round_trip_and_junk_is_refused() -> None:
    node = {"id": "n1", "name": "h:1", "version": "0.1"}
    msg = decode_message(encode_message("request", node, id="r1", op="info", params={}))
    assert msg == {"v": 1, "type": "request", "node": node, "id": "r1", "op": "info", "params": {}}
    assert decode_message(encode_message("reply", node, id="r1", error="boom"))["error"] == "boom"
    for junk in (b"", b"[]", b"null", b'{"v":1,"type":"heartbeat"}', b'{"v":2,"type":"heartbeat","node":{"id":"x"}}',
                 b'{"v":1,"type":"nope","node":{"id":"x"}}', b'{"v":1,"type":"heartbeat","node":{"id":""}}',
                 b'{"v":1,"type":"heartbeat","node":{"id":"x","name":1}}',
                 b'{"v":1,"type":"request","node":{"id":"x"},"id":"r","op":1}',
                 b'{"v":1,"type":"request","node":{"id":"x"},"id":"r","op":"info","params":[]}',
                 b'{"v":1,"type":"reply","node":{"id":"x"},"id":"r"}',
                 b'{"v":1,"type":"reply","node":{"id":"x"},"id":"r","error":{}}',
                 b"[" * 100_000):
        assert decode_message(junk) is None, junk


@pytest.mark.parametrize("pattern", ["*", "a*", "*a", "a?c", "a[bc]d", "a[^bc]d", "a[b-d]*", "a\\*", "[z-a]",
                                     "*.*.*", "h*llo", "[abc", "a[\\]]b", "", "é*", "?", "**a**"])
def test_glob_filter_agrees_with_redis_globs(pattern: str) -> None:
    names = ["", "a", "abc", "abd", "aed", "acd", "a*", "aXd", "hello", "hllo", "heeello", "x.y.z", "x.y",
             "éa", "ab", "a]b", "z", "b", "[abc", "aa"]
    match = glob_filter(pattern)
    for name in names:
        assert match(name) == glob_match(pattern, name), (pattern, name)


@settings(max_examples=400, deadline=None)
@given(st.text("ab*?[]^-\\", max_size=8).filter(lambda p: p.count("*") <= 3), st.text("ab]-^\\", max_size=10))
def test_glob_filter_agrees_with_redis_globs_on_random_input(pattern: str, name: str) -> None:
    assert glob_filter(pattern)(name) == glob_match(pattern, name)


def test_glob_filter_takes_linear_time_on_hostile_patterns() -> None:
    match = glob_filter("*a" * 100 + "b")
    t0 = time.process_time()
    assert not match("a" * 2000)
    assert time.process_time() - t0 < 2.0


# the CLI ----------------------------------------------------------------------------------------------


def juggler(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False)


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def stop(p: subprocess.Popen[str]) -> tuple[int, str]:
    if p.poll() is None:
        p.terminate()
    try:
        out, _ = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate(timeout=5)
    return p.returncode, out


async def test_cli_server_flags_and_environment_key() -> None:
    port, api_port = free_port(), free_port()
    p = start("server", "--listen", f"127.0.0.1:{port}", "--api", f"127.0.0.1:{api_port}",
              env={"JUGGLER_API_KEY": KEY})
    try:
        await asyncio.to_thread(wait_for_port, api_port, 30, p)
        url = f"http://127.0.0.1:{api_port}/api"
        (node,) = (await ok(url, "/info"))["nodes"]
        assert node["name"].endswith(f":{port}")
        assert (await error(url, "/info", {}, headers={"X-API-Key": "nope"}))[0] == 401
    finally:
        code, out = stop(p)
    assert code == 0, out
    assert f"server API on http://127.0.0.1:{api_port}/api" in out


async def test_cli_up_flag_key_and_insecure() -> None:
    port, api_port = free_port(), free_port()
    p = start("up", "--listen", f"127.0.0.1:{port}", "--api", f"127.0.0.1:{api_port}", "--api-key", "flag-key")
    try:
        await asyncio.to_thread(wait_for_port, api_port, 30, p)
        status, _ = await post(f"http://127.0.0.1:{api_port}/api", "/info", {},
                               headers={"Authorization": "apikey flag-key"})
        assert status == 200
    finally:
        code, out = stop(p)
    assert code == 0, out
    port, api_port = free_port(), free_port()
    p = start("server", "--listen", f"127.0.0.1:{port}", "--api", f"127.0.0.1:{api_port}", "--api-insecure",
              env={"JUGGLER_API_KEY": KEY})
    try:
        await asyncio.to_thread(wait_for_port, api_port, 30, p)
        status, _ = await post(f"http://127.0.0.1:{api_port}/api", "/info", {}, headers={})
        assert status == 200
    finally:
        code, out = stop(p)
    assert code == 0 and "accepts requests without a key" in out, out


def test_cli_api_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {"JUGGLER_API_KEY": ""}
    port = free_port()
    cases = [
        (["server", "--api", f"127.0.0.1:{port}"], "juggler server: the server API needs a key: --api-key KEY"),
        (["server", "--api-key", "k"], "juggler server: --api-key needs --api HOST:PORT"),
        (["server", "--api-insecure"], "juggler server: --api-insecure needs --api HOST:PORT"),
        (["up", "--api", "127.0.0.1:1", "--api-key", "k", "--api-insecure"],
         "juggler up: --api-key and --api-insecure exclude each other"),
        (["server", "--api", "127.0.0.1:x", "--api-key", "k"], "juggler server: invalid port in '127.0.0.1:x'"),
        (["server", "--api", f"127.0.0.1:{port}", "--api-key", "a key"],
         "juggler server: api key must be visible ASCII characters without spaces"),
    ]
    for args, said in cases:
        out = juggler(*args, env=env)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.strip().splitlines() == [said] or out.stderr.strip().startswith(said), (args, out.stderr)
        assert "Traceback" not in out.stderr
    cfg = tmp_path / "j.toml"
    cfg.write_text(f'[server]\nlisten = "127.0.0.1:{free_port()}"\n[api]\nlisten = "127.0.0.1:{port}"\n')
    out = juggler("server", "--config", str(cfg), env=env)
    assert out.returncode == 2 and "the server API needs a key" in out.stderr


def test_cli_busy_api_port_is_one_line_exit_2() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = juggler("server", "--listen", f"127.0.0.1:{free_port()}", "--api", f"127.0.0.1:{port}",
                      "--api-key", KEY)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"juggler server: cannot listen on 127.0.0.1:{port}: address already in use")
    assert "Traceback" not in out.stderr


def test_cli_help_names_the_api_flags() -> None:
    out = juggler("server", "--help")
    assert "--api HOST:PORT" in out.stdout and "--api-key KEY" in out.stdout and "--api-insecure" in out.stdout
    assert "JUGGLER_API_KEY" in out.stdout



async def test_history_method(redis_url: str) -> None:
    """history: a channel's kept publications after an offset; 400 where it keeps none."""
    import aiohttp

    from juggler.channels import ChannelOptions, ChannelRules
    from juggler.config import ApiConfig, AppConfig, ServerConfig
    from juggler.broker.redis import RedisBrokerConfig
    from juggler.runner import start_app

    config = AppConfig(server=ServerConfig(port=0), redis=RedisBrokerConfig(url=redis_url),
                       api=ApiConfig(port=0, key="k3y"),
                       channels=ChannelRules([ChannelOptions(match="h.*", history_size=3)]))
    running = await start_app(config)
    try:
        base = f"http://127.0.0.1:{running.api.port}/api/"
        headers = {"X-API-Key": "k3y"}
        async with aiohttp.ClientSession(headers=headers) as http:
            for i in range(5):
                async with http.post(base + "publish", json={"channel": "h.a", "data": {"i": i}}) as r:
                    assert (await r.json())["result"]["offset"] == i + 1
            async with http.post(base + "history", json={"channel": "h.a", "after": 3}) as r:
                res = (await r.json())["result"]
            assert [(p["offset"], p["data"]) for p in res["publications"]] == [(4, {"i": 3}), (5, {"i": 4})]
            assert res["offset"] == 5 and res["epoch"]
            async with http.post(base + "history", json={"channel": "h.a", "limit": 1}) as r:
                assert [p["offset"] for p in (await r.json())["result"]["publications"]] == [3]  # size 3 kept
            for body, status in (({"channel": "plain"}, 400), ({"channel": "h.a", "after": -1}, 400),
                                 ({"channel": "h.a", "limit": "x"}, 400), ({"channel": ""}, 400)):
                async with http.post(base + "history", json=body) as r:
                    assert r.status == status, body
    finally:
        await running.drain()
