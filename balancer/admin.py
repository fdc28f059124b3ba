"""The admin HTTP endpoint (its own port, asyncio, loopback by default).

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
and the running configuration stays.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from balancer.errors import BalancerConfigError, BalancerError
from balancer.metrics import render

if TYPE_CHECKING:
    from balancer.service import LoadBalancer

log = logging.getLogger("balancer.admin")

MAX_HEAD = 16384
READ_TIMEOUT = 10.0


class AdminServer:
    def __init__(self, lb: LoadBalancer, host: str, port: int) -> None:
        self._lb = lb
        self._host, self._port = host, port
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[:2]

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, self._host, self._port, limit=MAX_HEAD)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    if k.strip().lower() == "content-length":
                        length = int(v.strip())
                if length > MAX_HEAD:
                    raise ValueError("body too large")
                if length:
                    await reader.readexactly(length)
            status, ctype, body = await self._route(method, target)
        except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            status, ctype, body = 400, "application/json", b'{"error": "bad request"}'
        except ConnectionError:
            writer.close()
            return
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 409: "Conflict"}.get(status, "Error")
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode("latin-1") + body
        )
        try:
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _route(self, method: str, target: str) -> tuple[int, str, bytes]:
        url = urlsplit(target)
        path = url.path.rstrip("/") or "/"
        query = parse_qs(url.query)
        lb = self._lb

        def js(obj: Any, status: int = 200) -> tuple[int, str, bytes]:
            return status, "application/json", json.dumps(obj, indent=1).encode()

        if method == "GET":
            if path == "/metrics":
                return 200, "text/plain; version=0.0.4; charset=utf-8", render(lb.stats()).encode()
            if path == "/backends":
                return js(lb.backends())
            if path == "/stats":
                return js(lb.stats())
            if path == "/config":
                return js(dataclasses.asdict(lb.config))
            if path == "/healthz":
                return 200, "text/plain", b"ok\n"
            return js({"error": f"no such resource {path}"}, 404)
        if method != "POST":
            return js({"error": "use GET or POST"}, 405)
        if path == "/reload":
            try:
                await lb.reload()
            except BalancerConfigError as exc:
                return js({"error": str(exc)}, 400)
            return js({"reloaded": True})
        parts = path.split("/")
        if len(parts) == 4 and parts[1] == "backends":
            name, action = unquote(parts[2]), parts[3]
            try:
                if action in ("drain", "up", "down"):
                    lb.set_backend_state(name, action)
                elif action == "weight":
                    lb.set_backend_weight(name, int(query.get("w", query.get("weight", ["x"]))[0]))
                else:
                    return js({"error": f"unknown action {action!r}"}, 404)
            except ValueError:
                return js({"error": "weight must be an integer"}, 400)
            except BalancerError as exc:
                return js({"error": str(exc)}, 404 if "no backend" in str(exc) else 400)
            return js({"backend": name, "action": action})
        return js({"error": f"no such resource {path}"}, 404)
