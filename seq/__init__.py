"""seq: a durable distributed sequence (ID) service over read/write quorums.

Map (the protocol: docs/protocols/rrseq.md; the user's guide: docs/seq.md):

- ``server.py``      RRServer: one member (public ``pb.RRAPI`` + member-to-member ``RRPeer``),
                     join (bootstrap / catch-up), its part of a membership change (fence, install,
                     learning a newer configuration)
- ``startup.py``     ServerConfig (a member's flags) and the data-dir start checks and lock
- ``membership.py``  configurations (epoch + members) and one-member changes: the safety argument,
                     Admin (``juggler seq member list|add|remove``)
- ``api.py``         the public RRAPI endpoint: native gRPC server (rustext.GrpcServer), calls batched into the coordinator
- ``channel.py``     ApiChannel: RRAPI calls over the native gRPC client (rustext.GrpcClient), completions in batches
- ``coordinator.py`` NextID rounds: read quorum, compare-and-set write quorum, retries, forwarding, linger
- ``peerlink.py``    member-to-member hot path (read, compare-and-set, acquire) over rpc.transport
- ``quorum.py``      vote counting of one round (sans-I/O)
- ``http.py``        HttpApi: the HTTP/JSON API, status page and /metrics of a member (aiohttp, ``--http``)
- ``namestats.py``   per-name figures of the ranges a member served (sans-I/O; the cap on metric series)
- ``metrics.py``     Prometheus collectors of a member (totals, and per name, bounded)
- ``localcluster.py`` N server processes on loopback (tests, benches, ``juggler seq bench``)
- ``snowflake.py``   time-ordered IDs, sans-I/O: the bit layout, the generator, the decoder
- ``lease.py``       worker-ID leases kept in the cluster (quorum compare-and-set), and why they are safe
- ``worker.py``      SnowflakeWorker: ``juggler seq snowflake``, the generator behind the gRPC and HTTP APIs
- ``localworker.py`` one snowflake worker process on loopback (tests, benches)
- ``bench.py``       measurements shared by ``juggler seq bench`` and benches/seq
- ``store.py``       durable name → value map: group-committed fsync'd log, compaction, meta
- ``log.py``         the log's byte format and recovery (sans-I/O)
- ``buffered.py``    the double buffer (with adaptive prefetch) shared by the two sequences
- ``client.py``      RRSeq, the cluster client
- ``simple.py``      SimpleBufSeq, the single-process baseline
- ``wire.py``        grpcio glue over the generated messages in ``_proto/`` (peer Snapshot client, stubs for grpcio users)
- ``errors.py``      the exception tree
"""

from seq.buffered import BufferedSeq
from seq.client import RRSeq
from seq.errors import (
    ChangeRefused,
    MemberRemoved,
    MembershipError,
    SeqClosed,
    SeqError,
    SeqExhausted,
    SeqInconsistent,
    SeqUnavailable,
    StoreCorrupt,
    StoreError,
    UnsafeStart,
)
from seq.server import RRServer
from seq.simple import LocalCounter, SimpleBufSeq
from seq.startup import ServerConfig

__all__ = [
    "BufferedSeq",
    "ChangeRefused",
    "MemberRemoved",
    "MembershipError",
    "RRSeq",
    "RRServer",
    "SeqClosed",
    "SeqError",
    "SeqExhausted",
    "SeqInconsistent",
    "SeqUnavailable",
    "ServerConfig",
    "SimpleBufSeq",
    "LocalCounter",
    "StoreCorrupt",
    "StoreError",
    "UnsafeStart",
]
