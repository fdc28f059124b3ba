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
class Balancer:
    """The HTTP load balancer's data plane: a tokio + hyper reverse proxy on
    ``workers`` threads of its own (SO_REUSEPORT listeners). Python never runs
    per request. ``config`` is a dict (see ``balancer.config.BalancerConfig.
    to_native``): listen, workers, backends ([{"address", "weight",
    "max_connections"}] or "host:port"), algorithm, hash_key, connect_timeout,
    response_timeout, total_timeout, retries, eject_after, eject_cooldown,
    max_connections, queue_timeout, header_timeout, idle_timeout,
    max_header_bytes, pool_max_idle, pool_idle_timeout (seconds; 0 = none).
    Raises BalancerConfigError on an invalid config."""

    def __init__(self, config: dict[str, object]) -> None: ...
    def start(self) -> tuple[str, int]:
        """Bind and start the workers; returns the bound (host, port). Once."""
    @property
    def address(self) -> tuple[str, int] | None: ...
    @property
    def workers(self) -> int: ...
    @property
    def is_running(self) -> bool: ...
    def update(self, config: dict[str, object]) -> None:
        """Replace backends/weights/algorithm/timeouts at run time without dropping
        connections; on BalancerConfigError the running configuration stays."""
    def set_backend_state(self, name: str, state: str) -> None:
        """Admin state: "up", "drain" (no new requests, in-flight finish) or "down"."""
    def set_backend_health(self, name: str, healthy: bool) -> None:
        """Health from active checks; unhealthy backends get no requests."""
    def set_backend_weight(self, name: str, weight: int) -> None: ...
    def backends(self) -> list[dict[str, object]]:
        """name, weight, state (up/down/drain/ejected), active, requests, failures,
        ejections, responses {"1xx".."5xx"}, bytes_out."""
    def stats(self) -> dict[str, object]:
        """Totals over workers: connections_total/active, requests, responses,
        bytes_in/out, retries, no_backend, backend_errors, timeouts,
        latency_bounds (s), latency_buckets (last is +Inf), latency_sum (s);
        plus "workers" (per worker), "backends", "algorithm", "hash_key"."""
    def drain(self, timeout: float = 30.0) -> None:
        """Stop accepting, let in-flight requests finish within timeout, stop.
        Blocks without the GIL; idempotent."""
    def close(self) -> None:
        """Stop now; idempotent."""
