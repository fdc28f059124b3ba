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

class ClientMessage:
    """A parsed client frame. ``args`` stays raw JSON bytes (never decoded)."""

    type: int
    uuid: str  # canonical lower-case form
    uri: str | None  # CALL
    timeout_ns: int | None  # CALL: as sent (integer nanoseconds); None when absent
    channel: str | None  # PUB / SUB / UNSB
    pattern: bool  # SUB / UNSB
    args: bytes | None  # CALL / PUB: raw JSON text of `args`, None when absent

def parse_client_message(frame: bytes | str, allowed_types: frozenset[int] | None = None) -> ClientMessage:
    """Parse one client text frame; raises JugglerDecodeError on any protocol error
    (invalid JSON, bad uuid, unknown/server-only/forbidden type, wrong field types)."""

def build_ack(for_uuid: str, for_type: int, target: str) -> bytes:
    """ACK frame (with trailing newline); `target` is the uri (CALL) or channel."""

def build_nack(for_uuid: str, for_type: int, target: str, code: int, message: str) -> bytes: ...
def build_res(for_uuid: str, uri: str, args: bytes | None) -> bytes: ...
def build_evnt(for_uuid: str, channel: str, pattern: str | None, args: bytes | None) -> bytes: ...

class CallPayload:
    """The Redis call/result payload {"conn_uuid","msg_uuid","uri","args"}."""

    conn_uuid: str
    msg_uuid: str
    uri: str
    args: bytes | None  # raw JSON, None when the key is absent

def build_call_payload(conn_uuid: str, msg_uuid: str, uri: str, args: bytes | None) -> bytes:
    """Call or result payload; `args` omitted when None (as upstream's omitempty)."""

def parse_call_payload(data: bytes) -> CallPayload: ...
def build_pub_payload(msg_uuid: str, args: bytes | None) -> bytes: ...
def parse_pub_payload(data: bytes) -> tuple[str, bytes | None]:
    """(msg_uuid, raw args or None) of a PUBLISH body."""

def new_uuid() -> str:
    """A fresh random (v4) UUID in canonical lower-case form."""


# --- timer --------------------------------------------------------------

# --- balancer -----------------------------------------------------------
