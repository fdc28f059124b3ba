"""The proxies of a server: which one answers what, and their lifecycle.

:class:`ProxySet` is built from the ``[[proxy]]`` tables, opens one
transport per endpoint (an aiohttp session, a gRPC channel) in
:meth:`ProxySet.start` and closes them in :meth:`ProxySet.aclose`. The
connection driver asks it at three points:

- :meth:`ProxySet.connect` at the handshake (after ``[auth]``, if any):
  the backend's answer becomes the connection's
  :class:`juggler.auth.Identity`, a refusal or a failure refuses the
  handshake (HTTP 401/403; 502/503/504 when the backend gives no answer);
- :meth:`ProxySet.vet` for each SUB, PUB and CALL the session admitted:
  a subscribe or publish proxy whose ``match`` takes the channel allows,
  refuses (NACK with the backend's code) or, for a PUB, replaces the args;
  an rpc proxy whose ``match`` takes the URI answers the CALL itself (ACK,
  then a RES), and the broker never sees it;
- :meth:`ProxySet.refresh` when a connection's credentials near their expiry.

A backend that is down, slow or answers garbage costs the one message a
NACK 502/503 (an error RES for a CALL) within the proxy's timeout;
every other connection goes on.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import rustext
from juggler.auth import AuthError, Identity
from juggler.broker.glob import glob_match
from juggler.proxy.config import ProxyConfig
from juggler.proxy.errors import ProxyError
from juggler.proxy.handshake import (
    allowed_cookies,
    allowed_headers,
    bearer_token,
    remote_address,
)
from juggler.proxy.mapping import (
    ConnectResult,
    PublishResult,
    RefreshResult,
    Refusal,
    RpcResult,
    connect_question,
    error_res,
    parse_connect,
    parse_publish,
    parse_refresh,
    parse_rpc,
    parse_subscribe,
    publish_question,
    refresh_question,
    rpc_question,
    subscribe_question,
)
from juggler.proxy.stats import ProxyStats
from rustext.throttledlog import ThrottledLog

__all__ = ["HANDLED", "Proxy", "ProxyRefusal", "ProxySet", "identity_of"]

log = logging.getLogger("juggler.proxy")

CALL, PUB, SUB = rustext.CALL, rustext.PUB, rustext.SUB

#: what :meth:`ProxySet.vet` returns when it has answered the message itself
HANDLED: Any = object()

T = TypeVar("T")


class Transport(Protocol):
    """What a proxy speaks through (juggler.proxy.http.HttpTransport, juggler.proxy.grpc.GrpcTransport)."""

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def ask(self, kind: str, question: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The answer object; ProxyError when there is no usable answer within `timeout` s."""
        ...


def _transport(endpoint: str) -> Transport:
    if endpoint.startswith("grpc://"):
        # grpcio is imported only when a proxy speaks it
        from juggler.proxy.grpc import GrpcTransport

        return GrpcTransport(endpoint)
    from juggler.proxy.http import HttpTransport

    return HttpTransport(endpoint)


class Proxy:
    """One ``[[proxy]]``: its configuration, its endpoint's transport, its counters."""

    def __init__(self, config: ProxyConfig, transport: Transport) -> None:
        self.config = config
        self.transport = transport
        self.stats = ProxyStats(config.kind, config.name)
        # a backend that is down fails every question: one line per kind of failure per 10 s
        self._log = ThrottledLog(log)

    def matches(self, target: str) -> bool:
        return any(glob_match(p, target) for p in self.config.match)

    async def answer(self, question: dict[str, Any], parse: Callable[[Any], T], timeout: float | None = None) -> T:
        """Ask, parse the answer; counted and timed. ProxyError when there is no usable answer."""
        stats = self.stats
        stats.calls += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            result = parse(await self.transport.ask(self.config.kind, question, timeout or self.config.timeout))
        except ProxyError as exc:
            stats.error(exc.label)
            self._log.warning("%s proxy %s: %s", self.config.kind, self.config.name, exc, key=exc.label)
            raise
        finally:
            stats.observe(loop.time() - started)
        if isinstance(result, Refusal) or (isinstance(result, RefreshResult) and result.refusal is not None):
            stats.refusals += 1
        return result


class ProxySet:
    """The proxies of one server (see module doc). Lifecycle: ``start()``
    before the server accepts, ``aclose()`` after it has closed (idempotent)."""

    HANDLED = HANDLED

    def __init__(self, configs: Sequence[ProxyConfig]) -> None:
        transports: dict[str, Transport] = {}
        self.proxies: list[Proxy] = []
        for cfg in configs:
            transport = transports.get(cfg.endpoint)
            if transport is None:
                transport = transports[cfg.endpoint] = _transport(cfg.endpoint)
            self.proxies.append(Proxy(cfg, transport))
        self._transports = list(transports.values())
        self._by_kind: dict[str, list[Proxy]] = {}
        for p in self.proxies:
            self._by_kind.setdefault(p.config.kind, []).append(p)
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        for t in self._transports:
            await t.start()

    async def aclose(self) -> None:
        """Cancel the rpc proxy calls still running, close every transport."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for t in self._transports:
            await t.aclose()

    def stats(self) -> Iterator[ProxyStats]:
        """The counters of every proxy (for juggler.proxy.stats.ProxyCollector)."""
        return (p.stats for p in self.proxies)

    def pick(self, kind: str, target: str = "") -> Proxy | None:
        """The proxy answering `kind` for `target` (a channel or URI): the first whose match takes it."""
        for p in self._by_kind.get(kind, ()):
            if kind in ("connect", "refresh") or p.matches(target):
                return p
        return None

    @property
    def connecting(self) -> bool:
        """A connect proxy decides each handshake."""
        return "connect" in self._by_kind

    # the handshake -------------------------------------------------------------------------

    async def connect(self, conn: Any, request: Any, identity: Any = None) -> Any:
        """The connection's Identity as the connect proxy answers (`identity`:
        what ``[auth]`` found first, or an awaitable of it). Raises
        :class:`juggler.auth.AuthError` to refuse the handshake, whatever went wrong."""
        if inspect.isawaitable(identity):
            identity = await identity
        proxy = self.pick("connect")
        assert proxy is not None
        cfg = proxy.config
        auth = getattr(conn.context, "auth", None)
        if auth is not None and auth.config.enabled:
            token = auth.token(request)
        else:
            token = bearer_token(request.headers, request.path)
        question = connect_question(
            conn.id, remote=remote_address(conn.remote), path=request.path.split("?", 1)[0],
            headers=allowed_headers(request.headers, cfg.headers),
            cookies=allowed_cookies(request.headers, cfg.cookies), token=token,
        )
        try:
            answer = await proxy.answer(question, parse_connect)
        except ProxyError as exc:
            # the client is told what kind of failure, not the backend's address
            raise ProxyRefusal(f"connect proxy: {exc}", exc.code, "proxy_error",
                               exc.public) from None
        except Exception as exc:  # a bug must refuse the handshake, not leave it waiting
            log.exception("connect proxy %s failed", cfg.name)
            raise ProxyRefusal(f"connect proxy: {exc!r}", 500, "proxy_error", "internal error") from None
        if isinstance(answer, Refusal):
            raise ProxyRefusal(answer.reason, 401 if answer.code == 401 else 403, "proxy_refused", answer.reason)
        return identity_of(answer, identity)

    async def refresh(self, identity: Any, *, client: str = "") -> RefreshResult:
        """Ask the refresh proxy whether `identity` (a juggler.auth.Identity) may
        stay connected: a new ``expire_at`` (and data), or ``expired``
        (``refusal`` set when the backend refused). Raises LookupError without a
        refresh proxy, ProxyError when the backend gives no usable answer (the
        caller decides whether to retry)."""
        proxy = self.pick("refresh")
        if proxy is None:
            raise LookupError("no refresh proxy configured")
        question = refresh_question(client, _user(identity), expire_at=getattr(identity, "exp", None),
                                    data=getattr(identity, "data", None))
        return await proxy.answer(question, parse_refresh)

    # messages ------------------------------------------------------------------------------

    async def vet(self, conn: Any, msg: Any, verdict: Any) -> Any:
        """Before a SUB, PUB or CALL goes on: the args to go on with (a PUB's
        maybe replaced), or HANDLED when the message got its answer here
        (a NACK, or a proxied CALL's ACK with its RES to follow)."""
        t = msg.type
        if t == SUB:
            proxy = self.pick("subscribe", msg.channel)
            if proxy is None:
                return msg.args
            question = subscribe_question(conn.id, _user(conn.identity), channel=msg.channel, pattern=msg.pattern)
            refusal = await self._decide(conn, msg, proxy, question, parse_subscribe)
            return HANDLED if refusal is not None else msg.args
        if t == PUB:
            proxy = self.pick("publish", msg.channel)
            if proxy is None:
                return msg.args
            question = publish_question(conn.id, _user(conn.identity), channel=msg.channel, args=msg.args)
            result = await self._decide(conn, msg, proxy, question, parse_publish)
            if not isinstance(result, PublishResult):
                return HANDLED
            return result.data if result.replaced else msg.args
        if t == CALL:
            proxy = self.pick("rpc", msg.uri)
            if proxy is None:
                return msg.args
            self._call(conn, msg, proxy, verdict)
            return HANDLED
        return msg.args

    async def _decide(self, conn: Any, msg: Any, proxy: Proxy, question: dict[str, Any],
                      parse: Callable[[Any], Any]) -> Any:
        """The parsed answer; a refusal or a failure is NACKed here (and returned as a Refusal)."""
        try:
            result = await proxy.answer(question, parse)
        except ProxyError as exc:
            conn.nack(msg, nack_code(exc.code), exc.public)
            return Refusal(exc.code, str(exc))
        if isinstance(result, Refusal):
            conn.nack(msg, nack_code(result.code), result.reason)
        return result

    def _call(self, conn: Any, msg: Any, proxy: Proxy, timeout_ms: int) -> None:
        """A CALL the backend answers: in the pending-call table as any call
        (drain waits for it, max_inflight_calls counts it, its expiry answers
        it), ACKed now, its RES sent when the backend answers."""
        pending = conn.context.pending
        if not pending.add(msg.uuid, conn, timeout_ms, conn.loop.time(), msg.uri):
            conn.nack(msg, 500, "duplicate message uuid")
            return
        conn.reply(msg, conn.session.ack(msg))
        question = rpc_question(conn.id, _user(conn.identity), uri=msg.uri, args=msg.args)
        task = asyncio.get_running_loop().create_task(
            self._answer_call(conn, msg.uuid, msg.uri, proxy, question, timeout_ms / 1000))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer_call(self, conn: Any, msg_uuid: str, uri: str, proxy: Proxy, question: dict[str, Any],
                           timeout: float) -> None:
        try:
            result = await proxy.answer(question, parse_rpc, min(timeout, proxy.config.timeout))
        except ProxyError as exc:
            args = error_res(exc.code, exc.public)
        else:
            args = result.data if isinstance(result, RpcResult) else error_res(result.code, result.reason)
        if conn.context.pending.pop(msg_uuid) is conn and not conn.closed:
            conn.send_res(msg_uuid, uri, args)


class ProxyRefusal(AuthError):
    """The connect proxy refused the handshake, or gave no answer: ``status``
    is the HTTP status of the refusal, ``refusal`` its (reason label,
    response text) for the connection driver."""

    def __init__(self, message: str, status: int, reason: str, text: str) -> None:
        super().__init__(message, status)
        self.refusal = (reason, f"{_STATUS_TEXT.get(status, 'Refused')}: {text}\n")


_STATUS_TEXT = {401: "Unauthorized", 403: "Forbidden", 500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
                504: "Gateway Timeout"}


def identity_of(answer: ConnectResult, first: Any = None) -> Any:
    """The Identity of an accepted connection: the backend's user, expiry,
    data and channels; the grants of ``[auth]`` (its rules) when it found an identity first."""
    claims: dict[str, Any] = dict(first.claims or {}) if first is not None else {}
    claims["sub"] = answer.user
    if answer.expire_at is not None:
        claims["exp"] = answer.expire_at
    else:
        claims.pop("exp", None)
    grants = first.grants if first is not None else None
    return Identity(claims, grants, user=answer.user, data=answer.data, channels=answer.channels)


def nack_code(code: int) -> int:
    """The NACK code of a refusal or failure: 504 says "outcome unknown" in
    juggler.0 (a PUB may have been published), and a message the application
    refused or did not answer was certainly not done: 503 instead."""
    return 503 if code == 504 else code


def _user(identity: Any) -> str:
    if identity is None:
        return ""
    user = getattr(identity, "user", None)
    if user is not None:
        return str(user)
    return "" if identity.claims is None else str(identity.claims.get("sub", ""))
