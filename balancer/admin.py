"""The admin HTTP endpoint (its own port, loopback by default), on aiohttp.

==========================================  ===========================================
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
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from rustext.net import listen_error

from balancer.errors import BalancerConfigError, BalancerError
from balancer.metrics import CONTENT_TYPE_LATEST, exposition, registry_for

if TYPE_CHECKING:
    from balancer.service import LoadBalancer

log = logging.getLogger("balancer.admin")

#: largest request body the endpoint reads (its requests carry none that matter)
MAX_BODY = 16384


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(obj, indent=1), content_type="application/json")


class AdminServer:
    """The admin endpoint of one :class:`LoadBalancer`; ``start()`` / ``aclose()``."""

    def __init__(self, lb: LoadBalancer, host: str, port: int) -> None:
        self._lb = lb
        self._host, self._port = host, port
        self._registry = registry_for(lb.stats)
        self._runner: web.AppRunner | None = None
        self._address: tuple[str, int] | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self._address is not None, "not started"
        return self._address

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[_errors_as_json])
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
        return _json(dataclasses.asdict(self._lb.config))

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
