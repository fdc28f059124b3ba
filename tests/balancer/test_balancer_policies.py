"""Pool policies against real backends: a pool of 100 servers (the tried
set does not wrap), backup servers, slow start, retry-on and layer-7 passive
health."""

from __future__ import annotations

import http.client
import json
import re
import time

import pytest
from balancer_helpers import raw_exchange, split_response
from tests.netutil import free_port

import rustext
from balancer.config import BackendConfig, BalancerConfig, from_dict
from balancer.errors import BalancerConfigError
from balancer.policies import Policy

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
    lb = proxy(addrs, workers=1, retries=2, passive={"eject_after": 0})
    for i, a in enumerate(addrs):
        if i not in (0, 64):
            lb.set_backend_state(a, "drain")
    port = lb.address[1]
    got = [get(port) for _ in range(40)]
    assert got == [(200, live.name.encode())] * 40
    stats = {b["name"]: b for b in lb.backends()}
    assert stats[addrs[0]]["failures"] >= 1  # round robin starts on 0 a third of the time


def start(cfg: BalancerConfig) -> rustext.Balancer:
    lb = rustext.Balancer(cfg)
    lb.start()
    return lb


def post(port: int, path: str) -> int:
    return get(port, path, "POST")[0]


class Client:
    """One keep-alive connection; requests return (status, headers, body)."""

    def __init__(self, port: int) -> None:
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def get(self, path: str = "/whoami", headers: dict[str, str] | None = None,
            method: str = "GET") -> tuple[int, http.client.HTTPMessage, bytes]:
        self.c.request(method, path, headers=headers or {})
        r = self.c.getresponse()
        return r.status, r.headers, r.read()

    def close(self) -> None:
        self.c.close()


@pytest.fixture
def lbs():
    started: list[rustext.Balancer] = []

    def make(cfg: BalancerConfig) -> int:
        lb = start(cfg)
        started.append(lb)
        return lb

    yield make
    for lb in started:
        lb.close()


def test_backups_serve_only_when_no_other_server_is_available(backends, lbs):
    a, b, c = backends(3)
    servers = [{"address": a.address}, {"address": b.address, "backup": True}, {"address": c.address, "backup": True}]
    lb = lbs(from_dict({"listen": "127.0.0.1:0", "workers": 1, "backends": servers}))
    port = lb.address[1]
    assert {get(port)[1] for _ in range(6)} == {a.name.encode()}
    lb.set_backend_state(a.address, "down")
    assert {get(port)[1] for _ in range(6)} == {b.name.encode()}  # the first backup only
    lb.set_backend_health(b.address, False)
    assert {get(port)[1] for _ in range(4)} == {c.name.encode()}
    lb.set_backend_health(b.address, True)
    lb.set_backend_state(a.address, "up")
    assert {get(port)[1] for _ in range(4)} == {a.name.encode()}
    every = lbs(from_dict({"listen": "127.0.0.1:0", "workers": 1, "backends": servers, "all_backups": True}))
    every.set_backend_state(a.address, "down")
    assert {get(every.address[1])[1] for _ in range(8)} == {b.name.encode(), c.name.encode()}


def test_layer7_passive_health_ejects_a_server_answering_500(backends, lbs):
    a, b = backends(2)
    assert post(a.port, "/fail") == 200
    l4 = lbs(from_dict({"listen": "127.0.0.1:0", "workers": 1, "backends": [a.address, b.address],
                        "retry_on": [], "passive": {"eject_after": 3, "cooldown": 60}}))
    got = [get(l4.address[1])[0] for _ in range(12)]
    assert got.count(500) == 6  # layer 4: a 500 is not a failure
    l7 = lbs(from_dict({"listen": "127.0.0.1:0", "workers": 1, "backends": [a.address, b.address],
                        "passive": {"eject_after": 3, "cooldown": 60, "observe": "layer7"}}))
    port = l7.address[1]
    got = [get(port) for _ in range(16)]
    assert [s for s, _ in got].count(500) == 3  # three in a row, then a is out
    assert got[-6:] == [(200, b.name.encode())] * 6
    state = {x["name"]: x for x in l7.backends()}
    assert state[a.address]["state"] == "ejected" and state[a.address]["ejections"] == 1
    # an active health check passing brings it back at once
    assert post(a.port, "/recover") == 200
    l7.set_backend_health(a.address, False)
    l7.set_backend_health(a.address, True)
    assert {get(port)[1] for _ in range(6)} == {a.name.encode(), b.name.encode()}


def test_retry_on_a_status_replays_idempotent_requests_on_another_server(backends, lbs):
    a, b = backends(2)
    assert post(a.port, "/fail") == 200
    lb = lbs(from_dict({"listen": "127.0.0.1:0", "workers": 1, "backends": [a.address, b.address],
                        "retries": 1, "retry_on": ["500", "response-timeout"], "passive": {"eject_after": 0}}))
    port = lb.address[1]
    assert [get(port) for _ in range(8)] == [(200, b.name.encode())] * 8
    assert lb.stats()["retries"] >= 3
    # POST is not idempotent: never sent twice, the 500 comes through
    c = Client(port)
    posts = [c.get("/echo", method="POST")[0] for _ in range(6)]
    c.close()
    assert posts.count(500) == 3
    # both failing: the last attempt's response is the answer (not a 502)
    assert post(b.port, "/fail") == 200
    assert [get(port) for _ in range(4)] == [(500, a.name.encode()), (500, b.name.encode())] * 2 or \
        {get(port)[0] for _ in range(4)} == {500}


def test_retry_on_and_layer7_health_on_hyper_s_path(backends, lbs):
    """A sticky pool is served on hyper's path: the same policies apply there."""
    a, b = backends(2)
    assert post(a.port, "/fail") == 200
    lb = lbs(from_dict({"listen": "127.0.0.1:0", "workers": 1, "backends": [a.address, b.address],
                        "retries": 1, "retry_on": ["500"], "sticky": {},
                        "passive": {"eject_after": 2, "cooldown": 60, "observe": "layer7"}}))
    port = lb.address[1]
    assert [get(port) for _ in range(6)] == [(200, b.name.encode())] * 6
    state = {x["name"]: x for x in lb.backends()}
    assert state[a.address]["state"] == "ejected"


def test_slow_start_ramps_a_server_that_comes_back(backends, lbs):
    """The share of a server that came back grows from ~0 to its full share
    over its slow start (4 s): generous bounds on two windows, no timing
    finer than a second."""
    a, b = backends(2)
    lb = lbs(from_dict({"listen": "127.0.0.1:0", "workers": 1,
                        "backends": [a.address, {"address": b.address, "slow_start": "4s"}]}))
    c = Client(lb.address[1])
    lb.set_backend_health(b.address, False)
    assert {c.get()[2] for _ in range(10)} == {a.name.encode()}
    lb.set_backend_health(b.address, True)
    began = time.monotonic()
    early = [c.get()[2] for _ in range(200)]  # within its first 1.5 s (share ~0 to ~0.4)
    early_took = time.monotonic() - began
    time.sleep(max(0.0, 4.1 - (time.monotonic() - began)))
    late = [c.get()[2] for _ in range(200)]  # ramp over: round robin, half each
    c.close()
    share_early = early.count(b.name.encode()) / len(early)
    share_late = late.count(b.name.encode()) / len(late)
    if early_took < 1.5:
        assert share_early < 0.3, share_early
    assert share_late > 0.4, share_late
    assert share_early < share_late


def test_sticky_cookie_insert_indirect_and_redispatch(backends, lbs):
    a, b, c = backends(3)
    lb = lbs(from_dict({"listen": "127.0.0.1:0", "workers": 1,
                        "backends": [{"address": a.address, "cookie": "s1"}, b.address, c.address],
                        "sticky": {"cookie": "SERVERID", "max_age": 3600}}))
    port = lb.address[1]
    cl = Client(port)
    status, h, body = cl.get("/r/x")
    assert status == 200
    first = json.loads(body)["name"]
    cookie = h["Set-Cookie"]
    assert cookie.startswith("SERVERID=") and "Path=/" in cookie and "HttpOnly" in cookie and "Max-Age=3600" in cookie
    assert h["Cache-Control"] == "private"
    value = cookie.split(";")[0].split("=", 1)[1]
    if first == a.name:
        assert value == "s1"
    # with the cookie (among others): always the same server, no new cookie, and the server never
    # sees SERVERID (indirect)
    for _ in range(6):
        status, h, body = cl.get("/r/x", headers={"Cookie": f"a=1; SERVERID={value}; b=2"})
        seen = json.loads(body)
        assert seen["name"] == first and "Set-Cookie" not in h
        cookies = [v for k, v in seen["headers"] if k.lower() == "cookie"]
        assert cookies == ["a=1; b=2"]
    quoted = cl.get("/r/x", headers={"Cookie": f'SERVERID="{value}"'})
    assert json.loads(quoted[2])["name"] == first and not [k for k, _ in json.loads(quoted[2])["headers"]
                                                            if k.lower() == "cookie"]
    # two Cookie fields (as HTTP/2 clients send them): read both, forwarded as one without ours
    raw = raw_exchange(port, (f"GET /r/x HTTP/1.1\r\nHost: x\r\nCookie: a=1\r\nCookie: SERVERID={value}; b=2\r\n"
                              "Connection: close\r\n\r\n").encode())
    _, rh, rbody = split_response(raw)
    seen = json.loads(rbody)
    assert seen["name"] == first and "set-cookie" not in rh
    assert [v for k, v in seen["headers"] if k.lower() == "cookie"] == ["a=1; b=2"]
    # its server goes down: elsewhere, with a new cookie (redispatch)
    addr = {a.name: a.address, b.name: b.address, c.name: c.address}[first]
    lb.set_backend_state(addr, "down")
    status, h, body = cl.get("/r/x", headers={"Cookie": f"SERVERID={value}"})
    assert status == 200 and json.loads(body)["name"] != first
    assert h["Set-Cookie"].split(";")[0] != f"SERVERID={value}"
    # an unknown value: balanced as usual, and given a cookie
    status, h, body = cl.get("/r/x", headers={"Cookie": "SERVERID=nobody"})
    assert status == 200 and h["Set-Cookie"].startswith("SERVERID=")
    # hostile Cookie headers: refused or served, never a crash
    status, _, _ = cl.get("/r/x", headers={"Cookie": ";" * 5000 + "SERVERID" + "=" * 3000})
    assert status == 200
    cl.close()
    assert get(port)[0] == 200


def test_policy_config_errors():
    base = {"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]}
    for extra, message in (
        ({"retry_on": ["600"]}, "retry_on"),
        ({"retry_on": "503"}, "retry_on must be a list"),
        ({"slow_start": "fast"}, "slow_start must be a duration"),
        ({"sticky": {"cookie": "a b"}}, "sticky.cookie"),
        ({"sticky": {"mode": "rewrite"}}, "sticky.mode"),
        ({"sticky": {"nocach": True}}, "unknown key(s) in [sticky]: nocach"),
        ({"passive": {"observe": "layer5"}}, "passive.observe"),
        ({"backends": [{"address": "127.0.0.1:1", "cookie": "a;b"}]}, "cookie must be"),
        ({"backends": [{"address": "127.0.0.1:1", "backup": "yes"}]}, "backup"),
        ({"backends": [{"address": "127.0.0.1:1", "cookie": "s"}, {"address": "127.0.0.1:2", "cookie": "s"}]},
         "two servers have the cookie 's'"),
    ):
        with pytest.raises(BalancerConfigError, match=re.escape(message)):
            from_dict({**base, **extra})
    cfg = from_dict({**base, "retry_on": ["all-retryable-errors", 404], "slow_start": "1m",
                     "passive": {"observe": "layer7"}})
    pol = cfg.policy  # what the data plane applies
    assert pol.retry_statuses == (500, 502, 503, 504, 404) and pol.retry_timeout is True
    assert pol.slow_start == (("127.0.0.1:1", 60.0),)
    assert 500 in pol.error_statuses and 501 not in pol.error_statuses
    assert from_dict(base).policy == Policy()
    named = from_dict({"listen": "127.0.0.1:0", "sticky": {"cookie": "S"},
                       "backends": {"a": {"servers": ["127.0.0.1:1"]},
                                    "b": {"servers": ["127.0.0.1:2"], "sticky": False, "retry_on": ["503"]}}})
    pools = {p.name: p.config.policy for p in named.backend_pools()}
    assert pools["a"].sticky is not None and pools["a"].sticky.cookie == "S" and pools["b"].retry_statuses == (503,)
    assert pools["b"].sticky is None
