"""Typed stub of the compiled module ``rustext._native``."""

# --- errors -------------------------------------------------------------
class RustextError(Exception): ...
class DecodeError(RustextError, ValueError): ...
class FrameTooLarge(DecodeError): ...
class RpcxDecodeError(DecodeError): ...
class JugglerDecodeError(DecodeError): ...
class BalancerError(RustextError): ...
class BalancerConfigError(BalancerError, ValueError): ...

# --- framing ------------------------------------------------------------

# --- rpcx ---------------------------------------------------------------

# --- juggler ------------------------------------------------------------
# juggler.0 message types (protocols/juggler.md).
CALL: int  # 1
PUB: int  # 2
SUB: int  # 3
UNSB: int  # 4
NACK: int  # 7
ACK: int  # 8
RES: int  # 9
EVNT: int  # 10
ALL_CLIENT_TYPES: int  # mask (1 << CALL) | (1 << PUB) | (1 << SUB) | (1 << UNSB)

# Raw JSON (`args`) produced by this codec is *normalized* the way the Go
# server re-encodes a json.RawMessage: compacted (no insignificant
# whitespace) and HTML-safe (<, >, &, U+2028, U+2029 escaped inside strings).

class ClientMessage:
    """A parsed client frame (CALL/PUB/SUB/UNSB). ``args`` stays raw JSON bytes."""

    type: int
    uuid: str  # canonical lower-case form
    uri: str | None  # CALL ("" when absent); None for other types
    timeout_ns: int | None  # CALL: as sent (integer nanoseconds); None when absent or null
    channel: str | None  # PUB / SUB / UNSB ("" when absent); None for CALL
    pattern: bool  # SUB / UNSB
    args: bytes | None  # CALL / PUB: normalized raw JSON of `args`, None when absent (b"null" when null)

def parse_client_message(frame: bytes | str, allowed: int = ...) -> ClientMessage:
    """Parse one client text frame; raises JugglerDecodeError on any protocol error
    (invalid/empty JSON, not an object, bad/missing uuid, type 0/unknown/server-only,
    a type not in the `allowed` mask (bits ``1 << type``, default ALL_CLIENT_TYPES),
    missing/null payload, non-integer type or timeout, wrong field types).
    Anything after the first JSON value is ignored (as upstream)."""

def parse_allowed_messages(header: str) -> int:
    """Mask of a ``Juggler-Allowed-Messages`` header ("call, pub"; "*" or "" = all).
    Raises JugglerDecodeError on an unknown name."""

class ServerMessage:
    """A parsed server frame (NACK/ACK/RES/EVNT), for clients. ``args`` as sent."""

    type: int
    uuid: str
    for_uuid: str  # payload.for (canonical lower case)
    for_type: int | None  # ACK / NACK
    uri: str | None  # ACK/NACK of a CALL, RES
    channel: str | None  # ACK/NACK of PUB/SUB/UNSB, EVNT
    pattern: str | None  # EVNT of a pattern subscription
    code: int | None  # NACK
    message: str | None  # NACK
    args: bytes | None  # RES / EVNT raw JSON

def parse_server_message(frame: bytes | str) -> ServerMessage:
    """Parse one server frame; raises JugglerDecodeError when invalid."""

# Server frames: each gets a fresh v4 meta.uuid and ends with "\n".
def build_ack(for_uuid: str, for_type: int, target: str) -> bytes:
    """ACK frame; `target` is the uri (CALL) or the channel (PUB/SUB/UNSB)."""

def build_nack(for_uuid: str, for_type: int, target: str, code: int, message: str) -> bytes: ...
def build_res(for_uuid: str, uri: str, args: bytes | None) -> bytes:
    """RES frame. `args` is trusted raw JSON (from this codec); None -> null."""

def build_evnt(for_uuid: str, channel: str, pattern: str | None, args: bytes | None) -> bytes:
    """EVNT frame; `pattern` key only when not None; `args` None -> null."""

# Client frames (for clients/load tools); `args` must be valid JSON (validated,
# normalized) and is omitted when None. Raises JugglerDecodeError on invalid args.
def build_call(msg_uuid: str, uri: str, timeout_ns: int, args: bytes | None = None) -> bytes: ...
def build_pub(msg_uuid: str, channel: str, args: bytes | None = None) -> bytes: ...
def build_sub(msg_uuid: str, channel: str, pattern: bool = False) -> bytes: ...
def build_unsb(msg_uuid: str, channel: str, pattern: bool = False) -> bytes: ...

class CallPayload:
    """The Redis call/result payload {"conn_uuid","msg_uuid","uri","args"}."""

    conn_uuid: str
    msg_uuid: str
    uri: str
    args: bytes | None  # normalized raw JSON, None when the key is absent

def build_call_payload(conn_uuid: str, msg_uuid: str, uri: str, args: bytes | None) -> bytes:
    """Call or result payload; `args` (valid JSON, normalized) omitted when None
    (as upstream's omitempty). Raises JugglerDecodeError when `args` is not JSON."""

def parse_call_payload(data: bytes) -> CallPayload:
    """Raises JugglerDecodeError (not an object, missing/invalid conn_uuid or msg_uuid)."""

def parse_call_payloads(items: list[bytes]) -> list[CallPayload | None]:
    """Batch parse in one crossing; an invalid payload gives None (count and drop it)."""

def build_pub_payload(msg_uuid: str, args: bytes | None) -> bytes:
    """PUBLISH body {"msg_uuid","args"}; `args` omitted when None."""

def parse_pub_payload(data: bytes) -> tuple[str, bytes | None]:
    """(msg_uuid, raw args or None) of a PUBLISH body."""

def normalize_json(data: bytes) -> bytes:
    """Validate one JSON value and return it normalized; JugglerDecodeError if invalid."""

def new_uuid() -> str:
    """A fresh random (v4) UUID in canonical lower-case form."""

def canonical_uuid(s: str) -> str | None:
    """Canonical lower-case form of a UUID in any form Go accepts, or None."""


# --- timer --------------------------------------------------------------

# --- balancer -----------------------------------------------------------
