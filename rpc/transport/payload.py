"""Payload codecs (the message body's serialization): raw, JSON, msgpack, protobuf.

Each has the rpcx ``serialize_type`` it stands for, ``dumps(obj) -> bytes``
and ``loads(bytes) -> obj``. Handlers that return ``bytes`` bypass them.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

SERIALIZE_RAW = 0
SERIALIZE_JSON = 1
SERIALIZE_PROTOBUF = 2
SERIALIZE_MSGPACK = 3


class PayloadCodec(Protocol):
    name: str
    serialize_type: int

    def dumps(self, obj: Any) -> bytes: ...
    def loads(self, data: bytes) -> Any: ...


class RawCodec:
    name = "raw"
    serialize_type = SERIALIZE_RAW

    def dumps(self, obj: Any) -> bytes:
        if isinstance(obj, (bytes, bytearray, memoryview)):
            return bytes(obj)
        raise TypeError(f"raw payload must be bytes-like, not {type(obj).__name__}")

    def loads(self, data: bytes) -> bytes:
        return data


class JsonCodec:
    name = "json"
    serialize_type = SERIALIZE_JSON

    def dumps(self, obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


class MsgpackCodec:
    name = "msgpack"
    serialize_type = SERIALIZE_MSGPACK

    def __init__(self) -> None:
        import msgpack

        self._packb = msgpack.packb
        self._unpackb = msgpack.unpackb

    def dumps(self, obj: Any) -> bytes:
        return self._packb(obj, use_bin_type=True)

    def loads(self, data: bytes) -> Any:
        return self._unpackb(data, raw=False)


class ProtobufCodec:
    """Protobuf messages of one type (``message_class``, a generated class)."""

    name = "protobuf"
    serialize_type = SERIALIZE_PROTOBUF

    def __init__(self, message_class: Any) -> None:
        self._cls = message_class

    def dumps(self, obj: Any) -> bytes:
        return obj.SerializeToString()

    def loads(self, data: bytes) -> Any:
        msg = self._cls()
        msg.ParseFromString(data)
        return msg
