"""An asyncio juggler.0 client.

::

    async with connect("ws://127.0.0.1:9000/ws") as client:
        print(await client.call("test.echo", "hello", timeout=5))
        await client.sub("news.*", pattern=True)
        await client.pub("news.a", {"x": 1})
        async for event in client.events():
            print(event.channel, event.args)

Contract:

- ``call`` sends a CALL and waits for its RES. It raises :class:`CallNacked`
  when the server refuses the call and :class:`CallExpired` when no result
  came within `timeout` (the client's own timer, as the Go client's local
  "EXP"; a RES arriving later is ignored and counted in ``late_results``).
  A callee error is a *result*: ``{"error": {"message": ...}}`` is returned.
- ``sub``/``unsb``/``pub`` return when the server ACKs, raise CallNacked on NACK.
- Events (EVNT) queue up for :meth:`events` (at most ``max_queued_events``;
  beyond that the oldest are dropped and counted in ``dropped_events``),
  those of the server-side subscriptions (channels the server subscribed
  this connection to, never SUBed by it) among them.
- ``history``/``presence`` read a channel's history or presence (where the
  server lets clients: HISTORY/PRESENCE requests), raise CallNacked if not.
- Cancelling a call is safe: it only forgets its pending entry.
- When the connection closes, every waiter fails with
  :class:`~juggler.errors.ConnectionClosed` and the event iterator ends.
- Keepalive (:mod:`juggler.keepalive`): the client asks the server for
  KEEPALIVE messages (``keepalive=True``). Once the server has said its ping
  interval, a connection on which nothing arrives for that interval plus
  ``keepalive_grace`` is dropped as dead (and closes as above). The
  websockets library answers the server's pings; nothing else is sent.
- Compression: the client offers permessage-deflate (``compression="deflate"``,
  websockets' offer); a server that agrees compresses messages both ways.
  ``compression=None`` offers nothing.
- ``aclose()`` is idempotent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import socket
import uuid as uuidlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rustext.tls import ClientTls, describe_ssl_error
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed as WsConnectionClosed
from websockets.exceptions import InvalidMessage

from juggler.client_tokens import REFRESH_HEADER, ClientTokens, SubscriptionTokenSource, TokenSource
from juggler.errors import CallExpired, CallNacked, ConnectionClosed, ProtocolError
from juggler.extensions import EXPIRING, EXTENSION_MIN, HISTORY, PRESENCE, REPLY
from juggler.keepalive import HEADER as KEEPALIVE_HEADER
from juggler.keepalive import KEEPALIVE, ServerWatch

__all__ = [
    "ACK",
    "CALL",
    "EVNT",
    "KEEPALIVE",
    "NACK",
    "PUB",
    "RES",
    "SUB",
    "SUBPROTOCOL",
    "UNSB",
    "Client",
    "ClientEvent",
    "connect",
    "encode_message",
]

log = logging.getLogger("juggler.client")

SUBPROTOCOL = "juggler.0"
CALL, PUB, SUB, UNSB, NACK, ACK, RES, EVNT = 1, 2, 3, 4, 7, 8, 9, 10
TYPE_NAMES = {CALL: "CALL", PUB: "PUB", SUB: "SUB", UNSB: "UNSB", NACK: "NACK", ACK: "ACK", RES: "RES", EVNT: "EVNT"}

_UNSET: Any = object()


def new_uuid() -> str:
    return str(uuidlib.uuid4())


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encode_message(msg_type: int, msg_uuid: str, payload: Mapping[str, Any], raw_args: str | None = None) -> str:
    """A client frame. `raw_args` (JSON text) is inserted verbatim as ``args``."""
    body = _json(payload)
    if raw_args is not None:
        body = (body[:-1] + "," if len(body) > 2 else "{") + '"args":' + raw_args + "}"
    return '{"meta":{"type":%d,"uuid":"%s"},"payload":%s}' % (msg_type, msg_uuid, body)


@dataclass(frozen=True, slots=True)
class ClientEvent:
    """One EVNT: `args` decoded; `pattern` set when a pattern subscription matched.

    On channels with history, `offset` and `epoch` place it in the channel's
    history. ``recovered=False`` marks a notice, not a publication: events of
    this channel were lost and cannot be recovered (reload the state).

    ``join`` or ``leave`` (``{"client", "user"[, "conn_info"]}``) marks a
    join/leave notice of a channel with presence (``sub(..., join_leave=True)``
    asks for them): someone subscribed or unsubscribed; it has no ``args``.
    """

    channel: str
    pattern: str | None
    for_uuid: str  # the PUB's uuid
    args: Any
    offset: int | None = None
    epoch: str | None = None
    recovered: bool | None = None
    join: dict[str, Any] | None = None
    leave: dict[str, Any] | None = None


class _Pending:
    __slots__ = ("ack", "res", "msg_type")

    def __init__(self, loop: asyncio.AbstractEventLoop, msg_type: int, want_res: bool) -> None:
        self.msg_type = msg_type
        self.ack: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.res: asyncio.Future[Any] | None = loop.create_future() if want_res else None


class Client:
    """One juggler websocket connection (make it with :func:`connect`)."""

    def __init__(
        self,
        ws: ClientConnection,
        *,
        default_timeout: float = 60.0,
        max_queued_events: int = 10_000,
        on_message: Callable[[dict[str, Any], str], None] | None = None,
        keepalive_grace: float = 10.0,
        get_token: TokenSource | None = None,
        get_subscription_token: SubscriptionTokenSource | None = None,
    ) -> None:
        self.ws = ws
        #: renews the connection's token when the server says it expires (juggler.client_tokens)
        self.tokens = ClientTokens(self, get_token, get_subscription_token)
        self.default_timeout = default_timeout
        self.max_queued_events = max_queued_events
        self.on_message = on_message
        self.late_results = 0
        self.dropped_events = 0
        #: KEEPALIVE messages received (the server's sign of life; not passed to on_message)
        self.keepalives = 0
        self._loop = asyncio.get_running_loop()
        self._watch = ServerWatch(keepalive_grace)
        self._last_in = self._loop.time()  # when the last frame came (the keepalive's clock)
        self._watch_timer: asyncio.TimerHandle | None = None
        self._silent: str | None = None  # why the connection was dropped as dead
        self._pending: dict[str, _Pending] = {}
        #: channel -> (offset, epoch) of the last event seen, on channels with history
        self.positions: dict[str, tuple[int, str]] = {}
        self._events: deque[ClientEvent] = deque()
        self._event_waiter: asyncio.Future[None] | None = None
        self._closed_exc: ConnectionClosed | None = None
        self._reader = self._loop.create_task(self._read_loop(), name="juggler-client-reader")

    # properties -----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed_exc is not None

    @property
    def subprotocol(self) -> str | None:
        return self.ws.subprotocol

    async def wait_closed(self) -> None:
        await asyncio.shield(self._reader)

    # sending --------------------------------------------------------------------

    async def send_raw(self, text: str | bytes) -> None:
        """Send any frame as is (text for str, binary for bytes)."""
        self._check_open()
        try:
            await self.ws.send(text)
        except WsConnectionClosed as exc:
            raise self._closed(exc) from exc

    async def send(self, msg_type: int, payload: Mapping[str, Any], *, raw_args: str | None = None,
                   msg_uuid: str | None = None) -> str:
        """Send one message without waiting for anything; returns its uuid."""
        msg_uuid = msg_uuid or new_uuid()
        await self.send_raw(encode_message(msg_type, msg_uuid, payload, raw_args))
        return msg_uuid

    async def call(self, uri: str, args: Any = _UNSET, *, timeout: float | None = None,
                   raw_args: str | None = None, msg_uuid: str | None = None) -> Any:
        """Call `uri` and return its (decoded) result; see the module doc.

        `args` is any JSON value (left out of the CALL when not given);
        `raw_args` is JSON text sent verbatim instead. `timeout` (seconds,
        default ``default_timeout``) is sent to the server and also bounds
        the local wait.
        """
        if timeout is None:
            timeout = self.default_timeout
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        if raw_args is None and args is not _UNSET:
            raw_args = _json(args)
        msg_uuid = msg_uuid or new_uuid()
        pending = _Pending(self._loop, CALL, True)
        self._pending[msg_uuid] = pending
        try:
            await self.send(CALL, {"uri": uri, "timeout": int(timeout * 1e9)}, raw_args=raw_args, msg_uuid=msg_uuid)
            assert pending.res is not None
            try:
                async with asyncio.timeout(timeout):
                    return await pending.res
            except TimeoutError:
                raise CallExpired(f"call {msg_uuid} to {uri} expired after {timeout}s") from None
        finally:
            self._pending.pop(msg_uuid, None)

    async def request(self, msg_type: int, payload: Mapping[str, Any], *, timeout: float | None = None) -> Any:
        """Send an extension request (type 256 and above, :mod:`juggler.extensions`) and
        return the ``result`` of the server's REPLY; a NACK raises :class:`CallNacked`,
        no answer within `timeout` (default ``default_timeout``) raises TimeoutError. A
        server that does not handle the type closes the connection, as for any unknown type."""
        if msg_type < EXTENSION_MIN:
            raise ValueError(f"extension types start at {EXTENSION_MIN}, got {msg_type}")
        msg_uuid = new_uuid()
        pending = _Pending(self._loop, msg_type, True)
        self._pending[msg_uuid] = pending
        try:
            await self.send(msg_type, payload, msg_uuid=msg_uuid)
            assert pending.res is not None
            async with asyncio.timeout(timeout if timeout is not None else self.default_timeout):
                return await pending.res
        finally:
            self._pending.pop(msg_uuid, None)

    async def history(self, channel: str, *, limit: int | None = None, since: tuple[int, str] | None = None,
                      timeout: float | None = None) -> dict[str, Any]:
        """A channel's kept publications (a HISTORY request): ``{"events": [...],
        "offset", "epoch"}``, each event shaped as an EVNT's payload. `limit`: at
        most that many (0: the position only); `since` (offset, epoch): only those
        after it, with ``"recovered"`` saying whether none is missing."""
        payload: dict[str, Any] = {"channel": channel}
        if limit is not None:
            payload["limit"] = limit
        if since is not None:
            payload["since"] = {"offset": since[0], "epoch": since[1]}
        result: dict[str, Any] = await self.request(HISTORY, payload, timeout=timeout)
        return result

    async def presence(self, channel: str, *, timeout: float | None = None) -> dict[str, Any]:
        """Who is subscribed to `channel` (a PRESENCE request): client id ->
        ``{"client", "user"[, "conn_info"]}``."""
        result = await self.request(PRESENCE, {"channel": channel}, timeout=timeout)
        members: dict[str, Any] = result["presence"]
        return members

    async def _acked(self, msg_type: int, payload: dict[str, Any], raw_args: str | None, timeout: float | None,
                     msg_uuid: str | None = None) -> str:
        msg_uuid = msg_uuid or new_uuid()
        pending = _Pending(self._loop, msg_type, False)
        self._pending[msg_uuid] = pending
        try:
            await self.send(msg_type, payload, raw_args=raw_args, msg_uuid=msg_uuid)
            async with asyncio.timeout(timeout if timeout is not None else self.default_timeout):
                await pending.ack
            return msg_uuid
        finally:
            self._pending.pop(msg_uuid, None)

    async def sub(self, channel: str, pattern: bool = False, *, timeout: float | None = None,
                  msg_uuid: str | None = None, since: tuple[int, str] | None = None,
                  join_leave: bool = False, token: str | None = None) -> dict[str, Any]:
        """Subscribe (``pattern=True``: `channel` is a Redis glob pattern); returns the ACK's payload.

        On a channel with history the ACK carries its ``offset`` and ``epoch``;
        ``since=(offset, epoch)`` asks for the events after that position (the
        ACK says ``recovered``; the missed events follow it). ``since=(0, "")``
        asks for no recovery but for notices of unrecoverable gaps.

        ``token``: the subscription token of a private channel; without one,
        ``get_subscription_token(channel)`` is asked, when given (None: no token).
        """
        payload: dict[str, Any] = {"channel": channel, "pattern": bool(pattern)}
        if since is not None:
            payload["since"] = {"offset": int(since[0]), "epoch": str(since[1])}
        if join_leave:
            payload["join_leave"] = True
        if token is None:
            token = await self.tokens.for_subscription(channel)
        if token is not None:
            payload["token"] = token
        uuid = msg_uuid or new_uuid()
        pending = _Pending(self._loop, SUB, False)
        self._pending[uuid] = pending
        try:
            await self.send(SUB, payload, msg_uuid=uuid)
            async with asyncio.timeout(timeout if timeout is not None else self.default_timeout):
                ack = await pending.ack
        finally:
            self._pending.pop(uuid, None)
        if not pattern and ack.get("epoch") is not None:
            self.positions[channel] = (int(ack.get("offset") or 0), str(ack["epoch"]))
        return ack

    async def unsb(self, channel: str, pattern: bool = False, *, timeout: float | None = None,
                   msg_uuid: str | None = None) -> None:
        await self._acked(UNSB, {"channel": channel, "pattern": bool(pattern)}, None, timeout, msg_uuid)

    async def pub(self, channel: str, args: Any = _UNSET, *, raw_args: str | None = None,
                  timeout: float | None = None, msg_uuid: str | None = None) -> str:
        """Publish; returns the PUB's uuid (events carry it as ``for_uuid``)."""
        if raw_args is None and args is not _UNSET:
            raw_args = _json(args)
        return await self._acked(PUB, {"channel": channel}, raw_args, timeout, msg_uuid)

    # receiving ------------------------------------------------------------------

    async def events(self) -> AsyncIterator[ClientEvent]:
        """Events as they arrive, until the connection closes (one consumer at a time)."""
        while True:
            try:
                yield await self._next_event()
            except ConnectionClosed:
                return

    async def next_event(self, timeout: float | None = None) -> ClientEvent:
        """The next event; raises TimeoutError after `timeout` s, ConnectionClosed at the end."""
        async with asyncio.timeout(timeout):
            return await self._next_event()

    async def _next_event(self) -> ClientEvent:
        while True:
            if self._events:
                return self._events.popleft()
            if self._closed_exc is not None:
                raise self._closed_exc
            waiter = self._event_waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._event_waiter = None

    async def _read_loop(self) -> None:
        exc: BaseException | None = None
        try:
            async for frame in self.ws:
                self._last_in = self._loop.time()
                if isinstance(frame, bytes):
                    log.warning("ignoring a binary frame from the server")
                    continue
                try:
                    msg = json.loads(frame)
                    self._dispatch(msg, frame)
                except (ValueError, KeyError, TypeError) as e:
                    log.warning("ignoring an invalid frame from the server (%s): %.200s", e, frame)
        except WsConnectionClosed as e:
            exc = e
        except Exception as e:  # pragma: no cover - defensive
            exc = e
            log.exception("client reader failed")
        finally:
            self._closed(exc)

    def _dispatch(self, msg: dict[str, Any], frame: str) -> None:
        meta = msg.get("meta") if isinstance(msg, dict) else None
        if isinstance(meta, dict) and meta.get("type") == KEEPALIVE:
            self._keepalive(msg.get("payload"))
            return
        if isinstance(meta, dict) and meta.get("type") == EXPIRING:
            self.tokens.expiring(msg.get("payload"))
        if self.on_message is not None:
            try:
                self.on_message(msg, frame)
            except Exception:
                log.exception("on_message callback failed")
        msg_type = msg["meta"]["type"]
        payload = msg.get("payload") or {}
        if msg_type == EVNT:
            channel = payload.get("channel", "")
            offset, epoch = payload.get("offset"), payload.get("epoch")
            if isinstance(offset, int) and isinstance(epoch, str) and not payload.get("pattern"):
                seen = self.positions.get(channel)
                if seen is not None and seen[1] == epoch and offset <= seen[0] and "recovered" not in payload:
                    return  # already seen (a duplicate after recovery)
                self.positions[channel] = (offset, epoch)
            self._push_event(ClientEvent(
                channel=channel, pattern=payload.get("pattern") or None,
                for_uuid=payload.get("for", ""), args=payload.get("args"),
                offset=offset, epoch=epoch, recovered=payload.get("recovered"),
                join=payload.get("join"), leave=payload.get("leave"),
            ))
            return
        pending = self._pending.get(payload.get("for", ""))
        if msg_type == ACK:
            if pending is not None and not pending.ack.done():
                pending.ack.set_result(payload)
        elif msg_type == NACK:
            if pending is not None:
                err = CallNacked(int(payload.get("code", 0)), str(payload.get("message", "")))
                for fut in (pending.ack, pending.res):
                    if fut is not None and not fut.done():
                        fut.set_exception(err)
                        fut.exception()
        elif msg_type == REPLY:
            if pending is not None and pending.res is not None and not pending.res.done():
                pending.res.set_result(payload.get("result"))
        elif msg_type == RES:
            if pending is not None and pending.res is not None and not pending.res.done():
                if not pending.ack.done():
                    pending.ack.set_result(payload)
                pending.res.set_result(payload.get("args"))
            else:
                self.late_results += 1
        else:
            log.debug("ignoring message type %s", msg_type)

    # keepalive ----------------------------------------------------------------------

    def _keepalive(self, payload: Any) -> None:
        """A KEEPALIVE: the server is alive and says its ping interval; the
        first one arms the watch."""
        self.keepalives += 1
        if not self._watch.announced(payload):
            log.debug("ignoring a KEEPALIVE without a usable interval: %.200r", payload)
            return
        if self._watch_timer is None and self._closed_exc is None:
            self._watch_at(self._watch.deadline(self._last_in))

    def _watch_at(self, when: float | None) -> None:
        self._watch_timer = None if when is None else self._loop.call_at(when, self._check_server)

    def _check_server(self) -> None:
        """The watch's timer: drop the connection when nothing came in time,
        else wait until the new deadline (frames only move ``_last_in``)."""
        self._watch_timer = None
        if self._closed_exc is not None:
            return
        now = self._loop.time()
        if not self._watch.dead(now, self._last_in):
            self._watch_at(self._watch.deadline(self._last_in))
            return
        self._silent = (f"nothing from the server for {now - self._last_in:.1f}s (it announced a keepalive "
                        f"every {self._watch.interval:g}s): connection considered dead")
        log.info("%s", self._silent)
        transport = getattr(self.ws, "transport", None)
        if transport is not None:
            transport.abort()  # a dead server answers no closing handshake: the reader ends now

    def _push_event(self, ev: ClientEvent) -> None:
        if len(self._events) >= self.max_queued_events:
            self._events.popleft()
            self.dropped_events += 1
        self._events.append(ev)
        if self._event_waiter is not None and not self._event_waiter.done():
            self._event_waiter.set_result(None)

    def _check_open(self) -> None:
        if self._closed_exc is not None:
            raise self._closed_exc

    def _closed(self, exc: BaseException | None) -> ConnectionClosed:
        if self._closed_exc is None:
            if self._watch_timer is not None:
                self._watch_timer.cancel()
                self._watch_timer = None
            self.tokens.stop()
            rcvd = exc.rcvd if isinstance(exc, WsConnectionClosed) else self.ws.protocol.close_rcvd
            if self._silent is not None:
                detail = f": {self._silent}"
            elif rcvd is not None:
                detail = f" (code {rcvd.code}{': ' + rcvd.reason if rcvd.reason else ''})"
            else:
                detail = " (no close frame)"
            self._closed_exc = ConnectionClosed(f"connection closed{detail}")
            for p in list(self._pending.values()):
                for fut in (p.ack, p.res):
                    if fut is not None and not fut.done():
                        fut.set_exception(self._closed_exc)
                        fut.exception()
            if self._event_waiter is not None and not self._event_waiter.done():
                self._event_waiter.set_result(None)
        return self._closed_exc

    # lifecycle --------------------------------------------------------------------

    async def aclose(self, code: int = 1000, reason: str = "") -> None:
        """Close the websocket (normal closure) and stop the reader. Idempotent."""
        try:
            await self.ws.close(code, reason)
        except Exception:  # pragma: no cover - already broken
            pass
        if not self._reader.done():
            try:
                async with asyncio.timeout(5):
                    await asyncio.shield(self._reader)
            except TimeoutError:
                self._reader.cancel()
        self._closed(None)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Connect:
    """``await connect(...)`` or ``async with connect(...) as client``."""

    def __init__(self, url: str, kwargs: dict[str, Any]) -> None:
        self.url = url
        self.kwargs = kwargs
        self.client: Client | None = None

    def __await__(self) -> Any:
        return self._open().__await__()

    async def _open(self) -> Client:
        kw = dict(self.kwargs)
        subprotocols: Sequence[str] | None = kw.pop("subprotocols")
        headers: dict[str, str] = dict(kw.pop("headers") or {})
        allowed = kw.pop("allowed_messages")
        if allowed is not None:
            headers["Juggler-Allowed-Messages"] = ", ".join(allowed)
        if kw.pop("keepalive"):
            headers[KEEPALIVE_HEADER] = "1"
        get_token = kw.get("get_token")
        if get_token is not None:
            headers["Authorization"] = "Bearer " + await get_token()
        if get_token is not None or kw.get("get_subscription_token") is not None:
            headers[REFRESH_HEADER] = "1"  # EXPIRING messages: the tokens are renewed before they expire
        open_timeout = kw.pop("open_timeout")
        max_size = kw.pop("max_size")
        tls: ClientTls | ssl.SSLContext | None = kw.pop("tls")
        ssl_ctx: ssl.SSLContext | None = None
        if self.url.startswith("wss://"):
            ssl_ctx = tls if isinstance(tls, ssl.SSLContext) else (tls or ClientTls()).context()
        elif tls is not None:
            raise ValueError(f"TLS options need a wss:// URL, got {self.url}")
        try:
            ws = await ws_connect(
                self.url,
                ssl=ssl_ctx,
                subprotocols=list(subprotocols) if subprotocols else None,  # type: ignore[arg-type]
                additional_headers=headers or None,
                compression=kw.pop("compression"),
                open_timeout=open_timeout,
                max_size=max_size,
                ping_interval=None,
            )
        except ssl.SSLError as exc:
            raise ConnectionClosed(f"cannot connect to {self.url}: {describe_ssl_error(exc)}") from exc
        except (ConnectionRefusedError, TimeoutError, socket.gaierror) as exc:
            raise ConnectionClosed(f"cannot connect to {self.url}: {exc or type(exc).__name__}") from exc
        except Exception as exc:  # websockets.InvalidHandshake and friends, a reset
            # no HTTP answer at all (or a reset): maybe a port of the other kind; one probe says
            if isinstance(exc, (InvalidMessage, ConnectionResetError, EOFError)):
                tls_port = await _tls_port(self.url)
                if ssl_ctx is None and tls_port:
                    raise ConnectionClosed(f"cannot connect to {self.url}: this server speaks TLS: use "
                                           f"wss://{self.url.removeprefix('ws://')}") from exc
                if ssl_ctx is not None and tls_port is False:
                    raise ConnectionClosed(f"cannot connect to {self.url}: the server closed the connection during "
                                           "the TLS handshake: it does not speak TLS on this port (use "
                                           f"ws://{self.url.removeprefix('wss://')})") from exc
            raise ConnectionClosed(f"cannot connect to {self.url}: {exc or type(exc).__name__}") from exc
        if subprotocols and SUBPROTOCOL in subprotocols and ws.subprotocol is None:
            await ws.close()
            raise ProtocolError(f"{self.url} did not negotiate {SUBPROTOCOL}")
        return Client(ws, **kw)

    async def __aenter__(self) -> Client:
        self.client = await self._open()
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        if self.client is not None:
            await self.client.aclose()


async def _tls_port(url: str) -> bool | None:
    """Whether the host and port of a URL whose handshake failed answer in
    TLS (see rustext.tls.speaks_tls; None: nothing answers)."""
    from urllib.parse import urlsplit

    from rustext.tls import speaks_tls

    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "wss" else 80)
    except ValueError:
        return None
    return await speaks_tls(host, port) if host is not None else None


def connect(
    url: str = "ws://127.0.0.1:9000/ws",
    *,
    subprotocols: Sequence[str] | None = (SUBPROTOCOL,),
    headers: Mapping[str, str] | None = None,
    allowed_messages: Sequence[str] | None = None,
    default_timeout: float = 60.0,
    open_timeout: float | None = 10.0,
    max_size: int | None = 16 * 1024 * 1024,
    max_queued_events: int = 10_000,
    on_message: Callable[[dict[str, Any], str], None] | None = None,
    tls: ClientTls | ssl.SSLContext | None = None,
    keepalive: bool = True,
    keepalive_grace: float = 10.0,
    get_token: TokenSource | None = None,
    get_subscription_token: SubscriptionTokenSource | None = None,
    compression: str | None = "deflate",
) -> _Connect:
    """Open a juggler connection; use ``async with`` (or ``await`` then ``aclose()``).

    A ``wss://`` URL is verified against the system's trust store, or as
    ``tls`` says (``ClientTls(ca=…)``, a client certificate, or an explicit
    ``insecure=True``); ``tls`` with a ``ws://`` URL is an error.

    ``keepalive`` asks the server for KEEPALIVE messages (the
    ``Juggler-Keepalive: 1`` header): once the server has said its ping
    interval, a connection on which nothing arrives for that interval plus
    ``keepalive_grace`` seconds is dropped as dead. A server that sends none
    (the original, or pings off) is waited for as long as it takes.
    ``on_message`` does not see KEEPALIVE messages.

    ``get_token`` (an async callable returning a token) gives the token sent
    in the ``Authorization`` header at connect (and at every reconnection of
    :mod:`juggler.reconnecting`); the client then asks for EXPIRING messages
    (``Juggler-Refresh: 1``) and, when the server says the token expires,
    sends it a new one from ``get_token`` (REFRESH). ``get_subscription_token``
    (``async (channel) -> token or None``) gives the subscription token of
    each SUB to a private channel, and renews it (SUB_REFRESH) the same way.
    ``compression``: ``"deflate"`` offers permessage-deflate (used when the
    server agrees), None offers nothing.

    Raises :class:`ConnectionClosed` when the handshake fails and
    :class:`ProtocolError` when the server does not negotiate ``juggler.0``.
    """
    if not keepalive_grace > 0:
        raise ValueError("keepalive_grace must be > 0")
    if compression not in ("deflate", None):
        raise ValueError(f'compression must be "deflate" or None, got {compression!r}')
    return _Connect(url, {
        "subprotocols": subprotocols, "headers": headers, "allowed_messages": allowed_messages,
        "default_timeout": default_timeout, "open_timeout": open_timeout, "max_size": max_size,
        "max_queued_events": max_queued_events, "on_message": on_message, "tls": tls,
        "keepalive": keepalive, "keepalive_grace": keepalive_grace,
        "get_token": get_token, "get_subscription_token": get_subscription_token,
        "compression": compression,
    })
