"""The juggler.0 message model over rustext's codec (protocols/juggler.md).

The codec lives in Rust (``rustext``): client frames parse into
:class:`rustext.ClientMessage` with ``args`` kept as raw JSON bytes, and
server frames are built in one call each. This module adds the names, the
timeout rule and the outgoing-message record the server's handler chain sees.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import rustext
from rustext import ClientMessage, JugglerDecodeError, ServerMessage

__all__ = [
    "ALL_CLIENT_TYPES",
    "DEFAULT_CALL_TIMEOUT_MS",
    "SUBPROTOCOL",
    "ClientMessage",
    "JugglerDecodeError",
    "MessageType",
    "Outgoing",
    "ServerMessage",
    "allowed_mask",
    "call_timeout_ms",
    "mask_names",
]

SUBPROTOCOL = "juggler.0"
#: upstream's default call timeout (a CALL timeout under 1 ms means this)
DEFAULT_CALL_TIMEOUT_MS = 60_000
ALL_CLIENT_TYPES: int = rustext.ALL_CLIENT_TYPES


class MessageType(enum.IntEnum):
    CALL = 1
    PUB = 2
    SUB = 3
    UNSB = 4
    NACK = 7
    ACK = 8
    RES = 9
    EVNT = 10


TYPE_NAMES = {t.value: t.name for t in MessageType}


def call_timeout_ms(timeout_ns: int | None, default_ms: int = DEFAULT_CALL_TIMEOUT_MS) -> int:
    """A CALL's timeout in ms: nanoseconds truncated; under 1 ms (0, absent,
    sub-millisecond) means `default_ms`. A negative timeout stays negative
    (the server answers NACK 500, as the original ends up doing)."""
    if timeout_ns is None:
        return default_ms
    if timeout_ns < 0:
        return -((-timeout_ns) // 1_000_000) or -1
    ms = timeout_ns // 1_000_000
    return ms if ms > 0 else default_ms


def allowed_mask(header: str | None) -> int:
    """Mask of a ``Juggler-Allowed-Messages`` header (None/""/"*" = all).
    Raises JugglerDecodeError (a ValueError) on an unknown name."""
    if header is None:
        return ALL_CLIENT_TYPES
    return rustext.parse_allowed_messages(header)


def mask_names(mask: int) -> list[str]:
    return [t.name for t in MessageType if t <= MessageType.UNSB and mask & (1 << t)]


@dataclass(slots=True)
class Outgoing:
    """A server message on its way out, as the handler chain sees it.

    ``frame`` is the complete text (ending in ``\\n``); a middleware may
    replace it or drop the message by not calling the next handler."""

    type: int
    for_uuid: str
    frame: bytes
