"""Extension messages: juggler.0 messages of type 256 and above.

The original protocol stops at type 10 and its clients never send anything
else, so types from 256 up are free for additions that only a client which
asks for them sees (docs/protocols/juggler.md, "Extensions"). This module
holds their numbers, the parsing of those a client sends, and the one
generic answer the server sends back.

A client extension message has the shape of every juggler.0 message,
``{"meta": {"type": T, "uuid": U}, "payload": {...}}``. The server accepts
a type only when a handler for it is registered
(:attr:`juggler.server.Server.extensions`); any other type ends the
connection as bad input, as an unknown type always did. A handled request
is answered with a NACK (a refusal, ``for_type`` = T) or a REPLY:

    {"meta": {"type": 262, "uuid": …}, "payload": {"for": U, "for_type": T, "result": …}}

Parsing is done here in Python rather than by the Rust codec: extension
messages are rare (a token refresh per hour, a history request per
subscription), and keeping them out of the codec leaves the hot path as it is.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Container
from typing import Any

import rustext

__all__ = [
    "EXPIRING",
    "EXTENSION_MIN",
    "HISTORY",
    "KEEPALIVE",
    "PRESENCE",
    "REFRESH",
    "REPLY",
    "SUB_REFRESH",
    "TYPE_NAMES",
    "ExtensionHandler",
    "ExtensionMessage",
    "parse_extension",
    "reply_frame",
]

#: the first extension type; below it, juggler.0's own
EXTENSION_MIN = 256
#: server → client: the ping interval (juggler.keepalive)
KEEPALIVE = 256
#: client → server: a new token for this connection
REFRESH = 257
#: server → client: this connection's credentials expire soon
EXPIRING = 258
#: client → server: a new subscription token for a private channel
SUB_REFRESH = 259
#: client → server: a channel's recent events
HISTORY = 260
#: client → server: who is subscribed to a channel
PRESENCE = 261
#: server → client: the answer to a client's extension request
REPLY = 262

TYPE_NAMES = {
    KEEPALIVE: "KEEPALIVE", REFRESH: "REFRESH", EXPIRING: "EXPIRING", SUB_REFRESH: "SUB_REFRESH",
    HISTORY: "HISTORY", PRESENCE: "PRESENCE", REPLY: "REPLY",
}

#: the longest uuid form Go's uuid.Parse accepts (``urn:uuid:`` + 36)
_MAX_UUID = 45


class ExtensionMessage:
    """An extension request from a client, as the handler chain sees it.

    It carries the attributes the session and the middleware read on every
    message (``type``, ``uuid``, ``uri``, ``channel``, ``pattern``, ``args``);
    ``channel`` is the payload's ``channel`` when it names one (the target of
    a NACK). ``payload`` is the decoded JSON object."""

    __slots__ = ("args", "channel", "pattern", "payload", "type", "uri", "uuid")

    def __init__(self, msg_type: int, msg_uuid: str, payload: dict[str, Any]) -> None:
        self.type = msg_type
        self.uuid = msg_uuid
        self.payload = payload
        channel = payload.get("channel")
        self.channel = channel if isinstance(channel, str) else ""
        self.uri = ""
        self.pattern = False
        self.args: bytes | None = None

    def __repr__(self) -> str:
        return f"ExtensionMessage({TYPE_NAMES.get(self.type, self.type)}, {self.uuid})"


#: handles one extension request of a connection (a :class:`juggler.conn.Conn`, not
#: imported here: the connection imports this module): answers it with
#: ``conn.reply``/``conn.nack``, and may await
ExtensionHandler = Callable[[Any, ExtensionMessage], Awaitable[None]]


def parse_extension(data: bytes | str, accepted: Container[int]) -> ExtensionMessage | None:
    """The extension request in a text frame, or None when the frame is not
    one of the `accepted` types with a valid uuid and an object payload (then
    it is bad input, as the codec already said)."""
    try:
        msg = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(msg, dict):
        return None
    meta, payload = msg.get("meta"), msg.get("payload", {})
    if not isinstance(meta, dict) or not isinstance(payload, dict):
        return None
    msg_type, msg_uuid = meta.get("type"), meta.get("uuid")
    if msg_type.__class__ is not int or msg_type < EXTENSION_MIN or msg_type not in accepted:
        return None
    if not isinstance(msg_uuid, str) or len(msg_uuid) > _MAX_UUID:
        return None
    canonical = rustext.canonical_uuid(msg_uuid)  # the forms the codec accepts
    if canonical is None:
        return None
    return ExtensionMessage(msg_type, canonical, payload)


def reply_frame(for_type: int, for_uuid: str, result: Any) -> bytes:
    """The REPLY answering the extension request `for_uuid` with `result` (JSON-encodable)."""
    payload = {"for": for_uuid, "for_type": for_type, "result": result}
    text = json.dumps({"meta": {"type": REPLY, "uuid": rustext.new_uuid()}, "payload": payload},
                      separators=(",", ":"), ensure_ascii=False)
    return text.encode() + b"\n"
