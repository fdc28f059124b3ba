"""The server HTTP API: drive juggler from a backend written in any language.

An aiohttp application on a listener of its own (``[api]`` in the
configuration, ``--api HOST:PORT``), shaped after Centrifugo's server API:
``POST /api/<method>`` with a JSON object of parameters, or ``POST /api``
with ``{"method": …, "params": {…}}``. Every answer is JSON:
``{"result": {…}}``, or ``{"error": {"code": N, "message": "…"}}`` where N
is also the HTTP status: 400 (bad JSON, bad parameters), 401 (no key or a
wrong one), 404 (unknown method), 405 (not POST), 413 (body over
``max_body``), 500 (a bug, logged), 503 (the broker or the other servers
cannot be reached, or this server is shutting down).

Auth: a request carries the key as ``Authorization: apikey KEY`` or
``X-API-Key: KEY``; every such header it sends must carry it (compared in
constant time). The API does not start without a key unless ``insecure``.

Methods (:data:`METHODS`: a name → its parameters, a keyword-only
dataclass whose fields are checked against their types and then by its
``__post_init__``, and its handler). To add one, write both and a line in
the table:

- ``publish``, ``broadcast``: through ``Server.publish``;
- ``disconnect``, ``unsubscribe``, ``subscribe``, ``channels``, ``info``: on every server
  sharing the broker, through the control plane (:mod:`juggler.control`);
- ``history``: a channel's kept publications (:mod:`juggler.recovery`);
- ``presence``, ``presence_stats``: from the presence entries every server
  sharing the broker keeps (:mod:`juggler.presence`).

Bounds: a body over ``max_body`` bytes is refused before it is read
further; JSON is validated (nesting at most 512 levels, no NaN) before any
of it is decoded; unknown parameters are errors; error messages never echo
more than a few dozen characters of what was sent.

Lifecycle: ``start()`` listens (``rustext.net.ListenError`` when it cannot);
``aclose()`` stops accepting, lets requests in flight finish (up to
``survey_timeout`` + 2 s), then closes; ``abort()`` cancels those requests.
Both are idempotent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import json
import logging
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

import rustext
from juggler.broker.base import BrokerError
from juggler.config import ApiConfig
from juggler.control import Control, ControlError, NodeReply, Survey, package_version
from juggler.errors import JugglerError
from rustext.net import listen_error

__all__ = ["METHODS", "ApiError", "ApiServer", "Method", "RawJson", "parse_params"]

log = logging.getLogger("juggler.api")

#: channels one ``broadcast`` may name
MAX_BROADCAST_CHANNELS = 10_000
#: characters of a ``channels`` filter pattern
MAX_FILTER = 256


class ApiError(JugglerError):
    """A request the API refuses: ``status`` is the HTTP status and the error code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RawJson(bytes):
    """A parameter holding any JSON value, kept as its JSON text normalized
    as juggler forwards ``args`` (compact, HTML-safe, numbers as written)."""


def _short(text: str, limit: int = 40) -> str:
    """`text` for an error message, cut to `limit` characters."""
    return text if len(text) <= limit else text[:limit] + "…"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


_EXPECTED = {str: "a string", bool: "true or false", int: "an integer", float: "a number"}


def _check(name: str, tp: Any, value: Any, raw: str) -> Any:
    """`value` (whose JSON text is `raw`) checked against the annotation `tp`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (tp,) = [a for a in args if a is not type(None)]
        origin = typing.get_origin(tp)
    if tp is RawJson:
        return RawJson(rustext.normalize_json(raw.encode()))
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ApiError(400, f"{name}: expected an array of {_EXPECTED[item].split(' ', 1)[1]}s, "
                                f"got {_json_type(value)}")
        for i, v in enumerate(value):
            _check(f"{name}[{i}]", item, v, "")
        return list(value)
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)
    if not ok:
        raise ApiError(400, f"{name}: expected {_EXPECTED.get(tp, tp.__name__)}, got {_json_type(value)}")
    if tp is str:
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ApiError(400, f"{name}: not valid Unicode (an unpaired surrogate escape)") from None
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def parse_params(cls: type, members: Mapping[str, tuple[Any, str]]) -> Any:
    """An instance of the parameters dataclass `cls` from the members of a
    JSON object (name → (value, JSON text)); :class:`ApiError` 400 naming
    the first parameter that is unknown, missing or of the wrong type, or
    the ValueError of ``cls.__post_init__``."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(members) - set(fields))
    if unknown:
        names = ", ".join(_short(n) for n in unknown[:5])
        raise ApiError(400, f"unknown parameter{'s' if len(unknown) > 1 else ''}: {names}"
                            f"{' …' if len(unknown) > 5 else ''} (expected: {', '.join(fields) or 'none'})")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in members:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ApiError(400, f"{name} is required")
            continue
        value, raw = members[name]
        values[name] = _check(name, hints[name], value, raw)
    try:
        return cls(**values)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from exc


# the body ---------------------------------------------------------------------------

_decoder = json.JSONDecoder()
_ws = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]


def _members(text: str) -> dict[str, tuple[Any, str]]:
    """The members of the JSON object `text` (already validated), each as
    (value, its JSON text); ApiError 400 when it is not an object or names
    a member twice."""
    i = _ws(text, 0).end()
    if text[i:i + 1] != "{":
        raise ApiError(400, "the body must be a JSON object")
    out: dict[str, tuple[Any, str]] = {}
    i = _ws(text, i + 1).end()
    if text[i:i + 1] == "}":
        return out
    while True:
        key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
        i = _ws(text, _ws(text, i).end() + 1).end()  # past the ':'
        value, end = _decoder.raw_decode(text, i)
        if key in out:
            raise ApiError(400, f"{_short(key)} is given twice")
        out[key] = (value, text[i:end])
        i = _ws(text, end).end()
        if text[i] == "}":
            return out
        i = _ws(text, i + 1).end()  # past the ','


def _parse_body(body: bytes) -> dict[str, tuple[Any, str]]:
    """The members of a request body: a JSON object (empty body: no parameters)."""
    if not body.strip():
        return {}
    try:
        rustext.normalize_json(body)
    except ValueError as exc:
        raise ApiError(400, f"invalid JSON: {exc}") from exc
    text = body.decode("utf-8")  # validated as UTF-8 just above
    try:
        return _members(text)
    except (ValueError, RecursionError) as exc:  # what the validation let through and Python refuses
        raise ApiError(400, f"invalid JSON: {_short(str(exc), 80)}") from exc


def _envelope(members: dict[str, tuple[Any, str]]) -> tuple[str, dict[str, tuple[Any, str]]]:
    """``POST /api`` bodies: ``{"method": NAME, "params": {…}}``."""
    unknown = sorted(set(members) - {"method", "params"})
    if unknown:
        raise ApiError(400, f"unknown member {_short(unknown[0])!r}: POST /api takes "
                            f'{{"method": NAME, "params": {{…}}}} (or POST /api/NAME with the parameters)')
    if "method" not in members:
        raise ApiError(400, 'method is required: {"method": NAME, "params": {…}}')
    name = members["method"][0]
    if not isinstance(name, str):
        raise ApiError(400, f"method: expected a string, got {_json_type(name)}")
    params, raw = members.get("params", (None, "null"))
    if params is None:
        return name, {}
    if not isinstance(params, dict):
        raise ApiError(400, f"params: expected an object, got {_json_type(params)}")
    return name, _members(raw)


# parameters ---------------------------------------------------------------------------


def _channel(name: str, value: str) -> None:
    if not value:
        raise ValueError(f"{name} must not be empty")


def _uuid(name: str, value: str | None) -> str | None:
    if value is None:
        return None
    canonical = rustext.canonical_uuid(value)
    if canonical is None:
        raise ValueError(f"{name}: expected a UUID, got {_short(value)!r}")
    return canonical


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishParams:
    #: the channel to publish to
    channel: str
    #: the message: any JSON value, delivered as the EVNT's args
    data: RawJson
    #: the message's UUID (the EVNT's ``for``); default: a new one
    uuid: str | None = None

    def __post_init__(self) -> None:
        _channel("channel", self.channel)
        object.__setattr__(self, "uuid", _uuid("uuid", self.uuid))


@dataclass(frozen=True, kw_only=True, slots=True)
class BroadcastParams:
    #: the channels to publish to, each independently
    channels: list[str]
    #: the message: any JSON value
    data: RawJson

    def __post_init__(self) -> None:
        if not self.channels:
            raise ValueError("channels must not be empty")
        if len(self.channels) > MAX_BROADCAST_CHANNELS:
            raise ValueError(f"channels: at most {MAX_BROADCAST_CHANNELS} per broadcast, got {len(self.channels)}")
        for i, ch in enumerate(self.channels):
            _channel(f"channels[{i}]", ch)


def _close_code(code: int) -> None:
    if code != 1000 and not 3000 <= code <= 4999:
        raise ValueError(f"code must be 1000 or in 3000..4999, got {_short(str(code))}")


@dataclass(frozen=True, kw_only=True, slots=True)
class DisconnectParams:
    #: a connection's id
    client: str | None = None
    #: a user (the identity's name under auth): all of that user's connections
    user: str | None = None
    #: the websocket close code: 1000, or 3000..4999 (meanings your clients agree on)
    code: int = 4000
    #: the close reason (at most 123 bytes of UTF-8)
    reason: str = ""

    def __post_init__(self) -> None:
        if self.client is None and self.user is None:
            raise ValueError("client or user is required (a connection id, a user, or both)")
        object.__setattr__(self, "client", _uuid("client", self.client))
        if self.user is not None and not self.user:
            raise ValueError("user must not be empty")
        _close_code(self.code)
        if len(self.reason.encode()) > 123:
            raise ValueError("reason: at most 123 bytes of UTF-8 (a websocket close frame's limit)")


@dataclass(frozen=True, kw_only=True, slots=True)
class UnsubscribeParams:
    #: the channel (or pattern) to unsubscribe from, as the client subscribed it
    channel: str
    #: true: ``channel`` is a pattern subscription
    pattern: bool = False
    #: only this connection
    client: str | None = None
    #: only this user's connections
    user: str | None = None

    def __post_init__(self) -> None:
        _channel("channel", self.channel)
        object.__setattr__(self, "client", _uuid("client", self.client))
        if self.user is not None and not self.user:
            raise ValueError("user must not be empty")


@dataclass(frozen=True, kw_only=True, slots=True)
class SubscribeParams:
    #: the channel to subscribe the connections to (server-side: juggler.serversubs)
    channel: str
    #: this connection
    client: str | None = None
    #: this user's connections
    user: str | None = None

    def __post_init__(self) -> None:
        _channel("channel", self.channel)
        if self.client is None and self.user is None:
            raise ValueError("client or user is required (a connection id, a user, or both)")
        object.__setattr__(self, "client", _uuid("client", self.client))
        if self.user is not None and not self.user:
            raise ValueError("user must not be empty")


@dataclass(frozen=True, kw_only=True, slots=True)
class ChannelsParams:
    #: only the channels and patterns whose names match this Redis glob pattern
    pattern: str | None = None

    def __post_init__(self) -> None:
        if self.pattern is not None and len(self.pattern) > MAX_FILTER:
            raise ValueError(f"pattern: at most {MAX_FILTER} characters")


@dataclass(frozen=True, kw_only=True, slots=True)
class InfoParams:
    pass


@dataclass(frozen=True, kw_only=True, slots=True)
class HistoryParams:
    #: a channel whose ``[[channels]]`` rule keeps history
    channel: str
    #: publications after this offset (0: from the oldest kept)
    after: int = 0
    #: at most this many, oldest first (0: every one kept)
    limit: int = 0

    def __post_init__(self) -> None:
        _channel("channel", self.channel)
        if self.after < 0:
            raise ValueError("after must be >= 0")
        if self.limit < 0:
            raise ValueError("limit must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class PresenceParams:
    #: a channel whose ``[[channels]]`` rule has ``presence = true``
    channel: str

    def __post_init__(self) -> None:
        _channel("channel", self.channel)


# methods ----------------------------------------------------------------------------------


def _publication(pub: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"uuid": pub.msg_uuid}
    if getattr(pub, "offset", None) is not None:
        out["offset"] = pub.offset
    if getattr(pub, "epoch", None) is not None:
        out["epoch"] = pub.epoch
    return out


async def publish(api: ApiServer, p: PublishParams) -> dict[str, Any]:
    return _publication(await api.server.publish(p.channel, bytes(p.data), msg_uuid=p.uuid))


async def broadcast(api: ApiServer, p: BroadcastParams) -> dict[str, Any]:
    data = bytes(p.data)
    outcomes = await asyncio.gather(*(api.server.publish(ch, data) for ch in p.channels), return_exceptions=True)
    responses: list[dict[str, Any]] = []
    for ch, out in zip(p.channels, outcomes, strict=True):
        if isinstance(out, BaseException):
            if not isinstance(out, Exception):
                raise out
            status, message = _error_of(out, f"broadcast to {_short(ch)}")
            responses.append({"error": {"code": status, "message": message}})
        else:
            responses.append({"result": _publication(out)})
    return {"responses": responses}


def _answers(survey: Survey, op: str) -> tuple[list[NodeReply], dict[str, Any]]:
    """The servers' results, and ``{"missing_nodes": [...]}`` naming the
    servers that did not answer in time or failed (empty when all did)."""
    ok = [r for r in survey.replies if r.result is not None]
    missing = [n.get("name") or n["id"] for n in survey.missing]
    for r in survey.replies:
        if r.result is None:
            log.warning("%s failed on server %s: %s", op, r.node.get("name") or r.node["id"], r.error)
            missing.append(r.node.get("name") or r.node["id"])
    return ok, ({"missing_nodes": missing} if missing else {})


async def disconnect(api: ApiServer, p: DisconnectParams) -> dict[str, Any]:
    params = {"client": p.client, "user": p.user, "code": p.code, "reason": p.reason}
    ok, extra = _answers(await api.survey("disconnect", params), "disconnect")
    return {"disconnected": sum(int(r.result.get("disconnected", 0)) for r in ok if r.result), **extra}


async def unsubscribe(api: ApiServer, p: UnsubscribeParams) -> dict[str, Any]:
    params = {"channel": p.channel, "pattern": p.pattern, "client": p.client, "user": p.user}
    ok, extra = _answers(await api.survey("unsubscribe", params), "unsubscribe")
    return {"unsubscribed": sum(int(r.result.get("unsubscribed", 0)) for r in ok if r.result), **extra}


async def subscribe(api: ApiServer, p: SubscribeParams) -> dict[str, Any]:
    params = {"channel": p.channel, "client": p.client, "user": p.user}
    ok, extra = _answers(await api.survey("subscribe", params), "subscribe")
    out: dict[str, Any] = {"subscribed": sum(int(r.result.get("subscribed", 0)) for r in ok if r.result)}
    for name in ("over_limit", "failed"):
        n = sum(int(r.result.get(name, 0)) for r in ok if r.result)
        if n:
            out[name] = n
    return {**out, **extra}


async def channels(api: ApiServer, p: ChannelsParams) -> dict[str, Any]:
    ok, extra = _answers(await api.survey("channels", {"pattern": p.pattern}), "channels")
    out: dict[str, dict[str, dict[str, int]]] = {"channels": {}, "patterns": {}}
    for r in ok:
        assert r.result is not None
        for kind in ("channels", "patterns"):
            counts = r.result.get(kind)
            if not isinstance(counts, dict):
                continue
            merged = out[kind]
            for name, n in counts.items():
                if isinstance(n, int):
                    merged.setdefault(name, {"subscribers": 0})["subscribers"] += n
    return {**out, **extra}


async def info(api: ApiServer, p: InfoParams) -> dict[str, Any]:
    ok, extra = _answers(await api.survey("info", {}), "info")
    nodes = [{"id": r.node["id"], "name": r.node.get("name", ""), "version": r.node.get("version", ""),
              **(r.result or {})} for r in ok]
    return {"nodes": nodes, **extra}


async def history(api: ApiServer, p: HistoryParams) -> dict[str, Any]:
    if api.server.recovery.history_of(p.channel) is None:
        raise ApiError(400, f"channel {_short(p.channel)!r} keeps no history "
                            f"(a [[channels]] rule with history_size > 0)")
    page = await api.server.history(p.channel, after=p.after, limit=p.limit)
    pubs = [{"uuid": e.msg_uuid, "offset": e.offset, "data": json.loads(e.args) if e.args is not None else None}
            for e in page.publications]
    return {"publications": pubs, "offset": page.offset, "epoch": page.epoch}


def _presence_of(api: ApiServer, channel: str) -> Any:
    """The server's presence service, if it keeps presence for `channel` (else ApiError 400)."""
    service = api.server.presence
    if service is None or not service.enabled(channel):
        raise ApiError(400, f"channel {_short(channel)!r} keeps no presence "
                            f"(a [[channels]] rule with presence = true)")
    return service


async def presence(api: ApiServer, p: PresenceParams) -> dict[str, Any]:
    return {"presence": await _presence_of(api, p.channel).members(p.channel)}


async def presence_stats(api: ApiServer, p: PresenceParams) -> dict[str, Any]:
    stats = await _presence_of(api, p.channel).stats(p.channel)
    return {"num_clients": stats["clients"], "num_users": stats["users"]}


@dataclass(frozen=True, slots=True)
class Method:
    """One API method: its parameters dataclass and its handler."""

    params: type
    run: Callable[[ApiServer, Any], Awaitable[dict[str, Any]]]


#: the API's methods by name
METHODS: dict[str, Method] = {
    "publish": Method(PublishParams, publish),
    "broadcast": Method(BroadcastParams, broadcast),
    "disconnect": Method(DisconnectParams, disconnect),
    "unsubscribe": Method(UnsubscribeParams, unsubscribe),
    "subscribe": Method(SubscribeParams, subscribe),
    "channels": Method(ChannelsParams, channels),
    "info": Method(InfoParams, info),
    "history": Method(HistoryParams, history),
    "presence": Method(PresenceParams, presence),
    "presence_stats": Method(PresenceParams, presence_stats),
}


def _error_of(exc: Exception, what: str) -> tuple[int, str]:
    """(status, message) of an exception a method raised."""
    if isinstance(exc, ApiError):
        return exc.status, exc.message
    if isinstance(exc, ControlError):
        return 503, str(exc)
    if isinstance(exc, BrokerError):
        return 503, f"broker unavailable: {exc}"
    log.error("%s failed", what, exc_info=exc)
    return 500, "internal error"


def _answer(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(),
                        content_type="application/json")


def _error(status: int, message: str, **kw: Any) -> web.Response:
    response = _answer(status, {"error": {"code": status, "message": _short(message, 240)}})
    for name, value in kw.items():
        response.headers[name.replace("_", "-")] = value
    return response


# the server --------------------------------------------------------------------------------


class ApiServer:
    """The HTTP API of one juggler server (see the module doc).

    ``control`` is the server's control plane (``juggler.control``); None
    makes one for `server` (started and closed with the API).
    """

    def __init__(self, server: Any, config: ApiConfig, *, control: Control | None = None) -> None:
        config.check_key()
        self.server = server
        self.config = config
        self._key = config.key.encode() if config.key is not None else None
        self._own_control = control is None
        self.control = control if control is not None else Control.for_server(server, version=package_version())
        self._runner: web.AppRunner | None = None
        self._inflight: set[asyncio.Task[Any]] = set()
        self._draining = False
        self._closed: asyncio.Event | None = None

    # lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen; raises ``ListenError`` when the address is taken or not ours."""
        if self._runner is not None:
            return
        if self._own_control:
            await self.control.start()
        app = web.Application(client_max_size=self.config.max_body)
        app.router.add_route("*", "/api", self._handle)
        app.router.add_route("*", "/api/{method}", self._handle)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               shutdown_timeout=self.config.survey_timeout + 2.0)
        await runner.setup()
        cfg = self.config
        site = web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            if self._own_control:
                await self.control.aclose()
            raise listen_error(cfg.host, cfg.port, exc) from exc
        self._runner = runner
        self._closed = asyncio.Event()
        if cfg.insecure:
            log.warning("the server API on %s accepts requests without a key", self.url)

    @property
    def port(self) -> int:
        assert self._runner is not None, "not started"
        return int(self._runner.addresses[0][1])

    @property
    def url(self) -> str:
        """``http://HOST:PORT/api``."""
        host = self.config.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/api"

    async def aclose(self) -> None:
        """Stop accepting; let requests in flight finish (up to
        ``survey_timeout`` + 2 s), close. Idempotent."""
        if self._runner is None or self._closed is None:
            return
        if self._draining:
            await self._closed.wait()
            return
        self._draining = True
        await self._runner.cleanup()
        if self._own_control:
            await self.control.aclose()
        self._closed.set()

    def abort(self) -> None:
        """Cancel the requests in flight (a second Ctrl-C): :meth:`aclose` ends at once."""
        self._draining = True
        for task in list(self._inflight):
            task.cancel()

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def survey(self, op: str, params: Mapping[str, Any]) -> Survey:
        """Run a control operation on every server (``juggler.control``)."""
        return await self.control.request(op, params, self.config.survey_timeout)

    # requests ----------------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> str | None:
        """None when the request carries the key; else why not."""
        if self._key is None:
            return None
        given = []
        for value in request.headers.getall("Authorization", ()):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() != "apikey":
                return "invalid API key"
            given.append(token.strip())
        given.extend(v.strip() for v in request.headers.getall("X-API-Key", ()))
        if not given:
            return "missing API key: send the header 'Authorization: apikey KEY' or 'X-API-Key: KEY'"
        ok = True
        for token in given:  # all of them, so the time taken does not tell which one failed
            ok &= hmac.compare_digest(token.encode("utf-8", "surrogateescape"), self._key)
        return None if ok else "invalid API key"

    async def _handle(self, request: web.Request) -> web.Response:
        task = asyncio.current_task()
        assert task is not None
        self._inflight.add(task)
        try:
            return await self._respond(request)
        finally:
            self._inflight.discard(task)

    async def _respond(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            return _error(405, f"use POST (got {_short(request.method, 16)})", Allow="POST")
        if self._draining:
            return _error(503, "server shutting down")
        refusal = self._authorized(request)
        if refusal is not None:
            log.debug("API request from %s refused: %s", request.remote, refusal)
            return _error(401, refusal)
        name = request.match_info.get("method")
        if name is not None and name not in METHODS:
            return self._unknown(name)
        length = request.content_length
        if length is not None and length > self.config.max_body:
            return self._too_big()
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._too_big()
        try:
            members = _parse_body(body)
            if name is None:
                name, members = _envelope(members)
                if name not in METHODS:
                    return self._unknown(name)
            method = METHODS[name]
            params = parse_params(method.params, members)
            result = await method.run(self, params)
        except Exception as exc:
            status, message = _error_of(exc, f"API method {name}")
            return _error(status, message)
        return _answer(200, {"result": result})

    def _unknown(self, name: str) -> web.Response:
        return _error(404, f"unknown method {_short(name)!r} (methods: {', '.join(METHODS)})")

    def _too_big(self) -> web.Response:
        response = _error(413, f"request body over {self.config.max_body} bytes (max_body)")
        response.force_close()  # the rest of the body is not read
        return response

    async def _not_found(self, request: web.Request) -> web.Response:
        return _error(404, "not found: the API is at POST /api/<method> (or POST /api)")
