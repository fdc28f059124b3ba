"""Server-side subscriptions (juggler/serversubs.py): channels a connection
is subscribed to by the server, from its token's ``channels`` claim or the
server API's ``subscribe``, delivered as plain EVNTs. Real servers started by
juggler.runner.start_app on the in-memory broker, a real Redis and a real
Redis Cluster (two servers each), real websocket clients (the Python client,
and hand-made frames shaped as the original Go client's), real HTTP requests."""

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
from websockets.asyncio.client import connect as ws_connect

from juggler.auth import AuthConfig, AuthError, Identity
from juggler.broker.redis import RedisBrokerConfig
from juggler.channels import ChannelOptions, ChannelRules
from juggler.client import Client, connect
from juggler.reconnecting import reconnecting
from rustext.backoff import BackoffPolicy
from juggler.config import ApiConfig, AppConfig, ServerConfig
from juggler.errors import CallNacked, ConnectionClosed
from juggler.metrics import ServerStats
from juggler.runner import Running, start_app
from juggler.session import Session
from tests.faultproxy import FaultProxy
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)

KEY = "k3y-for-the-tests_0123456789"
SECRET = "a-test-secret-of-at-least-32-bytes-for-hs256"
RULES = ChannelRules([ChannelOptions(match="h.*", history_size=10, history_ttl=60, client_history=True)])


def token(sub: str, channels: Any = None, **claims: Any) -> str:
    body: dict[str, Any] = {"sub": sub, "exp": time.time() + 600, **claims}
    if channels is not None:
        body["channels"] = channels
    return jwt.encode(body, SECRET, algorithm="HS256")


@asynccontextmanager
async def app(redis: Any = None, *, api: bool = True, **server: Any) -> AsyncIterator[Running]:
    """One juggler server (in this process) with JWT auth and the server API."""
    cfg = AppConfig(
        server=ServerConfig(port=0, log_connections=False, close_timeout=2.0, drain_timeout=1.0, **server),
        redis=redis, api=ApiConfig(port=0, key=KEY) if api else None,
        auth=AuthConfig(jwt_secret=SECRET), channels=RULES,
    )
    running = await start_app(cfg)
    try:
        yield running
    finally:
        await running.drain()


def url(running: Running, tok: str) -> str:
    return running.server.url + "?token=" + tok


async def api(running: Running, method: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    assert running.api is not None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session, \
            session.post(f"{running.api.url}/{method}", json=body, headers={"X-API-Key": KEY}) as resp:
        return resp.status, await resp.json()


async def ok(running: Running, method: str, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = await api(running, method, body)
    assert status == 200, answer
    result: dict[str, Any] = answer["result"]
    return result


def conn_of(running: Running, client: Client) -> Any:
    port = client.ws.local_address[1]
    (conn,) = [c for c in running.server.conns if c.remote[1] == port]
    return conn


async def no_event(client: Client) -> None:
    """Nothing is queued for `client` once a message it sent itself came back."""
    probe = f"probe.{client.ws.local_address[1]}"  # this client's own
    await client.sub(probe)
    await client.pub(probe, "probe")
    ev = await client.next_event(timeout=5)
    assert (ev.channel, ev.args) == (probe, "probe"), ev


def test_the_channels_claim_and_its_errors() -> None:
    assert Identity({"sub": "a", "channels": ["x", "y", "x"]}, None).channels == ("x", "y")
    assert Identity({"sub": "a"}, None).channels == ()
    assert Identity(None, None).channels == ()
    for bad in ("x", [1], [""], {"x": 1}):
        with pytest.raises(AuthError, match="channels claim"):
            Identity({"sub": "a", "channels": bad}, None)
    identity = Identity({"sub": "a"}, None)
    identity.channels = ("set.by.a.proxy",)  # a plain attribute whoever authenticates may set
    assert identity.channels == ("set.by.a.proxy",)


def test_the_session_counts_them_against_max_subscriptions() -> None:
    rejected: list[str] = []
    session = Session(ServerConfig(max_subscriptions=2), ServerStats(), rejected.append, now=0.0)
    assert session.subscribed_by_server("a") is True
    assert session.subscribed_by_server("a") is None  # there already
    assert session.subscribed_by_server("b") is True
    assert session.subscribed_by_server("c") is False and rejected == ["subscription_limit"]
    session.unsubscribed("a", False)  # an UNSB (or the API) ends one: room for another
    assert session.subscribed_by_server("c") is True


@pytest.mark.parametrize("broker", ["memory", "redis"])
async def test_token_channels_bring_events_without_a_sub(broker: str, redis_url: str) -> None:
    redis = RedisBrokerConfig(url=redis_url) if broker == "redis" else None
    async with app(redis) as running:
        # the grants do not cover the server-side channels: the server decided them
        tok = token("alice", ["news", "user.alice", "h.feed"], juggler={"sub": ["probe.*"], "pub": ["probe.*"]})
        async with connect(url(running, tok)) as alice, connect(url(running, token("bob"))) as bob:
            # the answer to alice's first message comes after her subscriptions took effect
            await no_event(alice)
            conn = conn_of(running, alice)
            assert running.server.subscriptions.of(conn) == {(False, "news"), (False, "user.alice"),
                                                             (False, "h.feed"),
                                                             (False, f"probe.{alice.ws.local_address[1]}")}
            await bob.pub("news", {"n": 1})
            ev = await alice.next_event(timeout=5)
            assert (ev.channel, ev.args, ev.offset) == ("news", {"n": 1}, None)
            first = await running.server.publish("h.feed", b'"kept"')
            ev = await alice.next_event(timeout=5)
            assert (ev.channel, ev.args, ev.offset, ev.epoch) == ("h.feed", "kept", first.offset, first.epoch)
            # her own SUB to one of them is refused by her grants; the server's stays
            with pytest.raises(CallNacked) as nacked:
                await alice.sub("news")
            assert nacked.value.code == 403
            await bob.pub("news", 2)
            assert (await alice.next_event(timeout=5)).args == 2
            # an UNSB ends a server-side subscription as it ends a SUB's
            await alice.unsb("news")
            await bob.pub("news", 3)
            await no_event(alice)


async def test_at_reconnect_the_token_subscribes_again_and_history_fills_the_gap(redis_url: str) -> None:
    """Nothing is recovered by itself for a server-side subscription; the
    client that kept its last position reads what it missed (HISTORY since)."""
    async with app(RedisBrokerConfig(url=redis_url)) as running:
        tok = token("alice", ["h.feed"])
        async with connect(url(running, tok)) as first:
            await no_event(first)
            await running.server.publish("h.feed", b'"one"')
            ev = await first.next_event(timeout=5)
            last = (ev.offset, ev.epoch)
            assert last[0] == 1
        for text in ("two", "three"):  # while away
            await running.server.publish("h.feed", json.dumps(text).encode())
        async with connect(url(running, tok)) as again:
            assert last[1] is not None
            missed = await again.history("h.feed", since=(last[0], last[1]))
            assert missed["recovered"] is True
            assert [(e["args"], e["offset"]) for e in missed["events"]] == [("two", 2), ("three", 3)]
            await running.server.publish("h.feed", b'"four"')
            ev = await again.next_event(timeout=5)
            assert (ev.args, ev.offset) == ("four", 4)


async def test_the_reconnecting_client_gets_them_again_and_reads_the_gap(redis_url: str) -> None:
    states: list[str] = []
    async with app(RedisBrokerConfig(url=redis_url)) as running, \
            reconnecting(url(running, token("alice", ["h.inbox"])), backoff=BackoffPolicy(initial=0.05, maximum=0.2),
                         keepalive=False, on_state=states.append) as client:
        await client.pub("probe.start", 0)  # answered once the token's subscription is in effect
        await running.server.publish("h.inbox", b'"one"')
        assert (await client.next_event(timeout=5)).args == "one"
        seen = client.positions["h.inbox"]
        assert await ok(running, "disconnect", {"user": "alice"}) == {"disconnected": 1}
        await wait_until(lambda: "reconnecting" in states, timeout=5, what="the drop")
        await running.server.publish("h.inbox", b'"two"')  # while away (or once subscribed again: then live too)
        missed = await client.history("h.inbox", since=seen, timeout=10)
        assert missed["recovered"] is True and [e["args"] for e in missed["events"]] == ["two"]
        await running.server.publish("h.inbox", b'"three"')
        live = [await client.next_event(timeout=5)]
        while live[-1].args != "three":
            live.append(await client.next_event(timeout=5))
        assert [(e.args, e.offset) for e in live] in ([("three", 3)], [("two", 2), ("three", 3)])


async def test_max_subscriptions_counts_them_and_a_token_over_it_is_closed() -> None:
    async with app(max_subscriptions=3) as running:
        async with connect(url(running, token("a", ["c1", "c2", "c3", "c4"]))) as over:
            async with asyncio.timeout(10):
                await over.wait_closed()
            assert (over.ws.close_code, over.ws.close_reason) == (1008, "too many server-side subscriptions")
        async with connect(url(running, token("b", ["c1", "c2"]))) as client:
            await client.sub("c3")  # the third
            with pytest.raises(CallNacked) as nacked:
                await client.sub("c4")
            assert nacked.value.code == 500 and "too many subscriptions" in nacked.value.message
            # the server API cannot take it over the limit either
            assert await ok(running, "subscribe", {"channel": "c5", "user": "b"}) == {"subscribed": 0,
                                                                                      "over_limit": 1}


async def test_a_subscription_redis_does_not_make_closes_the_connection(redis_url: str) -> None:
    """Redis' replies held back past the command timeout: the connection is
    closed (1011) rather than left without a channel the server decided; the
    server serves on."""
    async with FaultProxy(int(redis_url.split(":")[2].split("/")[0])) as proxy:
        redis = RedisBrokerConfig(url=f"redis://127.0.0.1:{proxy.port}/{redis_url.rsplit('/', 1)[1]}",
                                  command_timeout=0.5)
        async with app(redis) as running:
            proxy.hold_replies()
            async with connect(url(running, token("a", ["held"]))) as client:
                async with asyncio.timeout(10):
                    await client.wait_closed()
                assert (client.ws.close_code, client.ws.close_reason) == (1011, "server-side subscription failed")
            proxy.release_replies()
            assert running.server.stats.closed.get("subscription_failed") == 1
            async with connect(url(running, token("b", ["fine"]))) as client:
                await no_event(client)
                assert (False, "fine") in running.server.subscriptions.of(conn_of(running, client))


async def test_a_connection_gone_while_subscribing_leaves_nothing_behind(redis_url: str) -> None:
    async with app(RedisBrokerConfig(url=redis_url)) as running:
        for _ in range(5):
            client = await connect(url(running, token("a", [f"gone.{i}" for i in range(20)])))
            await client.aclose()  # as soon as the handshake is done: while the server subscribes
        await wait_until(lambda: not running.server.conns and not running.server.subscriptions.channels(),
                         timeout=10, what="every subscription to end")
        broker = running.server.pubsub
        await wait_until(lambda: not broker._fanout._subs, timeout=10, what="the broker to unsubscribe")


async def test_an_invalid_channels_claim_refuses_the_handshake() -> None:
    async with app() as running:
        with pytest.raises(ConnectionClosed, match="HTTP 401"):
            async with connect(url(running, token("a", "not-a-list"))):
                pass


async def test_the_original_client_gets_plain_evnts(redis_url: str) -> None:
    """A client of the original protocol (no extension asked for) gets the
    server-side channels' events as ordinary EVNTs."""
    async with app(RedisBrokerConfig(url=redis_url)) as running, \
            ws_connect(url(running, token("go", ["legacy"])), subprotocols=["juggler.0"]) as ws:  # type: ignore[list-item]
        sub_uuid = "2b0c1f7a-4a5e-4d0b-9f3e-7e6c2d1a9b88"
        await ws.send(json.dumps({"meta": {"type": 3, "uuid": sub_uuid}, "payload": {"channel": "mine"}}))
        ack = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert ack["meta"]["type"] == 8 and ack["payload"]["for"] == sub_uuid
        result = await running.server.publish("legacy", b'{"x":1}')
        evnt = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert evnt["meta"]["type"] == 10
        assert evnt["payload"] == {"for": result.msg_uuid, "channel": "legacy", "args": {"x": 1}}


async def test_api_subscribe_reaches_a_connection_on_another_server(redis_url: str) -> None:
    redis = RedisBrokerConfig(url=redis_url)
    async with app(redis) as a, app(redis, api=False) as b:
        await wait_until(lambda: len(a.control.nodes()) == len(b.control.nodes()) == 2, timeout=10,
                         what="the servers to know each other")
        async with connect(url(b, token("alice"))) as on_b, connect(url(b, token("carol"))) as carol, \
                connect(url(a, token("pub"))) as publisher:
            status, answer = await api(a, "subscribe", {"channel": "room"})
            assert status == 400 and "client or user is required" in answer["error"]["message"]
            assert await ok(a, "subscribe", {"channel": "room", "user": "alice"}) == {"subscribed": 1}
            assert await ok(a, "subscribe", {"channel": "room", "user": "alice"}) == {"subscribed": 0}  # already
            # by connection id, on the other server
            assert await ok(a, "subscribe", {"channel": "h.room", "client": conn_of(b, carol).id}) == {"subscribed": 1}
            assert (await ok(a, "channels", {}))["channels"] == {"room": {"subscribers": 1},
                                                                 "h.room": {"subscribers": 1}}
            await publisher.pub("room", "hello")
            ev = await on_b.next_event(timeout=5)
            assert (ev.channel, ev.args) == ("room", "hello")
            await publisher.pub("h.room", "kept")
            ev = await carol.next_event(timeout=5)
            assert (ev.channel, ev.args, ev.offset) == ("h.room", "kept", 1)
            # the API's unsubscribe ends it
            assert await ok(a, "unsubscribe", {"channel": "room", "user": "alice"}) == {"unsubscribed": 1}
            await publisher.pub("room", "gone")
            await no_event(on_b)


async def test_server_side_subscriptions_on_a_redis_cluster_with_two_servers(cluster_seeds: str) -> None:
    cluster = RedisBrokerConfig(cluster=tuple(cluster_seeds.split(",")))
    async with app(cluster) as a, app(cluster) as b:
        await wait_until(lambda: len(a.control.nodes()) == len(b.control.nodes()) == 2, timeout=10,
                         what="the servers to know each other")
        channels = [f"user.{i}" for i in range(6)]  # over several slots, so several nodes
        async with connect(url(a, token("alice", channels))) as on_a, \
                connect(url(b, token("alice", ["h.news"]))) as on_b, \
                ws_connect(url(b, token("go", ["user.3"])), subprotocols=["juggler.0"]) as go:  # type: ignore[list-item]
            await no_event(on_a)
            await no_event(on_b)
            assert await ok(b, "subscribe", {"channel": "user.0", "user": "alice"}) == {"subscribed": 1}  # on_b
            for ch in channels:
                await on_b.pub(ch, ch)
            got = [await on_a.next_event(timeout=5) for _ in channels]
            assert [(e.channel, e.args) for e in got] == [(ch, ch) for ch in channels]
            ev = await on_b.next_event(timeout=5)
            assert (ev.channel, ev.args) == ("user.0", "user.0")
            await on_a.pub("h.news", "n1")
            ev = await on_b.next_event(timeout=5)
            assert (ev.channel, ev.args, ev.offset) == ("h.news", "n1", 1)
            evnt = json.loads(await asyncio.wait_for(go.recv(), 5))  # the original client: a plain EVNT
            assert evnt["meta"]["type"] == 10
            assert (evnt["payload"]["channel"], evnt["payload"]["args"]) == ("user.3", "user.3")
