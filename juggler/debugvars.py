"""``GET /debug/vars`` on the websocket port, in the shape the original served.

The original ``juggler-server`` published Go's expvar page on its websocket
port, and the original load tool (``juggler-load``) reads it before and after
a run to print the server's counters; without the page the tool stops at
once (unless run with ``-V``). With ``[server] debug_vars = true`` our server
answers that path with the same JSON object: a ``juggler`` map of the
original's counters, computed from :class:`juggler.metrics.ServerStats`, and a
``memstats`` map whose Go-runtime numbers are all zero (there is no Go
runtime to measure). Off by default: the counters are nobody else's business
on a public port; Prometheus metrics (``[metrics]``) are the real interface.
"""

from __future__ import annotations

import json
from typing import Any

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from juggler.metrics import ServerStats

__all__ = ["DEBUG_VARS_PATH", "debug_vars", "debug_vars_response"]

DEBUG_VARS_PATH = "/debug/vars"

#: message types of juggler.0 by name, as the original's "Msgs<TYPE>" counters name them
_READ = {"CALL": 1, "PUB": 2, "SUB": 3, "UNSB": 4}
_WRITE = {"NACK": 7, "ACK": 8, "RES": 9, "EVNT": 10}

_MEMSTATS = ("Alloc", "TotalAlloc", "Mallocs", "Frees", "HeapAlloc", "HeapInuse", "HeapObjects",
             "StackInuse", "NumGC", "PauseTotalNs")


def debug_vars(stats: ServerStats) -> dict[str, Any]:
    """The original's expvar object for these counters."""
    read = sum(stats.read) + sum(stats.extensions_read.values())
    written = sum(stats.written) + sum(stats.extensions_written.values())
    juggler: dict[str, int] = {
        "ActiveConns": stats.connections_active,
        "TotalConns": stats.connections_total,
        # one task per connection here, not the original's three goroutines
        "ActiveConnGoros": stats.connections_active,
        "TotalConnGoros": stats.connections_total,
        "Msgs": read + written,
        "MsgsRead": read,
        "MsgsWrite": written,
        "SlowProcessMsg": stats.slow_messages,
        "RecoveredPanics": 0,
    }
    for name, t in _READ.items():
        juggler["Msgs" + name] = stats.read[t]
    for name, t in _WRITE.items():
        juggler["Msgs" + name] = stats.written[t]
    return {"juggler": juggler, "memstats": dict.fromkeys(_MEMSTATS, 0)}


def debug_vars_response(request: Request, stats: ServerStats, *, head: bool = False) -> Response | None:
    """The response to ``GET``/``HEAD /debug/vars``; None for any other path."""
    if request.path.split("?", 1)[0] != DEBUG_VARS_PATH:
        return None
    body = json.dumps(debug_vars(stats), separators=(",", ":")).encode()
    headers = Headers()
    headers["Content-Type"] = "application/json; charset=utf-8"
    headers["Content-Length"] = str(len(body))
    headers["Connection"] = "close"
    headers["Cache-Control"] = "no-store"
    return Response(200, "OK", headers, b"" if head else body)
