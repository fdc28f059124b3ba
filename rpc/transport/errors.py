"""Exception tree of rpc.transport.

```
TransportLayerError(Exception)
├── ConnectionLost(…, ConnectionError)   the connection died; in-flight requests fail with it
│   └── TransportClosed(ConnectionLost)  closed locally (close/aclose); no new requests
├── Unavailable(…, ConnectionError)      the pool cannot reach an endpoint (down / backing off)
├── RequestTimeout(…, TimeoutError)      a request's deadline passed
├── QueueFull                            the send queue is full and the policy is fail-fast
├── RemoteError                          the peer's handler failed (error text from the peer)
├── ProtocolError(…, ValueError)         the peer sent bad input (the connection is closed)
│   └── KcpPacketError(ProtocolError)    a KCP datagram that does not decode (dropped, not fatal)
└── CodecError(…, ValueError)            a payload could not be encoded or decoded (rpc.errors re-exports it)
```
"""

from __future__ import annotations


class TransportLayerError(Exception):
    """Root of every error raised by rpc.transport, the layer under rpc (seq
    uses it on its own): it knows nothing of rpc's errors, and is named apart
    from ``rpc.errors.TransportError`` (a call that could not be carried),
    which means something else. The rpc callers
    (``rpc.rpcx_client``) map these onto ``rpc.errors.TransportError``, the
    retryable error of the rpc package."""


class ConnectionLost(TransportLayerError, ConnectionError):
    """The connection is gone; requests in flight on it fail at once with this."""


class TransportClosed(ConnectionLost):
    """The connection (or server, or pool) was closed locally."""


class Unavailable(TransportLayerError, ConnectionError):
    """The pool has no working connection to the endpoint (down, or reconnect failed)."""


class RequestTimeout(TransportLayerError, TimeoutError):
    """The request's deadline passed before its response arrived."""


class QueueFull(TransportLayerError):
    """The connection's bounded send queue is full (fail-fast policy)."""


class RemoteError(TransportLayerError):
    """The peer answered with an error status; ``args[0]`` is its error text."""

    response: object = None  # the error response message, when there is one


class ProtocolError(TransportLayerError, ValueError):
    """Malformed or oversized input from the peer. The connection is closed;
    its in-flight requests fail with ConnectionLost caused by this."""


class KcpPacketError(ProtocolError):
    """A KCP datagram that does not decrypt, checksum or parse (``rpc.transport.kcpwire``,
    ``rpc.transport.kcp``). UDP carries anyone's garbage: the driver drops the
    datagram and keeps the session, so this never closes a connection."""


class CodecError(TransportLayerError, ValueError):
    """A payload could not be encoded or decoded (``rpc.transport.codec``)."""
