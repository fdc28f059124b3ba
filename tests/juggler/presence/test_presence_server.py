"""Presence and join/leave end to end: real servers (in-memory broker, a real
Redis, a real Redis Cluster; two servers sharing one), the Python client and
raw websocket frames. Clients that do not ask never see a notice."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import jwt
import pytest
import redis.asyncio as aredis
from presence_helpers import make_broker
from websockets.asyncio.client import connect as ws_connect

import rustext
from juggler.auth import Auth, AuthConfig
from juggler.channels import ChannelOptions, ChannelRules
from juggler.client import Client, ClientEvent, connect
from juggler.config import ServerConfig
from juggler.errors import CallNacked
from juggler.presence import Presence
from juggler.server import Server
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)

RULES = ChannelRules([
    ChannelOptions(match="chat.*", presence=True, join_leave=True),
    ChannelOptions(match="quiet.*", presence=True),
])
SECRET = "a-test-secret-of-at-least-32-bytes-for-hs256"


@contextlib.asynccontextmanager
async def serving(kind: str, request: pytest.FixtureRequest, *, auth: Any = None) -> AsyncIterator[Server]:
    """A started server with presence on a broker of its own (as a separate process would have)."""
    broker = await make_broker(kind, request)
    presence = Presence(broker, RULES)
    await presence.start()
    server = Server(broker, ServerConfig(port=0), channels=RULES, presence=presence, auth=auth)
    try:
        await server.start()
        yield server
    finally:
        await server.aclose()
        await presence.aclose()
        await broker.aclose()


@contextlib.asynccontextmanager
async def two_servers(kind: str, request: pytest.FixtureRequest) -> AsyncIterator[tuple[Server, Server]]:
    """Two servers sharing a Redis (in memory: one server, twice)."""
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(serving(kind, request))
        b = a if kind == "memory" else await stack.enter_async_context(serving(kind, request))
        yield a, b


async def notice(client: Client) -> ClientEvent:
    ev = await client.next_event(timeout=10)
    assert ev.join is not None or ev.leave is not None, ev
    assert ev.args is None and ev.for_uuid == ""
    return ev


def ids(server: Server) -> set[str]:
    return {c.id for c in server.conns}


@pytest.mark.parametrize("kind", ["memory", "redis", "cluster"])
async def test_join_and_leave_reach_only_the_subscribers_that_asked(kind: str, request: pytest.FixtureRequest) -> None:
    async with two_servers(kind, request) as (sa, sb), connect(sa.url) as watcher, connect(sb.url) as plain, \
            connect(sb.url) as patterned:
        await watcher.sub("chat.1", join_leave=True)
        ev = await notice(watcher)  # its own join
        me = ev.join["client"]
        assert me in ids(sa) and ev.channel == "chat.1" and ev.join == {"client": me, "user": None}

        await patterned.sub("chat.*", pattern=True)  # patterns have no presence and no notices
        await plain.sub("chat.1")  # an original client: joins, asks for nothing
        ev = await notice(watcher)
        plain_id = ev.join["client"]
        assert plain_id in ids(sb) and ev.join == {"client": plain_id, "user": None}
        assert sorted(await sa.presence.members("chat.1")) == sorted([me, plain_id])
        assert await sb.presence.stats("chat.1") == {"clients": 2, "users": 0}

        await plain.sub("chat.1")  # twice counts once: no second join
        await plain.unsb("chat.1")
        ev = await notice(watcher)
        assert ev.leave == {"client": plain_id, "user": None}
        assert list(await sb.presence.members("chat.1")) == [me]

        async with connect(sb.url) as brief:
            await brief.sub("chat.1", join_leave=True)
            joined = (await notice(watcher)).join
            assert (await notice(brief)).join == joined  # its own
        ev = await notice(watcher)  # its connection closed
        assert ev.leave == joined
        assert list(await sa.presence.members("chat.1")) == [me]

        # the first events the others get are publications: no notice came before
        await plain.sub("chat.1")
        assert (await notice(watcher)).join["client"] == plain_id
        await watcher.pub("chat.1", {"n": 1})
        for c in (plain, patterned):
            ev = await c.next_event(timeout=10)
            assert (ev.args, ev.join, ev.leave) == ({"n": 1}, None, None)
        ev = await watcher.next_event(timeout=10)
        assert ev.args == {"n": 1} and ev.join is None


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_join_leave_refused_where_the_channel_sends_none(kind: str, request: pytest.FixtureRequest) -> None:
    async with serving(kind, request) as server, connect(server.url) as c:
        for channel, pattern in (("quiet.1", False), ("other", False), ("chat.*", True)):
            with pytest.raises(CallNacked) as info:
                await c.sub(channel, pattern=pattern, join_leave=True)
            assert info.value.code == 400
        await c.sub("quiet.1")  # presence without notices: an entry all the same
        assert list(await server.presence.members("quiet.1")) == [c_id for c_id in ids(server)]
        with pytest.raises(TimeoutError):
            await c.next_event(timeout=0.3)


async def test_the_notice_frames_on_the_wire(redis_url: str, request: pytest.FixtureRequest) -> None:
    async with serving("redis", request) as server, ws_connect(server.url, subprotocols=["juggler.0"]) as raw:
        uuid = rustext.new_uuid()
        await raw.send(rustext.build_sub(uuid, "chat.wire", join_leave=True).decode())
        frames = [json.loads(await asyncio.wait_for(raw.recv(), 10)) for _ in range(2)]
        (me,) = ids(server)
        kinds = sorted(f["meta"]["type"] for f in frames)
        assert kinds == [8, 10]  # the ACK and its own join, in either order
        evnt = next(f for f in frames if f["meta"]["type"] == 10)
        assert evnt["payload"] == {"channel": "chat.wire", "join": {"client": me, "user": None}}
        assert rustext.canonical_uuid(evnt["meta"]["uuid"]) == evnt["meta"]["uuid"] != uuid
        async with connect(server.url) as other:
            await other.sub("chat.wire")
            text = await asyncio.wait_for(raw.recv(), 10)
            other_id = next(i for i in ids(server) if i != me)
            assert text.endswith("\n")
            assert json.loads(text)["payload"] == {"channel": "chat.wire", "join": {"client": other_id, "user": None}}
            m = rustext.parse_server_message(text)
            assert m.type == rustext.EVNT and m.channel == "chat.wire" and m.for_uuid == "" and m.args is None
            assert json.loads(m.join) == {"client": other_id, "user": None}


async def test_redis_classic_subscribers_never_see_notices(redis_url: str, request: pytest.FixtureRequest) -> None:
    """What an original Go server sharing the Redis would subscribe to (any
    channel, any pattern) carries the publications only."""
    r = aredis.Redis.from_url(redis_url)
    classic = r.pubsub()
    try:
        await classic.psubscribe("*")
        async with serving("redis", request) as server, connect(server.url) as a, connect(server.url) as b:
            await a.sub("chat.2", join_leave=True)
            await b.sub("chat.2", join_leave=True)
            await b.unsb("chat.2")
            for _ in range(3):  # a's own join, b's join and leave
                await notice(a)
            await a.pub("chat.2", "hello")
        seen = []
        async with asyncio.timeout(10):
            while not seen:
                m = await classic.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if m is not None:
                    seen.append(m)
        assert [(m["channel"], json.loads(m["data"])["args"]) for m in seen] == [(b"chat.2", "hello")]
        assert await classic.get_message(ignore_subscribe_messages=True, timeout=0.2) is None
    finally:
        await classic.aclose()
        await r.aclose()


def token(sub: str, **claims: Any) -> str:
    return jwt.encode({"sub": sub, "exp": time.time() + 600, **claims}, SECRET, algorithm="HS256")


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_users_come_from_the_tokens(kind: str, request: pytest.FixtureRequest) -> None:
    auth = Auth(AuthConfig(jwt_secret=SECRET))
    await auth.start()
    try:
        async with serving(kind, request, auth=auth) as server:
            url = server.url + "?token="
            async with connect(url + token("alice", info={"name": "Alice"})) as a1, \
                    connect(url + token("alice")) as a2, connect(url + token("bob")) as b:
                await a1.sub("chat.users", join_leave=True)
                assert (await notice(a1)).join["conn_info"] == {"name": "Alice"}
                await a2.sub("chat.users")
                await b.sub("chat.users")
                joins = [(await notice(a1)).join for _ in range(2)]
                assert [j["user"] for j in joins] == ["alice", "bob"]
                assert "conn_info" not in joins[0]
                assert await server.presence.stats("chat.users") == {"clients": 3, "users": 2}
                members = await server.presence.members("chat.users")
                assert sorted(m["user"] for m in members.values()) == ["alice", "alice", "bob"]
    finally:
        await auth.aclose()


async def test_presence_survives_the_refresh_and_a_server_that_dies(request: pytest.FixtureRequest) -> None:
    """Two servers on one Redis; the second one "dies" (its presence service
    never removes its entries): they expire after presence_ttl, while the
    first server's entries, refreshed, stay."""
    rules = ChannelRules([ChannelOptions(match="*", presence=True, presence_ttl=0.6)])
    brokers = [await make_broker("redis", request) for _ in range(2)]
    services = [Presence(b, rules) for b in brokers]
    servers = [Server(b, ServerConfig(port=0), channels=rules, presence=p) for b, p in zip(brokers, services,
                                                                                          strict=True)]
    try:
        for p, s in zip(services, servers, strict=True):
            await p.start()
            await s.start()
        async with connect(servers[0].url) as alive, connect(servers[1].url) as doomed:
            await alive.sub("room")
            await doomed.sub("room")
            assert len(await services[0].members("room")) == 2
            # the second server dies: no more refresh, no removal
            services[1]._task.cancel()  # type: ignore[union-attr]
            services[1].left = _never  # type: ignore[method-assign]
            services[1].left_all = _never  # type: ignore[method-assign]

            async def one_left() -> bool:
                return len(await services[0].members("room")) == 1

            await wait_until(one_left, timeout=10, interval=0.05)
            assert list(await services[0].members("room")) == list(ids(servers[0]))
    finally:
        for p, s in zip(services, servers, strict=True):
            await s.aclose()
            await p.aclose()
        for b in brokers:
            await b.aclose()


async def _never(*args: Any) -> None:
    return None
