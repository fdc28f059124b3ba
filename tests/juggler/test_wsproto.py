"""juggler/wsproto.py: the sans-I/O websocket protocol of a server connection,
driven by bytes alone (no socket, no loop)."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.http11 import Request

import rustext
from juggler.protocol import SUBPROTOCOL
from juggler.wsproto import State, WsServerProtocol

REQUEST = (
    b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: juggler.0\r\n\r\n"
)


def masked(payload: bytes, opcode: int = 1, fin: bool = True) -> bytes:
    """One client frame (masked, RFC 6455 §5.3)."""
    key = os.urandom(4)
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def server_frame(payload: bytes, opcode: int = 1) -> bytes:
    """The reference encoding of one unmasked server frame (RFC 6455 §5.2)."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, n))
    elif n < 65536:
        head = bytes((0x80 | opcode, 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 127)) + n.to_bytes(8, "big")
    return head + payload


def proto(**kw: object) -> WsServerProtocol:
    return WsServerProtocol(subprotocol=SUBPROTOCOL, **kw)  # type: ignore[arg-type]


def opened(data: bytes = REQUEST) -> tuple[WsServerProtocol, bytes]:
    """A protocol past its handshake, and the 101 response it sent."""
    p = proto()
    events = p.receive_data(data)
    assert len(events) == 1 and isinstance(events[0], Request)
    assert p.accept(events[0]) is True
    assert p.state is State.OPEN
    out = p.data_to_send()
    assert len(out) == 1 and out[0].startswith(b"HTTP/1.1 101 ")
    assert b"Sec-WebSocket-Protocol: juggler.0\r\n" in out[0]
    return p, out[0]


def test_handshake_in_pieces_then_text_messages() -> None:
    p = proto()
    assert p.state is State.CONNECTING
    for i in range(0, len(REQUEST) - 1, 7):
        assert p.receive_data(REQUEST[i:i + 7]) == [] or p.request is not None
    p, _ = opened()
    assert p.receive_data(masked(b'{"a":1}') + masked(b"xyz")) == [b'{"a":1}', b"xyz"]


def test_frames_sent_with_the_request_are_read_after_accept() -> None:
    frame = masked(b"early")
    p = proto()
    events = p.receive_data(REQUEST + frame[:3])
    assert p.receive_data(frame[3:]) == []  # still CONNECTING: kept for later
    assert p.accept(events[0])
    assert p.receive_data(b"") == [b"early"]


def test_head_is_parsed_as_get_and_flagged() -> None:
    p = proto()
    assert p.receive_data(b"HE") == []
    events = p.receive_data(b"AD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert p.head and events[0].path == "/healthz"


def test_reject_sends_the_response_then_eof() -> None:
    p = proto()
    p.receive_data(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
    p.send_response(p.reject(404, "Not Found\n"))
    out = p.data_to_send()
    assert out[0].startswith(b"HTTP/1.1 404 ") and out[-1] == b""
    assert p.state is State.CLOSED
    assert p.receive_data(masked(b"late")) == []
    assert p.send_text(b"late") is False and p.data_to_send() == []


def test_no_juggler_subprotocol_upgrades_then_drops() -> None:
    request = REQUEST.replace(b"Sec-WebSocket-Protocol: juggler.0\r\n", b"Sec-WebSocket-Protocol: other\r\n")
    p = proto()
    assert p.accept(p.receive_data(request)[0]) is False
    assert p.offered == ["other"] and p.negotiated is None
    out = p.data_to_send()
    assert out[0].startswith(b"HTTP/1.1 101 ") and out[-1] == b""
    assert p.state is State.CLOSED
    # none offered: allowed unless allow_empty_subprotocol is off
    bare = REQUEST.replace(b"Sec-WebSocket-Protocol: juggler.0\r\n", b"")
    p = proto()
    assert p.accept(p.receive_data(bare)[0]) is True
    p = proto(allow_empty_subprotocol=False)
    assert p.accept(p.receive_data(bare)[0]) is False


def test_invalid_request_gets_an_error_response() -> None:
    p = proto()
    assert p.receive_data(b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n") == []
    out = p.data_to_send()
    assert out[0].startswith(b"HTTP/1.1 431 ") and out[-1] == b""
    assert p.state is State.CLOSED


def test_texts_of_a_turn_become_one_buffer() -> None:
    p, _ = opened()
    payloads = [b"a", b"b" * 200, b"c" * 70_000]
    for m in payloads:
        assert p.send_text(m)
    assert p.data_to_send() == [b"".join(server_frame(m) for m in payloads)]
    assert p.data_to_send() == []


def test_control_frames_keep_their_place_among_texts() -> None:
    p, _ = opened()
    p.send_text(b"one")
    (ping,) = p.receive_data(masked(b"hi", opcode=9))
    assert ping == (rustext.WS_PING, b"hi")
    p.receive_ping(ping[1])
    p.send_text(b"two")
    assert b"".join(p.data_to_send()) == server_frame(b"one") + server_frame(b"hi", 10) + server_frame(b"two")


def test_pings_only_while_open_and_pongs_give_no_event() -> None:
    p = proto()
    assert p.send_ping() is False  # no handshake yet
    p, _ = opened()
    p.send_text(b"one")
    assert p.send_ping() is True
    assert b"".join(p.data_to_send()) == server_frame(b"one") + server_frame(b"", 9)
    # the answer is no event: the driver saw bytes arrive, which is what the keepalive counts
    assert p.receive_data(masked(b"", opcode=10) + masked(b"after")) == [b"after"]
    assert p.send_close(1000)
    assert p.send_ping() is False and p.data_to_send() == [server_frame(b"\x03\xe8", 8)]


def test_closing_handshake_started_by_the_server() -> None:
    p, _ = opened()
    assert p.send_close(1001, "server shutting down")
    assert p.state is State.CLOSING
    assert p.send_text(b"x") is False and p.send_close(1000) is False
    assert p.data_to_send() == [server_frame(b"\x03\xe9server shutting down", 8)]
    # control frames are still read: a ping is not answered, the peer's close ends it
    (ping,) = p.receive_data(masked(b"p", opcode=9))
    p.receive_ping(ping[1])
    (close,) = p.receive_data(masked(b"\x03\xe9", opcode=8))
    p.receive_close(close[1])
    assert p.state is State.CLOSED and p.data_to_send() == [b""]


def test_closing_handshake_started_by_the_client_echoes_its_code() -> None:
    p, _ = opened()
    p.send_text(b"last")
    (close,) = p.receive_data(masked(b"\x03\xe8bye", opcode=8))
    assert close == (rustext.WS_CLOSE, b"\x03\xe8bye")
    p.receive_close(close[1])
    assert p.state is State.CLOSED
    out = p.data_to_send()
    assert b"".join(out) == server_frame(b"last") + server_frame(b"\x03\xe8", 8) and out[-1] == b""
    p.send_eof()  # idempotent: the end was already queued
    assert p.data_to_send() == []


def test_fail_sends_a_close_frame_then_eof() -> None:
    p = WsServerProtocol(subprotocol=SUBPROTOCOL, read_limit=10)
    p.accept(p.receive_data(REQUEST)[0])
    p.data_to_send()
    (fail,) = p.receive_data(masked(b"x" * 11))
    assert fail == (rustext.WS_FAIL, 1009, "message too big")
    p.fail(fail[1], fail[2])
    assert p.data_to_send() == [server_frame(b"\x03\xf1message too big", 8), b""]
    assert p.state is State.CLOSED


def test_stop_reading_drops_later_bytes_but_keeps_writing() -> None:
    p, _ = opened()
    p.stop_reading()
    assert not p.reading
    assert p.receive_data(masked(b"ignored")) == []
    assert p.send_text(b"reply") and p.data_to_send() == [server_frame(b"reply")]
    p.send_eof()
    assert p.data_to_send() == [b""]


def test_close_reason_is_cut_to_fit_a_control_frame() -> None:
    frame = rustext.ws_close_frame(1000, "r" * 300)
    assert frame[:4] == b"\x88\x7d\x03\xe8" and len(frame) == 2 + 125


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300) | st.sampled_from([b"", b"x" * 125, b"y" * 126, b"z" * 65_536]), max_size=8))
def test_text_frames_match_the_reference_encoder(payloads: list[bytes]) -> None:
    assert rustext.ws_text_frames(payloads) == b"".join(server_frame(m) for m in payloads)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=125), st.sampled_from([8, 9, 10]))
def test_control_frames_match_the_reference_encoder(payload: bytes, opcode: int) -> None:
    assert rustext.ws_control_frame(opcode, payload) == server_frame(payload, opcode)


def test_control_frame_limits() -> None:
    import pytest

    for opcode, payload in ((9, b"x" * 126), (1, b""), (11, b"")):
        with pytest.raises(rustext.RustextError):
            rustext.ws_control_frame(opcode, payload)
