"""gRPC glue for the two services, written by hand over the generated messages.

- ``pb.RRAPI`` — the public service of rrseq.md (same package, service,
  method and message names as the original, so any gRPC client works).
- ``rrseq.peer.v1.RRPeer`` — the rare member-to-member calls (snapshot,
  peer-port discovery), see ``_proto/rrpeer.proto``; the per-round calls go
  over rpc.transport (:mod:`seq.peerlink`).

Only the ``*_pb2`` message modules are generated (``python -m
seq._proto.generate``); handlers and stubs here use grpc's stable generic
API, so the generated code puts no floor on the grpcio version.

A member serves both services with the native server (:mod:`seq.api`) and
RRSeq calls through the native client (:mod:`seq.channel`); grpcio remains
for the rare peer ``Snapshot`` call (``PeerStub``), for any grpcio user
(``ApiStub``), and for the grpc.aio servers of the interoperability tests
(``api_handler``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from seq._proto import rrpeer_pb2 as peer_pb
from seq._proto import rrseq_pb2 as pb

API_SERVICE = "pb.RRAPI"
PEER_SERVICE = "rrseq.peer.v1.RRPeer"

# Channel options: reconnect quickly after a member restarts (grpc's default
# backoff grows to minutes), bounded messages (a snapshot may be large).
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
]

Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


def grpc_credentials(tls: Any) -> grpc.ChannelCredentials:
    """grpcio's channel credentials for a ``rustext.tls.ClientTls``: its CA
    (or the system's trust store) and its client certificate. grpcio has no
    way to skip verification, so ``insecure`` is refused."""
    if tls.insecure:
        raise ValueError("grpcio channels cannot skip certificate verification; give the CA instead")

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(root_certificates=read(tls.ca), private_key=read(tls.key),
                                        certificate_chain=read(tls.cert))


def _unary(fn: Handler, req: Any, rep: Any) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=req.FromString, response_serializer=rep.SerializeToString
    )


def api_handler(next_id: Handler, cur_id: Handler, set_id: Handler) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        API_SERVICE,
        {
            "GRPCNextID": _unary(next_id, pb.NextIDRequest, pb.NextIDReply),
            "GRPCCurID": _unary(cur_id, pb.CurIDRequest, pb.CurIDReply),
            "GRPCSetID": _unary(set_id, pb.SetIDRequest, pb.SetIDReply),
        },
    )


def peer_handler(snapshot: Handler) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        PEER_SERVICE,
        {"Snapshot": _unary(snapshot, peer_pb.SnapshotRequest, peer_pb.SnapshotReply)},
    )


class ApiStub:
    """Client stub of ``pb.RRAPI`` on a ``grpc.aio`` channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        def m(name: str, rep: Any) -> Any:
            return channel.unary_unary(
                f"/{API_SERVICE}/{name}",
                request_serializer=lambda r: r.SerializeToString(),
                response_deserializer=rep.FromString,
            )

        self.NextID = m("GRPCNextID", pb.NextIDReply)
        self.CurID = m("GRPCCurID", pb.CurIDReply)
        self.SetID = m("GRPCSetID", pb.SetIDReply)


class PeerStub:
    """Client stub of ``rrseq.peer.v1.RRPeer``."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        def m(name: str, rep: Any) -> Any:
            return channel.unary_unary(
                f"/{PEER_SERVICE}/{name}",
                request_serializer=lambda r: r.SerializeToString(),
                response_deserializer=rep.FromString,
            )

        self.Snapshot = m("Snapshot", peer_pb.SnapshotReply)
