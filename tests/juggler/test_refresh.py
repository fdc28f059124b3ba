"""Token refresh on live connections and subscription tokens for private
channels (juggler/refresh.py: the rules, with the clock passed in;
juggler/refreshing.py: the server's side; juggler/client_tokens.py: the
client's). On the wire: a real server on loopback, short-lived HS256 JWTs
(PyJWT), the Python client and hand-made frames."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed as WsConnectionClosed
from websockets.exceptions import InvalidStatus

from juggler.auth import Auth, AuthConfig, Identity
from juggler.broker.memory import MemoryBroker
from juggler.broker.redis import RedisBroker, RedisBrokerConfig
from juggler.channels import ChannelOptions, ChannelRules
from juggler.client import connect
from juggler.config import ServerConfig, config_from_dict
from juggler.errors import CallNacked, ConnectionClosed
from juggler.extensions import EXPIRING, REFRESH, REPLY, SUB_REFRESH
from juggler.reconnecting import reconnecting
from juggler.refresh import (
    CLOSE,
    CLOSE_CODE,
    END_SUB,
    REFRESH_HOOK,
    WARN,
    Due,
    Expiry,
    ExpiryRules,
    expiring_frame,
    expiring_notice,
)
from juggler.refresh import sub_token as token_of_frame
from juggler.refreshing import RefreshOutcome, TokenRefresh
from juggler.server import Server
from tests.netutil import wait_until

pytestmark = pytest.mark.timeout(60)

SECRET = "a-test-secret-of-at-least-32-bytes-for-hs256"


def token(lifetime: float = 600.0, **claims: Any) -> str:
    claims.setdefault("sub", "alice")
    claims.setdefault("exp", time.time() + lifetime)
    return jwt.encode(claims, SECRET, algorithm="HS256")


def sub_token(channel: str, lifetime: float = 600.0, **claims: Any) -> str:
    return token(lifetime, channel=channel, **claims)


# the rules, the clock passed in -----------------------------------------------------------


@pytest.mark.parametrize(("rules", "exp", "ticks", "expected"), [
    # warned 30 s ahead, closed at exp
    (ExpiryRules(), 1000.0, [(900.0, []), (970.0, [Due(WARN, None, 30.0)]), (980.0, []),
                             (1000.0, [Due(CLOSE)]), (1001.0, [])], None),
    # a short token: warned half-way through what was left of it
    (ExpiryRules(warn_ahead=30), 10.0, [(4.9, []), (5.0, [Due(WARN, None, 5.0)]), (10.0, [Due(CLOSE)])], None),
    # the grace: still open at exp, closed at exp + grace
    (ExpiryRules(grace=2), 100.0, [(70.0, [Due(WARN, None, 30.0)]), (100.5, []), (102.0, [Due(CLOSE)])], None),
    # no close: nothing after the warning
    (ExpiryRules(close_expired=False), 100.0, [(70.0, [Due(WARN, None, 30.0)]), (200.0, [])], None),
    # a refresher: asked rather than the client warned
    (ExpiryRules(refresher=True), 100.0, [(70.0, [Due(REFRESH_HOOK, None, 30.0)]), (100.0, [Due(CLOSE)])], None),
    # a late timer: the warning is skipped over by the close
    (ExpiryRules(), 100.0, [(150.0, [Due(CLOSE)])], None),
    # no exp: nothing ever
    (ExpiryRules(), None, [(1e12, [])], None),
])
def test_the_connection_rules(rules: ExpiryRules, exp: float | None, ticks: list[tuple[float, list[Due]]],
                              expected: None) -> None:
    core = Expiry(rules, exp, now=0.0)
    for now, due in ticks:
        deadline = core.next_deadline()
        assert core.tick(now) == due, now
        if due:
            assert deadline is not None and deadline <= now


def test_the_next_deadline_follows_the_renewals() -> None:
    core = Expiry(ExpiryRules(warn_ahead=10, grace=1), 100.0, now=0.0)
    assert core.next_deadline() == 90.0
    assert core.tick(90.0) == [Due(WARN, None, 10.0)]
    assert core.next_deadline() == 101.0  # warned: the close is next
    core.renewed(200.0, now=95.0)
    assert core.next_deadline() == 190.0  # warned again before the new expiry
    core.sub_renewed((False, "p"), 150.0, now=95.0)
    assert core.next_deadline() == 140.0
    assert core.tick(140.0) == [Due(WARN, (False, "p"), 10.0)]
    assert core.tick(151.0) == [Due(END_SUB, (False, "p"))]
    assert not core.timed((False, "p"))
    core.sub_renewed((True, "q.*"), 300.0, now=151.0)
    core.sub_ended((True, "q.*"))
    core.renewed(None, now=151.0)
    assert core.next_deadline() is None


@pytest.mark.parametrize(("ahead", "grace"), [(-1.0, 0.0), (0.0, -0.5)])
def test_the_rules_refuse_negative_times(ahead: float, grace: float) -> None:
    with pytest.raises(ValueError):
        ExpiryRules(warn_ahead=ahead, grace=grace)


def test_the_frames() -> None:
    assert json.loads(expiring_frame("u", 1.2345)) == {"meta": {"type": EXPIRING, "uuid": "u"},
                                                       "payload": {"expires_in_ms": 1234}}
    assert json.loads(expiring_frame("u", 2, (True, "a.*")))["payload"] == {
        "expires_in_ms": 2000, "channel": "a.*", "pattern": True}
    assert json.loads(expiring_notice("u", (False, "é")))["payload"] == {
        "channel": "é", "expires_in_ms": 0, "unsubscribed": True}


U = "0b9d7d4e-8a43-4a07-9e5b-5c1b8a9f0a11"


def _sub(meta: Any, payload: Any) -> bytes:
    return json.dumps({"meta": meta, "payload": payload}).encode()


@pytest.mark.parametrize(("frame", "expected"), [
    (_sub({"type": 3, "uuid": U.upper()}, {"channel": "c", "token": "t"}), (U, "t")),
    (_sub({"type": 3, "uuid": U}, {"channel": "c", "token": {"x": 1}}), (U, {"x": 1})),
    (_sub({"type": 3, "uuid": U}, {"channel": "c"}), None),  # no token
    (_sub({"type": 2, "uuid": U}, {"channel": "c", "token": "t"}), None),  # a PUB
    (_sub({"type": 3.0, "uuid": U}, {"token": "t"}), None),
    (_sub({"type": True, "uuid": U}, {"token": "t"}), None),
    (_sub({"type": 3, "uuid": "nope"}, {"token": "t"}), None),
    (_sub({"type": 3, "uuid": 7}, {"token": "t"}), None),
    (_sub({"type": 3, "uuid": "x" * 1000}, {"token": "t"}), None),
    (_sub({"type": 3, "uuid": U}, "token"), None),
    (_sub({"type": 3, "uuid": U}, ["token"]), None),
    (_sub({"type": 3, "uuid": U}, 7), None),
    (_sub([], {"token": "t"}), None),
    (b"[1,2]", None), (b"", None), (b"{", None), (b'"token"', None), (b"[" * 100_000, None),
    (b"\xff\xfe", None),
])
def test_the_subscription_token_of_a_frame(frame: bytes, expected: Any) -> None:
    assert token_of_frame(frame) == expected


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                              lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                                  st.sampled_from(["meta", "payload", "type", "uuid", "token", "x"]), inner,
                                  max_size=4), max_leaves=20).map(lambda v: json.dumps(v).encode())))
def test_any_frame_gives_a_token_or_none(data: bytes) -> None:
    found = token_of_frame(data)
    assert found is None or (isinstance(found[0], str) and len(found[0]) == 36)


def test_the_options_from_toml() -> None:
    cfg = config_from_dict({"auth": {"jwt_secret": SECRET, "refresh_warning": 5, "expiry_grace": 1.5,
                                     "close_expired": False},
                            "channels": [{"match": "private.*", "private": True}]})
    assert (cfg.auth.refresh_warning, cfg.auth.expiry_grace, cfg.auth.close_expired) == (5, 1.5, False)
    assert cfg.channels.lookup("private.x").private and not cfg.channels.lookup("public").private
    for bad in ({"refresh_warning": -1}, {"expiry_grace": -1}):
        with pytest.raises(ValueError):
            config_from_dict({"auth": {"jwt_secret": SECRET, **bad}})


# on the wire --------------------------------------------------------------------------------


class Refresher:
    """An in-process refresher: renews for `lifetime` seconds, or refuses."""

    def __init__(self, lifetime: float | None = 1.0, refuse: bool = False) -> None:
        self.lifetime = lifetime
        self.refuse = refuse
        self.asked: list[str] = []
        self.called = asyncio.Event()

    async def refresh(self, conn: Any, identity: Identity) -> RefreshOutcome:
        self.asked.append(identity.name)
        self.called.set()
        if self.refuse:
            return RefreshOutcome(refused=True)
        await asyncio.sleep(0)
        exp = None if self.lifetime is None else time.time() + self.lifetime
        return RefreshOutcome(expire_at=exp, info={"n": len(self.asked)})


@asynccontextmanager
async def serving(broker: Any = None, *, refresher: Any = None, channels: ChannelRules | None = None,
                  warning: float = 0.5, grace: float = 0.0, auth: bool = True,
                  close_expired: bool = True) -> AsyncIterator[Server]:
    own = broker is None
    broker = broker or MemoryBroker()
    if own:
        await broker.start()
    channels = channels or ChannelRules([ChannelOptions(match="private.*", private=True)])
    a = Auth(AuthConfig(jwt_secret=SECRET, refresh_warning=warning, expiry_grace=grace,
                        close_expired=close_expired)) if auth else None
    server = Server(broker, ServerConfig(port=0), auth=a, channels=channels)
    TokenRefresh(a, channels, refresher=refresher).install(server)
    try:
        await server.start()
        yield server
    finally:
        await server.aclose()
        if own:
            await broker.aclose()


class Tokens:
    """A token source counting what it gave."""

    def __init__(self, lifetime: float, **claims: Any) -> None:
        self.lifetime = lifetime
        self.claims = claims
        self.given = 0

    async def __call__(self) -> str:
        self.given += 1
        return token(self.lifetime, **self.claims)


async def test_a_client_with_get_token_stays_connected_across_several_expiries() -> None:
    async with serving() as server:
        tokens = Tokens(1.5)
        async with connect(server.url, get_token=tokens) as client:
            await wait_until(lambda: client.tokens.renewals >= 3)  # past two lifetimes of the first token
            assert await client.request(REFRESH, {"token": token(60)}, timeout=5) is not None
            assert not client.closed
            assert client.tokens.renewals >= 3 and client.tokens.failures == 0
        assert tokens.given >= 4  # the handshake's, then one per EXPIRING
        assert server.stats.extensions_written[EXPIRING] >= 3
        assert "token_expired" not in server.stats.closed


async def test_a_client_that_never_refreshes_is_closed_with_4001_at_expiry() -> None:
    async with serving() as server:
        closed = asyncio.get_running_loop().create_future()
        async with ws_connect(server.url, subprotocols=["juggler.0"],  # type: ignore[list-item]
                              additional_headers={"Authorization": "Bearer " + token(1.5)}) as ws:
            started = time.monotonic()
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), 5)  # the original client: nothing comes
            except WsConnectionClosed as exc:
                closed.set_result(exc)
            elapsed = time.monotonic() - started
        exc = await closed
        assert exc.rcvd is not None and (exc.rcvd.code, exc.rcvd.reason) == (CLOSE_CODE, "token expired")
        assert elapsed > 1.0  # not before the token's expiry (each recv above is bounded: a missing close fails)
        await wait_until(lambda: server.stats.connections_active == 0)
        assert server.stats.closed["token_expired"] == 1
        assert EXPIRING not in server.stats.extensions_written  # it did not opt in


async def test_the_python_client_says_why_it_was_closed() -> None:
    async with serving() as server, connect(server.url, headers={"Authorization": "Bearer " + token(1.5)}) as client:
        await client.wait_closed()
        with pytest.raises(ConnectionClosed, match="4001: token expired"):
            await client.pub("x", 1)


async def test_with_close_expired_off_an_expired_connection_stays_and_gets_nack_401() -> None:
    async with serving(close_expired=False) as server:
        warned = asyncio.Event()

        def on_message(m: dict[str, Any], _f: str) -> None:
            if m["meta"]["type"] == EXPIRING:
                warned.set()

        async with connect(server.url, headers={"Authorization": "Bearer " + token(1.5), "Juggler-Refresh": "1"},
                           on_message=on_message) as client:
            await asyncio.wait_for(warned.wait(), 5)  # warned, and not renewed
            await wait_until(lambda: time.time() > client_exp(server) + 0.2)
            with pytest.raises(CallNacked) as nacked:
                await client.pub("public", 1)
            assert nacked.value.code == 401
            # a REFRESH still brings it back
            await client.request(REFRESH, {"token": token(60)}, timeout=5)
            await client.pub("public", 2)
        assert "token_expired" not in server.stats.closed


def client_exp(server: Server) -> float:
    (conn,) = server.conns
    return float(conn.identity.exp)


async def test_refresh_refusals() -> None:
    async with serving() as server, connect(server.url, get_token=Tokens(60)) as client:
        with pytest.raises(CallNacked) as nacked:
            await client.request(REFRESH, {"token": token(60, sub="mallory")}, timeout=5)
        assert nacked.value.code == 403
        with pytest.raises(CallNacked) as nacked:
            await client.request(REFRESH, {"token": "not.a.jwt"}, timeout=5)
        assert nacked.value.code == 401
        with pytest.raises(CallNacked) as nacked:
            await client.request(REFRESH, {"token": token(-5)}, timeout=5)
        assert nacked.value.code == 401
        with pytest.raises(CallNacked) as nacked:
            await client.request(REFRESH, {"token": 7}, timeout=5)
        assert nacked.value.code == 400
        with pytest.raises(CallNacked) as nacked:  # a subscription token
            await client.request(REFRESH, {"token": sub_token("private.a", 600)}, timeout=5)
        assert nacked.value.code == 401
        # the connection stays, as it was
        await client.pub("public", 1)
        assert (await client.request(REFRESH, {"token": token(120)}, timeout=5))["expires_at"] > time.time() + 100


async def test_refresh_replaces_the_grants() -> None:
    async with serving() as server, connect(server.url, headers={
            "Authorization": "Bearer " + token(60, juggler={"pub": ["a.*"]})}) as client:
        await client.pub("a.1", 1)
        with pytest.raises(CallNacked):
            await client.pub("b.1", 1)
        await client.request(REFRESH, {"token": token(60, juggler={"pub": ["b.*"]})}, timeout=5)
        await client.pub("b.1", 1)
        with pytest.raises(CallNacked):
            await client.pub("a.1", 1)


async def test_refresh_without_auth_or_anonymous() -> None:
    async with serving(auth=False) as server, connect(server.url) as client:
        with pytest.raises(CallNacked) as nacked:
            await client.request(REFRESH, {"token": token()}, timeout=5)
        assert nacked.value.code == 400
    broker = MemoryBroker()
    await broker.start()
    auth = Auth(AuthConfig(jwt_secret=SECRET, anonymous=True))
    server = Server(broker, ServerConfig(port=0), auth=auth)
    TokenRefresh(auth, ChannelRules()).install(server)
    await server.start()
    try:
        async with connect(server.url) as client:
            with pytest.raises(CallNacked) as nacked:
                await client.request(REFRESH, {"token": token()}, timeout=5)
            assert nacked.value.code == 401
    finally:
        await server.aclose()
        await broker.aclose()


async def test_a_bad_refresh_opt_in_is_refused_at_the_handshake() -> None:
    async with serving() as server:
        with pytest.raises(InvalidStatus) as info:
            async with ws_connect(server.url, subprotocols=["juggler.0"],  # type: ignore[list-item]
                                  additional_headers={"Authorization": "Bearer " + token(),
                                                      "Juggler-Refresh": "yes"}):
                pass
        assert info.value.response.status_code == 400


async def test_the_reconnecting_client_takes_a_new_token_at_reconnect() -> None:
    """A token the server-side refresher refuses to renew: closed with 4001,
    then the reconnecting client comes back with a fresh token of get_token."""
    refresher = Refresher(refuse=True)
    async with serving(refresher=refresher, warning=0.5) as server:
        tokens = Tokens(1.5)
        async with reconnecting(server.url, get_token=tokens) as client:
            await asyncio.wait_for(refresher.called.wait(), 5)
            await wait_until(lambda: client.reconnects >= 1)
            await client.pub("public", 1)
        assert tokens.given >= 2


async def test_the_refresh_hook_renews_from_the_server_side() -> None:
    refresher = Refresher(lifetime=1.5)
    async with serving(refresher=refresher, warning=0.5) as server:
        msgs: list[dict[str, Any]] = []
        async with connect(server.url, headers={"Authorization": "Bearer " + token(1.5)},
                           on_message=lambda m, _f: msgs.append(m)) as client:
            await wait_until(lambda: len(refresher.asked) >= 3)  # past the first token's end, twice renewed
            assert not client.closed
            await client.pub("public", 1)
            conn = next(iter(server.conns))
            assert conn.expiry.info == {"n": len(refresher.asked)}
            assert conn.identity.exp is not None and conn.identity.exp > time.time()
        assert len(refresher.asked) >= 2 and set(refresher.asked) == {"alice"}
        assert not any(m["meta"]["type"] == EXPIRING for m in msgs)  # the client was not bothered


async def test_a_refresher_that_fails_leaves_it_to_the_client() -> None:
    class Failing:
        async def refresh(self, conn: Any, identity: Identity) -> RefreshOutcome:
            raise RuntimeError("backend down")

    async with serving(refresher=Failing(), warning=0.5) as server:
        tokens = Tokens(1.5)
        async with connect(server.url, get_token=tokens) as client:
            await wait_until(lambda: client.tokens.renewals >= 1)
            assert not client.closed


# private channels ------------------------------------------------------------------------


async def test_a_private_channel_needs_a_valid_subscription_token() -> None:
    async with serving() as server, connect(server.url, headers={"Authorization": "Bearer " + token()}) as client:
        await client.sub("public")  # no token needed
        for bad in (None, "junk", sub_token("private.b"), sub_token("private.a", sub="mallory"),
                    sub_token("private.a", lifetime=-10), jwt.encode({"sub": "alice", "channel": "private.a"},
                                                                     "another-secret-" * 4, algorithm="HS256")):
            with pytest.raises(CallNacked) as nacked:
                await client.sub("private.a", token=bad)
            assert nacked.value.code == 403, bad
        assert server.stats.rejections["forbidden"] == 6
        with pytest.raises(CallNacked) as nacked:
            await client.sub("private.*", pattern=True)  # a pattern may cover private channels
        assert nacked.value.code == 403
        await client.sub("private.a", token=sub_token("private.a"))
        await client.sub("private.*", pattern=True, token=sub_token("private.*"))


async def test_the_original_client_sub_with_a_token_field_and_hostile_frames() -> None:
    """The token rides in the SUB's payload (a field the original server
    ignores); frames with odd tokens are refused one by one, the connection stays."""
    async with serving() as server, ws_connect(server.url, subprotocols=["juggler.0"],  # type: ignore[list-item]
                                               additional_headers={"Authorization": "Bearer " + token()}) as ws:
        uuids = [f"0b9d7d4e-8a43-4a07-9e5b-5c1b8a9f0a{i:02d}" for i in range(6)]
        tokens: list[Any] = [7, None, {"a": 1}, "", "x" * 5000, sub_token("private.a")]
        for u, t in zip(uuids, tokens):
            await ws.send(json.dumps({"meta": {"type": 3, "uuid": u.upper()},
                                      "payload": {"channel": "private.a", "token": t}}))
        got = [json.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in uuids]
        assert [m["payload"]["for"] for m in got] == uuids
        assert [m["meta"]["type"] for m in got] == [7, 7, 7, 7, 7, 8]


async def test_sub_refresh_keeps_a_private_subscription_receiving(redis_url: str) -> None:
    broker = RedisBroker(RedisBrokerConfig(url=redis_url))
    await broker.start()
    try:
        async with serving(broker, warning=0.5) as server:
            asked: list[str] = []

            async def sub_tokens(channel: str) -> str | None:
                asked.append(channel)
                return sub_token(channel, lifetime=1.5) if channel.startswith("private.") else None

            async with connect(server.url, headers={"Authorization": "Bearer " + token()},
                               get_subscription_token=sub_tokens) as client, \
                    connect(server.url, headers={"Authorization": "Bearer " + token(sub="bob")}) as publisher:
                await client.sub("private.room")
                await wait_until(lambda: client.tokens.renewals >= 2)  # past the first token's end
                await publisher.pub("private.room", {"n": 1})
                event = await client.next_event(timeout=5)
                assert (event.channel, event.args) == ("private.room", {"n": 1})
                assert client.tokens.renewals >= 2 and client.tokens.ended == []
                assert asked.count("private.room") >= 3
    finally:
        await broker.aclose()


async def test_a_subscription_not_renewed_is_ended_and_the_connection_stays() -> None:
    async with serving(warning=0.5) as server:
        notices: list[dict[str, Any]] = []
        ended = asyncio.Event()

        def on_message(m: dict[str, Any], _f: str) -> None:
            if m["meta"]["type"] == EXPIRING:
                notices.append(m["payload"])
                if m["payload"].get("unsubscribed"):
                    ended.set()

        async def no_renewal(channel: str) -> str | None:
            if channel.startswith("private."):
                raise RuntimeError("no token for you")
            return None

        async with connect(server.url, headers={"Authorization": "Bearer " + token(), "Juggler-Refresh": "1"},
                           on_message=on_message, get_subscription_token=no_renewal) as client, \
                connect(server.url, headers={"Authorization": "Bearer " + token(sub="bob")}) as publisher:
            await client.sub("private.room", token=sub_token("private.room", lifetime=1.5))
            await asyncio.wait_for(ended.wait(), 5)
            assert notices[0]["channel"] == "private.room" and 0 < notices[0]["expires_in_ms"] <= 1500
            assert notices[-1] == {"channel": "private.room", "expires_in_ms": 0, "unsubscribed": True}
            assert client.tokens.ended == ["private.room"] and client.tokens.failures == 1
            # no more events from it; the connection serves the rest
            await client.sub("public")
            await publisher.pub("private.room", 1)
            await publisher.pub("public", 2)
            event = await client.next_event(timeout=5)
            assert (event.channel, event.args) == ("public", 2)
            with pytest.raises(CallNacked) as nacked:
                await client.request(SUB_REFRESH, {"channel": "private.room", "token": sub_token("private.room")},
                                     timeout=5)
            assert nacked.value.code == 400


async def test_a_pattern_subscription_is_renewed_as_a_pattern() -> None:
    async with serving(warning=0.5) as server:
        async def sub_tokens(channel: str) -> str | None:
            return sub_token(channel, lifetime=1.5)

        async with connect(server.url, headers={"Authorization": "Bearer " + token()},
                           get_subscription_token=sub_tokens) as client, \
                connect(server.url, headers={"Authorization": "Bearer " + token(sub="bob")}) as publisher:
            await client.sub("private.*", pattern=True)
            await wait_until(lambda: client.tokens.renewals >= 2)
            await publisher.pub("private.x", 1)
            event = await client.next_event(timeout=5)
            assert (event.channel, event.pattern, event.args) == ("private.x", "private.*", 1)
            assert client.tokens.ended == []


async def test_sub_refresh_refusals() -> None:
    async with serving() as server, connect(server.url, headers={"Authorization": "Bearer " + token()}) as client:
        await client.sub("private.a", token=sub_token("private.a", lifetime=60))
        for payload, code in (({"channel": "private.b", "token": sub_token("private.b")}, 400),
                              ({"channel": "private.a", "token": sub_token("private.b")}, 403),
                              ({"channel": "private.a", "token": sub_token("private.a", sub="bob")}, 403),
                              ({"channel": "private.a"}, 403)):
            with pytest.raises(CallNacked) as nacked:
                await client.request(SUB_REFRESH, payload, timeout=5)
            assert nacked.value.code == code, payload
        result = await client.request(SUB_REFRESH, {"channel": "private.a", "token": sub_token("private.a", 120)},
                                      timeout=5)
        assert result["expires_at"] > time.time() + 100
        assert server.stats.extensions_written[REPLY] == 1
        await client.unsb("private.a")
        with pytest.raises(CallNacked):
            await client.request(SUB_REFRESH, {"channel": "private.a", "token": sub_token("private.a")}, timeout=5)
