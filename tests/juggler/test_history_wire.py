"""History is an extension the original juggler never notices: checked against
the frames and the Redis traffic captured from the original Go server
(shared/vectors/juggler). Our EVNTs and PUBLISH payloads on channels with
history are the original bytes with `offset` and `epoch` appended, so a Go
server or client (encoding/json ignores unknown fields) reads them as before;
without history they are the original bytes."""

from __future__ import annotations

import json
import os
import re

import pytest
import redis.asyncio as aioredis
import rustext

from juggler.broker.redis import RedisBroker, RedisBrokerConfig
from juggler.channels import ChannelOptions
from juggler.protocol import JugglerDecodeError


def _captured(shared_dir: str) -> tuple[list[str], list[tuple[str, bytes]]]:
    evnts = []
    with open(os.path.join(shared_dir, "vectors", "juggler", "transcript.jsonl"), encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec["direction"] == "server->client" and rec["frame"].startswith('{"meta":{"type":10,'):
                evnts.append(rec["frame"])
    publishes = []
    with open(os.path.join(shared_dir, "vectors", "juggler", "redis_monitor.txt"), "rb") as f:
        for raw in f:
            m = re.search(rb'"PUBLISH" "([^"]*)" "(.*)"\s*$', raw)
            if m:
                body = m.group(2).decode("unicode_escape").encode("latin-1")  # MONITOR's escaping
                publishes.append((m.group(1).decode(), body))
    return evnts, publishes


def test_evnt_frames_are_the_original_plus_the_position(shared_dir: str) -> None:
    evnts, _ = _captured(shared_dir)
    assert evnts
    for frame in evnts:
        go = json.loads(frame)
        p = go["payload"]
        args = json.dumps(p["args"], ensure_ascii=False, separators=(",", ":")).encode() if "args" in p else None
        plain = rustext.build_evnt(p["for"], p["channel"], p.get("pattern"), args)
        with_history = rustext.build_evnt(p["for"], p["channel"], p.get("pattern"), args, 42, "9f3a61c2")
        ours_plain, ours = json.loads(plain), json.loads(with_history)
        # the same fields, in the same order; history only appends two
        assert list(ours_plain["payload"]) == list(p)
        assert list(ours["payload"]) == [*p, "offset", "epoch"]
        assert {k: v for k, v in ours["payload"].items() if k not in ("offset", "epoch")} == p
        # byte for byte (but the fresh meta uuid): the plain frame with the fields inserted at the end
        plain = plain[:27] + with_history[27:63] + plain[63:]  # the uuid after '{"meta":{"type":10,"uuid":"'
        assert with_history == plain[:-3] + b',"offset":42,"epoch":"9f3a61c2"}}\n'


async def test_history_publish_payload_extends_the_captured_one(shared_dir: str, redis_url: str) -> None:
    _, publishes = _captured(shared_dir)
    assert publishes
    channel, captured = next((c, b) for c, b in publishes if b'"args"' in b)
    msg_uuid, args = rustext.parse_pub_payload(captured)
    assert rustext.build_pub_payload(msg_uuid, args) == captured  # the original bytes, without history
    broker = RedisBroker(RedisBrokerConfig(url=redis_url))
    await broker.start()
    spy = aioredis.from_url(redis_url)
    pubsub = spy.pubsub()
    try:
        await pubsub.subscribe(channel)
        assert (await pubsub.get_message(timeout=5))["type"] == "subscribe"
        offset, epoch = await broker.publish_history(channel, msg_uuid, args,
                                                     ChannelOptions(match="*", history_size=10))
        msg = None
        while msg is None or msg["type"] != "message":
            msg = await pubsub.get_message(timeout=5)
            assert msg is not None
        body = msg["data"]
        assert body == captured[:-1] + b',"offset":%d,"epoch":"%s"}' % (offset, epoch.encode())
        # what a Go subscriber decodes: the original fields, unchanged
        decoded = json.loads(body)
        assert decoded["msg_uuid"] == msg_uuid and json.loads(captured)["args"] == decoded["args"]
    finally:
        await pubsub.aclose()
        await spy.aclose()
        await broker.aclose()


@pytest.mark.parametrize("frame", [
    '{"meta":{"type":3,"uuid":"6ba7b810-9dad-11d1-80b4-00c04fd430c8"},"payload":{"channel":"c","pattern":false}}',
])
def test_an_original_sub_parses_without_extensions(frame: str) -> None:
    msg = rustext.parse_client_message(frame)
    assert msg.since is None and msg.join_leave is False


@pytest.mark.parametrize(("since", "ok"), [
    ('{"offset":3,"epoch":"e"}', True),
    ("null", True),
    ('{"offset":-1,"epoch":"e"}', False),
    ('{"offset":3}', False),
    ('{"epoch":"e"}', False),
    ('"3"', False),
    ('{"offset":1.5,"epoch":"e"}', False),
    ('{"offset":3,"epoch":7}', False),
])
def test_since_is_validated(since: str, ok: bool) -> None:
    frame = ('{"meta":{"type":3,"uuid":"6ba7b810-9dad-11d1-80b4-00c04fd430c8"},'
             '"payload":{"channel":"c","since":%s}}' % since)
    if ok:
        rustext.parse_client_message(frame)
    else:
        with pytest.raises(JugglerDecodeError):
            rustext.parse_client_message(frame)
