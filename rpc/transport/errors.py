"""Exception tree of rpc.transport.

```
TransportError(rpc.errors.RpcError)
├── ConnectionLost(TransportError, ConnectionError)   the connection died; in-flight requests fail with it
│   └── TransportClosed(ConnectionLost)               closed locally (close/aclose); no new requests
├── Unavailable(TransportError, ConnectionError)      the pool cannot reach an endpoint (down / backing off)
├── RequestTimeout(TransportError, TimeoutError)      a request's deadline passed
├── QueueFull(TransportError)                         the send queue is full and the policy is fail-fast
├── RemoteError(TransportError)                       the peer's handler failed (error text from the peer)
└── ProtocolError(TransportError, ValueError)         the peer sent bad input (the connection is closed)
```
"""

from __future__ import annotations

from rpc.errors import RpcError


class TransportError(RpcError):
    """Root of every error raised by rpc.transport. It is an ``RpcError``, so
    one ``except RpcError`` catches the whole rpc package. (Not to be confused
    with ``rpc.errors.TransportError``, the retryable error the rpc callers
    raise: ``rpc.rpcx_client`` maps these onto that one.)"""


class ConnectionLost(TransportError, ConnectionError):
    """The connection is gone; requests in flight on it fail at once with this."""


class TransportClosed(ConnectionLost):
    """The connection (or server, or pool) was closed locally."""


class Unavailable(TransportError, ConnectionError):
    """The pool has no working connection to the endpoint (down, or reconnect failed)."""


class RequestTimeout(TransportError, TimeoutError):
    """The request's deadline passed before its response arrived."""


class QueueFull(TransportError):
    """The connection's bounded send queue is full (fail-fast policy)."""


class RemoteError(TransportError):
    """The peer answered with an error status; ``args[0]`` is its error text."""

    response: object = None  # the error response message, when there is one


class ProtocolError(TransportError, ValueError):
    """Malformed or oversized input from the peer. The connection is closed;
    its in-flight requests fail with ConnectionLost caused by this."""
