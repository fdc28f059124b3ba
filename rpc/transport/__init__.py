"""rpc.transport: a multiplexed, full-duplex transport (ListenRain-style).

Map:
- ``endpoint``    Endpoint: tcp://host:port, quic://host:port, kcp://host:port, unix:///path, inproc://name (the pool key)
- ``channelapi``  the Channel / Listener interface every byte stream implements
- ``channels``    byte streams behind it: TCP, Unix, in-process (InProcNetwork); channel_for
- ``quic``        QuicChannel: one bidirectional QUIC stream per connection (aioquic), as Go rpcx's quic tag
- ``kcp``         KcpSession: kcp-go's ARQ, sans-I/O (segments, acks, retransmission, windows)
- ``kcpwire``     kcp-go's packet layer, sans-I/O: AES-CFB block crypt, crc32, FEC data-shard framing
- ``kcpchannel``  KcpChannel: KCP sessions on UDP as byte streams (KcpOptions: crypt, shards), as rpcx's kcp tag
- ``wire``        packet + message layer per protocol: rpcx (rustext codec), frame (rustext framing)
- ``codec``       payload codecs by serialize type: raw, JSON, protobuf (by annotation),
                  msgpack; SerializeType; the one codec module of rpc too
- ``registry``    ProtocolRegistry: protocol name → wire + payload codec
- ``timer``       DeadlineScheduler: request deadlines on the rustext min-heap, one loop timer
- ``connection``  Connection: multiplexing, request styles, back-pressure, lifecycle
- ``server``      TransportServer: accept, serve, push, drain
- ``pool``        TransportPool: one connection per endpoint, health, reconnect
- ``errors``      the exception tree (root TransportLayerError)
- ``config``      ConnectionConfig, ServerConfig, PoolConfig
- ``tuning``      tune_malloc(): keep large buffers off fresh mmaps (large messages)
- ``bench``       the transport-bench engine behind ``juggler rpc transport-bench``
"""

from rpc.transport.channels import Channel, InProcNetwork, Listener, TcpChannel, UnixChannel, channel_for
from rpc.transport.config import ConnectionConfig, PoolConfig, ServerConfig
from rpc.transport.connection import Connection, HandlerLimiter, connect
from rpc.transport.endpoint import Endpoint
from rpc.transport.errors import (
    ConnectionLost,
    ProtocolError,
    QueueFull,
    RemoteError,
    RequestTimeout,
    TransportClosed,
    TransportLayerError,
    Unavailable,
)
from rpc.transport.codec import (
    CodecError,
    CodecRegistry,
    JSONCodec,
    MsgpackCodec,
    PayloadCodec,
    ProtobufCodec,
    RawCodec,
    SerializeType,
)
from rpc.transport.pool import Health, TransportPool
from rpc.transport.registry import ProtocolRegistry, TransportProtocol
from rpc.transport.server import TransportServer
from rpc.transport.timer import DeadlineScheduler
from rpc.transport.tuning import tune_malloc
from rpc.transport.wire import FrameMessage, FrameWire, RpcxWire, Wire

__all__ = [
    "Channel",
    "Connection",
    "ConnectionConfig",
    "ConnectionLost",
    "DeadlineScheduler",
    "Endpoint",
    "FrameMessage",
    "FrameWire",
    "HandlerLimiter",
    "Health",
    "InProcNetwork",
    "CodecError",
    "CodecRegistry",
    "JSONCodec",
    "Listener",
    "MsgpackCodec",
    "PayloadCodec",
    "PoolConfig",
    "ProtobufCodec",
    "ProtocolError",
    "ProtocolRegistry",
    "QueueFull",
    "RawCodec",
    "RemoteError",
    "RequestTimeout",
    "RpcxWire",
    "SerializeType",
    "ServerConfig",
    "TcpChannel",
    "TransportClosed",
    "TransportLayerError",
    "TransportPool",
    "TransportProtocol",
    "TransportServer",
    "UnixChannel",
    "Unavailable",
    "Wire",
    "channel_for",
    "connect",
    "tune_malloc",
]
