"""The gRPC transport: the ``JugglerProxy`` service of ``proxy.proto``.

One ``grpc.aio`` channel per endpoint (``grpc://HOST:PORT``, plaintext: a
backend next to the server), opened by :meth:`GrpcTransport.start` and
closed by :meth:`GrpcTransport.aclose`. The transport maps the question
objects of :mod:`juggler.proxy.mapping` onto the request messages and the
responses back onto answer objects, so both transports share one parser:
JSON values travel as bytes of JSON, ``0`` is "no expiry".
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import grpc

from juggler.proxy import proxy_pb2
from juggler.proxy.errors import ProxyBadAnswer, ProxyTimeout, ProxyUnavailable
from juggler.proxy.mapping import MAX_ANSWER, json_value

__all__ = ["GrpcTransport", "answer_of", "request_of"]

#: kind → (request message, response message, method name)
_METHODS: dict[str, tuple[Any, Any, str]] = {
    "connect": (proxy_pb2.ConnectRequest, proxy_pb2.ConnectResponse, "Connect"),
    "refresh": (proxy_pb2.RefreshRequest, proxy_pb2.RefreshResponse, "Refresh"),
    "subscribe": (proxy_pb2.SubscribeRequest, proxy_pb2.SubscribeResponse, "Subscribe"),
    "publish": (proxy_pb2.PublishRequest, proxy_pb2.PublishResponse, "Publish"),
    "rpc": (proxy_pb2.RPCRequest, proxy_pb2.RPCResponse, "RPC"),
}
SERVICE = "/juggler.proxy.v1.JugglerProxy/"

_UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE,)
_TIMEOUT = (grpc.StatusCode.DEADLINE_EXCEEDED,)


def request_of(kind: str, question: dict[str, Any]) -> Any:
    """The request message of a question object."""
    cls = _METHODS[kind][0]
    fields: dict[str, Any] = {}
    for key, value in question.items():
        if key == "data":
            if value is not None:
                fields["data"] = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        elif key == "expire_at":
            fields["expire_at"] = int(value or 0)
        elif value is not None:
            fields[key] = value
    return cls(**fields)


def answer_of(response: Any) -> dict[str, Any]:
    """The answer object of a response message (ProxyBadAnswer: data that is not JSON)."""
    if response.HasField("error"):
        return {"error": {"code": response.error.code, "reason": response.error.reason}}
    if not response.HasField("result"):
        return {}
    result = response.result
    out: dict[str, Any] = {}
    for desc in result.DESCRIPTOR.fields:
        name = desc.name
        if name == "data":
            if result.HasField("data"):
                out["data"] = json_value(result.data, "result.data")
        elif name == "expire_at":
            out["expire_at"] = result.expire_at or None
        elif name == "channels":
            out["channels"] = list(result.channels)
        else:
            out[name] = getattr(result, name)
    return {"result": out}


class GrpcTransport:
    """Calls one ``JugglerProxy`` server. Lifecycle: ``start()``, then ``aclose()`` (idempotent)."""

    def __init__(self, endpoint: str) -> None:
        parts = urlsplit(endpoint)
        self.endpoint = endpoint
        self.target = f"{parts.hostname}:{parts.port}" if ":" not in (parts.hostname or "") \
            else f"[{parts.hostname}]:{parts.port}"
        self._channel: grpc.aio.Channel | None = None
        self._calls: dict[str, Any] = {}

    async def start(self) -> None:
        if self._channel is None:
            # an answer larger than an HTTP one may be is a bad answer too (RESOURCE_EXHAUSTED)
            channel = self._channel = grpc.aio.insecure_channel(
                self.target, options=[("grpc.max_receive_message_length", MAX_ANSWER)])
            # the calls by hand, not the generated stub: proxy_pb2_grpc.py (for applications)
            # requires the grpcio it was generated with, the server any grpcio
            self._calls = {
                kind: channel.unary_unary(SERVICE + name, request_serializer=req.SerializeToString,
                                          response_deserializer=resp.FromString)
                for kind, (req, resp, name) in _METHODS.items()
            }

    async def aclose(self) -> None:
        channel, self._channel = self._channel, None
        self._calls = {}
        if channel is not None:
            await channel.close()

    async def ask(self, kind: str, question: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The backend's answer object; ProxyError (unavailable, timeout, bad answer) otherwise."""
        method = self._calls.get(kind)
        if method is None:
            raise ProxyUnavailable("proxy not started")
        try:
            request = request_of(kind, question)
        except (TypeError, ValueError) as exc:  # a question the message cannot hold (a bug)
            raise ProxyBadAnswer(f"cannot encode the {kind} question: {exc}") from exc
        try:
            # the deadline goes to the backend too; asyncio.timeout is the guard of last resort
            async with asyncio.timeout(timeout + 0.5):
                response = await method(request, timeout=timeout)
        except TimeoutError:
            raise ProxyTimeout(f"no answer within {timeout:g} s") from None
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            text = f"gRPC {code.name}: {exc.details() or ''}".rstrip(": ")
            if code in _UNAVAILABLE:
                raise ProxyUnavailable(text) from None
            if code in _TIMEOUT:
                raise ProxyTimeout(text) from None
            raise ProxyBadAnswer(text) from None
        return answer_of(response)
