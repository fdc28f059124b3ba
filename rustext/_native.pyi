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
# (imports used by the framing, rpcx and timer sections)
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from typing_extensions import Buffer

class FrameDecoder:
    """Length-field stream splitter and encoder (sans-I/O).

    A frame is ``header (offset bytes) | length field (width bytes) | body``; the
    field holds ``len(body) - adjust``. ``feed`` takes any chunk of the stream
    and returns every frame completed by it, in order: bodies when
    ``strip_header`` (the default), whole frames otherwise (e.g. rpcx: offset=12,
    width=4, strip_header=False). A body over ``max_frame`` raises
    ``FrameTooLarge`` as soon as the length field is readable, before any of the
    body is buffered; after any error the decoder is failed for good.
    """

    def __init__(
        self,
        *,
        width: int = 4,
        endian: Literal["big", "little"] = "big",
        offset: int = 0,
        adjust: int = 0,
        max_frame: int = 16 * 1024 * 1024,
        strip_header: bool = True,
    ) -> None: ...
    def feed(self, data: Buffer) -> list[bytes]: ...
    def encode(self, body: Buffer, header: bytes | None = None) -> bytes:
        """One frame; ``header`` must be exactly ``offset`` bytes."""
    def encode_many(self, bodies: Iterable[Buffer]) -> bytes:
        """Frames for every body (offset must be 0), concatenated (one write)."""
    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
    @property
    def failed(self) -> bool: ...
    @property
    def max_frame(self) -> int: ...

# --- rpcx ---------------------------------------------------------------
RPCX_REQUEST: int  # 0
RPCX_RESPONSE: int  # 1
RPCX_COMPRESS_NONE: int  # 0
RPCX_COMPRESS_GZIP: int  # 1
RPCX_STATUS_NORMAL: int  # 0
RPCX_STATUS_ERROR: int  # 1
RPCX_SERIALIZE_RAW: int  # 0
RPCX_SERIALIZE_JSON: int  # 1
RPCX_SERIALIZE_PROTOBUF: int  # 2
RPCX_SERIALIZE_MSGPACK: int  # 3
RPCX_SERIALIZE_THRIFT: int  # 4

class RpcxMessage:
    """One rpcx message (protocols/rpcx.md). ``payload`` is the logical
    (uncompressed) payload; it is gzip-compressed on encode when
    ``compress_type == RPCX_COMPRESS_GZIP``. ``metadata`` is ordered pairs.
    Equality compares every field."""

    message_type: int  # RPCX_REQUEST / RPCX_RESPONSE
    heartbeat: bool
    oneway: bool
    compress_type: int  # 0 none, 1 gzip
    status: int  # 0 normal, 1 error (2 bits)
    serialize_type: int  # 0..15
    seq: int  # u64
    service_path: str
    service_method: str
    payload: bytes
    def __init__(
        self,
        *,
        message_type: int = 0,
        heartbeat: bool = False,
        oneway: bool = False,
        compress_type: int = 0,
        status: int = 0,
        serialize_type: int = 0,
        seq: int = 0,
        service_path: str | None = None,
        service_method: str | None = None,
        metadata: Iterable[tuple[str, str]] | Mapping[str, str] | None = None,
        payload: bytes | None = None,
    ) -> None: ...
    @property
    def metadata(self) -> list[tuple[str, str]]: ...
    @metadata.setter
    def metadata(self, value: Iterable[tuple[str, str]] | Mapping[str, str]) -> None: ...
    def get_meta(self, key: str, default: str | None = None) -> str | None: ...
    @property
    def is_response(self) -> bool: ...
    @property
    def error(self) -> str | None:
        """``__rpcx_error__`` of an error response (status 1), else None."""
    def encode(self) -> bytes:
        """The frame; ValueError for out-of-range fields."""
    def encode_reply(
        self,
        payload: Buffer | None = None,
        *,
        error: str | None = None,
        metadata: Iterable[tuple[str, str]] | Mapping[str, str] | None = None,
    ) -> bytes:
        """The response frame to this request in one call: seq, path, method,
        serialize and compress type are the request's (as rpcx does); ``error``
        sets status error and ``__rpcx_error__``."""
    def reply(
        self,
        payload: bytes | None = None,
        *,
        error: str | None = None,
        metadata: Iterable[tuple[str, str]] | Mapping[str, str] | None = None,
    ) -> RpcxMessage:
        """The response as a message (see ``encode_reply``)."""

def decode_rpcx(
    frame: Buffer, *, max_message_len: int = 64 << 20, max_decompressed: int = 64 << 20
) -> RpcxMessage:
    """Decode exactly one frame. RpcxDecodeError on malformed input, FrameTooLarge
    when the total length exceeds ``max_message_len``."""

def encode_rpcx_request(
    seq: int,
    payload: Buffer,
    *,
    service_path: str = "",
    service_method: str = "",
    metadata: Iterable[tuple[str, str]] | Mapping[str, str] | None = None,
    serialize_type: int = 0,
    oneway: bool = False,
    heartbeat: bool = False,
    compress_type: int = 0,
) -> bytes:
    """A request frame in one call (no RpcxMessage built): the client's hot path."""

def encode_rpcx_many(messages: Iterable[RpcxMessage]) -> bytes:
    """Encode many messages into one buffer (one write)."""

def encode_rpcx_replies(
    items: Iterable[tuple[RpcxMessage, Buffer | None] | tuple[RpcxMessage, Buffer | None, str | None]],
) -> bytes:
    """Responses to many requests, ``(request, payload[, error])``, in one buffer."""

class RpcxStream:
    """Stream decoder: ``feed`` a read buffer, get every message it completes.
    A wrong magic byte fails at once; a total length over ``max_message_len``
    raises FrameTooLarge before the body is buffered. Failed for good after an
    error."""

    def __init__(self, *, max_message_len: int = 64 << 20, max_decompressed: int = 64 << 20) -> None: ...
    def feed(self, data: Buffer) -> list[RpcxMessage]: ...
    @property
    def buffered(self) -> int: ...
    @property
    def failed(self) -> bool: ...

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
    since: tuple[int, str] | None  # SUB extension: recover after (offset, epoch)
    join_leave: bool  # SUB extension: send this subscriber join/leave notices

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
    offset: int | None  # EVNT / SUB ACK extension: the channel's history position
    epoch: str | None
    recovered: bool | None  # SUB ACK (asked with since) / EVNT notice of an unrecoverable gap
    join: bytes | None  # EVNT join notice (raw JSON object)
    leave: bytes | None  # EVNT leave notice (raw JSON object)

def parse_server_message(frame: bytes | str) -> ServerMessage:
    """Parse one server frame; raises JugglerDecodeError when invalid."""

# Server frames: each gets a fresh v4 meta.uuid and ends with "\n".
def build_ack(for_uuid: str, for_type: int, target: str) -> bytes:
    """ACK frame; `target` is the uri (CALL) or the channel (PUB/SUB/UNSB)."""

def build_nack(for_uuid: str, for_type: int, target: str, code: int, message: str) -> bytes: ...
def build_res(for_uuid: str, uri: str, args: bytes | None) -> bytes:
    """RES frame. `args` is trusted raw JSON (from this codec); None -> null."""

def build_evnt(
    for_uuid: str,
    channel: str,
    pattern: str | None = None,
    args: bytes | None = None,
    offset: int | None = None,
    epoch: str | None = None,
) -> bytes:
    """EVNT frame; `pattern` key only when not None; `args` None -> null;
    `offset` and `epoch` (extension) on channels with history."""

def build_sub_ack(
    for_uuid: str, channel: str, offset: int | None = None, epoch: str | None = None, recovered: bool | None = None
) -> bytes:
    """ACK of a SUB with the channel's history position and, when it asked
    to recover, whether it was (extension fields)."""

# Client frames (for clients/load tools); `args` must be valid JSON (validated,
# normalized) and is omitted when None. Raises JugglerDecodeError on invalid args.
def build_call(msg_uuid: str, uri: str, timeout_ns: int, args: bytes | None = None) -> bytes: ...
def build_pub(msg_uuid: str, channel: str, args: bytes | None = None) -> bytes: ...
def build_sub(
    msg_uuid: str,
    channel: str,
    pattern: bool = False,
    since: tuple[int, str] | None = None,
    join_leave: bool = False,
) -> bytes: ...
def build_unsb(msg_uuid: str, channel: str, pattern: bool = False) -> bytes: ...

class CallPayload:
    """The Redis call/result payload {"conn_uuid","msg_uuid","uri","args"}."""

    conn_uuid: str
    msg_uuid: str
    uri: str
    args: bytes | None  # normalized raw JSON, None when the key is absent
    trace: bytes | None  # our "trace" object (trace-context headers, raw JSON), None when absent

def build_call_payload(
    conn_uuid: str, msg_uuid: str, uri: str, args: bytes | None, trace: bytes | None = None
) -> bytes:
    """Call or result payload; `args` (valid JSON, normalized) omitted when None
    (as upstream's omitempty); `trace` (a JSON object) added last as "trace",
    which Go callees ignore. Raises JugglerDecodeError when `args` is not JSON
    or `trace` not a JSON object."""

def parse_call_payload(data: bytes) -> CallPayload:
    """Raises JugglerDecodeError (not an object, missing/invalid conn_uuid or msg_uuid)."""

def parse_call_payloads(items: list[bytes]) -> list[CallPayload | None]:
    """Batch parse in one crossing; an invalid payload gives None (count and drop it)."""

def build_pub_payload(msg_uuid: str, args: bytes | None) -> bytes:
    """PUBLISH body {"msg_uuid","args"}; `args` omitted when None."""

def parse_pub_payload(data: bytes) -> tuple[str, bytes | None]:
    """(msg_uuid, raw args or None) of a PUBLISH body."""

def parse_pub_payload_at(data: bytes) -> tuple[str, bytes | None, int | None, str | None]:
    """(msg_uuid, raw args, offset, epoch) of a PUBLISH body (offset/epoch on channels with history)."""

class FanoutHub:
    """Native fan-out of event frames to websocket connections: per key
    (a channel or pattern numbered by the caller) its subscribed connections,
    per connection its socket (never closed by the hub: remove a connection
    before its socket can close). ``publish`` writes each connection's frames
    of one turn with one ``sendmsg``."""

    def __init__(self) -> None: ...
    def add_conn(self, conn: int, fd: int, deflate: bool = False) -> None:
        """Register `conn` writing to `fd`; -1: Python writes everything for it.
        `deflate`: it negotiated permessage-deflate (written the compressed frames)."""
    def remove_conn(self, conn: int) -> bool: ...
    def hold(self, conn: int, held: bool) -> None:
        """Held: Python has output queued for `conn`; its frames are handed back."""
    def subscribe(self, conn: int, key: int) -> bool: ...
    def unsubscribe(self, conn: int, key: int) -> bool: ...
    def subscribers(self, key: int) -> int: ...
    def publish(
        self, frames: list[tuple[int, bytes]] | list[tuple[int, bytes, bytes | None]]
    ) -> tuple[int, list[tuple[int, int]] | None, list[tuple[int, bytes]] | None, list[int] | None]:
        """(frames written, held (conn, frame index), partial (conn, rest), failed conns).
        A frame's optional third item is its compressed form, for deflate connections."""

class FanoutSubscribers:
    """`n` native websocket subscribers of `channel` for the fan-out load
    (``juggler load --mode fanout``): plain ws://, one SUB each; every EVNT's
    ``args.t`` (publish time, ns) and ``args.seq`` give latency and
    lost/duplicate/reordered counts. They start connecting at once, on
    `threads` runtime threads."""

    def __init__(
        self, host: str, port: int, path: str, channel: str, n: int, threads: int = 1, deflate: bool = False
    ) -> None:
        """`deflate`: offer permessage-deflate (as browsers do) and inflate compressed events."""
    def wait_subscribed(self, timeout: float) -> tuple[int, int]:
        """Block until all are subscribed or failed, or `timeout` s: (subscribed, failed)."""
    def finish(self) -> tuple[bytes, int, int, int, int, list[str]]:
        """Stop them: (latencies in µs as native int64 bytes, seen, duplicates, out of order,
        subscribed, errors (at most 20))."""

def normalize_json(data: bytes) -> bytes:
    """Validate one JSON value and return it normalized; JugglerDecodeError if invalid."""

def new_uuid() -> str:
    """A fresh random (v4) UUID in canonical lower-case form."""

def canonical_uuid(s: str) -> str | None:
    """Canonical lower-case form of a UUID in any form Go accepts, or None."""

# Websocket frames from clients (RFC 6455 §5, server side): the juggler
# server's frame reader. `feed` returns, in order: `bytes` for each complete
# text message (reassembled, unmasked, not UTF-8 checked), else a tuple:
#   (WS_PING, payload)        a ping (payload ≤ 125 bytes); answer with a pong
#   (WS_CLOSE, payload)       a close frame: b"" or ≥ 2 bytes (code first); ends the stream
#   (WS_BINARY, b"")          a binary frame (payload dropped); ends the stream
#   (WS_FAIL, code, reason)   invalid input: close with 1002 (protocol) or 1009
#                             (over read_limit); ends the stream
# Pongs are dropped. Once the stream has ended, `feed` returns [] for good.
WS_BINARY: int  # 2
WS_CLOSE: int  # 8
WS_PING: int  # 9
WS_FAIL: int  # 255

class WsFrameReader:
    """Sans-I/O reader of masked client frames: feed any chunking of the bytes
    after the handshake. `read_limit` (0 = none) bounds one message: a frame's
    length plus the fragments held, checked from its header alone (1009).
    Raises RustextError for a negative `read_limit`."""

    def __init__(self, read_limit: int = 0) -> None: ...
    def feed(self, data: bytes) -> list[bytes | tuple[int, bytes] | tuple[int, int, str]]: ...
    def enable_deflate(self, context_takeover: bool) -> None:
        """permessage-deflate was agreed: RSV1 marks compressed messages (first
        frame of a message only), inflated in bounded steps; their inflated size
        counts against `read_limit` (1009). `context_takeover`: the agreement
        lacks client_no_context_takeover."""
    @property
    def done(self) -> bool:
        """True after a failure, a binary or a close frame."""
    @property
    def buffered(self) -> int:
        """Bytes held: a partial frame plus the fragments of an open message."""


# Websocket frames to clients (RFC 6455 §5, server side): unmasked, FIN set.
def ws_text_frames(payloads: list[bytes]) -> bytes:
    """One text frame per payload, back to back in one buffer (the frames of
    one event-loop turn, written with one ``transport.write``)."""
class WsDeflate:
    """Server text frames with permessage-deflate (RFC 7692), compressed
    without context takeover, so one instance serves every connection.
    Raises RustextError for a level outside 0-9 or a negative threshold."""

    def __init__(self, level: int = 1, threshold: int = 0) -> None: ...
    def text_frames(self, payloads: list[bytes]) -> bytes:
        """One text frame per payload, back to back: compressed (RSV1) when the
        payload has at least `threshold` bytes and compressing shrinks it."""
    def compress(self, payload: bytes) -> bytes:
        """The compressed payload of one message (trailing 00 00 FF FF removed)."""
    @property
    def threshold(self) -> int:
        """Payloads shorter than this go uncompressed."""

def ws_control_frame(opcode: int, payload: bytes) -> bytes:
    """One control frame (opcode 8 close, 9 ping or 10 pong) with a raw
    payload of at most 125 bytes; raises RustextError otherwise."""
def ws_close_frame(code: int, reason: str = "") -> bytes:
    """A close frame: ``code`` (2 bytes, big-endian), then ``reason`` (UTF-8)
    cut to 123 bytes."""

# --- timer --------------------------------------------------------------
class DeadlineHeap:
    """Indexed min-heap of deadlines (integers in the caller's unit, e.g. ms).

    ``add`` and ``cancel`` are O(log n); ``pop_expired(now)`` returns every key
    with ``deadline <= now``, earliest first, ties in insertion order. Handles
    are never reused: cancelling a fired or cancelled handle returns False."""

    def __init__(self) -> None: ...
    def add(self, deadline: int, key: object) -> int: ...
    def cancel(self, handle: int) -> bool: ...
    def __contains__(self, handle: int) -> bool: ...
    def pop_expired(self, now: int) -> list[Any]: ...
    def next_deadline(self) -> int | None: ...
    def clear(self) -> list[Any]:
        """Remove everything; the keys, in deadline order."""
    def __len__(self) -> int: ...
    def __bool__(self) -> bool: ...

# --- balancer -----------------------------------------------------------
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from balancer.config import BalancerConfig

class Balancer:
    """The HTTP load balancer's data plane: a tokio + hyper reverse proxy on
    ``workers`` threads of its own (SO_REUSEPORT listeners). Python never runs
    per request. ``config`` is a ``balancer.config.BalancerConfig``: the data
    plane reads its dataclasses directly (their fields, and the views the
    configuration derives for it: ``effective_listeners()``,
    ``backend_pools()`` with each pool's ``policy``, the tunnel timeout in
    force...); ``balancer.config`` holds the defaults and the checks, with
    FILE:LINE errors. What only the data plane can check (certificate files,
    addresses resolved to sockets, what its HTTP library takes) raises
    BalancerConfigError naming the key. A dict raises TypeError
    (``balancer.config.from_dict`` builds a configuration from one)."""

    def __init__(self, config: BalancerConfig) -> None: ...
    def start(self, inherited: dict[str, list[int]] | None = None) -> tuple[str, int]:
        """Bind and start the workers; returns the bound (host, port). Once.
        ``inherited``: listening sockets handed over by the process this one
        replaces, by listener key (``127.0.0.1:8000``, ``unix:/path``); those
        listeners accept on copies of them instead of binding (the
        descriptors stay the caller's). A socket that is not listening where
        its listener says raises BalancerError."""
    def listener_sockets(self) -> list[tuple[str, bool, list[int]]]:
        """Every listener's sockets for a process taking them over: (key,
        tls, descriptors), new copies the caller owns and closes. Empty
        before start() and once draining."""
    def handed_over(self) -> None:
        """Another process accepts on the listeners now: their Unix socket
        files stay when this one stops."""
    @property
    def address(self) -> tuple[str, int] | None: ...
    @property
    def addresses(self) -> list[tuple[str, int]]:
        """Every listener's bound (host, port), the first as ``address``; empty before start().
        A Unix socket listener is ``("unix:/path", 0)``."""
    @property
    def redirect_address(self) -> tuple[str, int] | None:
        """The bound (host, port) of the HTTP-to-HTTPS redirect listener, if any."""
    @property
    def tls(self) -> bool:
        """Whether the listener terminates TLS."""
    def reload_tls(self) -> None:
        """Read the certificate files again: new handshakes get them,
        established connections keep theirs; BalancerConfigError (naming the
        file) keeps the current ones."""
    def set_ocsp_staple(self, certificate: bytes, response: bytes | None) -> bool:
        """Staple ``response`` (DER OCSP response) to the served certificate whose
        leaf is ``certificate`` (DER); None removes it; new handshakes get it.
        False when no served certificate is that one."""
    def ocsp_staple(self, certificate: bytes) -> bytes | None:
        """The staple served with the certificate whose leaf is ``certificate`` (DER)."""
    def acme_http01_set(self, token: str, key_authorization: str) -> None:
        """Answer the ACME HTTP-01 challenge ``token`` on the plain-HTTP listeners (before routing)."""
    def acme_http01_remove(self, token: str) -> None: ...
    def acme_tls_alpn_set(self, name: str, cert_pem: bytes, key_pem: bytes) -> None:
        """Serve this certificate to ``acme-tls/1`` handshakes for ``name`` (TLS-ALPN-01)."""
    def acme_tls_alpn_remove(self, name: str) -> None: ...
    @property
    def workers(self) -> int: ...
    @property
    def is_running(self) -> bool: ...
    def update(self, config: BalancerConfig) -> None:
        """Apply ``config``'s listeners, pools, routes, policies, rate limits, error
        pages and access logs at run time without dropping connections (in-flight
        requests finish on the old routing table; a listener that stays keeps its
        socket, a rate limit whose key stays keeps its counts). What is fixed at
        start (workers, TLS, header/idle timeouts, pool sizes) is not read again.
        On BalancerConfigError the running configuration stays."""
    def reopen_access_log(self) -> None:
        """Reopen the access log file (after logrotate moved it); no-op without one."""
    @staticmethod
    def check_log_format(format: str) -> None:
        """Raise ValueError naming what is wrong with an access log format."""
    @staticmethod
    def check_regex(pattern: str, replacement: str | None = None) -> None:
        """Raise ValueError naming what is wrong with a route's regular expression
        (and with a replacement's groups, when given)."""
    def set_backend_state(self, name: str, state: str) -> None:
        """Admin state: "up", "drain" (no new requests, in-flight finish) or "down"."""
    def backend_ejected(self, name: str, pool: str | None = None) -> bool:
        """Whether passive health has the backend out (ejected, or marked down until a health check brings it back)."""
    def set_backend_health(self, name: str, healthy: bool, pool: str | None = None) -> None:
        """Health from active checks; unhealthy backends get no requests (in ``pool``,
        or in every pool listing the backend)."""
    def set_backend_weight(self, name: str, weight: int) -> None: ...
    def backends(self) -> list[dict[str, object]]:
        """pool, name, weight, state (up/down/drain/ejected), active, requests, failures,
        ejections, responses {"1xx".."5xx"}, bytes_out."""
    def stats(self) -> dict[str, object]:
        """Totals over workers: connections_total/active, requests, responses,
        bytes_in/out, retries, no_backend, backend_errors, timeouts,
        rate_limited (requests refused by ``rate_limit``), rate_delayed (held back
        by one in delay mode), compressed, compress_bytes_in, compress_bytes_out (responses
        compressed and their body bytes before and after), latency_bounds (s), latency_buckets (last is +Inf), latency_sum (s);
        plus "workers" (per worker), "backends", "algorithm", "hash_key",
        access_log_lines, access_log_dropped."""
    def drain(self, timeout: float = 30.0) -> None:
        """Stop accepting, let in-flight requests finish within timeout, stop.
        Blocks without the GIL; idempotent."""
    def close(self) -> None:
        """Stop now; idempotent."""

# --- seq (grpc) -----------------------------------------------------------
class GrpcServer:
    """A gRPC server (HTTP/2, hyper, its own tokio thread) for seq's ``pb.RRAPI``
    plus pass-through unary ``raw_methods`` (full paths). Calls are decoded in
    Rust and queued; ``fileno()`` turns readable when the queue goes non-empty
    (register it with ``loop.add_reader``), ``take()`` returns every queued
    call, ``complete()`` answers a batch. A call not answered by its
    ``grpc-timeout`` (or ``max_wait`` s when the client sent none) gets
    DEADLINE_EXCEEDED; unknown methods UNIMPLEMENTED; malformed messages
    INTERNAL; calls after ``drain()``/``close()`` UNAVAILABLE. With
    ``tls_cert``/``tls_key`` (PEM) every connection is TLS (ALPN h2), the
    handshake done on the server's thread; ``tls_client_ca`` requires client
    certificates signed by it. Bad files raise ValueError naming them."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        raw_methods: list[str] = ...,
        max_message: int = 4194304,
        max_concurrent_streams: int = 4096,
        max_wait: float = 60.0,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_client_ca: str | None = None,
    ) -> None: ...
    def reload_tls(self) -> None:
        """Read the certificate files again: new handshakes get the new
        certificate. ValueError (the current one stays) on unusable files."""
    def start(self) -> int:
        """Bind and serve; returns the bound port. Raises OSError. Once."""
    def fileno(self) -> int:
        """Readable while calls are queued."""
    def take(self) -> list[tuple[int, int, str | bytes, int, float | None]]:
        """Every queued call: (token, kind, name, arg, timeout_s). kind 0 NextID
        (arg: range_size), 1 CurID, 2 SetID (arg: new_id), 3 + i raw method i
        (name: the request message bytes). timeout_s: what is left of the
        client's deadline, None if it sent none."""
    def complete(self, replies: list[tuple[int, int, int]]) -> int:
        """Answer a batch of (token, a, b): NextID [a, b); CurID a; SetID a != 0.
        Returns how many calls were still waiting (the rest expired or were cancelled)."""
    def complete_raw(self, token: int, data: bytes) -> bool:
        """Answer a raw method's call with its serialized reply."""
    def fail(self, token: int, code: int, message: str) -> bool:
        """Answer with gRPC status `code` (1..16) and `message`."""
    def pending(self) -> int:
        """Calls received and not answered yet."""
    def drain(self) -> None:
        """Close the listener, send GOAWAY, refuse new calls (UNAVAILABLE);
        calls already received can still be answered."""
    def close(self) -> None:
        """Answer what is left with UNAVAILABLE, stop and join the runtime thread. Idempotent."""
    @property
    def closed(self) -> bool: ...

class GrpcClient:
    """A gRPC client for seq's ``pb.RRAPI`` (HTTP/2, hyper, its own tokio
    thread): one connection per target (``HOST:PORT``), made on first use and
    remade after a failure; calls multiplexed as streams. Calls return a token
    at once; ``fileno()`` turns readable when finished calls wait in ``take()``.
    Each call is bounded by its timeout (sent as ``grpc-timeout``)."""

    def __init__(
        self,
        targets: list[str],
        *,
        connect_timeout: float = 1.0,
        max_message: int = 4194304,
        tls: bool = False,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_insecure: bool = False,
    ) -> None:
        """TLS (ALPN h2) when ``tls`` or any ``tls_*`` is given: servers
        verified against ``tls_ca`` or the system's trust store and the host
        of their HOST:PORT (``tls_insecure``: not verified at all)."""
    def cancel(self, token: int) -> bool:
        """Cancel a call: not sent yet, it never is; running, its HTTP/2
        stream is reset; its completion never comes. False if it had finished."""
    def fileno(self) -> int: ...
    def next_id(self, target: int, name: str, range_size: int, timeout: float) -> int:
        """Start GRPCNextID on targets[target]; returns the call's token."""
    def cur_id(self, target: int, name: str, timeout: float) -> int: ...
    def set_id(self, target: int, name: str, new_id: int, timeout: float) -> int: ...
    def take(self) -> list[tuple[int, int, int, int, str | None]]:
        """Every finished call: (token, status, a, b, message). Status 0 (OK):
        NextID (from, to), CurID (cur, 0), SetID (success, 0); otherwise the
        gRPC status code and its message (UNAVAILABLE when the server cannot be
        reached, DEADLINE_EXCEEDED when the timeout passed)."""
    def inflight(self) -> int: ...
    def close(self) -> None:
        """Drop calls in flight (no completion), stop and join the thread. Idempotent."""
    @property
    def closed(self) -> bool: ...
