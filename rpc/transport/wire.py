"""Wire formats (packet layer + message header), chosen per protocol.

A wire turns read buffers into messages (one Rust call per buffer) and
builds request and reply frames. Every message exposes the same attributes,
which is all the connection relies on: ``message_type`` (0 request, 1
response), ``seq``, ``oneway``, ``heartbeat``, ``status`` (1 = error),
``error``, ``payload``, ``service_path``, ``service_method``, ``metadata``.

- ``RpcxWire``: the rpcx message (rustext codec), wire-compatible with rpcx.
- ``FrameWire``: a u32 length-prefixed frame (rustext framing) holding
  ``flags u8 | seq u64 | payload``: the lightest wire for custom protocols.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

import rustext

from rpc.transport.config import ConnectionConfig


class Decoder(ABC):
    @abstractmethod
    def feed(self, data: bytes) -> list[Any]:
        """Messages completed by ``data``; raises rustext.DecodeError on bad input."""


class Wire(ABC):
    name: str

    @abstractmethod
    def decoder(self, config: ConnectionConfig) -> Decoder: ...

    @abstractmethod
    def encode_request(
        self,
        seq: int,
        payload: bytes,
        *,
        oneway: bool = False,
        heartbeat: bool = False,
        service_path: str = "",
        service_method: str = "",
        metadata: Iterable[tuple[str, str]] | None = None,
        serialize_type: int = 0,
        compress_type: int = 0,
    ) -> bytes: ...

    @abstractmethod
    def encode_replies(self, items: Sequence[tuple[Any, Any, str | None]]) -> bytes:
        """Replies ``(request, payload, error-or-None)`` concatenated (one write)."""


class RpcxWire(Wire):
    name = "rpcx"

    def decoder(self, config: ConnectionConfig) -> Decoder:
        return rustext.RpcxStream(max_message_len=config.max_frame, max_decompressed=config.max_decompressed)  # type: ignore[return-value]

    # The native encoders themselves, not methods calling them: no Python
    # frame per request or per batch of replies on the hot path.
    encode_request = staticmethod(rustext.encode_rpcx_request)
    encode_replies = staticmethod(rustext.encode_rpcx_replies)


# --- frame wire ---------------------------------------------------------------

F_RESPONSE = 0x01
F_ONEWAY = 0x02
F_ERROR = 0x04
F_HEARTBEAT = 0x08
_HEAD = 9  # flags + seq


class FrameMessage:
    """A message of the frame wire (same attributes as rustext.RpcxMessage)."""

    __slots__ = ("message_type", "seq", "oneway", "heartbeat", "status", "payload")
    service_path = ""
    service_method = ""
    metadata: list[tuple[str, str]] = []
    serialize_type = 0

    def __init__(self, flags: int, seq: int, payload: bytes) -> None:
        self.message_type = flags & F_RESPONSE
        self.seq = seq
        self.oneway = bool(flags & F_ONEWAY)
        self.heartbeat = bool(flags & F_HEARTBEAT)
        self.status = 1 if flags & F_ERROR else 0
        self.payload = payload

    @property
    def error(self) -> str | None:
        return self.payload.decode("utf-8", "replace") if self.status else None

    def __repr__(self) -> str:
        return f"FrameMessage(type={self.message_type}, seq={self.seq}, status={self.status}, payload=<{len(self.payload)} bytes>)"


class _FrameDecoder(Decoder):
    def __init__(self, max_frame: int) -> None:
        self._frames = rustext.FrameDecoder(max_frame=max_frame)

    def feed(self, data: bytes) -> list[Any]:
        out = []
        for body in self._frames.feed(data):
            if len(body) < _HEAD:
                raise rustext.DecodeError(f"frame of {len(body)} bytes is shorter than its {_HEAD}-byte header")
            flags = body[0]
            if flags & ~0x0F:
                raise rustext.DecodeError(f"unknown frame flags {flags:#04x}")
            out.append(FrameMessage(flags, int.from_bytes(body[1:_HEAD], "big"), body[_HEAD:]))
        return out


def _frame(flags: int, seq: int, payload: bytes | bytearray | memoryview) -> bytes:
    n = _HEAD + len(payload)
    return b"".join((n.to_bytes(4, "big"), bytes((flags,)), seq.to_bytes(8, "big"), payload))


class FrameWire(Wire):
    name = "frame"

    def decoder(self, config: ConnectionConfig) -> Decoder:
        return _FrameDecoder(config.max_frame)

    def encode_request(
        self, seq: int, payload: bytes, *, oneway: bool = False, heartbeat: bool = False, **rpcx_header: Any
    ) -> bytes:
        """``rpcx_header`` (service path and method, metadata, serialize and
        compress types) has no place in a frame: the frame wire ignores it."""
        flags = (F_ONEWAY if oneway else 0) | (F_HEARTBEAT if heartbeat else 0)
        return _frame(flags, seq, payload)

    def encode_replies(self, items: Sequence[tuple[Any, Any, str | None]]) -> bytes:
        parts = []
        for req, payload, error in items:
            flags = F_RESPONSE | (F_HEARTBEAT if req.heartbeat else 0)
            if error is not None:
                parts.append(_frame(flags | F_ERROR, req.seq, error.encode()))
            else:
                parts.append(_frame(flags, req.seq, payload if payload is not None else b""))
        return b"".join(parts)
