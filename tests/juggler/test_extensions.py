"""Extension requests (juggler/extensions.py): a type from 256 up is taken
only when the server registers a handler for it; the handler answers with a
REPLY or a NACK, in the connection's order; anything else is bad input, as
an unknown type always was. A real server on loopback, the Python client
and the websockets library for hand-made frames."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed as WsConnectionClosed

from juggler.broker.memory import MemoryBroker
from juggler.client import connect
from juggler.config import ServerConfig
from juggler.conn import Conn
from juggler.errors import CallNacked
from juggler.extensions import HISTORY, PRESENCE, REPLY, ExtensionMessage, parse_extension, reply_frame
from juggler.server import Server

pytestmark = pytest.mark.timeout(60)

ECHO = 300  # a type of this test's own


async def echo(conn: Conn, msg: ExtensionMessage) -> None:
    """Answers with the payload, or refuses one that says so."""
    if msg.payload.get("refuse"):
        conn.nack(msg, 403, "refused by the handler")  # type: ignore[arg-type]
        return
    await asyncio.sleep(0)
    conn.reply(msg, (REPLY, msg.uuid, reply_frame(msg.type, msg.uuid, msg.payload)))  # type: ignore[arg-type]


@asynccontextmanager
async def serving(**cfg: Any) -> AsyncIterator[Server]:
    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0, **cfg))
    server.extensions[ECHO] = echo
    try:
        await server.start()
        yield server
    finally:
        await server.aclose()
        await broker.aclose()


async def test_a_registered_type_is_answered_with_a_reply_or_a_nack() -> None:
    async with serving() as server, connect(server.url) as client:
        assert await client.request(ECHO, {"channel": "a", "n": [1, 2]}, timeout=5) == {"channel": "a", "n": [1, 2]}
        with pytest.raises(CallNacked) as nacked:
            await client.request(ECHO, {"refuse": True, "channel": "b"}, timeout=5)
        assert nacked.value.code == 403
        # the connection goes on serving the protocol's own messages
        await client.sub("c")
        assert server.stats.extensions_read[ECHO] == 2
        assert server.stats.extensions_written[REPLY] == 1


async def test_the_nack_names_the_extension_type_and_the_channel() -> None:
    async with serving() as server, ws_connect(server.url, subprotocols=["juggler.0"]) as ws:  # type: ignore[list-item]
        uuid = "0b9d7d4e-8a43-4a07-9e5b-5c1b8a9f0a11"
        await ws.send(json.dumps({"meta": {"type": ECHO, "uuid": uuid}, "payload": {"refuse": 1, "channel": "x"}}))
        nack = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert nack["meta"]["type"] == 7
        assert nack["payload"]["for"] == uuid
        assert nack["payload"]["for_type"] == ECHO
        assert nack["payload"]["channel"] == "x"
        assert nack["payload"]["code"] == 403


async def test_replies_keep_the_connections_order() -> None:
    """An extension request is ordered like a SUB: the ACK of a PUB sent
    before it comes first, and the one of a PUB sent after it comes after."""
    async with serving() as server, ws_connect(server.url, subprotocols=["juggler.0"]) as ws:  # type: ignore[list-item]
        ids = [f"0b9d7d4e-8a43-4a07-9e5b-5c1b8a9f0a1{i}" for i in range(3)]
        await ws.send(json.dumps({"meta": {"type": 2, "uuid": ids[0]}, "payload": {"channel": "p", "args": 1}}))
        await ws.send(json.dumps({"meta": {"type": ECHO, "uuid": ids[1]}, "payload": {}}))
        await ws.send(json.dumps({"meta": {"type": 2, "uuid": ids[2]}, "payload": {"channel": "p", "args": 2}}))
        got = [json.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in range(3)]
        assert [m["payload"]["for"] for m in got] == ids
        assert [m["meta"]["type"] for m in got] == [8, REPLY, 8]


@pytest.mark.parametrize("frame", [
    {"meta": {"type": 301, "uuid": "0b9d7d4e-8a43-4a07-9e5b-5c1b8a9f0a11"}, "payload": {}},  # not registered
    {"meta": {"type": ECHO, "uuid": "not-a-uuid"}, "payload": {}},
    {"meta": {"type": ECHO}, "payload": {}},
    {"meta": {"type": ECHO, "uuid": "0b9d7d4e-8a43-4a07-9e5b-5c1b8a9f0a11"}, "payload": [1]},
    {"meta": {"type": float(ECHO), "uuid": "0b9d7d4e-8a43-4a07-9e5b-5c1b8a9f0a11"}, "payload": {}},
])
async def test_anything_else_is_bad_input_and_ends_that_connection_only(frame: dict[str, Any]) -> None:
    async with serving() as server, connect(server.url) as other:
        async with ws_connect(server.url, subprotocols=["juggler.0"]) as ws:  # type: ignore[list-item]
            await ws.send(json.dumps(frame))
            with pytest.raises(WsConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
        assert server.stats.protocol_errors == 1
        assert await other.request(ECHO, {"still": "here"}, timeout=5) == {"still": "here"}


async def test_a_server_without_handlers_treats_extension_types_as_before() -> None:
    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0))
    await server.start()
    try:
        async with ws_connect(server.url, subprotocols=["juggler.0"]) as ws:  # type: ignore[list-item]
            await ws.send(json.dumps({"meta": {"type": HISTORY, "uuid": "0b9d7d4e-8a43-4a07-9e5b-5c1b8a9f0a11"},
                                      "payload": {"channel": "a"}}))
            with pytest.raises(WsConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
    finally:
        await server.aclose()
        await broker.aclose()


def test_the_reply_frame() -> None:
    frame = reply_frame(PRESENCE, "0b9d7d4e-8a43-4a07-9e5b-5c1b8a9f0a11", {"clients": ["é"]})
    assert frame.endswith(b"\n")
    msg = json.loads(frame)
    assert msg["meta"]["type"] == REPLY
    assert msg["payload"] == {"for": "0b9d7d4e-8a43-4a07-9e5b-5c1b8a9f0a11", "for_type": PRESENCE,
                              "result": {"clients": ["é"]}}


def test_the_uuid_is_canonical_and_the_channel_read() -> None:
    msg = parse_extension(b'{"meta":{"type":260,"uuid":"{0B9D7D4E-8A43-4A07-9E5B-5C1B8A9F0A11}"},'
                          b'"payload":{"channel":"c","limit":3}}', {HISTORY})
    assert msg is not None
    assert (msg.type, msg.uuid, msg.channel, msg.payload["limit"]) == (
        HISTORY, "0b9d7d4e-8a43-4a07-9e5b-5c1b8a9f0a11", "c", 3)
    no_channel = parse_extension(b'{"meta":{"type":260,"uuid":"0b9d7d4e-8a43-4a07-9e5b-5c1b8a9f0a11"},'
                                 b'"payload":{"channel":7}}', {HISTORY})
    assert no_channel is not None and no_channel.channel == ""


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                              lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=4),
                              max_leaves=20).map(lambda v: json.dumps(v).encode())))
def test_the_parser_never_raises(data: bytes) -> None:
    msg = parse_extension(data, {HISTORY, PRESENCE, ECHO})
    assert msg is None or (msg.type in {HISTORY, PRESENCE, ECHO} and isinstance(msg.payload, dict))


def test_deeply_nested_input_is_refused_not_raised() -> None:
    assert parse_extension(b"[" * 100_000, {HISTORY}) is None
