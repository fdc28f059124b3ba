"""Protocol registry: a protocol = a wire (packet + message layer) + a payload codec.

Registries are objects (no global table); ``ProtocolRegistry.default()``
holds the built-in protocols:

| name | wire | payload |
| --- | --- | --- |
| ``rpcx`` | rpcx message | raw bytes |
| ``rpcx+json`` / ``rpcx+msgpack`` | rpcx message | JSON / msgpack |
| ``frame`` | u32 length prefix + flags/seq header | raw bytes |
| ``frame+json`` / ``frame+msgpack`` | same | JSON / msgpack |

Add your own with ``registry.register(TransportProtocol(name, wire, payload,
payload_type))``: the payload codecs are ``rpc.transport.codec``'s (e.g.
``ProtobufCodec()`` with ``payload_type=MyMessage``, what ``Connection.call``
decodes replies into).
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Any

from rpc.transport.codec import JSONCodec, MsgpackCodec, PayloadCodec, RawCodec
from rpc.transport.wire import FrameWire, RpcxWire, Wire


@dataclass(frozen=True)
class TransportProtocol:
    name: str
    wire: Wire
    payload: PayloadCodec
    #: what replies decode into (a protobuf message class, a dataclass, ...); None: as the codec gives
    payload_type: Any = None


class ProtocolRegistry:
    def __init__(self) -> None:
        self._protocols: dict[str, TransportProtocol] = {}

    def register(self, protocol: TransportProtocol, *, replace: bool = False) -> None:
        if protocol.name in self._protocols and not replace:
            raise ValueError(f"protocol {protocol.name!r} is already registered")
        self._protocols[protocol.name] = protocol

    def get(self, name: str | TransportProtocol) -> TransportProtocol:
        if isinstance(name, TransportProtocol):
            return name
        try:
            return self._protocols[name]
        except KeyError:
            raise KeyError(f"unknown protocol {name!r}; registered: {sorted(self._protocols)}") from None

    def names(self) -> list[str]:
        return sorted(self._protocols)

    @classmethod
    def default(cls) -> ProtocolRegistry:
        reg = cls()
        rpcx, frame = RpcxWire(), FrameWire()
        for wire in (rpcx, frame):
            reg.register(TransportProtocol(wire.name, wire, RawCodec()))
            reg.register(TransportProtocol(f"{wire.name}+json", wire, JSONCodec()))
            reg.register(TransportProtocol(f"{wire.name}+msgpack", wire, MsgpackCodec()))
        return reg
