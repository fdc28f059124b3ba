"""Payload codecs selected by the rpcx serialize type: raw, JSON, protobuf,
msgpack, Thrift: the one codec module of the suite, in the transport (the layer
under rpc) so that both rpc and the transport's own protocols use it.

A codec turns a Python object into payload bytes and back. Decoding is driven
by a *type* (a handler's argument annotation, a client's ``reply_type``):

- raw (0): payloads are bytes; ``bytes``/``bytearray``/``memoryview`` encode as is.
- JSON (1) and msgpack (3): any JSON/msgpack value; a dataclass type is built
  from the decoded mapping (and encoded through ``dataclasses.asdict``), a
  protobuf message type through its JSON mapping (proto field names);
  ``int``/``float``/``str``/``bool``/``list``/``dict`` are checked.
- protobuf (2): the type must be a protobuf ``Message`` class
  (``FromString``/``SerializeToString``), like rpcx's PBCodec.
- Thrift (4): the type must be a Thrift struct class (what ``thrift --gen py``
  makes: ``thrift_spec``, ``read``, ``write``), encoded with Apache Thrift's
  binary protocol, like rpcx's ThriftCodec (``TSerializer`` over
  ``TBinaryProtocol``).

``decoder_for(type)`` resolves the conversion once (the service layer does it
at registration), so the per-call cost is one function call.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import typing
from collections.abc import Callable
from typing import Any, Protocol

import msgpack

import rustext
from rpc.transport.errors import CodecError

__all__ = [
    "CodecError",
    "CodecRegistry",
    "Decoder",
    "JSONCodec",
    "MsgpackCodec",
    "PayloadCodec",
    "ProtobufCodec",
    "RawCodec",
    "SerializeType",
    "ThriftCodec",
    "serialize_type_from_name",
]

Decoder = Callable[[bytes], Any]


class SerializeType(enum.IntEnum):
    """rpcx's serialize types; the numbers are the native codec's (``rustext.RPCX_SERIALIZE_*``)."""

    RAW = rustext.RPCX_SERIALIZE_RAW
    NONE = rustext.RPCX_SERIALIZE_RAW  # rpcx's name for raw bytes (SerializeNone)
    JSON = rustext.RPCX_SERIALIZE_JSON
    PROTOBUF = rustext.RPCX_SERIALIZE_PROTOBUF
    MSGPACK = rustext.RPCX_SERIALIZE_MSGPACK
    THRIFT = rustext.RPCX_SERIALIZE_THRIFT


class PayloadCodec(Protocol):
    serialize_type: SerializeType

    def encode(self, obj: Any) -> bytes: ...

    def decoder_for(self, type_: Any) -> Decoder: ...

    def decode(self, data: bytes, type_: Any = None) -> Any: ...


def _is_protobuf_type(type_: Any) -> bool:
    return isinstance(type_, type) and hasattr(type_, "FromString") and hasattr(type_, "SerializeToString")


def _to_plain(obj: Any) -> Any:
    """``default=`` hook: dataclasses and protobuf messages become dicts."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if _is_protobuf_type(type(obj)):
        from google.protobuf import json_format

        # proto field names, as protoc-gen-go's json tags (what a Go rpcx JSON codec emits)
        return json_format.MessageToDict(obj, preserving_proto_field_name=True)
    raise TypeError(f"cannot serialize {type(obj).__name__}")


_CHECKED = (int, float, str, bool, list, dict)


def _shape(type_: Any) -> Callable[[Any], Any] | None:
    """A function that turns a decoded JSON/msgpack value into ``type_`` (None = as is)."""
    if type_ is None or type_ is Any or type_ is object or type_ is typing.Any:
        return None
    origin = typing.get_origin(type_)
    if origin is not None:  # dict[str, int], list[float], ...: check the container only
        type_ = origin
    if dataclasses.is_dataclass(type_) and isinstance(type_, type):
        cls = type_

        def build(value: Any) -> Any:
            if not isinstance(value, dict):
                raise CodecError(f"expected an object for {cls.__name__}, got {type(value).__name__}")
            try:
                return cls(**value)
            except TypeError as exc:
                raise CodecError(f"cannot build {cls.__name__}: {exc}") from exc

        return build
    if _is_protobuf_type(type_):
        from google.protobuf import json_format

        pb_cls = type_

        def parse(value: Any) -> Any:
            if not isinstance(value, dict):
                raise CodecError(f"expected an object for {pb_cls.__name__}, got {type(value).__name__}")
            try:
                return json_format.ParseDict(value, pb_cls())
            except json_format.ParseError as exc:
                raise CodecError(f"cannot build {pb_cls.__name__}: {exc}") from exc

        return parse
    if type_ in _CHECKED:
        expected = type_

        def check(value: Any) -> Any:
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                return float(value)
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise CodecError(f"expected {expected.__name__}, got {type(value).__name__}")
            return value

        return check
    return None


class RawCodec:
    """Serialize type 0: the payload is the bytes themselves."""

    serialize_type = SerializeType.RAW

    def encode(self, obj: Any) -> bytes:
        if isinstance(obj, bytes):
            return obj
        if isinstance(obj, (bytearray, memoryview)):
            return bytes(obj)
        if obj is None:
            return b""
        raise CodecError(f"raw codec needs bytes, got {type(obj).__name__}")

    def decoder_for(self, type_: Any) -> Decoder:
        if type_ is str:
            return _utf8
        return bytes

    def decode(self, data: bytes, type_: Any = None) -> Any:
        return self.decoder_for(type_)(data)


def _utf8(data: bytes) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CodecError(f"payload is not UTF-8: {exc}") from exc


def _self_describing_decoder(
    loads: Callable[[Any], Any],
    errors: tuple[type[BaseException], ...],
    what: str,
    shape: Callable[[Any], Any] | None,
) -> Decoder:
    """The decoder of a format that carries its own types (JSON, msgpack):
    an empty payload is None, input ``loads`` rejects with one of ``errors``
    is a CodecError, and the value is then checked against the handler's
    annotation (``shape``)."""

    def decode(data: bytes) -> Any:
        if not data:
            value = None
        else:
            try:
                value = loads(data)
            except errors as exc:
                raise CodecError(f"invalid {what} payload: {exc}") from exc
        return value if shape is None else shape(value)

    return decode


_JSON = json.JSONDecoder()
_SCAN = _JSON.scan_once  # the C scanner under JSONDecoder.decode


def _json_loads(data: bytes) -> Any:
    """What ``json.loads`` returns for a UTF-8 payload (RFC 8259), at the cost
    of one scanner call: ``JSONDecoder.decode`` adds two Python frames and
    two regex matches (for whitespace around the value) per message. Anything
    but a bare, valid value (whitespace, extra data, bad input) goes to
    ``decode``, so results and errors stay ``json.loads``'."""
    s = bytes(data).decode("utf-8")
    try:
        obj, end = _SCAN(s, 0)
    except Exception:  # StopIteration (no value at 0), JSONDecodeError, RecursionError
        return _JSON.decode(s)
    if end == len(s):
        return obj
    return _JSON.decode(s)


def _unpackb(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


class JSONCodec:
    """Serialize type 1 (compact JSON, UTF-8)."""

    serialize_type = SerializeType.JSON

    def __init__(self) -> None:
        # one encoder, not one per call (json.dumps with options builds a new one)
        self._encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_to_plain).encode
        # JSONEncoder.encode builds a C encoder per call (with a fresh dict of
        # the containers on the way, to detect cycles); this one is built once,
        # without that dict, so it holds no state and threads may share it. A
        # cycle then ends in RecursionError, and the reference encoder above
        # says what it says for it (ValueError) or for a too-deep value.
        make = getattr(json.encoder, "c_make_encoder", None)
        self._fast: Callable[[Any, int], Any] | None = None
        if make is not None:
            self._fast = make(None, _to_plain, json.encoder.encode_basestring, None, ":", ",", False, False, True)

    def encode(self, obj: Any) -> bytes:
        try:
            if self._fast is not None:
                try:
                    return "".join(self._fast(obj, 0)).encode()
                except RecursionError:
                    pass
            return self._encode(obj).encode()
        except (TypeError, ValueError) as exc:
            raise CodecError(f"cannot encode JSON: {exc}") from exc

    def decoder_for(self, type_: Any) -> Decoder:
        # ValueError includes UnicodeDecodeError; RecursionError: deep nesting
        return _self_describing_decoder(_json_loads, (ValueError, RecursionError), "JSON", _shape(type_))

    def decode(self, data: bytes, type_: Any = None) -> Any:
        return self.decoder_for(type_)(data)


class MsgpackCodec:
    """Serialize type 3 (msgpack, str as str, bin as bytes)."""

    serialize_type = SerializeType.MSGPACK

    def encode(self, obj: Any) -> bytes:
        try:
            return msgpack.packb(obj, use_bin_type=True, default=_to_plain)
        except (TypeError, ValueError, OverflowError) as exc:
            raise CodecError(f"cannot encode msgpack: {exc}") from exc

    def decoder_for(self, type_: Any) -> Decoder:
        # TypeError: a map key that Python cannot hash (an array or map)
        errors = (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError)
        return _self_describing_decoder(_unpackb, errors, "msgpack", _shape(type_))

    def decode(self, data: bytes, type_: Any = None) -> Any:
        return self.decoder_for(type_)(data)


class ProtobufCodec:
    """Serialize type 2: protobuf messages, typed by annotation."""

    serialize_type = SerializeType.PROTOBUF

    def encode(self, obj: Any) -> bytes:
        try:
            return obj.SerializeToString()
        except AttributeError as exc:
            raise CodecError(f"protobuf codec needs a protobuf message, got {type(obj).__name__}") from exc
        except Exception as exc:  # EncodeError: required fields missing
            raise CodecError(f"cannot encode protobuf: {exc}") from exc

    def decoder_for(self, type_: Any) -> Decoder:
        if type_ is bytes:
            return bytes
        if not _is_protobuf_type(type_):
            raise CodecError(f"protobuf payloads need a protobuf message type, got {type_!r}")
        from_string = type_.FromString

        def decode(data: bytes) -> Any:
            try:
                return from_string(data)
            except Exception as exc:  # google.protobuf.message.DecodeError
                raise CodecError(f"invalid protobuf payload for {type_.__name__}: {exc}") from exc

        return decode

    def decode(self, data: bytes, type_: Any = None) -> Any:
        return self.decoder_for(type_)(data)


def _is_thrift_type(type_: Any) -> bool:
    return isinstance(type_, type) and hasattr(type_, "thrift_spec") and hasattr(type_, "read")


class ThriftCodec:
    """Serialize type 4: Thrift structs in Apache Thrift's binary protocol,
    typed by annotation, as rpcx's ThriftCodec writes them (a struct's bytes,
    no message header). The ``thrift`` package is imported at the first use."""

    serialize_type = SerializeType.THRIFT

    def encode(self, obj: Any) -> bytes:
        if obj is None:
            return b""
        if not _is_thrift_type(type(obj)):
            raise CodecError(f"thrift codec needs a Thrift struct (thrift --gen py), got {type(obj).__name__}")
        from thrift.protocol.TBinaryProtocol import TBinaryProtocolAccelerated
        from thrift.transport.TTransport import TMemoryBuffer

        buf = TMemoryBuffer()
        try:
            obj.write(TBinaryProtocolAccelerated(buf, fallback=True))
        except Exception as exc:  # struct.error, TypeError: a field of the wrong type
            raise CodecError(f"cannot encode Thrift {type(obj).__name__}: {exc}") from exc
        return buf.getvalue()

    def decoder_for(self, type_: Any) -> Decoder:
        if type_ is bytes or type_ is None or type_ is Any:
            return bytes  # no struct named: the payload as it came (a reply read without reply_type)
        if not _is_thrift_type(type_):
            raise CodecError(f"thrift payloads need a Thrift struct type (thrift --gen py), got {type_!r}")
        from thrift.protocol.TBinaryProtocol import TBinaryProtocolAccelerated
        from thrift.transport.TTransport import TMemoryBuffer

        def decode(data: bytes) -> Any:
            if not data:
                return None
            obj = type_()
            n = len(data)  # no string or container can be longer than the payload holding it
            try:
                obj.read(TBinaryProtocolAccelerated(TMemoryBuffer(bytes(data)), fallback=True,
                                                    string_length_limit=n, container_length_limit=n))
            except Exception as exc:  # TProtocolException, EOFError, UnicodeDecodeError, ...
                raise CodecError(f"invalid Thrift payload for {type_.__name__}: {exc}") from exc
            return obj

        return decode

    def decode(self, data: bytes, type_: Any = None) -> Any:
        return self.decoder_for(type_)(data)


class CodecRegistry:
    """Codecs by serialize type (one per registry; no global state)."""

    def __init__(self, codecs: list[PayloadCodec] | None = None) -> None:
        self._codecs: dict[int, PayloadCodec] = {}
        for codec in codecs if codecs is not None else [RawCodec(), JSONCodec(), ProtobufCodec(), MsgpackCodec(),
                                                                   ThriftCodec()]:
            self.add(codec)

    def add(self, codec: PayloadCodec) -> None:
        self._codecs[int(codec.serialize_type)] = codec

    def get(self, serialize_type: int) -> PayloadCodec:
        try:
            return self._codecs[serialize_type]
        except KeyError:
            # rpcx's own wording, so that Go clients see a familiar error
            raise CodecError(f"can not find codec for {int(serialize_type)}") from None

    def __contains__(self, serialize_type: int) -> bool:
        return serialize_type in self._codecs


def serialize_type_from_name(name: str) -> SerializeType:
    """``"json"`` / ``"msgpack"`` / ``"protobuf"`` / ``"thrift"`` / ``"raw"`` → SerializeType."""
    aliases = {"pb": "protobuf", "proto": "protobuf", "bytes": "raw"}
    key = aliases.get(name.lower(), name.lower())
    try:
        return SerializeType[key.upper()]
    except KeyError:
        raise ValueError(f"unknown codec {name!r} (raw, json, protobuf, msgpack, thrift)") from None
