"""rustext: the native hot paths, behind a typed facade.

The compiled module is the private ``rustext._native``; this package
re-exports its public names (see ``_native.pyi`` for the typed API).

- errors    the exception tree (``RustextError`` and its subclasses)
- framing   length-prefixed stream splitter (``FrameDecoder``)
- rpcx      rpcx message codec
- juggler   juggler.0 envelope codec (args stay raw JSON bytes)
- wsframe   websocket frames, server side: ``WsFrameReader`` (client frames
            in) and ``ws_text_frames`` / ``ws_control_frame`` / ``ws_close_frame``
            (server frames out)
- timer     min-heap of deadlines (``DeadlineHeap``)
- balancer  the HTTP load balancer's data plane (``Balancer``)
- grpc      gRPC (HTTP/2) server and client for seq (``GrpcServer``, ``GrpcClient``)
- backoff   capped, jittered exponential backoff (pure Python), the one policy
            behind every reconnect and retry loop of the suite
- tls       ssl contexts from PEM files, reload in place, a development CA
            (pure Python; the native servers load the same files with rustls)
- appspec   MODULE:OBJECT specs (--app), resolved with errors that name the part missing
- net       ListenError: "cannot listen on HOST:PORT: reason", for every server
- tokens    JWT verification on PyJWT (secrets, PEM keys, JWKS with rotation),
            shared by juggler's handshake and rpc's auth plugin (pure Python)
- dns       A/AAAA and SRV lookups with their TTL on dnspython, shared by the
            balancer's and rpc's DNS discovery (pure Python)
"""

# Inside a source checkout, ``python -m …`` and ``python -c`` put the
# checkout's root first on sys.path, so this source folder (without the
# compiled module) shadows the installed package. Extending __path__ with the
# other ``rustext`` folders on sys.path lets ``rustext._native`` be found in
# the installed one (site-packages) all the same.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
del extend_path

from rustext._native import (  # noqa: E402
    BalancerConfigError,
    BalancerError,
    DecodeError,
    FrameTooLarge,
    JugglerDecodeError,
    RpcxDecodeError,
    RustextError,
)

__all__ = [
    "BalancerConfigError",
    "BalancerError",
    "DecodeError",
    "FrameTooLarge",
    "JugglerDecodeError",
    "RpcxDecodeError",
    "RustextError",
]

# Each area below adds its own import block and extends __all__, so that
# parallel work on different areas merges without conflicts.

# --- framing ---
from rustext._native import FrameDecoder  # noqa: E402

__all__ += ["FrameDecoder"]

# --- rpcx ---
from rustext._native import (  # noqa: E402
    RPCX_COMPRESS_GZIP,
    RPCX_COMPRESS_NONE,
    RPCX_REQUEST,
    RPCX_RESPONSE,
    RPCX_SERIALIZE_JSON,
    RPCX_SERIALIZE_MSGPACK,
    RPCX_SERIALIZE_PROTOBUF,
    RPCX_SERIALIZE_RAW,
    RPCX_SERIALIZE_THRIFT,
    RPCX_STATUS_ERROR,
    RPCX_STATUS_NORMAL,
    RpcxMessage,
    RpcxStream,
    decode_rpcx,
    encode_rpcx_many,
    encode_rpcx_replies,
    encode_rpcx_request,
)

__all__ += [
    "RPCX_COMPRESS_GZIP",
    "RPCX_COMPRESS_NONE",
    "RPCX_REQUEST",
    "RPCX_RESPONSE",
    "RPCX_SERIALIZE_JSON",
    "RPCX_SERIALIZE_MSGPACK",
    "RPCX_SERIALIZE_PROTOBUF",
    "RPCX_SERIALIZE_RAW",
    "RPCX_SERIALIZE_THRIFT",
    "RPCX_STATUS_ERROR",
    "RPCX_STATUS_NORMAL",
    "RpcxMessage",
    "RpcxStream",
    "decode_rpcx",
    "encode_rpcx_many",
    "encode_rpcx_replies",
    "encode_rpcx_request",
]

# --- juggler ---
from rustext._native import (  # noqa: E402
    ACK,
    ALL_CLIENT_TYPES,
    CALL,
    EVNT,
    NACK,
    PUB,
    RES,
    SUB,
    UNSB,
    CallPayload,
    ClientMessage,
    FanoutHub,
    FanoutSubscribers,
    ServerMessage,
    build_ack,
    build_call,
    build_call_payload,
    build_evnt,
    build_nack,
    build_pub,
    build_pub_payload,
    build_res,
    build_sub,
    build_sub_ack,
    build_unsb,
    canonical_uuid,
    new_uuid,
    normalize_json,
    parse_allowed_messages,
    parse_call_payload,
    parse_call_payloads,
    parse_client_message,
    parse_pub_payload,
    parse_pub_payload_at,
    parse_server_message,
)

__all__ += [
    "ACK", "ALL_CLIENT_TYPES", "CALL", "EVNT", "NACK", "PUB", "RES", "SUB", "UNSB",
    "CallPayload", "ClientMessage", "FanoutHub", "FanoutSubscribers", "ServerMessage",
    "build_ack", "build_call", "build_call_payload", "build_evnt", "build_nack", "build_pub",
    "build_pub_payload", "build_res", "build_sub", "build_sub_ack", "build_unsb", "canonical_uuid", "new_uuid",
    "normalize_json", "parse_allowed_messages", "parse_call_payload", "parse_call_payloads",
    "parse_client_message", "parse_pub_payload", "parse_pub_payload_at", "parse_server_message",
]

# websocket frames (RFC 6455 §5), for juggler/wsproto.py: client frames in, server frames out
from rustext._native import (  # noqa: E402
    WS_BINARY,
    WS_CLOSE,
    WS_FAIL,
    WS_PING,
    WsDeflate,
    WsFrameReader,
    ws_close_frame,
    ws_control_frame,
    ws_text_frames,
)

__all__ += ["WS_BINARY", "WS_CLOSE", "WS_FAIL", "WS_PING", "WsDeflate", "WsFrameReader", "ws_close_frame",
            "ws_control_frame",
            "ws_text_frames"]

# --- timer ---
from rustext._native import DeadlineHeap  # noqa: E402

__all__ += ["DeadlineHeap"]

# --- balancer ---
from rustext._native import Balancer  # noqa: E402

__all__ += ["Balancer"]

# --- seq (grpc) ---
from rustext._native import GrpcClient, GrpcServer  # noqa: E402

__all__ += ["GrpcClient", "GrpcServer"]
