"""The rpc exception tree: builtin meanings and what the fail modes retry."""

from __future__ import annotations

from rpc.errors import (
    AuthFailed,
    BroadcastError,
    CallTimeout,
    CircuitOpen,
    CodecError,
    HandlerTimeout,
    RateLimited,
    RegistryUnavailable,
    RpcError,
    ServiceError,
    TransportError,
    TransportErrorKind,
    UnknownMethod,
    UnknownService,
    is_retryable,
)


def test_tree_and_builtins() -> None:
    for cls in (ServiceError, TransportError, CallTimeout, CircuitOpen, RegistryUnavailable):
        assert issubclass(cls, RpcError)
    # the codecs' error belongs to the layer underneath (one codec module, in rpc.transport)
    import rpc.transport

    assert CodecError is rpc.transport.CodecError and issubclass(CodecError, rpc.transport.TransportLayerError)
    for cls in (UnknownService, UnknownMethod, AuthFailed, RateLimited, HandlerTimeout):
        assert issubclass(cls, ServiceError)
    assert issubclass(TransportError, ConnectionError) and issubclass(CallTimeout, TimeoutError)
    assert issubclass(CodecError, ValueError) and issubclass(RegistryUnavailable, ConnectionError)
    assert UnknownService("Foo").text == "rpcx: can't find service Foo"
    assert UnknownMethod("Bar").text == "rpcx: can't find method Bar"
    assert TransportError("x").kind is TransportErrorKind.CLOSED


def test_what_is_retried() -> None:
    assert is_retryable(TransportError("refused", TransportErrorKind.CONNECT))
    assert is_retryable(CircuitOpen("tcp@a:1"))
    for exc in (ServiceError("no"), RateLimited("slow down"), CallTimeout("late"), CodecError("bad"), ValueError()):
        assert not is_retryable(exc)


def test_broadcast_error_keeps_everything() -> None:
    err = BroadcastError({"a": TransportError("down")}, {"b": 1})
    assert err.errors["a"].args == ("down",) and err.replies == {"b": 1} and "a: down" in str(err)
