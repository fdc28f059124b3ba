"""rustext.WsFrameReader (the juggler server's client-frame reader) against
references written here: an encoder of client frames with the events a
valid stream must give, and a pure-Python parser of RFC 6455's rules (the
server's former parser plus UTF-8 and close-code checks, with Python's own
UTF-8 decoder) on arbitrary frame sequences, valid or not, fed in arbitrary
chunks."""

from __future__ import annotations

import codecs
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rustext
from rustext import WS_BINARY, WS_CLOSE, WS_FAIL, WS_PING, WsFrameReader


def mask(payload: bytes, key: bytes) -> bytes:
    return bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def encode(fin: bool, op: int, payload: bytes, key: bytes = b"\x01\x02\x03\x04", *,
           rsv: int = 0, masked: bool = True, width: int | None = None) -> bytes:
    """One client frame; `width` forces the length encoding (7, 16 or 64 bits)."""
    n = len(payload)
    if width is None:
        width = 7 if n < 126 else 16 if n < 65536 else 64
    b0 = (0x80 if fin else 0) | (rsv << 4) | op
    m = 0x80 if masked else 0
    if width == 7:
        head = bytes((b0, m | n))
    elif width == 16:
        head = bytes((b0, m | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((b0, m | 127)) + n.to_bytes(8, "big")
    if not masked:
        return head + payload
    return head + key + mask(payload, key)


def feed_split(reader: WsFrameReader, data: bytes, cuts: list[int]) -> list:
    events: list = []
    last = 0
    for c in sorted(min(c, len(data)) for c in cuts) + [len(data)]:
        events += reader.feed(data[last:c])
        last = c
    return events


INVALID_TEXT = (WS_FAIL, 1007, "invalid UTF-8 in a text message")


def close_code_is_valid(code: int) -> bool:
    return 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999


def reference(data: bytes, limit: int) -> list:
    """RFC 6455's rules for a server reading client frames, as a pure
    function over the whole stream, stopping as the server does on a
    failure, a binary frame or a close frame."""
    out: list = []
    n = len(data)
    pos = 0
    frag: list[bytes] | None = None
    frag_size = 0
    utf8 = codecs.getincrementaldecoder("utf-8")()
    while n - pos >= 2:
        b0, b1 = data[pos], data[pos + 1]
        ln = b1 & 0x7F
        if ln < 126:
            hdr = 2
        elif ln == 126:
            if n - pos < 4:
                break
            ln = int.from_bytes(data[pos + 2:pos + 4], "big")
            hdr = 4
        else:
            if n - pos < 10:
                break
            ln = int.from_bytes(data[pos + 2:pos + 10], "big")
            hdr = 10
        if b0 & 0x70 or not b1 & 0x80 or ln >> 63:
            return out + [(WS_FAIL, 1002, "protocol error")]
        if limit and ln + frag_size > limit:
            return out + [(WS_FAIL, 1009, "message too big")]
        end = pos + hdr + 4 + ln
        if end > n:
            break
        payload = mask(data[pos + hdr + 4:end], data[pos + hdr:pos + hdr + 4])
        pos = end
        fin, op = b0 & 0x80, b0 & 0x0F
        if op in (0, 1):
            if op == 1 and frag is not None:
                return out + [(WS_FAIL, 1002, "expected a continuation frame")]
            if op == 0 and frag is None:
                return out + [(WS_FAIL, 1002, "unexpected continuation frame")]
            if op == 1:
                frag, frag_size = [], 0
                utf8.reset()
            assert frag is not None
            try:
                utf8.decode(payload, final=bool(fin))
            except UnicodeDecodeError:
                return out + [INVALID_TEXT]
            frag.append(payload)
            frag_size += len(payload)
            if fin:
                out.append(b"".join(frag))
                frag, frag_size = None, 0
        elif op == 2:
            return out + [(WS_BINARY, b"")]
        elif op >= 8 and (not fin or len(payload) > 125):
            return out + [(WS_FAIL, 1002, "invalid control frame")]
        elif op == 9:
            out.append((WS_PING, payload))
        elif op == 10:
            pass
        elif op == 8:
            if len(payload) == 1:
                return out + [(WS_FAIL, 1002, "invalid close frame")]
            if payload and not close_code_is_valid(code := int.from_bytes(payload[:2], "big")):
                return out + [(WS_FAIL, 1002, f"invalid close code {code}")]
            try:
                payload[2:].decode("utf-8")
            except UnicodeDecodeError:
                return out + [(WS_FAIL, 1007, "invalid UTF-8 in a close reason")]
            return out + [(WS_CLOSE, payload)]
        else:
            return out + [(WS_FAIL, 1002, f"reserved opcode {op}")]
    return out


keys = st.binary(min_size=4, max_size=4)
small = st.text(max_size=60).map(str.encode)
# 16- and 64-bit lengths without making hypothesis draw every byte
large = st.builds(lambda n, c, head: head.encode() + c.encode() * n, st.integers(126, 70_000),
                  st.characters(codec="utf-8"), st.text(max_size=8))


@st.composite
def valid_stream(draw) -> tuple[bytes, list]:
    """Text messages (in 1–4 fragments cut at any byte, so characters straddle
    fragments), pings and pongs, maybe a close at the end."""
    data = b""
    want: list = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["text", "text", "ping", "pong"]))
        key = draw(keys)
        if kind == "text":
            text = draw(st.one_of(small, small, large))
            parts = draw(st.integers(1, 4))
            step = max(1, -(-len(text) // parts))
            chunks = [text[i:i + step] for i in range(0, len(text), step)] or [b""]
            for i, c in enumerate(chunks):
                data += encode(i == len(chunks) - 1, 1 if i == 0 else 0, c, key)
            want.append(text)
        else:
            p = draw(st.binary(max_size=125))
            data += encode(True, 9 if kind == "ping" else 10, p, key)
            if kind == "ping":
                want.append((WS_PING, p))
    if draw(st.booleans()):
        p = draw(st.sampled_from([b"", b"\x03\xe8", b"\x03\xe9going away", b"\x0f\xa0\xce\xba\xe1\xbd\xb9"]))
        data += encode(True, 8, p, draw(keys))
        want.append((WS_CLOSE, p))
    return data, want


@settings(max_examples=150, deadline=None)
@given(valid_stream(), st.lists(st.integers(0, 200_000), max_size=8))
def test_valid_streams_any_split(stream: tuple[bytes, list], cuts: list[int]) -> None:
    data, want = stream
    assert WsFrameReader(0).feed(data) == want
    reader = WsFrameReader(0)
    assert feed_split(reader, data, cuts) == want
    assert reader.buffered == 0


@st.composite
def any_frame(draw) -> bytes:
    """Frames with every opcode, RSV bits, unmasked, FIN unset, all length widths."""
    payload = draw(st.one_of(st.binary(max_size=2), st.binary(max_size=130), st.binary(min_size=124, max_size=127),
                             st.just(b"x" * 300)))
    width = draw(st.sampled_from([None, None, None, 16, 64]))
    return encode(
        draw(st.booleans()),
        draw(st.sampled_from([0, 0, 0, 1, 1, 1, 2, 8, 8, 9, 9, 10, 3, 7, 11, 15])),
        payload,
        draw(keys),
        rsv=draw(st.sampled_from([0, 0, 0, 0, 0, 0, 1, 4])),
        masked=draw(st.integers(0, 15)) != 0,
        width=width,
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(any_frame(), max_size=10),
    st.sampled_from([0, 0, 10, 100, 200, 1000]),
    st.lists(st.integers(0, 3000), max_size=6),
    st.binary(max_size=12),
)
def test_matches_the_reference_parser(frames: list[bytes], limit: int, cuts: list[int],
                                          tail: bytes) -> None:
    data = b"".join(frames) + tail
    want = reference(data, limit)
    reader = WsFrameReader(limit)
    assert feed_split(reader, data, cuts) == want
    ended = bool(want) and want[-1].__class__ is tuple and want[-1][0] in (WS_FAIL, WS_BINARY, WS_CLOSE)
    assert reader.done == ended
    if ended:
        assert reader.feed(encode(True, 1, b"late")) == []
        assert reader.buffered == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=10), st.integers(0, 50))
def test_arbitrary_bytes(chunks: list[bytes], limit: int) -> None:
    reader = WsFrameReader(limit)
    got: list = []
    for c in chunks:
        got += reader.feed(c)
    assert got == reference(b"".join(chunks), limit)


def test_random_bulk_bytes() -> None:
    for seed in range(20):
        data = random.Random(seed).randbytes(4096)
        assert WsFrameReader(64).feed(data) == reference(data, 64)


def test_limit_fires_from_the_header() -> None:
    reader = WsFrameReader(10)
    assert reader.feed(encode(False, 1, b"123456")) == []
    assert reader.buffered == 6
    assert reader.feed(encode(True, 0, b"12345")[:2]) == [(WS_FAIL, 1009, "message too big")]
    assert reader.done and reader.buffered == 0


def test_huge_64_bit_length() -> None:
    too_big = bytes((0x81, 0xFF)) + (2**64 - 1).to_bytes(8, "big") + b"\0\0\0\0"
    assert WsFrameReader(0).feed(too_big) == [(WS_FAIL, 1002, "protocol error")]  # MSB set (RFC 6455 §5.2)
    head = bytes((0x81, 0xFF)) + (2**63 - 1).to_bytes(8, "big") + b"\0\0\0\0"
    assert WsFrameReader(1 << 20).feed(head) == [(WS_FAIL, 1009, "message too big")]
    reader = WsFrameReader(0)
    assert reader.feed(head) == []  # waits (no limit), without overflow
    assert reader.buffered == len(head)


def test_bad_arguments() -> None:
    with pytest.raises(rustext.RustextError):
        WsFrameReader(-1)
    with pytest.raises(TypeError):
        WsFrameReader(0).feed("text")  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(valid_stream(), st.sampled_from([0, 1, 50, 150, 1000, 100_000]), st.lists(st.integers(0, 200_000), max_size=4))
def test_limit_on_valid_streams(stream: tuple[bytes, list], limit: int, cuts: list[int]) -> None:
    """The limit counts the fragments held (whole messages, not frames)."""
    data, _ = stream
    assert feed_split(WsFrameReader(limit), data, cuts) == reference(data, limit)


def test_control_frame_bounds() -> None:
    for op in (8, 9, 10):
        assert WsFrameReader(0).feed(encode(True, op, b"\x03\xe8" + b"x" * 124))[-1] == (
            WS_FAIL, 1002, "invalid control frame")
        assert WsFrameReader(0).feed(encode(False, op, b"")) == [(WS_FAIL, 1002, "invalid control frame")]
    assert WsFrameReader(0).feed(encode(True, 9, b"p" * 125)) == [(WS_PING, b"p" * 125)]
    assert WsFrameReader(0).feed(encode(True, 10, b"p" * 125)) == []
    assert WsFrameReader(0).feed(encode(True, 8, b"\x03")) == [(WS_FAIL, 1002, "invalid close frame")]
    assert WsFrameReader(0).feed(encode(True, 8, b"\x03\xe8" + b"r" * 123)) == [(WS_CLOSE, b"\x03\xe8" + b"r" * 123)]
