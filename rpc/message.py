"""Python-side rpcx message model (protocols/rpcx.md), independent of the codec.

``Message`` carries the logical fields of an rpcx frame: the payload here is
always the *uncompressed* payload; ``compress_type`` says how the codec puts
it on the wire. The service layer, plugins and client governance work on this
model; the wire codec (``rustext`` rpcx, driven by ``rpc.transport``)
converts frames to and from it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from rpc.transport.codec import SerializeType

# Reserved metadata keys.
META_ERROR = "__rpcx_error__"
META_AUTH = "__AUTH"
META_SERVER_TIMEOUT = "__ServerTimeout"


class MessageType(enum.IntEnum):
    REQUEST = 0
    RESPONSE = 1


class CompressType(enum.IntEnum):
    NONE = 0
    GZIP = 1


class MessageStatus(enum.IntEnum):
    NORMAL = 0
    ERROR = 1


@dataclass(slots=True)
class Message:
    """One rpcx message. ``seq`` is allocated by the transport for requests.

    ``metadata`` is a plain ``dict[str, str]``: when a key repeats on the wire,
    the last value wins (as in rpcx).
    """

    message_type: MessageType = MessageType.REQUEST
    heartbeat: bool = False
    oneway: bool = False
    compress_type: CompressType = CompressType.NONE
    status: MessageStatus = MessageStatus.NORMAL
    serialize_type: SerializeType = SerializeType.JSON
    seq: int = 0
    service_path: str = ""
    service_method: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    payload: bytes = b""

    @property
    def is_request(self) -> bool:
        return self.message_type == MessageType.REQUEST

    @property
    def is_error(self) -> bool:
        return self.status == MessageStatus.ERROR

    @property
    def error_text(self) -> str | None:
        """``__rpcx_error__`` of an error response (None when status is normal)."""
        if self.status != MessageStatus.ERROR:
            return None
        return self.metadata.get(META_ERROR, "")

    def reply(self, payload: bytes = b"", metadata: dict[str, str] | None = None) -> Message:
        """A normal response to this request: same seq, path, method, serialize and
        compress types (rpcx answers in the request's formats)."""
        # positional, in field order: one reply per call, and keywords cost more
        return Message(
            MessageType.RESPONSE,
            self.heartbeat,
            False,
            self.compress_type,
            MessageStatus.NORMAL,
            self.serialize_type,
            self.seq,
            self.service_path,
            self.service_method,
            {} if metadata is None else metadata,
            payload,
        )

    def error_reply(self, text: str, metadata: dict[str, str] | None = None) -> Message:
        """An error response: status error, ``__rpcx_error__`` = text, empty payload."""
        res = self.reply(b"", dict(metadata) if metadata else {})
        res.status = MessageStatus.ERROR
        res.metadata[META_ERROR] = text
        return res

    def heartbeat_reply(self) -> Message:
        """rpcx echoes a heartbeat: the same frame turned into a response."""
        return Message(
            message_type=MessageType.RESPONSE,
            heartbeat=True,
            oneway=self.oneway,
            compress_type=self.compress_type,
            status=self.status,
            serialize_type=self.serialize_type,
            seq=self.seq,
            service_path=self.service_path,
            service_method=self.service_method,
            metadata=dict(self.metadata),
            payload=self.payload,
        )


def heartbeat_request(seq: int = 0) -> Message:
    """A heartbeat request (what an rpcx client sends to keep a connection alive)."""
    return Message(heartbeat=True, seq=seq, serialize_type=SerializeType.RAW)


_TYPES = {0: MessageType.REQUEST, 1: MessageType.RESPONSE}
_COMPRESS = {0: CompressType.NONE, 1: CompressType.GZIP}
_STATUS = {0: MessageStatus.NORMAL, 1: MessageStatus.ERROR}
_SERIALIZE = {int(t): t for t in SerializeType}


def from_wire(m: object) -> Message:
    """A ``Message`` from a decoded wire message (``rustext.RpcxMessage`` or
    anything with its attributes). Unknown serialize types stay plain ints;
    a status other than 0/1 counts as an error."""
    md = m.metadata  # type: ignore[attr-defined]
    st = m.serialize_type  # type: ignore[attr-defined]
    return Message(
        _TYPES[m.message_type],  # type: ignore[attr-defined]
        m.heartbeat,  # type: ignore[attr-defined]
        m.oneway,  # type: ignore[attr-defined]
        _COMPRESS.get(m.compress_type, m.compress_type),  # type: ignore[attr-defined, arg-type]
        _STATUS.get(m.status, MessageStatus.ERROR),  # type: ignore[attr-defined]
        _SERIALIZE.get(st, st),  # type: ignore[arg-type]
        m.seq,  # type: ignore[attr-defined]
        m.service_path,  # type: ignore[attr-defined]
        m.service_method,  # type: ignore[attr-defined]
        dict(md) if md else {},
        m.payload,  # type: ignore[attr-defined]
    )
