"""Payload codecs by serialize type, typed by annotation; fuzzed decoders."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpc.errors import CodecError
from rpc.examples import benchmark_request
from rpc.message import SerializeType
from rpc.proto.benchmark_pb2 import BenchmarkMessage
from rpc.transport.codec import (
    CodecRegistry,
    JSONCodec,
    MsgpackCodec,
    ProtobufCodec,
    RawCodec,
    ThriftCodec,
    serialize_type_from_name,
)


@dataclass
class Point:
    x: int
    y: int


def test_registry_selects_by_serialize_type() -> None:
    reg = CodecRegistry()
    assert isinstance(reg.get(SerializeType.RAW), RawCodec)
    assert isinstance(reg.get(SerializeType.JSON), JSONCodec)
    assert isinstance(reg.get(SerializeType.PROTOBUF), ProtobufCodec)
    assert isinstance(reg.get(SerializeType.MSGPACK), MsgpackCodec)
    assert isinstance(reg.get(SerializeType.THRIFT), ThriftCodec)
    with pytest.raises(CodecError, match="can not find codec for 9"):
        reg.get(9)
    assert serialize_type_from_name("thrift") == SerializeType.THRIFT
    assert serialize_type_from_name("msgpack") == SerializeType.MSGPACK
    assert serialize_type_from_name("pb") == SerializeType.PROTOBUF
    with pytest.raises(ValueError):
        serialize_type_from_name("xml")


def test_raw() -> None:
    c = RawCodec()
    assert c.encode(b"ab") == b"ab" and c.encode(bytearray(b"x")) == b"x" and c.encode(None) == b""
    assert c.decode(b"ab") == b"ab" and c.decode("é".encode(), str) == "é"
    with pytest.raises(CodecError):
        c.encode("text")
    with pytest.raises(CodecError):
        c.decode(b"\xff", str)


@pytest.mark.parametrize("codec", [JSONCodec(), MsgpackCodec()])
def test_json_msgpack_shapes(codec: Any) -> None:
    data = codec.encode(Point(1, 2))
    assert codec.decode(data) == {"x": 1, "y": 2}
    assert codec.decode(data, Point) == Point(1, 2)
    assert codec.decode(data, dict[str, int]) == {"x": 1, "y": 2}
    assert codec.decode(codec.encode(3), float) == 3.0
    assert codec.decode(b"", Any) is None
    with pytest.raises(CodecError):
        codec.decode(codec.encode([1]), Point)
    with pytest.raises(CodecError):
        codec.decode(codec.encode({"x": 1}), Point)
    with pytest.raises(CodecError):
        codec.decode(codec.encode(True), int)
    with pytest.raises(CodecError):
        codec.encode(object())


def test_json_is_compact_utf8() -> None:
    assert JSONCodec().encode({"a": "é", "b": [1, 2]}) == '{"a":"é","b":[1,2]}'.encode()


def test_protobuf_by_type() -> None:
    c = ProtobufCodec()
    data = c.encode(benchmark_request())
    assert len(data) == 581
    msg = c.decode(data, BenchmarkMessage)
    assert isinstance(msg, BenchmarkMessage) and msg.field3 == 100000
    assert c.decode(data, bytes) == data
    with pytest.raises(CodecError, match="protobuf message type"):
        c.decoder_for(dict)
    with pytest.raises(CodecError):
        c.decode(b"\xff\xff\xff", BenchmarkMessage)
    with pytest.raises(CodecError):
        c.encode({"not": "a message"})
    with pytest.raises(CodecError):  # required fields missing
        c.encode(BenchmarkMessage())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_decoders_reject_garbage_with_codec_error(data: bytes) -> None:
    for codec, type_ in ((JSONCodec(), None), (MsgpackCodec(), None), (ProtobufCodec(), BenchmarkMessage)):
        try:
            codec.decode(data, type_)
        except CodecError:
            pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)
@given(json_values)
def test_roundtrip(value: Any) -> None:
    for codec in (JSONCodec(), MsgpackCodec()):
        assert codec.decode(codec.encode(value)) == value
    assert json.loads(JSONCodec().encode(value)) == value
    assert msgpack.unpackb(MsgpackCodec().encode(value)) == value


def test_hostile_payloads_are_codec_errors() -> None:
    with pytest.raises(CodecError):
        MsgpackCodec().decode(b"\x81\x80\x01")  # a map as a map key (unhashable)
    with pytest.raises(CodecError):
        JSONCodec().decode(b"[" * 200_000)  # nesting deeper than the recursion limit
    with pytest.raises(CodecError):
        MsgpackCodec().decode(b"\x91" * 200_000)


def test_protobuf_messages_through_json_and_msgpack() -> None:
    msg = benchmark_request()
    for codec in (JSONCodec(), MsgpackCodec()):
        data = codec.encode(msg)
        plain = codec.decode(data)
        assert plain["field1"] == msg.field1 and plain["field2"] == 100000
        assert codec.decode(data, BenchmarkMessage) == msg
        with pytest.raises(CodecError):
            codec.decode(codec.encode({"field2": "not a number"}), BenchmarkMessage)
        with pytest.raises(CodecError):
            codec.decode(codec.encode([1]), BenchmarkMessage)


def test_thrift() -> None:
    from tests.rpc.arith_thrift.ttypes import MulArgs, MulReply

    c = ThriftCodec()
    data = c.encode(MulArgs(a=6, b=7, note="é", tags=[1, 2]))
    # Thrift's binary protocol, a struct without a message header, as rpcx's ThriftCodec writes it
    assert data == bytes.fromhex("0a00010000000000000006" "0a00020000000000000007" "0b000300000002c3a9"
                                 "0f0004080000000200000001" "00000002" "00")
    assert c.decode(data, MulArgs) == MulArgs(a=6, b=7, note="é", tags=[1, 2])
    assert c.decode(data, bytes) == data and c.decode(data) == data
    assert c.decode(b"", MulArgs) is None and c.encode(None) == b""
    assert c.decode(b"\x00", MulReply) == MulReply()  # every field unset
    with pytest.raises(CodecError, match="needs a Thrift struct"):
        c.encode({"a": 1})
    with pytest.raises(CodecError, match="need a Thrift struct type"):
        c.decoder_for(dict)
    with pytest.raises(CodecError, match="invalid Thrift payload for MulArgs"):
        c.decode(data[:-6], MulArgs)  # truncated
    with pytest.raises(CodecError, match="invalid Thrift payload for MulArgs"):
        c.decode(bytes.fromhex("0b0003" "7fffffff" "41"), MulArgs)  # a string longer than the payload
    with pytest.raises(CodecError, match="invalid Thrift payload for MulArgs"):
        c.decode(bytes.fromhex("0f0004" "08" "7fffffff" "00"), MulArgs)  # a list longer than the payload


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES, st.sampled_from(["", " ", "\n", " x", "]"]), st.sampled_from(["", " ", "\t"]))
def test_json_matches_the_standard_library(value: Any, tail: str, head: str) -> None:
    """The codec's JSON is json.dumps' (compact, UTF-8) and its decoding is
    json.loads', whitespace, extra data and errors included."""
    codec = JSONCodec()
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert codec.encode(value) == text.encode()
    data = (head + text + tail).encode()
    try:
        expected: Any = json.loads(data.decode())
    except ValueError as exc:
        with pytest.raises(CodecError, match="invalid JSON payload") as caught:
            codec.decode(data)
        assert str(exc) in str(caught.value)
        return
    got = codec.decode(data)
    assert json.dumps(got) == json.dumps(expected)  # NaN != NaN; their texts are equal


def test_json_cycles_and_depth_fail_as_before() -> None:
    codec = JSONCodec()
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(CodecError, match="Circular reference detected"):
        codec.encode(loop)
    assert codec.encode({"after": [1, 2]}) == b'{"after":[1,2]}'  # nothing left behind
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(RecursionError):
        codec.encode(deep)
