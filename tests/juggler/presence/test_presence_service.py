"""The presence service (juggler/presence/service.py) on the in-memory broker,
a real redis-server and a real Redis Cluster: entries, refresh, expiry of a
crashed server's entries, join/leave notices to the subscribers that asked
(on two services sharing one Redis, as two servers would), broker failures."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest
from presence_helpers import FakeConn, make_broker

from juggler.auth import Identity
from juggler.broker.memory import MemoryBroker
from juggler.broker.redis import RedisBroker, RedisBrokerConfig
from juggler.channels import ChannelOptions, ChannelRules
from juggler.presence import Presence, PresenceDisabled, notice_channel
from tests.netutil import start_redis, wait_until

pytestmark = pytest.mark.timeout(60)

RULES = ChannelRules([
    ChannelOptions(match="chat.*", presence=True, join_leave=True),
    ChannelOptions(match="quiet.*", presence=True),
])


@contextlib.asynccontextmanager
async def two_servers(backend: str, request: pytest.FixtureRequest,
                      rules: ChannelRules = RULES) -> AsyncIterator[tuple[Presence, Presence]]:
    """The presence services of two servers sharing a broker (in memory: one
    process, so one service twice)."""
    brokers = [await make_broker(backend, request)]
    if backend != "memory":
        brokers.append(await make_broker(backend, request))
    services = [Presence(b, rules) for b in brokers]
    try:
        for s in services:
            await s.start()
        yield services[0], services[-1]
    finally:
        for s in services:
            await s.aclose()
        for b in brokers:
            await b.aclose()


def join(conn: FakeConn, channel: str, user: str | None = None) -> dict[str, Any]:
    return {"channel": channel, "join": {"client": conn.id, "user": user}}


def leave(conn: FakeConn, channel: str, user: str | None = None) -> dict[str, Any]:
    return {"channel": channel, "leave": {"client": conn.id, "user": user}}


@pytest.mark.parametrize("backend", ["memory", "redis", "cluster"])
async def test_notices_reach_only_the_subscribers_that_asked(backend: str, request: pytest.FixtureRequest) -> None:
    async with two_servers(backend, request) as (p1, p2):
        a, b, c = FakeConn(), FakeConn(), FakeConn()
        await p1.joined(a, "chat.1", notify=True)
        await wait_until(lambda: a.notices == [join(a, "chat.1")])  # its own join too
        await p2.joined(b, "chat.1", notify=True)  # on the other server
        await p2.joined(c, "chat.1")  # did not ask
        await wait_until(lambda: len(a.notices) == 3 and len(b.notices) == 2)
        assert a.notices == [join(a, "chat.1"), join(b, "chat.1"), join(c, "chat.1")]
        assert b.notices == [join(b, "chat.1"), join(c, "chat.1")]

        await p2.joined(c, "chat.1")  # subscribed twice: counts once, no second join
        await p1.joined(a, "chat.1", notify=True)
        await p2.left(c, "chat.1")
        await wait_until(lambda: len(a.notices) == 4 and len(b.notices) == 3)
        assert a.notices[3] == b.notices[2] == leave(c, "chat.1")
        assert c.frames == []  # the notices went out together: c got none

        for p in (p1, p2):
            assert sorted(await p.members("chat.1")) == sorted([a.id, b.id])
            assert await p.stats("chat.1") == {"clients": 2, "users": 0}

        # presence without join_leave: entries, no notices even when asked
        await p1.joined(a, "quiet.1", notify=True)
        await p2.joined(b, "quiet.1", notify=True)
        assert sorted(await p1.members("quiet.1")) == sorted([a.id, b.id])
        # another notice after them, to know nothing else came
        await p2.left(b, "chat.1")
        await wait_until(lambda: len(a.notices) == 5)
        assert a.notices[4] == leave(b, "chat.1") and len(b.notices) == 3

        # no presence for this channel: joined is a no-op, the API says so
        await p1.joined(a, "elsewhere", notify=True)
        with pytest.raises(PresenceDisabled):
            await p1.members("elsewhere")
        with pytest.raises(PresenceDisabled):
            await p2.stats("elsewhere")
        await p1.left(a, "elsewhere")  # a no-op
        assert p1.enabled("chat.x") and not p1.enabled("elsewhere")


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_users_from_the_connections_identity(backend: str, request: pytest.FixtureRequest) -> None:
    async with two_servers(backend, request) as (p1, p2):
        alice1 = FakeConn(Identity({"sub": "alice", "info": {"name": "Alice"}}, None))
        alice2 = FakeConn(Identity({"sub": "alice"}, None))
        bob = FakeConn(Identity({"sub": "bob"}, None))
        anon = FakeConn(Identity(None, None))  # an anonymous connection has no user
        for conn in (alice1, alice2, bob, anon):
            await p1.joined(conn, "chat.users")
        watcher = FakeConn()
        await p2.joined(watcher, "chat.users", notify=True)
        members = await p2.members("chat.users")
        assert members[alice1.id] == {"client": alice1.id, "user": "alice", "conn_info": {"name": "Alice"}}
        assert members[alice2.id] == {"client": alice2.id, "user": "alice"}
        assert members[anon.id] == {"client": anon.id, "user": None}
        assert await p2.stats("chat.users") == {"clients": 5, "users": 2}
        await p1.left(alice1, "chat.users")
        await wait_until(lambda: len(watcher.notices) == 2)
        assert watcher.notices[1] == {
            "channel": "chat.users", "leave": {"client": alice1.id, "user": "alice", "conn_info": {"name": "Alice"}},
        }


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_refresh_keeps_live_entries_while_a_crashed_servers_expire(
    backend: str, request: pytest.FixtureRequest
) -> None:
    rules = ChannelRules([ChannelOptions(match="*", presence=True, presence_ttl=0.6)])
    async with two_servers(backend, request, rules) as (p1, _):
        assert p1.period == pytest.approx(0.2)
        live = FakeConn()
        await p1.joined(live, "room")
        # an entry of a server that died: added once, never refreshed
        await p1.store.add("room", "crashed", {"client": "crashed", "user": None}, 0.6)

        async def crashed_gone() -> bool:
            return "crashed" not in await p1.members("room")

        await wait_until(crashed_gone, timeout=10, interval=0.05)
        # more than presence_ttl has passed since the live entry was added
        assert list(await p1.members("room")) == [live.id]
        assert p1.counters.refreshes >= 2 and p1.counters.refreshed >= 2


async def test_refresh_on_a_controlled_clock() -> None:
    now = [100.0]
    rules = ChannelRules([ChannelOptions(match="*", presence=True, presence_ttl=30)])
    async with MemoryBroker() as broker:
        p = Presence(broker, rules, clock=lambda: now[0])  # not started: refresh() by hand
        live = FakeConn()
        await p.joined(live, "room")
        await p.store.add("room", "crashed", {"client": "crashed", "user": None}, 30)
        now[0] += 9.9
        assert await p.refresh() == 0  # not due before presence_ttl / 3
        now[0] += 0.1
        assert await p.refresh() == 1
        now[0] += 20  # 30 s after the crash: its entry has expired, the refreshed one not
        assert list(await p.members("room")) == [live.id]
        assert await p.refresh(force=True) == 1
        await p.aclose()
        assert await p.store.members("room") == {}


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_close_and_shutdown_remove_entries_with_leave_notices(
    backend: str, request: pytest.FixtureRequest
) -> None:
    async with two_servers(backend, request) as (p1, p2):
        watcher, gone, stays = FakeConn(), FakeConn(), FakeConn()
        await p1.joined(watcher, "chat.a", notify=True)
        for ch in ("chat.a", "chat.b", "quiet.c"):
            await p2.joined(gone, ch, notify=True)
        await p2.joined(stays, "chat.a")
        await wait_until(lambda: len(watcher.notices) == 3)
        gone.closed = True  # its connection closed: the server calls left_all
        await p2.left_all(gone)
        await p2.left_all(gone)  # nothing left: a no-op
        await wait_until(lambda: len(watcher.notices) == 4)
        assert watcher.notices[3] == leave(gone, "chat.a")
        assert await p1.members("chat.b") == {} and await p1.members("quiet.c") == {}
        assert leave(gone, "chat.a") not in gone.notices  # it had gone: nothing more written to it
        if p1 is not p2:
            # a server shutting down removes what its connections left behind
            await p2.aclose()
            assert list(await p1.members("chat.a")) == [watcher.id]
            await wait_until(lambda: len(watcher.notices) == 5)
            assert watcher.notices[4] == leave(stays, "chat.a")
            await p2.joined(FakeConn(), "chat.a")  # closed: a no-op
            assert list(await p1.members("chat.a")) == [watcher.id]


async def test_broker_failures_never_raise_and_refresh_repairs() -> None:
    """Redis goes away: joined/left log and count, never raise; once Redis is
    back, the next refresh puts the entries back and notices flow again."""
    server = start_redis()
    port = server.port
    broker = RedisBroker(RedisBrokerConfig(url=server.url, command_timeout=1.0, connect_timeout=0.5,
                                           cluster_retry_timeout=1.0))
    await broker.start()
    p = Presence(broker, RULES)
    try:
        a, b = FakeConn(), FakeConn()
        await p.joined(a, "chat.r", notify=True)
        await wait_until(lambda: len(a.notices) == 1)
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)
        failures = p.counters.failures
        await p.joined(b, "chat.r", notify=True)  # does not raise
        assert p.counters.failures > failures
        loop = asyncio.get_running_loop()
        server = await loop.run_in_executor(None, lambda: start_redis(port=port))  # an empty Redis
        assert await p.refresh(force=True) == 2
        assert sorted(await p.members("chat.r")) == sorted([a.id, b.id])
        c = FakeConn()
        await wait_until(lambda: p._bus.subscribed(notice_channel("chat.r")), timeout=15)
        await p.joined(c, "chat.r")
        await wait_until(lambda: join(c, "chat.r") in a.notices and join(c, "chat.r") in b.notices, timeout=15)
    finally:
        await p.aclose()
        await broker.aclose()
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


async def test_what_presence_takes() -> None:
    with pytest.raises(TypeError, match="MemoryBroker or a RedisBroker"):
        Presence(object(), RULES)
    async with MemoryBroker() as broker:
        p = Presence(broker, ChannelRules())
        assert p.period is None
        await p.start()  # no rule with presence: no refresh loop
        assert p._task is None
        await p.joined(FakeConn(), "chat.1", notify=True)
        await p.aclose()
        await p.aclose()  # idempotent


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_leaving_while_joining_leaves_nothing_behind(backend: str, request: pytest.FixtureRequest) -> None:
    """The connection closes while its entry is being written: no entry, no
    listener, no notice subscription stays behind."""
    async with two_servers(backend, request) as (p, _):
        a = FakeConn()
        joining = asyncio.create_task(p.joined(a, "chat.race", notify=True))
        await wait_until(lambda: p.local_members("chat.race"), interval=0)  # joined waits for Redis now
        assert not joining.done()
        await p.left(a, "chat.race")
        await joining
        assert await p.members("chat.race") == {}
        assert p.local_members("chat.race") == [] and p._listeners == {}
        assert not p._bus.subscribed(notice_channel("chat.race"))
        assert p.counters.entries == 0
