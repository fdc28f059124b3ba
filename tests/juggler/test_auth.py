"""juggler/auth.py: the auth configuration, authentication at the handshake
(JWT through rustext.tokens, custom verifiers, origins, a JWKS with key
rotation) and per-message authorization, through a real server. The JWT
rules themselves are tested in tests/rustext/test_tokens.py."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest
from test_server import call, recv, stack, ws
from websockets.exceptions import InvalidStatus

from juggler.auth import Auth, AuthConfig, Rule
from tests.jwks import JwksServer, SigningKey
from juggler.client import ACK, connect
from juggler.config import config_from_dict

pytestmark = pytest.mark.timeout(60)


SECRET = "a-test-secret-of-at-least-32-bytes-for-hs256"


def token(**claims: Any) -> str:
    claims.setdefault("sub", "alice")
    claims.setdefault("exp", time.time() + 600)
    return jwt.encode(claims, SECRET, algorithm="HS256")


def test_auth_config_from_toml_dict() -> None:
    cfg = config_from_dict({
        "server": {"max_connections": 10, "rate_limit": 5.0, "rate_limit_action": "close",
                   "max_inflight_calls": 3, "drain_timeout": 2.0},
        "auth": {"jwt_secret": SECRET, "allowed_origins": ["https://*.example.com"],
                 "rules": [{"match": {"role": "admin"}, "call": ["*"]}]},
        "redis": {"cluster": ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]},
        "pubsub": {"url": "redis://127.0.0.1:6380/0"},
    })
    assert cfg.server.max_connections == 10 and cfg.server.rate_limit_action == "close"
    assert cfg.auth.rules == (Rule(match={"role": "admin"}, call=("*",)),)
    assert cfg.redis.cluster == ("redis://127.0.0.1:7000", "redis://127.0.0.1:7001")
    assert cfg.pubsub.url == "redis://127.0.0.1:6380/0"
    for bad in ({"server": {"rate_limit_action": "drop"}}, {"auth": {"rules": [{"allow": ["x"]}]}},
                {"auth": {"verifier": "nocolon"}}, {"server": {"max_connections": -1}}):
        with pytest.raises(ValueError):
            config_from_dict(bad)


# authentication ------------------------------------------------------------------


async def test_auth_accepts_header_and_query_token_refuses_others() -> None:
    auth = Auth(AuthConfig(jwt_secret=SECRET))
    async with stack(auth=auth) as server:
        async with ws(server, additional_headers={"Authorization": f"Bearer {token()}"}) as c:
            uid, f = call("test.echo", "hi")
            await c.send(f)
            assert (await recv(c))["meta"]["type"] == ACK
            assert (await recv(c))["payload"]["args"] == "hi"
        async with connect(server.url + "?token=" + token()) as c:
            assert await c.call("test.echo", "q", timeout=5) == "q"
        for headers in ({}, {"Authorization": "Bearer nope"},
                        {"Authorization": "Bearer " + jwt.encode({"sub": "x"}, "wrong-secret-" * 4, algorithm="HS256")},
                        {"Authorization": "Bearer " + token(exp=time.time() - 1)}):
            with pytest.raises(InvalidStatus) as info:
                async with ws(server, additional_headers=headers):
                    pass
            assert info.value.response.status_code == 401
        assert server.stats.rejections["unauthenticated"] == 4


async def test_claims_checked_at_the_handshake() -> None:
    """Not yet valid, another audience, another issuer, no audience: HTTP
    401 at the handshake; the right claims pass. (Algorithms and keys:
    tests/rustext/test_tokens.py.)"""
    auth = Auth(AuthConfig(jwt_secret=SECRET, audience="app", issuer="https://idp.test/"))
    good = {"aud": "app", "iss": "https://idp.test/"}
    async with stack(auth=auth) as server:
        async with connect(server.url + "?token=" + token(**good)) as c:
            assert await c.call("test.echo", "ok", timeout=5) == "ok"
        bad = [
            token(**good, nbf=time.time() + 600),
            token(aud="other", iss="https://idp.test/"),
            token(aud="app", iss="https://evil.test/"),
            token(iss="https://idp.test/"),  # no audience at all
        ]
        for t in bad:
            with pytest.raises(InvalidStatus) as info:
                async with ws(server, additional_headers={"Authorization": f"Bearer {t}"}):
                    pass
            assert info.value.response.status_code == 401
        assert server.stats.rejections["unauthenticated"] == 4


async def test_custom_verifier_and_origin_allow_list() -> None:
    def verify(tok: str, request: Any) -> dict[str, Any] | None:
        return {"sub": tok} if tok.startswith("good-") else None

    auth = Auth(AuthConfig(allowed_origins=("https://*.example.com",)), verifier=verify)
    async with stack(auth=auth) as server:
        ok = {"Authorization": "good-bob"}
        async with ws(server, additional_headers=ok, origin="https://app.example.com") as c:
            await c.send(call("test.echo", 1)[1])
            assert (await recv(c))["meta"]["type"] == ACK
        with pytest.raises(InvalidStatus) as info:
            async with ws(server, additional_headers=ok, origin="https://evil.test"):
                pass
        assert info.value.response.status_code == 403
        with pytest.raises(InvalidStatus) as info:
            async with ws(server, additional_headers={"Authorization": "bad"}, origin="https://app.example.com"):
                pass
        assert info.value.response.status_code == 401
        assert server.stats.rejections == {"origin": 1, "unauthenticated": 1}


async def test_per_message_authorization_nacks_401_and_403() -> None:
    cfg = AuthConfig(jwt_secret=SECRET, anonymous=True, rules=(
        Rule(match={"role": "admin"}, call=("*",), pub=("*",), sub=("*",)),
        Rule(match={"role": "user"}, call=("test.echo",), sub=("news.*",)),
    ))
    async with stack(auth=Auth(cfg)) as server:
        async with connect(server.url, headers={"Authorization": "Bearer " + token(role="user")}) as c:
            assert await c.call("test.echo", "ok", timeout=5) == "ok"
            with pytest.raises(Exception) as info:
                await c.call("test.reverse", "no", timeout=5)
            assert getattr(info.value, "code", None) == 403
            await c.sub("news.a")
            await c.sub("news.*", pattern=True)  # a pattern is checked as a string
            with pytest.raises(Exception) as info:
                await c.sub("*", pattern=True)
            assert getattr(info.value, "code", None) == 403
            with pytest.raises(Exception) as info:
                await c.pub("news.a", 1)
            assert getattr(info.value, "code", None) == 403
            await c.unsb("news.a")  # always allowed
        # grants carried by the token itself
        own = token(juggler={"call": ["test.rev*"]})
        async with connect(server.url, headers={"Authorization": "Bearer " + own}) as c:
            assert await c.call("test.reverse", "ab", timeout=5) == "ba"
        async with connect(server.url) as anon:  # anonymous: 401 for everything
            with pytest.raises(Exception) as info:
                await anon.call("test.echo", "x", timeout=5)
            assert getattr(info.value, "code", None) == 401
        async with connect(server.url, headers={"Authorization": "Bearer " + token(role="admin")}) as c:
            await c.pub("anything", 1)
        assert server.stats.rejections["forbidden"] == 3
        assert server.stats.rejections["unauthorized"] == 1


async def test_jwks_keys_rotated_while_serving() -> None:
    """An identity provider rotates its signing key: handshakes with tokens of
    the new key are accepted after one refetch, the old key's tokens are
    refused once it is gone, and connections made before go on."""
    old, new = SigningKey("RS256", kid="k1"), SigningKey("ES256", kid="k2")
    async with JwksServer([old]) as idp:
        auth = Auth(AuthConfig(jwks_url=idp.url, audience="juggler", issuer="https://idp.test", jwks_refresh=3600,
                               jwks_min_interval=0))
        await auth.start()
        claims = {"sub": "carol", "aud": "juggler", "iss": "https://idp.test", "exp": time.time() + 600}
        try:
            async with stack(auth=auth) as server:
                bearer = {"Authorization": "Bearer " + old.sign(claims)}
                async with connect(server.url, headers=bearer) as before:
                    assert await before.call("test.echo", "a", timeout=5) == "a"
                    idp.keys = [old, new]
                    fetches = idp.fetches
                    async with connect(server.url, headers={"Authorization": "Bearer " + new.sign(claims)}) as c:
                        assert await c.call("test.echo", "b", timeout=5) == "b"
                    assert idp.fetches == fetches + 1
                    idp.keys = [new]
                    assert auth.tokens is not None
                    await auth.tokens.refresh()  # what the background refresh does
                    with pytest.raises(InvalidStatus) as info:
                        async with ws(server, additional_headers=bearer):
                            pass
                    assert info.value.response.status_code == 401
                    assert await before.call("test.echo", "still", timeout=5) == "still"
                for bad in ({**claims, "aud": "other"}, {**claims, "iss": "https://evil.test"},
                            {**claims, "exp": time.time() - 5}, {**claims, "nbf": time.time() + 600}):
                    with pytest.raises(InvalidStatus) as info:
                        async with ws(server, additional_headers={"Authorization": "Bearer " + new.sign(bad)}):
                            pass
                    assert info.value.response.status_code == 401
        finally:
            await auth.aclose()
