"""The join/leave notice wire format (juggler/presence/notices.py), sans I/O,
and the in-process notice bus."""

from __future__ import annotations

import json

import pytest

import rustext
from juggler.broker.cluster import key_slot
from juggler.presence import (
    notice_channel,
    notice_frame,
    notice_payload,
    parse_notice,
    presence_key,
)
from juggler.presence.notices import LocalNotices

pytestmark = pytest.mark.timeout(10)

U = "3f1c4b2a-9d8e-4f7a-b6c5-0a1b2c3d4e5f"


def test_the_notice_frame_exactly() -> None:
    payload = notice_payload("chat.a", "join", {"client": "c-1", "user": "alice"})
    assert notice_frame(payload, U) == (
        b'{"meta":{"type":10,"uuid":"' + U.encode() + b'"},'
        b'"payload":{"channel":"chat.a","join":{"client":"c-1","user":"alice"}}}\n'
    )
    leave = notice_frame(notice_payload("chat.a", "leave", {"client": "c-1", "user": None, "conn_info": {"n": 1}}))
    msg = json.loads(leave)
    assert msg["meta"]["type"] == 10 and rustext.canonical_uuid(msg["meta"]["uuid"]) == msg["meta"]["uuid"]
    assert msg["payload"] == {"channel": "chat.a", "leave": {"client": "c-1", "user": None, "conn_info": {"n": 1}}}
    assert notice_frame(payload) != notice_frame(payload)  # a fresh uuid each


def test_the_codec_reads_notices_as_events_without_for_or_args() -> None:
    m = rustext.parse_server_message(notice_frame(notice_payload("room", "join", {"client": "c", "user": None})))
    assert (m.type, m.channel, m.for_uuid, m.args, m.leave) == (rustext.EVNT, "room", "", None, None)
    assert json.loads(m.join) == {"client": "c", "user": None}
    m = rustext.parse_server_message(notice_frame(notice_payload("room", "leave", {"client": "c", "user": "u"})))
    assert m.join is None and json.loads(m.leave) == {"client": "c", "user": "u"}


def test_payloads_are_compact_and_html_safe() -> None:
    payload = notice_payload("<b>&", "join", {"client": "c", "user": "é\u2028"})
    assert payload == b'{"channel":"\\u003cb\\u003e\\u0026","join":{"client":"c","user":"\xc3\xa9\\u2028"}}'
    with pytest.raises(ValueError):
        notice_payload("c", "hello", {"client": "c"})


@pytest.mark.parametrize("data", [
    b"not json", b"[]", b'{"channel":1,"join":{"client":"c"}}', b'{"channel":"c"}',
    b'{"channel":"c","join":{"client":"c"},"leave":{"client":"c"}}', b'{"channel":"c","join":{"user":"u"}}',
    b'{"channel":"c","join":"x"}', b'{"channel":"c","join":{"client":"c"},"args":1}',
])
def test_what_is_not_a_notice(data: bytes) -> None:
    assert parse_notice(data) is None


def test_parse_notice() -> None:
    assert parse_notice(notice_payload("c", "join", {"client": "x", "user": None})) == (
        "c", "join", {"client": "x", "user": None})


def test_notice_channel_shares_the_presence_keys_slot() -> None:
    assert notice_channel("chat.1") == "juggler:presence:notices:{chat.1}"
    for ch in ("chat.1", "a", "x.y.z", "{odd}"):
        assert key_slot(notice_channel(ch)) == key_slot(presence_key(ch))


async def test_local_bus() -> None:
    got: list[tuple[str, bytes]] = []
    bus = LocalNotices(lambda ch, data: got.append((ch, data)))
    assert await bus.publish("a", b"1") == 0  # nobody listens
    await bus.subscribe("a")
    assert bus.subscribed("a")
    assert await bus.publish("a", b"2") == 1
    bus.unsubscribe("a")
    assert await bus.publish("a", b"3") == 0
    await bus.subscribe("b")
    await bus.aclose()
    assert await bus.publish("b", b"4") == 0
    assert got == [("a", b"2")]
