"""rustext rpcx codec: rpcx's own frames (shared vectors), limits, fast paths, fuzzing."""

from __future__ import annotations

import gzip
import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rustext
from rustext import RpcxMessage, RpcxStream, decode_rpcx

MESSAGE_TYPES = {"request": rustext.RPCX_REQUEST, "response": rustext.RPCX_RESPONSE}
COMPRESS = {"none": rustext.RPCX_COMPRESS_NONE, "gzip": rustext.RPCX_COMPRESS_GZIP}
STATUS = {"normal": rustext.RPCX_STATUS_NORMAL, "error": rustext.RPCX_STATUS_ERROR}
SERIALIZE = {
    "none": rustext.RPCX_SERIALIZE_RAW,
    "json": rustext.RPCX_SERIALIZE_JSON,
    "protobuf": rustext.RPCX_SERIALIZE_PROTOBUF,
    "msgpack": rustext.RPCX_SERIALIZE_MSGPACK,
    "thrift": rustext.RPCX_SERIALIZE_THRIFT,
}

# Our documented choices for the frames rpcx accepts although malformed
# (see rustext/src/rpcx.rs): True = we decode like rpcx, False = we reject.
LENIENT_ACCEPTED = {
    "payload_len_field_zero": False,  # payload length must match the body
    "payload_len_field_too_large": False,
    "header_reserved_bits_set": True,  # reserved bits ignored, as rpcx
    "duplicate_metadata_key": True,  # last value wins, as rpcx
}


def load_cases(shared_dir: str) -> list[dict[str, Any]]:
    with open(os.path.join(shared_dir, "vectors", "rpcx", "frames.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def cases(shared_dir: str) -> list[dict[str, Any]]:
    return load_cases(shared_dir)


def of_kind(cases: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    found = [c for c in cases if c["kind"] == kind]
    assert found, f"no {kind} cases in the vectors"
    return found


def fields(case: dict[str, Any]) -> dict[str, Any]:
    """The logical fields of a case, as RpcxMessage keyword arguments."""
    return dict(
        message_type=MESSAGE_TYPES[case["message_type"]],
        heartbeat=case["heartbeat"],
        oneway=case["oneway"],
        compress_type=COMPRESS[case["compress_type"]],
        status=STATUS[case["status"]],
        serialize_type=SERIALIZE[case["serialize_type"]],
        seq=case["seq"],
        service_path=case["service_path"],
        service_method=case["service_method"],
        metadata=[tuple(p) for p in case["metadata"]],
        payload=bytes.fromhex(case["payload_hex"]),
    )


def as_fields(m: RpcxMessage) -> dict[str, Any]:
    return dict(
        message_type=m.message_type,
        heartbeat=m.heartbeat,
        oneway=m.oneway,
        compress_type=m.compress_type,
        status=m.status,
        serialize_type=m.serialize_type,
        seq=m.seq,
        service_path=m.service_path,
        service_method=m.service_method,
        metadata=m.metadata,
        payload=m.payload,
    )


def sections_before_payload(frame: bytes) -> bytes:
    """Path, method and metadata sections (everything between the 16-byte
    prefix and the payload length field)."""
    pos = 16
    for _ in range(3):
        n = int.from_bytes(frame[pos : pos + 4], "big")
        pos += 4 + n
    return frame[16:pos]


def test_vectors_cover_every_kind(cases: list[dict[str, Any]]) -> None:
    kinds = {c["kind"] for c in cases}
    assert kinds == {"valid", "invalid", "lenient"}
    assert {c["name"] for c in of_kind(cases, "lenient")} == set(LENIENT_ACCEPTED)


def test_valid_decode(cases: list[dict[str, Any]]) -> None:
    for case in of_kind(cases, "valid"):
        frame = bytes.fromhex(case["frame_hex"])
        assert len(frame) == case["frame_len"], case["name"]
        assert as_fields(decode_rpcx(frame)) == fields(case), case["name"]


def test_valid_encode_byte_for_byte(cases: list[dict[str, Any]]) -> None:
    for case in of_kind(cases, "valid"):
        frame = bytes.fromhex(case["frame_hex"])
        ours = RpcxMessage(**fields(case)).encode()
        if case["compress_type"] == "gzip":
            # Go's gzip bytes differ from flate2's: compare the header, the
            # plain sections and the decompressed payload.
            assert ours[:12] == frame[:12], case["name"]
            assert sections_before_payload(ours) == sections_before_payload(frame)
            wire = ours[16 + len(sections_before_payload(ours)) + 4 :]
            assert gzip.decompress(wire) == bytes.fromhex(case["payload_hex"])
            assert gzip.decompress(bytes.fromhex(case["wire_payload_hex"])) == bytes.fromhex(
                case["payload_hex"]
            )
            assert decode_rpcx(ours) == decode_rpcx(frame)
        else:
            assert ours == frame, case["name"]


def test_valid_through_stream_in_one_buffer(cases: list[dict[str, Any]]) -> None:
    valid = of_kind(cases, "valid")
    stream = RpcxStream()
    buf = b"".join(bytes.fromhex(c["frame_hex"]) for c in valid)
    got = stream.feed(buf)
    assert [as_fields(m) for m in got] == [fields(c) for c in valid]
    assert stream.buffered == 0


def decode_limits(case: dict[str, Any]) -> dict[str, int]:
    cfg = case.get("decode_config") or {}
    if "MaxMessageLength" in cfg:
        return {"max_message_len": cfg["MaxMessageLength"]}
    return {}


def test_invalid_rejected_with_typed_error(cases: list[dict[str, Any]]) -> None:
    for case in of_kind(cases, "invalid"):
        frame = bytes.fromhex(case["frame_hex"])
        limits = decode_limits(case)
        expected = rustext.FrameTooLarge if "max_message_len" in limits else rustext.RpcxDecodeError
        with pytest.raises(expected):
            decode_rpcx(frame, **limits)


def test_invalid_through_stream(cases: list[dict[str, Any]]) -> None:
    """A stream either fails or (for a truncated frame) waits for more bytes;
    it never yields a message."""
    for case in of_kind(cases, "invalid"):
        frame = bytes.fromhex(case["frame_hex"])
        stream = RpcxStream(**decode_limits(case))
        try:
            got = stream.feed(frame)
        except rustext.DecodeError:
            assert stream.failed
            with pytest.raises(rustext.DecodeError):
                stream.feed(b"")
        else:
            assert got == [], case["name"]
            assert stream.buffered == len(frame), case["name"]


def test_lenient_cases_follow_documented_choice(cases: list[dict[str, Any]]) -> None:
    for case in of_kind(cases, "lenient"):
        frame = bytes.fromhex(case["frame_hex"])
        if LENIENT_ACCEPTED[case["name"]]:
            decoded = case["rpcx_decode"]["decoded"]
            assert as_fields(decode_rpcx(frame)) == fields(decoded), case["name"]
        else:
            with pytest.raises(rustext.RpcxDecodeError):
                decode_rpcx(frame)


def test_max_message_len_checked_before_body() -> None:
    m = RpcxMessage(service_path="S", payload=b"x" * 1000)
    frame = m.encode()
    stream = RpcxStream(max_message_len=100)
    with pytest.raises(rustext.FrameTooLarge):
        stream.feed(frame[:16])  # only the prefix: fails before the body arrives


def test_bad_magic_fails_on_first_byte() -> None:
    with pytest.raises(rustext.RpcxDecodeError):
        RpcxStream().feed(b"G")
    with pytest.raises(rustext.RpcxDecodeError):
        RpcxStream().feed(RpcxMessage().encode() + b"GET / HTTP/1.1")


def test_decompression_bomb_limited() -> None:
    m = RpcxMessage(compress_type=rustext.RPCX_COMPRESS_GZIP, payload=b"\0" * 1_000_000)
    frame = m.encode()
    assert len(frame) < 12_000  # zlib-rs's level 1 (deflate_quick) codes long runs less tightly than zlib's
    assert decode_rpcx(frame).payload == m.payload
    with pytest.raises(rustext.RpcxDecodeError):
        decode_rpcx(frame, max_decompressed=999_999)


def test_reply_fast_paths() -> None:
    req = RpcxMessage(
        seq=42, service_path="Arith", service_method="Mul", serialize_type=1, metadata={"k": "v"},
        payload=b"{}",
    )
    frame = req.encode_reply(b"ok")
    resp = decode_rpcx(frame)
    assert (resp.is_response, resp.seq, resp.service_path, resp.service_method) == (True, 42, "Arith", "Mul")
    assert resp.serialize_type == 1 and resp.payload == b"ok" and resp.metadata == []
    assert resp == req.reply(b"ok")
    err = decode_rpcx(req.encode_reply(error="boom"))
    assert err.status == rustext.RPCX_STATUS_ERROR and err.error == "boom"
    both = rustext.encode_rpcx_replies([(req, b"a"), (req, memoryview(b"b"), None), (req, None, "bad")])
    got = RpcxStream().feed(both)
    assert [m.payload for m in got] == [b"a", b"b", b""]
    assert [m.error for m in got] == [None, None, "bad"]
    assert rustext.encode_rpcx_many([req, req]) == req.encode() * 2


def test_encode_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        RpcxMessage(compress_type=2).encode()
    with pytest.raises(ValueError):
        RpcxMessage(serialize_type=16).encode()
    with pytest.raises(ValueError):
        RpcxMessage(message_type=2).encode()
    with pytest.raises(OverflowError):
        RpcxMessage(seq=-1)


def test_metadata_accessors() -> None:
    m = RpcxMessage(metadata=[("a", "1"), ("b", "2")])
    assert m.get_meta("b") == "2" and m.get_meta("zz", "d") == "d"
    m.metadata = {"x": "y"}
    assert m.metadata == [("x", "y")]
    assert "RpcxMessage(" in repr(m)


texts = st.text(max_size=20)
messages = st.builds(
    RpcxMessage,
    message_type=st.integers(0, 1),
    heartbeat=st.booleans(),
    oneway=st.booleans(),
    compress_type=st.integers(0, 1),
    status=st.integers(0, 3),
    serialize_type=st.integers(0, 15),
    seq=st.integers(0, 2**64 - 1),
    service_path=texts,
    service_method=texts,
    metadata=st.dictionaries(st.text(min_size=1, max_size=5), texts, max_size=4).map(lambda d: list(d.items())),
    payload=st.binary(max_size=300),
)


@given(messages)
@settings(max_examples=200, deadline=None)
def test_roundtrip(m: RpcxMessage) -> None:
    assert decode_rpcx(m.encode()) == m
    if m.message_type == rustext.RPCX_REQUEST and m.status == 0:
        fast = rustext.encode_rpcx_request(
            m.seq, m.payload, service_path=m.service_path, service_method=m.service_method,
            metadata=m.metadata, serialize_type=m.serialize_type, oneway=m.oneway,
            heartbeat=m.heartbeat, compress_type=m.compress_type,
        )
        assert decode_rpcx(fast) == m


@given(st.lists(messages, max_size=5), st.lists(st.integers(0, 4000), max_size=8))
@settings(max_examples=100, deadline=None)
def test_stream_any_chunking(ms: list[RpcxMessage], cuts: list[int]) -> None:
    wire = b"".join(m.encode() for m in ms)
    points = sorted({0, len(wire), *(min(c, len(wire)) for c in cuts)})
    stream = RpcxStream()
    got: list[RpcxMessage] = []
    for a, b in zip(points, points[1:]):
        got += stream.feed(wire[a:b])
    assert got == ms
    assert stream.buffered == 0


@given(st.binary(max_size=600))
@settings(max_examples=300, deadline=None)
def test_random_bytes_never_crash(data: bytes) -> None:
    for blob in (data, b"\x08" + data):
        try:
            decode_rpcx(blob, max_message_len=512, max_decompressed=1024)
        except rustext.DecodeError:
            pass
        stream = RpcxStream(max_message_len=512, max_decompressed=1024)
        try:
            stream.feed(blob)
        except rustext.DecodeError:
            pass
        assert stream.buffered <= 16 + 512
