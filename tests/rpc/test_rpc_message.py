"""The Python message model: replies mirror the request; vectors' fields map onto it."""

from __future__ import annotations

import json
import os

from rpc.message import (
    META_ERROR,
    CompressType,
    Message,
    MessageStatus,
    MessageType,
    SerializeType,
    heartbeat_request,
)


def test_reply_mirrors_request() -> None:
    m = Message(seq=5, service_path="S", service_method="M", serialize_type=SerializeType.MSGPACK,
                compress_type=CompressType.GZIP, oneway=False, metadata={"a": "b"}, payload=b"x")
    r = m.reply(b"y", {"k": "v"})
    assert r.message_type == MessageType.RESPONSE and r.status == MessageStatus.NORMAL
    assert (r.seq, r.service_path, r.service_method) == (5, "S", "M")
    assert r.serialize_type == SerializeType.MSGPACK and r.compress_type == CompressType.GZIP
    assert r.metadata == {"k": "v"} and r.payload == b"y" and r.error_text is None
    e = m.error_reply("bad")
    assert e.is_error and e.error_text == "bad" and e.metadata == {META_ERROR: "bad"} and e.payload == b""


def test_heartbeat() -> None:
    hb = heartbeat_request(9)
    r = hb.heartbeat_reply()
    assert r.heartbeat and r.seq == 9 and r.message_type == MessageType.RESPONSE


def test_vector_fields_fit_the_model(shared_dir: str) -> None:
    with open(os.path.join(shared_dir, "vectors", "rpcx", "frames.json")) as f:
        cases = json.load(f)
    valid = [c for c in cases if c["kind"] == "valid"]
    assert valid
    for c in valid:
        m = Message(
            message_type=MessageType[c["message_type"].upper()],
            heartbeat=c["heartbeat"],
            oneway=c["oneway"],
            compress_type=CompressType[c["compress_type"].upper()],
            status=MessageStatus[c["status"].upper()],
            serialize_type=SerializeType[c["serialize_type"].upper()],
            seq=c["seq"],
            service_path=c["service_path"],
            service_method=c["service_method"],
            metadata=dict(c["metadata"]),
            payload=bytes.fromhex(c["payload_hex"]),
        )
        if m.status == MessageStatus.ERROR:
            assert m.error_text == "rpcx: can't find service Foo"
        if c["name"] == "request_protobuf_benchmark":
            assert len(m.payload) == 581 and m.serialize_type == SerializeType.PROTOBUF
