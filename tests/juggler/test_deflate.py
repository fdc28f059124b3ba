"""permessage-deflate (RFC 7692): the negotiation table and a hostile battery
of offers, then real servers on 127.0.0.1 with the websockets client, the
juggler clients and a raw client that sees the frames' RSV1 bit: round trips
with and without compression, the threshold, fragmented compressed
messages, a deflate bomb (1009, the server serves the others), bad RSV bits
(1002), and the native fan-out to compressed and plain subscribers at once."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jugglerprocs import juggler_listening
from websockets.asyncio.client import connect as ws_connect

import rustext
from juggler.broker.memory import MemoryBroker
from juggler.client import connect
from juggler.config import ServerConfig
from juggler.deflate import Agreement, negotiate
from juggler.fanout import FanoutConfig, run_fanout
from juggler.reconnecting import reconnecting
from juggler.server import Server

pytestmark = pytest.mark.timeout(60)

SUB = '{"meta":{"type":3,"uuid":"%s"},"payload":{"channel":"%s","pattern":false}}'
PUB = '{"meta":{"type":2,"uuid":"%s"},"payload":{"channel":"%s","args":%s}}'

PLAIN_BOTH = "permessage-deflate; server_no_context_takeover; client_no_context_takeover"


# negotiation ---------------------------------------------------------------------

@pytest.mark.parametrize(("offers", "takeover", "answer"), [
    (["permessage-deflate"], False, PLAIN_BOTH),
    (["permessage-deflate; client_max_window_bits"], False, PLAIN_BOTH),  # websockets, Chromium
    (["permessage-deflate; client_max_window_bits=10"], False, PLAIN_BOTH),
    (['permessage-deflate; client_max_window_bits="12"'], False, PLAIN_BOTH),  # quoted-string, a token inside
    (["permessage-deflate; server_no_context_takeover"], False, PLAIN_BOTH),
    (["permessage-deflate; client_no_context_takeover"], True, PLAIN_BOTH),
    (["permessage-deflate"], True, "permessage-deflate; server_no_context_takeover"),
    (["permessage-deflate; server_max_window_bits=15"], False, PLAIN_BOTH + "; server_max_window_bits=15"),
    # a narrower server window than ours: that offer is declined, the next one taken
    (["permessage-deflate; server_max_window_bits=10, permessage-deflate"], False, PLAIN_BOTH),
    (["permessage-deflate; server_max_window_bits=10", "permessage-deflate"], False, PLAIN_BOTH),
    (["x-webkit-deflate-frame, permessage-deflate; client_max_window_bits"], False, PLAIN_BOTH),
    (["permessage-deflate; server_max_window_bits=10"], False, None),
    ([], False, None),
    (["x-webkit-deflate-frame"], False, None),
    # malformed offers are declined (RFC 7692 §5), the handshake goes on
    (["permessage-deflate; server_max_window_bits"], False, None),  # needs a value
    (["permessage-deflate; server_max_window_bits=08"], False, None),  # leading zero
    (["permessage-deflate; server_max_window_bits=16"], False, None),
    (["permessage-deflate; client_max_window_bits=7"], False, None),
    (["permessage-deflate; client_max_window_bits=0x0f"], False, None),
    (["permessage-deflate; client_max_window_bits=-15"], False, None),
    (["permessage-deflate; server_no_context_takeover=1"], False, None),
    (["permessage-deflate; client_no_context_takeover=true"], False, None),
    (["permessage-deflate; client_no_context_takeover; client_no_context_takeover"], False, None),
    (["permessage-deflate; client_max_window_bits; client_max_window_bits=9"], False, None),
    (["permessage-deflate; mystery"], False, None),
    (['permessage-deflate; client_max_window_bits="1 5"'], False, None),
    (["permessage-deflate;"], False, None),
    (["permessage-deflate;;"], False, None),
    ([", , ,"], False, None),
    ([""], False, None),
    (["\x00permessage-deflate"], False, None),
    (["permessage-deflate; client_max_window_bits=15" + "5" * 5000], False, None),
    # a header that is no extension syntax is declined; a later header may still offer
    (["permessage-deflate; =", "permessage-deflate"], False, PLAIN_BOTH),
])
def test_negotiation_table(offers: list[str], takeover: bool, answer: str | None) -> None:
    agreement = negotiate(offers, client_context_takeover=takeover)
    assert (agreement.header() if agreement else None) == answer


_param = st.sampled_from(["server_no_context_takeover", "client_no_context_takeover", "server_max_window_bits",
                          "client_max_window_bits", "x", ""])
_value = st.one_of(st.none(), st.sampled_from(["8", "15", "16", "08", '"9"', '""', "a b"]), st.text(max_size=6))
_offer = st.builds(lambda name, params: "; ".join([name] + [p if v is None else f"{p}={v}" for p, v in params]),
                   st.sampled_from(["permessage-deflate", "PerMessage-Deflate", "x"]),
                   st.lists(st.tuples(_param, _value), max_size=4))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.lists(_offer, min_size=1, max_size=3).map(", ".join), st.text(max_size=40)),
                max_size=3), st.booleans())
def test_hostile_offers_give_an_agreement_or_none(values: list[str], takeover: bool) -> None:
    agreement = negotiate(values, client_context_takeover=takeover)
    assert agreement is None or isinstance(agreement, Agreement)
    if agreement is not None:
        header = agreement.header()
        assert header.startswith("permessage-deflate; server_no_context_takeover")
        assert agreement.server_max_window_bits in (None, 15)
        if not takeover:
            assert not agreement.client_context_takeover


# a raw client: the frames as they are on the wire ------------------------------------------

class Raw:
    """A websocket client over asyncio streams that shows RSV1 and inflates by itself."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, response: str) -> None:
        self.reader, self.writer, self.response = reader, writer, response

    @classmethod
    async def open(cls, server: Server, extensions: str | None = "permessage-deflate") -> Raw:
        reader, writer = await asyncio.open_connection(server.config.host, server.port)
        key = base64.b64encode(os.urandom(16)).decode()
        head = (f"GET {server.config.path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: juggler.0\r\n")
        if extensions is not None:
            head += f"Sec-WebSocket-Extensions: {extensions}\r\n"
        writer.write((head + "\r\n").encode())
        response = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode()
        assert response.startswith("HTTP/1.1 101"), response
        return cls(reader, writer, response)

    @property
    def deflate(self) -> bool:
        return "sec-websocket-extensions: permessage-deflate" in self.response.lower()

    def send_frame(self, payload: bytes, *, op: int = 1, fin: bool = True, rsv: int = 0) -> None:
        key = os.urandom(4)
        n = len(payload)
        head = bytes([(0x80 if fin else 0) | rsv | op])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
        else:
            head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
        self.writer.write(head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload)))

    async def frame(self) -> tuple[int, bool, bytes]:
        """(opcode, RSV1, payload as sent)."""
        b0, b1 = await asyncio.wait_for(self.reader.readexactly(2), 10)
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(await self.reader.readexactly(2), "big")
        elif n == 127:
            n = int.from_bytes(await self.reader.readexactly(8), "big")
        return b0 & 0x0F, bool(b0 & 0x40), await self.reader.readexactly(n)

    async def text(self) -> tuple[bool, dict[str, Any]]:
        """The next text message: (came compressed, its JSON)."""
        while True:
            op, rsv1, payload = await self.frame()
            if op == 1:
                if rsv1:
                    payload = zlib.decompressobj(-15).decompress(payload + b"\x00\x00\xff\xff")
                return rsv1, json.loads(payload)
            assert op in (9, 10), (op, payload)

    async def close_code(self) -> int:
        while True:
            op, _, payload = await self.frame()
            if op == 8:
                return int.from_bytes(payload[:2], "big")

    async def subscribe(self, channel: str) -> None:
        self.send_frame((SUB % (uuid.uuid4(), channel)).encode())
        _, ack = await self.text()
        assert ack["meta"]["type"] == 8, ack

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass  # the server already dropped it


def deflated(payload: bytes) -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, -15)
    out = z.compress(payload) + z.flush(zlib.Z_SYNC_FLUSH)
    assert out.endswith(b"\x00\x00\xff\xff")
    return out[:-4]


async def serve(**cfg: Any) -> Server:
    broker = MemoryBroker()
    await broker.start()
    server = Server(broker, ServerConfig(port=0, **cfg))
    await server.start()
    return server


async def stop(server: Server) -> None:
    await server.aclose()
    await server.broker.aclose()


# real servers ----------------------------------------------------------------------------

async def test_the_juggler_clients_negotiate_deflate_and_round_trip() -> None:
    server = await serve(compression=True, compression_threshold=64)
    try:
        async with connect(server.url) as sub, connect(server.url) as pub, \
                connect(server.url, compression=None) as plain:
            assert [type(e).__name__ for e in sub.ws.protocol.extensions] == ["PerMessageDeflate"]
            assert plain.ws.protocol.extensions == []
            await sub.sub("c")
            await plain.sub("c")
            for args in ({"small": 1}, {"big": "ab" * 2000}, {"text": "ünïcödé " * 100}):
                await pub.pub("c", args)
                assert (await sub.next_event(10)).args == args
                assert (await plain.next_event(10)).args == args
        for compression, agreed in (("deflate", True), (None, False)):
            async with reconnecting(server.url, compression=compression) as rc, connect(server.url) as pub:
                await rc.sub("r")
                assert rc.client is not None and bool(rc.client.ws.protocol.extensions) is agreed
                await pub.pub("r", {"big": "r" * 1000})
                assert (await rc.next_event(10)).args == {"big": "r" * 1000}
    finally:
        await stop(server)


async def test_off_by_default_and_nothing_offered_nothing_agreed() -> None:
    server = await serve()
    try:
        raw = await Raw.open(server)
        assert not raw.deflate  # off: the offer is ignored
        await raw.close()
    finally:
        await stop(server)
    server = await serve(compression=True, compression_threshold=0)
    try:
        # the original Go client (gorilla/websocket) offers nothing: nothing changes for it
        raw = await Raw.open(server, extensions=None)
        assert not raw.deflate
        await raw.subscribe("g")
        async with connect(server.url) as pub:
            await pub.pub("g", {"x": "y" * 1000})
        rsv1, evnt = await raw.text()
        assert not rsv1 and evnt["payload"]["args"] == {"x": "y" * 1000}
        await raw.close()
    finally:
        await stop(server)


async def test_threshold_and_websockets_round_trip() -> None:
    server = await serve(compression=True, compression_threshold=200)
    try:
        raw = await Raw.open(server, "permessage-deflate; client_max_window_bits")
        assert raw.deflate
        await raw.subscribe("t")
        async with ws_connect(server.url, subprotocols=["juggler.0"]) as ws:  # type: ignore[list-item]
            assert ws.protocol.extensions
            for args in ('"s"', json.dumps("z" * 500), json.dumps(os.urandom(300).hex()[:300])):
                await ws.send(PUB % (uuid.uuid4(), "t", args))
                ack = json.loads(await asyncio.wait_for(ws.recv(), 10))
                assert ack["meta"]["type"] == 8
                rsv1, evnt = await raw.text()
                assert evnt["payload"]["args"] == json.loads(args)
                # under the threshold plain; over it compressed when that shrinks it (random
                # hex may not, at the fastest level: then it goes plain too)
                if len(args) < 200:
                    assert not rsv1
                elif args.startswith('"zzz'):
                    assert rsv1
        await raw.close()
    finally:
        await stop(server)


async def test_fragmented_compressed_messages_and_context_takeover() -> None:
    for takeover in (False, True):
        server = await serve(compression=True, compression_client_context_takeover=takeover)
        try:
            raw = await Raw.open(server)
            assert ("client_no_context_takeover" in raw.response) is not takeover
            await raw.subscribe("f")
            body = (PUB % (uuid.uuid4(), "f", json.dumps({"k": "fragmented " * 300}))).encode()
            z = deflated(body)
            third = len(z) // 3
            raw.send_frame(z[:third], fin=False, rsv=0x40)
            raw.send_frame(b"", op=9)  # a ping between the fragments
            raw.send_frame(z[third:2 * third], op=0, fin=False)
            raw.send_frame(z[2 * third:], op=0)
            got = [(await raw.text())[1]["meta"]["type"] for _ in range(2)]
            assert sorted(got) == [8, 10]  # the ACK and the event
            # the websockets client keeps its context when the server lets it
            async with ws_connect(server.url, subprotocols=["juggler.0"]) as ws:  # type: ignore[list-item]
                for i in range(5):
                    await ws.send(PUB % (uuid.uuid4(), "f", json.dumps({"i": i, "pad": "same text " * 50})))
                    assert json.loads(await asyncio.wait_for(ws.recv(), 10))["meta"]["type"] == 8
                    _, evnt = await raw.text()
                    assert evnt["payload"]["args"]["i"] == i
            await raw.close()
        finally:
            await stop(server)


async def test_a_deflate_bomb_is_closed_1009_and_the_others_are_served() -> None:
    server = await serve(compression=True, read_limit=64 * 1024)
    try:
        async with connect(server.url) as sub, connect(server.url) as pub:
            await sub.sub("b")
            bomb = deflated((PUB % (uuid.uuid4(), "b", json.dumps("a" * (50 << 20)))).encode())
            assert len(bomb) < 100_000
            raw = await Raw.open(server)
            raw.send_frame(bomb, rsv=0x40)
            assert await raw.close_code() == 1009
            await raw.close()
            await pub.pub("b", {"still": "serving"})
            assert (await sub.next_event(10)).args == {"still": "serving"}
    finally:
        await stop(server)


@pytest.mark.parametrize(("extensions", "frames"), [
    (None, [(0x40, 1, True)]),  # RSV1 without the agreement
    ("permessage-deflate", [(0, 1, False), (0x40, 0, True)]),  # RSV1 on a continuation frame
    ("permessage-deflate", [(0x40, 9, True)]),  # RSV1 on a control frame
    ("permessage-deflate", [(0x20, 1, True)]),  # RSV2
    ("permessage-deflate", [(0x60, 1, True)]),
])
async def test_bad_rsv_bits_close_1002(extensions: str | None, frames: list[tuple[int, int, bool]]) -> None:
    server = await serve(compression=True)
    try:
        raw = await Raw.open(server, extensions)
        for rsv, op, fin in frames:
            raw.send_frame(deflated(b'"x"') if rsv else b'"x"', op=op, fin=fin, rsv=rsv)
        assert await raw.close_code() == 1002
        await raw.close()
        async with connect(server.url) as client:  # the server goes on
            await client.sub("after")
    finally:
        await stop(server)


async def test_native_fan_out_to_compressed_and_plain_subscribers() -> None:
    server = await serve(compression=True, compression_threshold=100)
    try:
        assert server.subscriptions.hub is not None
        raws = [await Raw.open(server, ext) for ext in ("permessage-deflate", None, "permessage-deflate", None)]
        assert [r.deflate for r in raws] == [True, False, True, False]
        for r in raws:
            await r.subscribe("mixed")
        async with connect(server.url) as sub, connect(server.url, compression=None) as plain_sub, \
                connect(server.url) as pub:
            await sub.sub("mixed")
            await plain_sub.sub("mixed")
            sent = [{"i": i, "pad": "p" * (i * 97)} for i in range(8)]
            for args in sent:
                await pub.pub("mixed", args)
            for r in raws:
                got = [await r.text() for _ in sent]
                assert [evnt["payload"]["args"] for _, evnt in got] == sent
                # compressed frames to the deflate subscribers only, and only over the threshold
                assert any(rsv1 for rsv1, _ in got) is r.deflate
                assert all(not rsv1 for rsv1, evnt in got if len(json.dumps(evnt)) < 100)
            for c in (sub, plain_sub):
                assert [(await c.next_event(10)).args for _ in sent] == sent
        for r in raws:
            await r.close()
    finally:
        await stop(server)


def test_the_load_tools_native_subscribers_inflate_a_compressing_server() -> None:
    """`juggler server --set server.compression=true` (a real process) and the
    load tool's native subscribers offering deflate: every event arrives, once, in order."""
    with juggler_listening("up", "--set", "server.compression=true", "--set", "server.compression_threshold=0") as url:
        report = run_fanout(FanoutConfig(url=url, subscribers=50, rate=20, duration=1.0, payload_bytes=400,
                                         settle=2.0, compression=True))
    assert not report.error_messages, report.error_messages[:3]
    assert report.published >= 10
    assert report.delivered == report.expected == report.published * 50
    assert report.duplicates == 0 and report.out_of_order == 0


def test_the_sans_io_protocol_agrees_inflates_and_compresses() -> None:
    """WsServerProtocol alone: the 101 carries the agreement, RSV1 messages are
    inflated, text over the threshold goes out compressed, under it plain."""
    from juggler.deflate import Deflate
    from juggler.wsproto import WsServerProtocol

    for offer, agreed in (("permessage-deflate; client_max_window_bits", True), (None, False)):
        ws = WsServerProtocol(subprotocol="juggler.0", read_limit=1 << 16, deflate=Deflate(threshold=100))
        head = ("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                "Sec-WebSocket-Protocol: juggler.0\r\n")
        if offer:
            head += f"Sec-WebSocket-Extensions: {offer}\r\n"
        (request,) = ws.receive_data((head + "\r\n").encode())
        assert ws.accept(request)
        response = b"".join(ws.data_to_send())
        assert (b"Sec-WebSocket-Extensions: " + PLAIN_BOTH.encode() in response) is agreed
        assert (ws.compression is not None) is agreed
        body = b'{"k":"' + b"v" * 1000 + b'"}'
        z = deflated(body)
        key = b"\x01\x02\x03\x04"
        masked = bytes(b ^ key[i % 4] for i, b in enumerate(z))
        frame = bytes([0xC1, 0x80 | 126]) + len(z).to_bytes(2, "big") + key + masked
        events = ws.receive_data(frame)
        assert events == ([body] if agreed else [(rustext.WS_FAIL, 1002, "protocol error")])
        if agreed:
            ws.send_text(body)
            ws.send_text(b'"small"')
            out = b"".join(ws.data_to_send())
            assert out[0] == 0xC1 and out[-9:] == b'\x81\x07"small"'
