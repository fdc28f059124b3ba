"""JwtAuthPlugin on a real rpcx server: JWTs in ``__AUTH`` (with or without
``Bearer``), refused ones close the connection after "auth failed", claims
reach handlers, keys rotated through a JWKS, verified tokens cached."""

from __future__ import annotations

import asyncio
import time

import jwt
import pytest

import rustext
from rpc.examples import register_example
from rpc.plugins import JwtAuthPlugin
from rpc.rpcx_server import RpcxServer
from rpc.server import Server
from rustext.tokens import TokenConfig
from tests.jwks import JwksServer, SigningKey

pytestmark = pytest.mark.timeout(60)

SECRET = "an-rpc-test-secret-of-at-least-32-bytes"


async def exchange(port: int, tokens: list[str], *, until_closed: bool = False) -> dict[int, rustext.RpcxMessage]:
    """Send one Arith.Mul per token, pipelined; the replies by seq, once all
    came (or, ``until_closed``, once the server closed the connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(
        rustext.encode_rpcx_request(seq, b'{"A":2,"B":3}', service_path="Arith", service_method="Mul",
                                    metadata=[("__AUTH", t)], serialize_type=1)
        for seq, t in enumerate(tokens, 1)
    ))
    stream = rustext.RpcxStream()
    replies: dict[int, rustext.RpcxMessage] = {}
    try:
        while until_closed or len(replies) < len(tokens):
            data = await asyncio.wait_for(reader.read(65536), 5)
            if not data:
                break
            replies.update((m.seq, m) for m in stream.feed(data))
    finally:
        writer.close()
    return replies


async def test_jwts_accepted_and_refused() -> None:
    plugin = JwtAuthPlugin.from_config(TokenConfig(secret=SECRET, audience="rpc"))
    server = Server(plugins=[plugin])
    register_example(server.registry, "arith")
    good = jwt.encode({"sub": "svc", "aud": "rpc", "exp": time.time() + 60}, SECRET, algorithm="HS256")
    expired = jwt.encode({"sub": "svc", "aud": "rpc", "exp": time.time() - 60}, SECRET, algorithm="HS256")
    wrong_aud = jwt.encode({"sub": "svc", "aud": "web"}, SECRET, algorithm="HS256")
    async with RpcxServer(server, "tcp@127.0.0.1:0") as rpcx:
        port = rpcx.endpoint.port
        replies = await exchange(port, [good, "Bearer " + good])
        assert [replies[s].payload for s in (1, 2)] == [b'{"C":6}', b'{"C":6}']
        for bad in (expired, wrong_aud, "not-a-jwt", ""):
            # answered "auth failed", then the server closes the connection (reading
            # stops there; a request already read may still be answered)
            replies = await exchange(port, [good, bad, good], until_closed=True)
            assert replies[1].status == 0
            assert replies[2].status == 1 and replies[2].error == "auth failed"
    await server.dispatcher.aclose()
    await plugin.aclose()


async def test_jwks_rotation_and_the_token_cache() -> None:
    k1, k2 = SigningKey("RS256", kid="k1"), SigningKey("EdDSA", kid="k2")
    async with JwksServer([k1]) as idp:
        plugin = JwtAuthPlugin.from_config(TokenConfig(jwks_url=idp.url, jwks_min_interval=0))
        await plugin.start()
        server = Server(plugins=[plugin])
        register_example(server.registry, "arith")
        claims = {"sub": "svc", "exp": time.time() + 60}
        try:
            async with RpcxServer(server, "tcp@127.0.0.1:0") as rpcx:
                port = rpcx.endpoint.port
                assert (await exchange(port, [k1.sign(claims)] * 3))[3].payload == b'{"C":6}'
                idp.keys = [k1, k2]
                assert (await exchange(port, [k2.sign(claims)]))[1].payload == b'{"C":6}'
                assert idp.fetches == 2  # one for the unknown kid, then cached
                assert (await exchange(port, [k2.sign(claims)] * 2))[2].status == 0
                assert idp.fetches == 2
        finally:
            await server.dispatcher.aclose()
            await plugin.aclose()


async def test_claims_reach_handlers() -> None:
    from rpc.service import Context

    class Who:
        async def Me(self, ctx: Context, args: dict) -> dict:
            return {"sub": ctx.values["claims"]["sub"] if ctx.values else None}

    plugin = JwtAuthPlugin.from_config(TokenConfig(secret=SECRET))
    server = Server(plugins=[plugin])
    server.registry.register(Who(), name="Who")
    token = jwt.encode({"sub": "dave"}, SECRET, algorithm="HS256")
    async with RpcxServer(server, "tcp@127.0.0.1:0") as rpcx:
        reader, writer = await asyncio.open_connection("127.0.0.1", rpcx.endpoint.port)
        writer.write(rustext.encode_rpcx_request(1, b"{}", service_path="Who", service_method="Me",
                                                 metadata=[("__AUTH", token)], serialize_type=1))
        stream = rustext.RpcxStream()
        got: list = []
        while not got:
            got = stream.feed(await asyncio.wait_for(reader.read(65536), 5))
        writer.close()
        assert got[0].payload == b'{"sub":"dave"}'
    await server.dispatcher.aclose()


def test_options_are_checked() -> None:
    from rustext.tokens import TokenVerifier

    with pytest.raises(ValueError):
        JwtAuthPlugin(TokenVerifier(TokenConfig(secret=SECRET)), cache_size=-1)
