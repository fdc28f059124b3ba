"""The HTTP/JSON API of one member (``juggler seq server --http HOST:PORT``).

An aiohttp application on a listener of its own, beside the gRPC port:
one ``curl`` draws IDs from any language. Routes:

- ``GET /v1/next/{name}?count=N``: a range of N fresh IDs (default 1, at
  most ``max_count``), ``{"name", "from", "to"}`` with both ends included,
  allocated by the member's coordinator exactly as ``GRPCNextID`` is
  (forwarded to the name's preferred member, same deadline: ``--timeout``);
- ``GET /v1/current/{name}``: this member's high-water mark (the next ID it
  would hand out, 1 for a new name), as ``GRPCCurID``;
- ``POST /v1/set/{name}`` with ``{"value": N}``: moves this member's value
  forward only, as ``GRPCSetID``; a value not above it is a 409;
- ``GET /v1/names?limit=&after=``: per name, sorted: the value, the last
  range served here, ranges and IDs served here, the recent rate;
- ``GET /healthz`` (the process serves), ``GET /readyz`` (this member votes;
  503 while it bootstraps or catches up);
- ``GET /`` or ``/status``: the same figures as an HTML table (no script,
  every value escaped); ``GET /metrics``: the member's Prometheus metrics.

Names are checked as the gRPC API checks them: any UTF-8 string of at most
256 bytes (the path segment is percent-decoded; a ``/`` may be sent as
``%2F`` or as is). Every error is JSON, ``{"error": {"code": "...",
"message": "..."}}``, with the HTTP status of its kind (:data:`STATUS`);
messages never echo more than a few dozen characters of the request.
Unknown query parameters, a parameter given twice, a body over
:data:`MAX_BODY` bytes, a body that is not a JSON object with exactly the
expected member: all typed 4xx errors, after which the connection and the
member carry on.

Lifecycle: ``await start()`` listens (``rustext.net.ListenError`` when it
cannot) and returns the port; ``await aclose()`` stops accepting, gives
requests in flight up to ``grace`` seconds, then closes. Idempotent.
"""

from __future__ import annotations

import asyncio
import datetime
import html
import json
import logging
import re
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from aiohttp import web

from rustext.net import listen_error
from seq.errors import MemberRemoved, SeqExhausted, SeqUnavailable, StoreError
from seq.lease import RESERVED_MESSAGE, RESERVED_PREFIX
from seq.log import MAX_NAME, MAX_VALUE
from seq.namestats import NameStats

__all__ = ["MAX_BODY", "MAX_LIST", "STATUS", "HttpApi"]

log = logging.getLogger("seq.http")

#: bytes of a request body (``POST /v1/set``)
MAX_BODY = 4096
#: names one ``/v1/names`` page (or status page) shows at most
MAX_LIST = 10_000
DEFAULT_LIST = 1000

#: error code → HTTP status
STATUS = {
    "bad_name": 400,
    "bad_count": 400,
    "bad_request": 400,
    "not_found": 404,
    "method_not_allowed": 405,
    "not_forward": 409,
    "exhausted": 409,
    "payload_too_large": 413,
    "internal": 500,
    "no_quorum": 503,
    "removed": 410,
    "no_lease": 503,
    "clock_moved_backwards": 503,
    "not_ready": 503,
    "unavailable": 503,
    "overloaded": 503,
    "deadline_exceeded": 504,
}

_DIGITS = re.compile(r"[0-9]{1,19}", re.ASCII)


class _Refused(Exception):
    """A request answered with an error (code of :data:`STATUS`)."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


class Store(Protocol):
    def get(self, name: str) -> int: ...
    def advance(self, name: str, new: int) -> tuple[bool, asyncio.Future[None] | None]: ...
    def names_page(self, after: str | None, limit: int) -> list[str]: ...
    def __len__(self) -> int: ...


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(),
                        content_type="application/json", headers=headers)


def _error(code: str, message: str, headers: dict[str, str] | None = None, **extra: Any) -> web.Response:
    return _json(STATUS[code], {"error": {"code": code, "message": message}, **extra}, headers)


def _iso(wall: float | None) -> str | None:
    if wall is None:
        return None
    return datetime.datetime.fromtimestamp(wall, datetime.UTC).isoformat(timespec="milliseconds")


class HttpApi:
    """The HTTP listener of one member (see the module doc).

    ``acquire(name, n, deadline)`` is the coordinator's (a range ``[from,
    to)`` or None when no quorum answered by `deadline`, on the loop's
    clock); ``state()`` the member's state; ``metrics()`` renders the
    Prometheus text.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        acquire: Callable[[str, int, float], Awaitable[tuple[int, int] | None]],
        store: Store,
        state: Callable[[], str],
        names: NameStats,
        on_store_failure: Callable[[BaseException], None],
        max_count: int,
        timeout: float,
        member: str = "",
        metrics: Callable[[], tuple[bytes, str]] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        grace: float = 2.0,
        routes: Iterable[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = (),
        not_ready: Callable[[str], str] | None = None,
        max_pending: int = 10000,
    ) -> None:
        self.host = host.strip("[]")
        self.max_pending = max_pending  # NextID requests waiting at most; beyond, 503 "overloaded" at once
        self._waiting = 0
        self._routes = tuple(routes)  # (method, path, handler) added by the embedding process
        self._not_ready = not_ready  # state -> the /readyz message (default: a member's)
        self._port = port
        self._acquire = acquire
        self._store = store
        self._state = state
        self._names = names
        self._on_store_failure = on_store_failure
        self.max_count = max_count
        self.timeout = timeout
        self.member = member
        self._metrics = metrics
        self._ssl = ssl_context
        self._grace = grace
        self._runner: web.AppRunner | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self.port = 0

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> int:
        """Listen; returns the bound port."""
        if self._runner is not None:
            return self.port
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._errors])
        r = app.router
        r.add_get("/healthz", self._healthz)
        r.add_get("/readyz", self._readyz)
        r.add_get("/v1/next/{name:.*}", self._next, allow_head=False)  # HEAD must not allocate
        r.add_get("/v1/current/{name:.*}", self._current)
        r.add_post("/v1/set/{name:.*}", self._set)
        r.add_get("/v1/names", self._list)
        r.add_get("/", self._status)
        r.add_get("/status", self._status)
        r.add_get("/metrics", self._prometheus)
        for method, path, handler in self._routes:
            r.add_route(method, path, handler)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=self._grace)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._port, ssl_context=self._ssl, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise listen_error(self.host, self._port, exc) from exc
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        return self.port

    async def aclose(self) -> None:
        """Stop accepting; requests in flight get up to ``grace`` seconds. Idempotent."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        if self._runner is not None:
            await self._runner.cleanup()
        self._closed.set()

    def reload_tls(self, cert: str, key: str) -> None:
        """New handshakes use the certificate read now; established connections keep theirs."""
        if self._ssl is not None:
            self._ssl.load_cert_chain(cert, key)

    # -- plumbing -------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        try:
            return await handler(request)
        except _Refused as exc:
            return _error(exc.code, exc.message, **exc.extra)
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            return _error("method_not_allowed", f"{_short(request.method, 16)} is not allowed here (allowed: {allowed})",
                          {"Allow": allowed})
        except web.HTTPNotFound:
            return _error("not_found", "no such route: the API is at /v1/next/NAME, /v1/current/NAME, "
                                       "/v1/set/NAME, /v1/names, /healthz, /readyz, /status, /metrics")
        except web.HTTPRequestEntityTooLarge:
            resp = _error("payload_too_large", f"request body over {MAX_BODY} bytes")
            resp.force_close()  # the rest of the body is not read
            return resp
        except web.HTTPException as exc:
            return _json(exc.status, {"error": {"code": "bad_request" if exc.status < 500 else "internal",
                                                "message": _short(exc.reason or "", 80)}})
        except Exception:  # a bug costs one request, not the listener
            log.exception("HTTP %s %s failed", request.method, _short(request.path, 80))
            return _error("internal", "internal error")

    @staticmethod
    def _name(request: web.Request) -> str:
        # From the raw path: the router's decoding keeps an invalid %-sequence as text (%FF
        # would name a sequence "%FF"), where gRPC refuses a string that is not UTF-8.
        parts = request.raw_path.split("?", 1)[0].split("/", 3)
        if len(parts) == 4 and parts[1] == "v1":
            try:
                name = urllib.parse.unquote_to_bytes(parts[3]).decode("utf-8")
            except UnicodeDecodeError:
                raise _Refused("bad_name", "the name is not valid UTF-8") from None
        else:
            name = request.match_info["name"]
        try:
            size = len(name.encode())
        except UnicodeEncodeError:
            raise _Refused("bad_name", "the name is not valid UTF-8") from None
        if size > MAX_NAME:
            raise _Refused("bad_name", f"name longer than {MAX_NAME} bytes")
        return name

    @staticmethod
    def _query(request: web.Request, allowed: tuple[str, ...]) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in request.query.items():
            if key not in allowed:
                can = f" (parameters: {', '.join(allowed)})" if allowed else " (this route takes none)"
                raise _Refused("bad_request", f"unknown parameter {_short(key)!r}{can}")
            if key in out:
                raise _Refused("bad_request", f"parameter {key!r} given more than once")
            out[key] = value
        return out

    @staticmethod
    def _int(value: str, what: str, lo: int, hi: int, code: str = "bad_request") -> int:
        if not _DIGITS.fullmatch(value) or not lo <= int(value) <= hi:
            raise _Refused(code, f"{what} must be an integer from {lo} to {hi} (got {_short(value, 24)!r})")
        return int(value)

    # -- routes ---------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        self._query(request, ())
        return _json(200, {"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        self._query(request, ())
        state = self._state()
        if state != "ready":
            text = (self._not_ready(state) if self._not_ready is not None
                    else f"this member does not vote yet ({state.replace('_', ' ')})")
            return _error("not_ready", text, state=state)
        return _json(200, {"status": "ready", "state": state})

    async def _next(self, request: web.Request) -> web.Response:
        name = self._name(request)
        if name.startswith(RESERVED_PREFIX):
            raise _Refused("bad_name", RESERVED_MESSAGE)
        q = self._query(request, ("count",))
        n = self._int(q["count"], "count", 1, self.max_count, "bad_count") if "count" in q else 1
        loop = asyncio.get_running_loop()
        t = self.timeout
        # The coordinator gives up a little before the deadline, so the caller sees "no quorum"
        # (503) rather than the safety net's 504 (a round in flight when the deadline passes).
        deadline = loop.time() + t - min(0.05, t * 0.1)
        if self._waiting >= self.max_pending:
            raise _Refused("overloaded", f"{self.max_pending} requests already wait here (max_pending): "
                                         "retry after a backoff or on another member")
        self._waiting += 1
        try:
            async with asyncio.timeout(t):  # no task of its own, unlike wait_for
                r = await self._acquire(name, n, deadline)
        except TimeoutError:
            raise _Refused("deadline_exceeded", f"no range within the deadline ({t:g} s)") from None
        except SeqExhausted:
            raise _Refused("exhausted", "the sequence would pass 2**63-1") from None
        except MemberRemoved as exc:
            raise _Refused("removed", str(exc)) from None
        except SeqUnavailable as exc:  # a snowflake worker (no lease, its clock moved backwards); a member not added yet
            raise _Refused(getattr(exc, "code", "unavailable"), str(exc)) from None
        except StoreError as exc:
            self._on_store_failure(exc)
            raise _Refused("unavailable", "this member's store failed; it is stopping") from None
        finally:
            self._waiting -= 1
        if r is None:
            if self._closing:
                raise _Refused("unavailable", "this member is shutting down")
            raise _Refused("no_quorum", f"no quorum within the deadline ({t:g} s): "
                                        "fewer than a majority of members answered")
        self._names.served(name, r[1] - r[0])
        return _json(200, {"name": name, "from": r[0], "to": r[1] - 1})

    async def _current(self, request: web.Request) -> web.Response:
        name = self._name(request)
        self._query(request, ())
        return _json(200, {"name": name, "value": self._store.get(name)})

    async def _set(self, request: web.Request) -> web.Response:
        name = self._name(request)
        if name.startswith(RESERVED_PREFIX):
            raise _Refused("bad_name", RESERVED_MESSAGE)
        self._query(request, ())
        if request.content_length is not None and request.content_length > MAX_BODY:
            raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=request.content_length)
        body = await request.read()
        value = self._set_body(body)
        try:
            ok, fut = self._store.advance(name, value)
        except StoreError as exc:
            self._on_store_failure(exc)
            raise _Refused("unavailable", "this member's store failed; it is stopping") from None
        if not ok:
            cur = self._store.get(name)
            raise _Refused("not_forward", f"this member is at {cur} for this name: set only moves a sequence "
                                          f"forward (send a value above {cur})", value=cur)
        if fut is not None:
            try:
                await fut
            except StoreError as exc:
                self._on_store_failure(exc)
                raise _Refused("unavailable", "this member's store failed; it is stopping") from None
        return _json(200, {"name": name, "value": value})

    @staticmethod
    def _set_body(body: bytes) -> int:
        want = 'a JSON object {"value": N}, N an integer from 1 to 2**63-1'
        try:
            doc = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise _Refused("bad_request", f"the body is not JSON: expected {want}") from None
        if not isinstance(doc, dict):
            raise _Refused("bad_request", f"expected {want}")
        extra = [k for k in doc if k != "value"]
        if extra:
            raise _Refused("bad_request", f"unknown member {_short(extra[0])!r}: expected {want}")
        value = doc.get("value")
        if type(value) is not int or not 1 <= value <= MAX_VALUE:
            raise _Refused("bad_request", f"expected {want}")
        return value

    def _page(self, request: web.Request) -> tuple[list[dict[str, Any]], str | None]:
        q = self._query(request, ("limit", "after"))
        limit = self._int(q["limit"], "limit", 1, MAX_LIST) if "limit" in q else DEFAULT_LIST
        after = q.get("after")
        page = self._store.names_page(after, limit + 1)
        more = len(page) > limit
        page = page[:limit]
        now = self._names.clock()
        rows = []
        for name in page:
            f = self._names.get(name)
            rows.append({
                "name": name,
                "value": self._store.get(name),
                "last_allocation": _iso(f.last_wall) if f else None,
                "ranges_served": f.ranges if f else 0,
                "ids_served": f.ids if f else 0,
                "rate": round(f.rate(now), 3) if f else 0.0,
            })
        return rows, page[-1] if more and page else None

    async def _list(self, request: web.Request) -> web.Response:
        rows, nxt = self._page(request)
        return _json(200, {"member": self.member, "state": self._state(), "total": len(self._store),
                           "names": rows, "next": nxt})

    async def _status(self, request: web.Request) -> web.Response:
        rows, nxt = self._page(request)
        e = html.escape
        member = e(self.member)
        out = [
            f'<!doctype html><html><head><meta charset="utf-8"><title>seq member {member}</title>',
            _STYLE,
            (f"<h1>seq member {member}</h1><p>state: <b>{e(self._state())}</b> · names held: {len(self._store)}"
             " · figures of ranges served by this member (gRPC and HTTP); rate: IDs/s over about the last minute</p>"),
            _HEAD,
        ]
        for row in rows:
            out.append(
                f"<tr><td>{e(row['name'])}</td><td class=n>{row['value']}</td>"
                f"<td>{e(row['last_allocation'] or '–')}</td><td class=n>{row['ranges_served']}</td>"
                f"<td class=n>{row['ids_served']}</td><td class=n>{row['rate']:.3f}</td></tr>"
            )
        out.append("</table>")
        if nxt is not None:
            href = "?" + urllib.parse.urlencode({"after": nxt, "limit": len(rows)})
            out.append(f"<p><a href=\"{e(href)}\">next page</a></p>")
        out.append("</body></html>")
        return web.Response(text="".join(out), content_type="text/html", charset="utf-8",
                            headers={"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"})

    async def _prometheus(self, request: web.Request) -> web.Response:
        self._query(request, ())
        if self._metrics is None:
            raise web.HTTPNotFound()
        body, content_type = self._metrics()
        return web.Response(body=body, headers={"Content-Type": content_type})


_STYLE = ("<style>body{font-family:sans-serif}td,th{padding:2px 8px}th{text-align:left}"
          "td.n{text-align:right;font-variant-numeric:tabular-nums}</style></head><body>")


_HEAD = ("<table><tr><th>name</th><th>value</th><th>last range served</th><th>ranges served</th>"
         "<th>IDs served</th><th>rate</th></tr>")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
