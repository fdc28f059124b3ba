"""Plain HTTP requests on the websocket port (before the upgrade).

``GET /healthz`` answers ``200 ok`` while the server accepts connections and
``503 draining`` once it is shutting down (load balancers stop sending new
clients). Kept apart from the websocket path handling so other HTTP
handlers (e.g. static files) can be added next to it.
"""

from __future__ import annotations

from typing import Any

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

__all__ = ["HEALTH_PATH", "http_response"]

HEALTH_PATH = "/healthz"


def _response(status: int, reason: str, body: bytes) -> Response:
    headers = Headers()
    headers["Content-Type"] = "text/plain; charset=utf-8"
    headers["Content-Length"] = str(len(body))
    headers["Connection"] = "close"
    headers["Cache-Control"] = "no-store"
    return Response(status, reason, headers, body)


def http_response(request: Request, *, draining: bool) -> Any:
    """A Response for plain-HTTP paths this server answers itself, else None."""
    path = request.path.split("?", 1)[0]
    if path == HEALTH_PATH:
        if draining:
            return _response(503, "Service Unavailable", b"draining\n")
        return _response(200, "OK", b"ok\n")
    return None
