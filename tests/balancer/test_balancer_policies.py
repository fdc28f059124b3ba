"""Pool policies against real backends: a pool of 100 servers (the tried
set does not wrap), backup servers, slow start, retry-on and layer-7 passive
health."""

from __future__ import annotations

import http.client

import pytest
from tests.netutil import free_port

pytestmark = pytest.mark.timeout(60)


def get(port: int, path: str = "/whoami", method: str = "GET") -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_a_pool_of_100_servers_retries_past_index_64(backends, proxy):
    """Server 0 refuses connections, 64 is the only other one up: every
    request ends on 64 (a 64-bit tried mask took 64 for 0 and gave up)."""
    live = backends(1)[0]
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(100)]
    addrs[64] = live.address
    lb = proxy(addrs, workers=1, retries=2, eject_after=0)
    for i, a in enumerate(addrs):
        if i not in (0, 64):
            lb.set_backend_state(a, "drain")
    port = lb.address[1]
    got = [get(port) for _ in range(40)]
    assert got == [(200, live.name.encode())] * 40
    stats = {b["name"]: b for b in lb.backends()}
    assert stats[addrs[0]]["failures"] >= 1  # round robin starts on 0 a third of the time
