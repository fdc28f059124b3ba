"""The questions put to the application's backend and its answers, sans-I/O.

Every kind is one JSON object each way (the gRPC transport maps its
messages onto the same objects, :mod:`juggler.proxy.grpc`). A question
always says who asks::

    {"client": "<connection id>", "transport": "websocket", "protocol": "juggler.0",
     "user": "<user or empty>", ...what the kind adds}

An answer is ``{"result": {...}}`` (accepted, maybe with data) or
``{"error": {"code": 403, "reason": "..."}}`` (refused). The parsers here
turn an answer (already decoded from JSON) into a typed result, and
anything else into :class:`ProxyBadAnswer`: a backend is trusted to decide,
not to be well-formed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from juggler.proxy.errors import ProxyBadAnswer

__all__ = [
    "ConnectResult",
    "PublishResult",
    "RefreshResult",
    "Refusal",
    "RpcResult",
    "connect_question",
    "decode_answer",
    "error_res",
    "json_value",
    "parse_connect",
    "parse_publish",
    "parse_refresh",
    "parse_rpc",
    "parse_subscribe",
    "publish_question",
    "question",
    "refresh_question",
    "rpc_question",
    "subscribe_question",
]

TRANSPORT = "websocket"
PROTOCOL = "juggler.0"
#: a refusal's code when the backend gives none
DEFAULT_REFUSAL = 403
#: largest answer body read (bytes); a larger one is a bad answer
MAX_ANSWER = 1 << 20


@dataclass(frozen=True, slots=True)
class Refusal:
    """The backend said no: ``code`` becomes the NACK code (or handshake status), ``reason`` its text."""

    code: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectResult:
    """A connection the backend let in: who it is, until when, what it carries."""

    user: str
    #: unix seconds after which the credentials must be refreshed; None: never
    expire_at: float | None = None
    #: application data about the connection (any JSON value)
    data: Any = None
    #: channels the server subscribes the connection to
    channels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RefreshResult:
    """The backend's answer to a refresh: a new expiry (and data), or ``expired``."""

    #: the credentials are no longer valid: the connection should go
    expired: bool = False
    #: the new expiry (unix seconds); None: never
    expire_at: float | None = None
    #: new application data about the connection, when the backend sends some
    data: Any = None
    #: the backend refused (``expired`` is True too)
    refusal: Refusal | None = None


@dataclass(frozen=True, slots=True)
class PublishResult:
    """A publication the backend allowed; ``data`` replaces the args when ``replaced``."""

    replaced: bool = False
    #: raw JSON of the replacement args
    data: bytes | None = None


@dataclass(frozen=True, slots=True)
class RpcResult:
    """The backend's result of a CALL: raw JSON of the RES args."""

    data: bytes = field(default=b"null")


# questions ----------------------------------------------------------------------------


def question(client: str, user: str, **fields: Any) -> dict[str, Any]:
    """The part every question shares, plus `fields`."""
    q: dict[str, Any] = {"client": client, "transport": TRANSPORT, "protocol": PROTOCOL, "user": user}
    q.update(fields)
    return q


def connect_question(client: str, *, remote: str, headers: Mapping[str, str], cookies: Mapping[str, str],
                     token: str | None, path: str) -> dict[str, Any]:
    """Who knocks: the address, the allowed headers and cookies, the token if any."""
    q = question(client, "", remote=remote, path=path, headers=dict(headers), cookies=dict(cookies))
    if token is not None:
        q["token"] = token
    return q


def refresh_question(client: str, user: str, *, expire_at: float | None, data: Any) -> dict[str, Any]:
    return question(client, user, expire_at=expire_at, data=data)


def subscribe_question(client: str, user: str, *, channel: str, pattern: bool) -> dict[str, Any]:
    return question(client, user, channel=channel, pattern=pattern)


def publish_question(client: str, user: str, *, channel: str, args: bytes | None) -> dict[str, Any]:
    return question(client, user, channel=channel, data=_raw(args))


def rpc_question(client: str, user: str, *, uri: str, args: bytes | None) -> dict[str, Any]:
    return question(client, user, uri=uri, data=_raw(args))


def _raw(args: bytes | None) -> Any:
    """A message's raw JSON args as a value to embed (they were validated by the decoder)."""
    return None if args is None else json.loads(args)


# answers ------------------------------------------------------------------------------


def decode_answer(body: bytes) -> dict[str, Any]:
    """An answer's body → its object; ProxyBadAnswer for anything that is not one."""
    if len(body) > MAX_ANSWER:
        raise ProxyBadAnswer(f"answer of {len(body)} bytes (max {MAX_ANSWER})")
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise ProxyBadAnswer(f"answer is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ProxyBadAnswer(f"answer is not a JSON object but {type(value).__name__}")
    return value


def json_value(raw: bytes, what: str) -> Any:
    """A JSON value sent as bytes (gRPC's ``data``); ProxyBadAnswer when it is not strict JSON."""
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise ProxyBadAnswer(f"{what} is not JSON: {exc}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _split(answer: Any) -> tuple[dict[str, Any] | None, Refusal | None]:
    """(result, None) or (None, refusal): an ``error`` refuses, else the ``result`` (an object) accepts."""
    if not isinstance(answer, Mapping):
        raise ProxyBadAnswer(f"answer is not an object but {type(answer).__name__}")
    result, error = answer.get("result"), answer.get("error")
    if error is not None:
        if not isinstance(error, Mapping):
            raise ProxyBadAnswer("error must be an object {code, reason}")
        code = error.get("code", DEFAULT_REFUSAL)
        if code.__class__ is not int or not 400 <= code <= 599:
            raise ProxyBadAnswer(f"error.code must be an integer in 400..599, got {code!r}")
        reason = error.get("reason", "")
        if not isinstance(reason, str):
            raise ProxyBadAnswer("error.reason must be a string")
        return None, Refusal(code, reason or "refused")
    if result is None:
        # neither: a backend that lost track of its answer must not let anything through
        raise ProxyBadAnswer("an answer has a result or an error")
    if not isinstance(result, Mapping):
        raise ProxyBadAnswer("result must be an object")
    return dict(result), None


def _expire_at(result: Mapping[str, Any]) -> float | None:
    v = result.get("expire_at")
    if v is None or v == 0:
        return None
    if v.__class__ not in (int, float) or not math.isfinite(v) or v < 0:
        raise ProxyBadAnswer(f"expire_at must be unix seconds, got {v!r}")
    return float(v)


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def parse_connect(answer: Any) -> ConnectResult | Refusal:
    result, refusal = _split(answer)
    if refusal is not None:
        return refusal
    assert result is not None
    user = result.get("user", "")
    if not isinstance(user, str):
        raise ProxyBadAnswer("result.user must be a string")
    channels = result.get("channels", [])
    if not isinstance(channels, Sequence) or isinstance(channels, str) or not all(
            isinstance(c, str) and c for c in channels):
        raise ProxyBadAnswer("result.channels must be a list of channel names")
    return ConnectResult(user=user, expire_at=_expire_at(result), data=result.get("data"), channels=tuple(channels))


def parse_refresh(answer: Any) -> RefreshResult:
    result, refusal = _split(answer)
    if refusal is not None:
        return RefreshResult(expired=True, refusal=refusal)
    assert result is not None
    expired = result.get("expired", False)
    if not isinstance(expired, bool):
        raise ProxyBadAnswer("result.expired must be a boolean")
    return RefreshResult(expired=expired, expire_at=_expire_at(result), data=result.get("data"))


def parse_subscribe(answer: Any) -> Refusal | None:
    """None: allowed."""
    _, refusal = _split(answer)
    return refusal


def parse_publish(answer: Any) -> PublishResult | Refusal:
    result, refusal = _split(answer)
    if refusal is not None:
        return refusal
    assert result is not None
    if "data" in result:
        return PublishResult(True, _json_bytes(result["data"]))
    return PublishResult()


def parse_rpc(answer: Any) -> RpcResult | Refusal:
    result, refusal = _split(answer)
    if refusal is not None:
        return refusal
    assert result is not None
    return RpcResult(_json_bytes(result.get("data")))


def error_res(code: int, reason: str) -> bytes:
    """The args of the error RES of a CALL the backend refused or failed (a callee error's shape)."""
    return _json_bytes({"error": {"code": code, "message": reason}})
