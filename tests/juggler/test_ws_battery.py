"""A websocket battery against a real juggler server on Redis, modelled on
the Autobahn|Testsuite's sections: 1 framing (payload lengths across the
7-, 16- and 64-bit encodings), 2 pings and pongs, 3 reserved bits, 4
opcodes, 5 fragmentation, 6 UTF-8, 7 closing, 9 limits. Raw sockets speak
RFC 6455 by hand (masked client frames); after every case a separate
connection checks that the server still serves calls.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.juggler.stacks import redis_stack

pytestmark = [pytest.mark.timeout(180)]

TEXT, BINARY, CLOSE, PING, PONG, CONT = 0x1, 0x2, 0x8, 0x9, 0xA, 0x0


def frame(op: int, payload: bytes = b"", *, fin: bool = True, rsv: int = 0, mask: bool = True,
          length_override: bytes | None = None) -> bytes:
    """A client frame; ``length_override`` replaces the encoded length (malformed frames)."""
    b0 = (0x80 if fin else 0) | (rsv << 4) | op
    n = len(payload)
    if length_override is not None:
        head = bytes([b0]) + length_override
    elif n < 126:
        head = bytes([b0, (0x80 if mask else 0) | n])
    elif n < 65536:
        head = bytes([b0, (0x80 if mask else 0) | 126]) + struct.pack("!H", n)
    else:
        head = bytes([b0, (0x80 if mask else 0) | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(c ^ key[i % 4] for i, c in enumerate(payload))


def close_payload(code: int, reason: bytes = b"") -> bytes:
    return struct.pack("!H", code) + reason


def call_message(args: Any) -> bytes:
    return json.dumps({"meta": {"type": 1, "uuid": str(uuid.uuid4())},
                       "payload": {"uri": "test.echo", "timeout": 5_000_000_000, "args": args}}).encode()


_OPEN: list[WsClient] = []


class WsClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        _OPEN.append(self)

    @classmethod
    async def open(cls, port: int) -> WsClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write((f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                      "Sec-WebSocket-Protocol: juggler.0\r\n\r\n").encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 101"), head
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv(self, timeout: float = 10) -> tuple[int, bytes] | None:
        """The next server frame (opcode, payload), or None at EOF."""
        try:
            b0, b1 = await asyncio.wait_for(self.reader.readexactly(2), timeout)
        except asyncio.IncompleteReadError:
            return None
        assert not b1 & 0x80, "server frames are never masked"
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", await self.reader.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", await self.reader.readexactly(8))[0]
        return b0 & 0x0F, await self.reader.readexactly(n)

    async def expect_close(self, code: int) -> None:
        """The server fails or closes the connection with ``code``, then EOF."""
        while True:
            got = await self.recv()
            assert got is not None, f"EOF without a close frame (wanted {code})"
            op, payload = got
            if op == CLOSE:
                assert struct.unpack("!H", payload[:2])[0] == code, payload
                break
        assert await self.recv() is None  # then the server closes the TCP connection

    async def result_of_call(self, args: Any) -> Any:
        while True:
            got = await self.recv()
            assert got is not None, "closed instead of answering"
            op, payload = got
            if op == TEXT:
                msg = json.loads(payload)
                if msg["meta"]["type"] == 9:  # RES
                    return msg["payload"]["args"]

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def port(redis_url: str) -> AsyncIterator[int]:
    async with redis_stack(url=redis_url) as server:
        yield server.port
        while _OPEN:
            c = _OPEN.pop()
            c.writer.close()
            try:
                await c.writer.wait_closed()
            except OSError:
                pass


async def still_serving(port: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(TEXT, call_message("still here")))
    assert await c.result_of_call("still here") == "still here"
    c.close()


# --- 1: framing ------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 100, 125, 126, 127, 128, 65535, 65536, 200_000])
async def test_1_payload_lengths(port: int, size: int) -> None:
    c = await WsClient.open(port)
    text = "x" * size
    c.send(frame(TEXT, call_message(text)))
    assert await c.result_of_call(text) == text
    c.close()


async def test_1_an_unmasked_client_frame_fails(port: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(TEXT, call_message("x"), mask=False))
    await c.expect_close(1002)
    await still_serving(port)


async def test_1_binary_messages_are_not_juggler_messages(port: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(BINARY, b"\x00\x01"))
    got = await c.recv()
    assert got is None or got[0] == CLOSE
    await still_serving(port)


# --- 2: pings and pongs ----------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 125])
async def test_2_ping_gets_its_payload_back(port: int, size: int) -> None:
    c = await WsClient.open(port)
    payload = os.urandom(size)
    c.send(frame(PING, payload))
    assert await c.recv() == (PONG, payload)
    c.close()


async def test_2_unsolicited_pong_is_ignored(port: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(PONG, b"unsolicited") + frame(TEXT, call_message("1")))
    assert await c.result_of_call("1") == "1"
    c.close()


@pytest.mark.parametrize("case", ["ping over 125 bytes", "fragmented ping", "pong over 125 bytes"])
async def test_2_bad_control_frames_fail(port: int, case: str) -> None:
    c = await WsClient.open(port)
    if case == "ping over 125 bytes":
        c.send(frame(PING, b"x" * 126))
    elif case == "fragmented ping":
        c.send(frame(PING, b"x", fin=False))
    else:
        c.send(frame(PONG, b"x" * 126))
    await c.expect_close(1002)
    await still_serving(port)


# --- 3: reserved bits ------------------------------------------------------------


@pytest.mark.parametrize("rsv", [1, 2, 4, 7])
async def test_3_reserved_bits_fail(port: int, rsv: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(TEXT, call_message("1"), rsv=rsv))
    await c.expect_close(1002)
    await still_serving(port)


# --- 4: opcodes ------------------------------------------------------------------


@pytest.mark.parametrize("op", [3, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF])
async def test_4_reserved_opcodes_fail(port: int, op: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(op, b"x"))
    await c.expect_close(1002)
    await still_serving(port)


# --- 5: fragmentation ------------------------------------------------------------


async def test_5_fragmented_message_with_a_ping_in_between(port: int) -> None:
    c = await WsClient.open(port)
    msg = call_message("in three parts")
    a, b, rest = msg[:10], msg[10:20], msg[20:]
    c.send(frame(TEXT, a, fin=False) + frame(PING, b"mid") + frame(CONT, b, fin=False) + frame(CONT, rest))
    assert await c.recv() == (PONG, b"mid")  # the control frame is answered at once
    assert await c.result_of_call("in three parts") == "in three parts"
    c.close()


async def test_5_fragments_one_byte_each(port: int) -> None:
    c = await WsClient.open(port)
    msg = call_message("bytewise")
    frames = [frame(TEXT, msg[:1], fin=False)] + [frame(CONT, msg[i:i + 1], fin=False) for i in range(1, len(msg) - 1)]
    c.send(b"".join(frames) + frame(CONT, msg[-1:]))
    assert await c.result_of_call("bytewise") == "bytewise"
    c.close()


@pytest.mark.parametrize("case", ["continuation without a start", "text inside a fragmented message",
                                  "final continuation without a start"])
async def test_5_bad_fragmentation_fails(port: int, case: str) -> None:
    c = await WsClient.open(port)
    if case == "continuation without a start":
        c.send(frame(CONT, b"x", fin=False))
    elif case == "text inside a fragmented message":
        c.send(frame(TEXT, b"{", fin=False) + frame(TEXT, b"x"))
    else:
        c.send(frame(CONT, b"x"))
    await c.expect_close(1002)
    await still_serving(port)


# --- 6: UTF-8 --------------------------------------------------------------------


async def test_6_valid_utf8_split_across_fragments(port: int) -> None:
    c = await WsClient.open(port)
    text = "κόσμε 🎉 ünïcödé"
    msg = json.dumps(
        {"meta": {"type": 1, "uuid": str(uuid.uuid4())},
         "payload": {"uri": "test.echo", "timeout": 5_000_000_000, "args": text}}, ensure_ascii=False).encode()
    cut = msg.index("🎉".encode()) + 2  # inside the four bytes of one character
    c.send(frame(TEXT, msg[:cut], fin=False) + frame(CONT, msg[cut:]))
    assert await c.result_of_call(text) == text
    c.close()


@pytest.mark.parametrize("bad", [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"caf\xe9"])
async def test_6_invalid_utf8_fails_with_1007(port: int, bad: bytes) -> None:
    c = await WsClient.open(port)
    c.send(frame(TEXT, b'{"x":"' + bad + b'"}'))
    await c.expect_close(1007)
    await still_serving(port)


async def test_6_invalid_utf8_in_a_fragment_fails_before_the_message_ends(port: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(TEXT, b'{"x":"\xff', fin=False))  # the rest never comes: the first fragment is enough
    await c.expect_close(1007)
    await still_serving(port)


# --- 7: closing ------------------------------------------------------------------


# 1012-1014 were registered with IANA after RFC 6455 (service restart, try again later, bad gateway)
@pytest.mark.parametrize("code", [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014,
                                  3000, 3999, 4000, 4999])
async def test_7_valid_close_codes_are_echoed(port: int, code: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(CLOSE, close_payload(code, b"bye")))
    await c.expect_close(code)


async def test_7_empty_close_gets_a_close(port: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(CLOSE))
    got = await c.recv()
    assert got is not None and got[0] == CLOSE and got[1][:2] in (b"", struct.pack("!H", 1000))
    assert await c.recv() is None


@pytest.mark.parametrize("code", [0, 999, 1004, 1005, 1006, 1015, 1016, 2000, 2999, 5000, 65535])
async def test_7_invalid_close_codes_fail_with_1002(port: int, code: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(CLOSE, close_payload(code)))
    await c.expect_close(1002)
    await still_serving(port)


async def test_7_one_byte_close_payload_fails(port: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(CLOSE, b"\x03"))
    await c.expect_close(1002)


async def test_7_close_reason_not_utf8_fails(port: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(CLOSE, close_payload(1000, b"\xff\xfe")))
    await c.expect_close(1007)
    await still_serving(port)


async def test_7_nothing_is_processed_after_a_close(port: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(CLOSE, close_payload(1000)) + frame(TEXT, call_message("after close")))
    await c.expect_close(1000)


# --- 9: limits -------------------------------------------------------------------


async def test_9_a_message_over_the_limit_fails_with_1009_before_it_is_read(port: int) -> None:
    c = await WsClient.open(port)
    # the header announces 16 MiB; the server refuses from the header alone
    c.send(frame(TEXT, length_override=bytes([0x80 | 127]) + struct.pack("!Q", 16 << 20) + os.urandom(4)))
    await c.expect_close(1009)
    await still_serving(port)


async def test_9_a_fragmented_message_over_the_limit_fails(port: int) -> None:
    c = await WsClient.open(port)
    # each fragment under the limit, the message over it; sent whole so that the server has read
    # everything when it closes (unread bytes would make the close a reset)
    part = b"x" * ((1 << 20) - 100)
    c.send(frame(TEXT, part, fin=False) + frame(CONT, b"x" * 200))
    await c.expect_close(1009)
    await still_serving(port)


async def test_9_a_64_bit_length_with_its_top_bit_set_fails(port: int) -> None:
    c = await WsClient.open(port)
    c.send(frame(TEXT, length_override=bytes([0x80 | 127]) + struct.pack("!Q", 1 << 63) + os.urandom(4)))
    await c.expect_close(1002)
    await still_serving(port)


async def test_9_many_messages_in_one_write(port: int) -> None:
    c = await WsClient.open(port)
    c.send(b"".join(frame(TEXT, call_message(str(i))) for i in range(200)))
    seen = set()
    while len(seen) < 200:
        seen.add(await c.result_of_call(None))
    assert seen == {str(i) for i in range(200)}
    c.close()
