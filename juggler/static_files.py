"""Plain HTTP next to the websocket endpoint: the browser client and the demo page.

The server hands every handshake request whose path is not the websocket
path to :meth:`StaticSite.respond`; the answer is one HTTP response, then the
connection closes (no keep-alive). Nothing here runs for websocket traffic.

Safety by construction: the files are read once, at start-up, from
``juggler/static/`` (regular files at its top level only) into a dict keyed by
URL path; a request is a dict lookup, so no request path ever reaches the
filesystem (no traversal, no symlink games, no partial reads). Every response
has an exact ``Content-Type`` with ``X-Content-Type-Options: nosniff``, an
``ETag`` (``If-None-Match`` → 304) and ``Cache-Control: no-cache`` (browsers
revalidate, so an upgraded server is picked up at once). HEAD gets the GET
headers without the body.

Routes: ``/juggler.js`` (with ``/protocol.js`` and ``/fallback.js``, which it
imports) and ``/juggler.d.ts`` always; with ``demo=True`` also
``/`` (``index.html``), the page's assets and ``/stats.json`` (a snapshot of the
server counters for the page's live chart).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

__all__ = ["STATIC_DIR", "StaticSite", "content_type", "stats_snapshot"]

STATIC_DIR = Path(__file__).resolve().parent / "static"

#: always served (the client library)
#: the browser client: juggler.js imports the other two modules (relative URLs)
LIBRARY = ("juggler.js", "protocol.js", "fallback.js", "juggler.d.ts")

_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".d.ts": "application/typescript; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".ico": "image/x-icon",
    ".txt": "text/plain; charset=utf-8",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# the demo page loads only its own scripts and talks only to websockets
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self' ws: wss:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


def content_type(name: str) -> str | None:
    """The Content-Type of a file name, or None if it is not a type we serve."""
    for suffix in sorted(_TYPES, key=len, reverse=True):
        if name.endswith(suffix):
            return _TYPES[suffix]
    return None


@dataclass(frozen=True, slots=True)
class _File:
    body: bytes
    ctype: str
    etag: str


def stats_snapshot(server: Any) -> dict[str, Any]:
    """The counters of a :class:`juggler.server.Server` as JSON-ready numbers."""
    s = server.stats
    return {
        "time": time.time(),
        "connections_active": s.connections_active,
        "connections_total": s.connections_total,
        "calls": s.calls,
        "results": s.results,
        "publishes": s.publishes,
        "events": s.events,
        "nacks": s.nacks,
        "pending_calls": server.pending_calls,
        "ws_path": server.config.path,
    }


class StaticSite:
    """Answers the plain HTTP requests of one server (see module doc)."""

    def __init__(
        self,
        *,
        demo: bool = False,
        stats: Callable[[], Mapping[str, Any]] | None = None,
        directory: Path = STATIC_DIR,
    ) -> None:
        self.demo = demo
        self.stats = stats
        self.files: dict[str, _File] = {}
        names = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
        for name in names:
            path = directory / name
            ctype = content_type(name)
            if not _NAME.match(name) or ctype is None or path.is_symlink() or not path.is_file():
                continue
            if not demo and name not in LIBRARY:
                continue
            body = path.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
            self.files["/" + name] = _File(body, ctype, etag)
        if demo and "/index.html" in self.files:
            self.files["/"] = self.files["/index.html"]

    def respond(self, request: Request, *, head: bool = False) -> Response:
        """The response to one GET (or HEAD, ``head=True``) request."""
        if getattr(request, "method", "GET") != "GET":  # websockets >= 15 parses other methods too
            return self._response(405, "Method Not Allowed", b"Method Not Allowed\n",
                                  "text/plain; charset=utf-8", head, {"Allow": "GET, HEAD"})
        path = request.path.split("?", 1)[0].split("#", 1)[0]
        if path == "/stats.json" and self.demo and self.stats is not None:
            body = json.dumps(self.stats(), separators=(",", ":")).encode()
            return self._response(200, "OK", body, "application/json", head, {"Cache-Control": "no-store"})
        f = self.files.get(path)
        if f is None:
            return self._response(404, "Not Found", b"Not Found\n", "text/plain; charset=utf-8", head)
        extra = {"ETag": f.etag, "Cache-Control": "no-cache"}
        if f.ctype.startswith("text/html"):
            extra["Content-Security-Policy"] = _CSP
        inm = request.headers.get("If-None-Match")
        if inm is not None and (inm.strip() == "*" or f.etag in [t.strip().removeprefix("W/") for t in inm.split(",")]):
            return self._response(304, "Not Modified", b"", None, True, extra)
        return self._response(200, "OK", f.body, f.ctype, head, extra)

    @staticmethod
    def _response(status: int, reason: str, body: bytes, ctype: str | None, head: bool,
                  extra: Mapping[str, str] | None = None) -> Response:
        headers = Headers()
        if ctype is not None:
            headers["Content-Type"] = ctype
        if status != 304:
            headers["Content-Length"] = str(len(body))
        headers["X-Content-Type-Options"] = "nosniff"
        headers["Referrer-Policy"] = "no-referrer"
        for k, v in (extra or {}).items():
            headers[k] = v
        headers["Connection"] = "close"
        return Response(status, reason, headers, b"" if head else body)
