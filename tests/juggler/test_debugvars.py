"""GET /debug/vars: the original's counters page, for its load tool (juggler.debugvars)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import jwt
import pytest
from jugglerprocs import juggler_server

from juggler.client import connect
from juggler.debugvars import debug_vars
from juggler.metrics import ServerStats

pytestmark = pytest.mark.timeout(60)


def test_the_counters_in_the_original_names() -> None:
    s = ServerStats(connections_active=2, connections_total=5, slow_messages=1)
    s.read[1], s.read[3] = 4, 1          # 4 CALLs, 1 SUB
    s.written[8], s.written[9], s.written[10] = 5, 4, 7
    s.extensions_read[257] = 2            # extension messages count as messages, not as any type
    s.extensions_written[256] = 3
    v = debug_vars(s)
    j = v["juggler"]
    assert (j["ActiveConns"], j["TotalConns"], j["SlowProcessMsg"]) == (2, 5, 1)
    assert (j["MsgsCALL"], j["MsgsSUB"], j["MsgsPUB"], j["MsgsACK"], j["MsgsRES"], j["MsgsEVNT"]) == (4, 1, 0, 5, 4, 7)
    assert (j["MsgsRead"], j["MsgsWrite"], j["Msgs"]) == (7, 19, 26)
    assert set(v["memstats"]) >= {"Alloc", "NumGC", "PauseTotalNs"} and not any(v["memstats"].values())


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


async def test_served_only_when_asked_for_and_before_authentication(redis_url: str) -> None:
    with juggler_server(redis_url) as url:
        status, _, _ = _get(url.replace("ws://", "http://").replace("/ws", "/debug/vars"))
        assert status == 404
    secret = "x" * 32
    with juggler_server(redis_url, "--set", "server.debug_vars=true", "--jwt-secret", secret) as url:
        page = url.replace("ws://", "http://").replace("/ws", "/debug/vars")  # no token needed
        token = jwt.encode({"sub": "a", "exp": int(time.time()) + 600}, secret, algorithm="HS256")
        async with connect(f"{url}?token={token}") as c:
            await c.sub("a")
            await c.pub("a", 1)
            await c.next_event(5)
            status, ctype, body = _get(page)
        assert status == 200 and ctype.startswith("application/json")
        j = json.loads(body)["juggler"]
        assert (j["ActiveConns"], j["TotalConns"], j["MsgsSUB"], j["MsgsPUB"], j["MsgsEVNT"]) == (1, 1, 1, 1, 1)
