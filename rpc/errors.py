"""The rpc exception tree: one root, and subclasses that also inherit the builtin they mean.

::

    RpcError
    ├── ServiceError            the server ran (or refused) the call and returned an error
    │   │                       (status error + ``__rpcx_error__``); NEVER retried
    │   ├── UnknownService      "rpcx: can't find service X"
    │   ├── UnknownMethod       "rpcx: can't find method X"
    │   ├── AuthFailed          the server's auth hook refused ``__AUTH`` (connection closes)
    │   ├── RateLimited         a rate-limit plugin refused the request
    │   └── HandlerTimeout      the handler overran ``__ServerTimeout`` and was cancelled
    ├── (CodecError (ValueError): a payload could not be encoded or decoded; raised by
    │    the codecs of rpc.transport.codec, so a TransportError of the layer
    │    underneath, not an RpcError: ``except (RpcError, CodecError)``)
    ├── TransportError (ConnectionError)
    │                           the request may not have reached a server: retryable
    │                           by the fail modes; ``kind`` says which step failed
    ├── CallTimeout (TimeoutError)  the caller's deadline passed before a reply
    ├── CircuitOpen             the server's circuit breaker refuses calls for now
    ├── NoServerAvailable       discovery knows no (usable) server for the service
    ├── BroadcastError          some servers of a broadcast failed (``errors`` per server)
    ├── RegistryError           a discovery registry (Redis, etcd) failed
    │   └── RegistryUnavailable the registry cannot be reached
    └── ServerClosing           the server is shutting down and accepts no new calls

The transport (``rpc.transport``) raises ``TransportError`` (or subclasses) for
connect/write/connection-lost failures, so that the fail modes can tell
"retry elsewhere" apart from "the service said no".
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class RpcError(Exception):
    """Root of every error raised by the rpc package."""


class ServiceError(RpcError):
    """The server returned an error for the call (status error).

    ``text`` is exactly what went on the wire in ``__rpcx_error__``. The fail
    modes never retry a ServiceError: the server got the request and answered.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class UnknownService(ServiceError):
    """No service of that name is registered on the server."""

    def __init__(self, service: str) -> None:
        super().__init__(f"rpcx: can't find service {service}")
        self.service = service


class UnknownMethod(ServiceError):
    """The service has no such method."""

    def __init__(self, method: str) -> None:
        super().__init__(f"rpcx: can't find method {method}")
        self.method = method


class AuthFailed(ServiceError):
    """The auth hook refused the request's ``__AUTH`` token."""


class RateLimited(ServiceError):
    """A rate-limit plugin refused the request."""


class HandlerTimeout(ServiceError):
    """The handler did not finish before the request's ``__ServerTimeout``."""


# the codecs live in the layer underneath (rpc.transport.codec): their error is
# the transport's, re-exported here so that rpc code names it as rpc's own
from rpc.transport.errors import CodecError  # noqa: E402


class TransportErrorKind(enum.Enum):
    """Which step of moving a request failed."""

    CONNECT = "connect"  # no connection could be made: the request was never sent
    WRITE = "write"  # the write failed: the request may or may not have left
    CLOSED = "closed"  # the connection closed/was lost with the request in flight
    PROTOCOL = "protocol"  # the peer sent something the protocol does not allow
    OVERLOADED = "overloaded"  # a bounded queue was full and the caller chose fail-fast


class TransportError(RpcError, ConnectionError):
    """The request could not be carried to or from the server (retryable)."""

    def __init__(self, message: str, kind: TransportErrorKind = TransportErrorKind.CLOSED) -> None:
        super().__init__(message)
        self.kind = kind


class CallTimeout(RpcError, TimeoutError):
    """The caller's deadline passed before a reply arrived."""


class CircuitOpen(RpcError):
    """The circuit breaker of a server is open: calls to it are refused locally."""

    def __init__(self, address: str) -> None:
        super().__init__(f"circuit breaker open for {address}")
        self.address = address


class NoServerAvailable(RpcError):
    """No usable server for the service (none discovered, all excluded or open)."""


class BroadcastError(RpcError):
    """A broadcast call failed on some servers; ``errors`` maps address → error."""

    def __init__(self, errors: Mapping[str, BaseException], replies: Mapping[str, object]) -> None:
        first = next(iter(errors.items()))
        super().__init__(f"broadcast failed on {len(errors)} server(s), e.g. {first[0]}: {first[1]}")
        self.errors = dict(errors)
        self.replies = dict(replies)


class RegistryError(RpcError):
    """A discovery registry operation failed."""


class RegistryUnavailable(RegistryError, ConnectionError):
    """The registry could not be reached."""


class ServerClosing(RpcError):
    """The server is shutting down and takes no new calls."""


def is_retryable(exc: BaseException) -> bool:
    """Whether a fail mode may try again after ``exc``.

    Transport errors and open circuits are retryable (the request did not get a
    served answer); service errors never are; the caller's own deadline
    (CallTimeout) and cancellation end the call.
    """
    return isinstance(exc, (TransportError, CircuitOpen)) and not isinstance(exc, ServiceError)
