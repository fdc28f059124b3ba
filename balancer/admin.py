"""The admin HTTP endpoint (its own port, loopback by default), on aiohttp.

==========================================  ===========================================
``GET  /``                                  JSON list of these endpoints
``GET  /backends``                          JSON list: name, weight, state, counters
``GET  /stats``                             JSON totals, per worker and per backend
``GET  /metrics``                           Prometheus text
``GET  /config``                            JSON of the running configuration
``POST /backends/<host:port>/drain``        no new requests to it; in-flight finish
``POST /backends/<host:port>/up``           back in rotation (``/down`` takes it out)
``POST /backends/<host:port>/weight?w=N``   change its weight
``POST /reload``                            re-read the config file (as SIGHUP)
``GET  /healthz``                           200 while serving
==========================================  ===========================================

Errors answer 4xx with a JSON ``{"error": ...}``; an invalid reload is a 400
and the running configuration stays. The endpoint sits on top of
:class:`balancer.service.LoadBalancer`, which knows nothing of it.

With ``[admin_auth]`` (balancer.auth) every request but the configured
public read-only paths needs credentials, else ``401`` with
``WWW-Authenticate``; the table is read again when a reload changes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from rustext.net import listen_error

from balancer.auth import MAX_HEADER as MAX_AUTH_HEADER
from balancer.auth import AdminAuth, Authenticator
from balancer.errors import BalancerConfigError, BalancerError
from balancer.metrics import CONTENT_TYPE_LATEST, exposition, registry_for

if TYPE_CHECKING:
    from balancer.service import LoadBalancer

log = logging.getLogger("balancer.admin")

#: largest request body the endpoint reads (its requests carry none that matter)
MAX_BODY = 16384

#: what ``GET /`` answers: every resource, so that a browser or curl pointed at the port finds its way
ENDPOINTS: tuple[tuple[str, str, str], ...] = (
    ("GET", "/backends", "every backend: name, pool, weight, state, counters"),
    ("GET", "/stats", "totals, per worker and per backend"),
    ("GET", "/metrics", "Prometheus text"),
    ("GET", "/config", "the running configuration"),
    ("GET", "/healthz", "200 while serving"),
    ("POST", "/backends/<host:port>/drain", "no new requests to it; those in flight finish"),
    ("POST", "/backends/<host:port>/down", "out of rotation"),
    ("POST", "/backends/<host:port>/up", "back in rotation"),
    ("POST", "/backends/<host:port>/weight?w=N", "change its weight"),
    ("POST", "/reload", "read the configuration file again (as SIGHUP)"),
)


def _sizes(obj: Any) -> Any:
    """What JSON cannot hold as such: bytes (a page read from a file) are shown by their size."""
    if isinstance(obj, bytes):
        return f"{len(obj)} bytes"
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(obj, indent=1, default=_sizes),
                        content_type="application/json")


class AdminServer:
    """The admin endpoint of one :class:`LoadBalancer`; ``start()`` / ``aclose()``."""

    def __init__(self, lb: LoadBalancer, host: str, port: int) -> None:
        self._lb = lb
        self._host, self._port = host, port
        self._registry = registry_for(lb.stats)
        self._runner: web.AppRunner | None = None
        self._address: tuple[str, int] | None = None
        self._auth: Authenticator | None = None
        self._auth_config: AdminAuth | None = None
        self._bcrypt = asyncio.Semaphore(4)  # password checks at once: bcrypt is CPU on purpose

    def _authenticator(self) -> Authenticator | None:
        """The running config's authenticator (made again when a reload changed the table)."""
        cfg = self._lb.config.admin_auth
        if cfg is not self._auth_config:
            try:
                self._auth = Authenticator(cfg) if cfg is not None else None
            except BalancerConfigError as exc:  # a file gone since the config was read: nobody gets in
                log.error("admin authentication cannot load its credentials, refusing every request: %s", exc)
                self._auth = _DENY_ALL
            self._auth_config = cfg
        return self._auth

    @property
    def address(self) -> tuple[str, int]:
        assert self._address is not None, "not started"
        return self._address

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[_errors_as_json, self._authenticate])
        app.router.add_get("/", self._index)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/backends", self._backends)
        app.router.add_get("/stats", self._stats)
        app.router.add_get("/config", self._config)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_post("/reload", self._reload)
        app.router.add_post("/backends/{name}/{action}", self._backend)
        return app

    async def start(self) -> None:
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise listen_error(self._host, self._port, exc) from exc
        self._runner = runner
        self._address = tuple(runner.addresses[0][:2])  # type: ignore[assignment]  # the bound port when 0 was asked
        self._authenticator()
        if self._lb.config.admin_auth is None and not _loopback(self._host):
            log.warning("the admin endpoint on %s:%d is reachable from other hosts and has no authentication: "
                        "anyone who reaches it can drain backends and reload; add an [admin_auth] table",
                        self._host, self._port)

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # handlers -----------------------------------------------------------------------

    async def _backends(self, request: web.Request) -> web.Response:
        return _json(self._lb.backends())

    async def _stats(self, request: web.Request) -> web.Response:
        return _json(self._lb.stats())

    async def _config(self, request: web.Request) -> web.Response:
        out = dataclasses.asdict(self._lb.config)
        # the pages' fields and sizes, not their bytes
        out["error_pages"] = {str(p.status): {"headers": [list(h) for h in p.headers], "bytes": len(p.body)}
                              for p in self._lb.config.error_pages}
        auth = self._lb.config.admin_auth
        if auth is not None:  # never the hashes or where the token lives
            out["admin_auth"] = {"users": [u.partition(":")[0] for u in auth.users],
                                 "users_file": auth.users_file is not None,
                                 "token": auth.token_file is not None or auth.token_env is not None,
                                 "public": list(auth.public)}
        return _json(out)

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        auth = self._authenticator()
        if auth is None or (request.method in ("GET", "HEAD") and auth.is_public(request.path)):
            return await handler(request)
        header = request.headers.get("Authorization")
        if header is not None and len(header) <= MAX_AUTH_HEADER:
            async with self._bcrypt:
                if await asyncio.to_thread(auth.check, header):
                    return await handler(request)
        response = _json({"error": "authentication required"}, 401)
        for challenge in auth.challenges:
            response.headers.add("WWW-Authenticate", challenge)
        return response

    async def _index(self, request: web.Request) -> web.Response:
        return _json({"service": "juggler balancer admin",
                      "endpoints": [{"method": m, "path": p, "what": w} for m, p, w in ENDPOINTS]})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=exposition(self._registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _reload(self, request: web.Request) -> web.Response:
        try:
            await self._lb.reload()
        except BalancerConfigError as exc:
            return _json({"error": str(exc)}, 400)
        return _json({"reloaded": True})

    async def _backend(self, request: web.Request) -> web.Response:
        name, action = request.match_info["name"], request.match_info["action"]
        try:
            if action in ("drain", "up", "down"):
                self._lb.set_backend_state(name, action)
            elif action == "weight":
                raw = request.query.get("w", request.query.get("weight", ""))
                try:
                    weight = int(raw)
                except ValueError:
                    return _json({"error": "weight must be an integer"}, 400)
                self._lb.set_backend_weight(name, weight)
            else:
                return _json({"error": f"unknown action {action!r}"}, 404)
        except BalancerError as exc:
            return _json({"error": str(exc)}, 404 if "no backend" in str(exc) else 400)
        return _json({"backend": name, "action": action})


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _DenyAll:
    challenges: tuple[str, ...] = ()

    def is_public(self, path: str) -> bool:
        return False

    def check(self, header: str | None) -> bool:
        return False


_DENY_ALL: Any = _DenyAll()


@web.middleware
async def _errors_as_json(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own 404/405/413 answers, as JSON like every other error here."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = {404: f"no such resource {request.path}", 405: "use GET or POST"}.get(exc.status, exc.reason)
        return _json({"error": message}, exc.status)
