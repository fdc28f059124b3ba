"""Rate limiting: per client address and per header, exact across workers,
both request paths, 429 with Retry-After, stats and access log, reloads,
bounded key memory, configuration errors. Real balancers and backends; the
rates are per minute so that no test depends on timing."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from balancer_helpers import lb_config, split_response
from test_access_log import ROOT, wait_lines

from balancer.config import BalancerConfig, BackendConfig, from_dict, load
from balancer.errors import BalancerConfigError
from balancer.ratelimit import RateLimit, parse_rate

pytestmark = pytest.mark.timeout(60)


class Conn:
    """One keep-alive client connection doing requests in turn."""

    def __init__(self, port: int) -> None:
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def request(self, path: str = "/whoami", headers: str = "", body: bytes | None = None,
                chunked: bool = False) -> tuple[int, dict[str, str], bytes]:
        if chunked:
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}Transfer-Encoding: chunked\r\n\r\n"
            data = head.encode() + b"%x\r\n" % len(body or b"") + (body or b"") + b"\r\n0\r\n\r\n"
        else:
            data = f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode()
        self.s.sendall(data)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        status, hdrs, _ = split_response(head + b"\r\n\r\n")
        n = int(hdrs["content-length"])
        while len(rest) < n:
            rest += self._recv()
        self.buf = rest[n:]
        return int(status.split()[1]), hdrs, rest[:n]

    def _recv(self) -> bytes:
        data = self.s.recv(65536)
        assert data, "connection closed"
        return data

    def close(self) -> None:
        self.s.close()


def statuses(port: int, n: int, **kw: object) -> list[int]:
    c = Conn(port)
    try:
        return [c.request(**kw)[0] for _ in range(n)]  # type: ignore[arg-type]
    finally:
        c.close()


def limit(rate: str = "1/m", **kw: object) -> dict[str, object]:
    """A ``[rate_limit]`` table."""
    return {"rate": rate, **kw}


def test_burst_then_429_with_retry_after_on_the_fast_path(backends, proxy):
    b = backends(1)
    lb = proxy(b, rate_limit=limit("1/m", burst=2))
    port = lb.address[1]
    c = Conn(port)
    got = [c.request() for _ in range(6)]
    c.close()
    assert [s for s, _, _ in got] == [200, 200, 200, 429, 429, 429]
    status, headers, body = got[3]
    assert body == b"too many requests\n"
    assert 1 <= int(headers["retry-after"]) <= 60  # one request per minute: back within the minute
    assert "x-backend" not in headers  # the backend was never asked
    st = lb.stats()
    assert st["rate_limited"] == 3 and st["responses"]["4xx"] == 3 and st["requests"] == 6
    from balancer.metrics import exposition, registry_for

    assert b"balancer_rate_limited_total 3.0" in exposition(registry_for(lb.stats))


def test_the_hyper_path_counts_in_the_same_table(backends, proxy):
    b = backends(1)
    lb = proxy(b, rate_limit=limit("1/m", burst=1))
    port = lb.address[1]
    c = Conn(port)
    # a chunked upload goes through hyper; the fast path shares the key
    assert c.request("/echo", body=b"abc", chunked=True)[0] == 200
    assert c.request()[0] == 200
    status, headers, _ = c.request("/echo", body=b"abc", chunked=True)
    c.close()
    assert status == 429 and int(headers["retry-after"]) >= 1
    assert lb.stats()["rate_limited"] == 1


def test_exact_across_workers_and_connections(backends, proxy):
    b = backends(1)
    lb = proxy(b, workers=2, rate_limit=limit("1/m", burst=19))
    port = lb.address[1]
    results: list[int] = []
    lock = threading.Lock()

    def client() -> None:
        got = statuses(port, 10)
        with lock:
            results.extend(got)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 80
    assert results.count(200) == 20 and results.count(429) == 60
    per_worker = [w["requests"] for w in lb.stats().get("workers", [])]
    assert not per_worker or sum(per_worker) == 80


def test_header_key_counts_each_value_and_falls_back_to_the_address(backends, proxy):
    b = backends(1)
    lb = proxy(b, rate_limit=limit("1/m", key="header:X-Api-Key"))
    port = lb.address[1]
    assert statuses(port, 2, headers="X-Api-Key: alice\r\n") == [200, 429]
    assert statuses(port, 2, headers="x-api-key: bob\r\n") == [200, 429]
    assert statuses(port, 2) == [200, 429]  # no header: by client address
    lb2 = proxy(b, rate_limit=limit("1/m", key="header:X-Api-Key", missing="allow"))
    assert statuses(lb2.address[1], 5) == [200] * 5


def test_hostile_keys_stay_within_max_keys(backends, proxy):
    b = backends(1)
    lb = proxy(b, workers=1, rate_limit=limit("1/m", key="header:X-K", max_keys=16))
    port = lb.address[1]
    c = Conn(port)
    assert c.request(headers="X-K: first\r\n")[0] == 200
    assert c.request(headers="X-K: first\r\n")[0] == 429
    for i in range(500):  # many keys, some huge: the oldest are forgotten
        assert c.request(headers=f"X-K: {i}{'x' * (i % 7) * 1000}\r\n")[0] == 200
    assert c.request(headers="X-K: first\r\n")[0] == 200  # evicted: a fresh start
    c.close()


def test_reload_keeps_counts_for_the_same_key_and_applies_the_new_rate(backends, proxy):
    b = backends(1)
    lb = proxy(b, workers=1, rate_limit=limit("1/m"))
    port = lb.address[1]
    assert statuses(port, 2) == [200, 429]
    lb.update(lb_config(b, workers=1, rate_limit=limit("1/m", burst=1)))
    # the key's state stayed: its one request still counts, the burst is new
    assert statuses(port, 2) == [200, 429]
    lb.update(lb_config(b, workers=1, rate_limit=limit("1/m", key="header:X-K")))  # another key: a new table
    assert statuses(port, 2, headers="X-K: a\r\n") == [200, 429]
    lb.update(lb_config(b, workers=1))  # no limit
    assert statuses(port, 3, headers="X-K: a\r\n") == [200] * 3


def test_429_has_an_access_log_line(tmp_path, backends, proxy):
    b = backends(1)
    log = tmp_path / "access.log"
    lb = proxy(b, rate_limit=limit("1/m"), access_log={"path": str(log), "format": "%ST %ts %b %[res.hdr(Retry-After)]"})
    port = lb.address[1]
    assert statuses(port, 2) == [200, 429]
    c = Conn(port)
    assert c.request("/echo", body=b"x", chunked=True)[0] == 429  # hyper's path
    c.close()
    lines = sorted(wait_lines(log, 3))  # two workers: each hands its lines over on its own
    assert lines[0].startswith("200 -- default ")
    assert lines[1:] == ["429 PR - 60", "429 PR - 60"]  # no pool reached; Retry-After: a minute


def test_config_rates_and_errors(tmp_path):
    assert parse_rate("100/s") == (100, 1.0)
    assert parse_rate("10r/s") == (10, 1.0)
    assert parse_rate("600/m") == (600, 60.0)
    assert parse_rate(" 5 / hour ") == (5, 3600.0)
    for bad in ("0/s", "100", "100/d", "-1/s", "1.5/s", 100, "2000000000/s"):
        with pytest.raises(BalancerConfigError, match="rate_limit.rate"):
            parse_rate(bad)
    cfg = from_dict({"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"],
                     "rate_limit": {"rate": "10/s", "burst": 20, "key": "header:X-Api-Key"}})
    limited = cfg.rate_limit
    assert limited is not None and limited.per_period == (10, 1.0)  # as the data plane reads it
    assert (limited.burst, limited.key, limited.missing, limited.max_keys, limited.status, limited.nodelay) == (
        20, "header:X-Api-Key", "src", 100_000, 429, True)
    for table, message in ((
        {"rate": "10/s", "brust": 1}, "unknown key(s) in [rate_limit]: brust"),
        ({"rate": "10/s", "key": "cookie"}, "rate_limit.key"),
        ({"rate": "10/s", "max_keys": 0}, "rate_limit.max_keys"),
        ({"rate": "10/s", "status": 200}, "rate_limit.status"),
        ({"burst": 1}, "rate"),
    ):
        with pytest.raises(BalancerConfigError, match=re.escape(message)):
            from_dict({"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], "rate_limit": table})
    path = tmp_path / "lb.toml"
    path.write_text('listen = "127.0.0.1:0"\nbackends = ["127.0.0.1:1"]\n\n[rate_limit]\nrate = "10/s"\n'
                    'burst = -1\n')
    with pytest.raises(BalancerConfigError, match=r"lb.toml:6: .*rate_limit.burst"):
        load(path)
    assert BalancerConfig(listen="127.0.0.1:0", backends=(BackendConfig(address="127.0.0.1:1"),),
                          rate_limit=RateLimit(rate="1/s")).rate_limit is not None


def test_cli_flag_limits_per_client_address(backends):
    from tests.netutil import free_port, wait_for_port

    b = backends(1)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "balancer", "--listen", f"127.0.0.1:{port}",
                             "--backends", b[0].address, "--workers", "1", "--rate-limit", "1/m"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port, timeout=30)
        assert statuses(port, 3) == [200, 429, 429]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.stderr is not None
        proc.stderr.close()
    bad = subprocess.run([sys.executable, "-m", "cli", "balancer", "--listen", "127.0.0.1:0", "--backends",
                          b[0].address, "--rate-limit", "lots"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "rate_limit.rate" in bad.stderr and "Traceback" not in bad.stderr


def test_a_pool_of_its_own_limit_on_both_paths(backends):
    import rustext

    b = backends(1)
    cfg = from_dict({"listen": "127.0.0.1:0", "workers": 2, "default_backend": "web",
                     "routes": [{"path_prefix": "/api/", "backend": "api"}],
                     "backends": {"web": {"servers": [b[0].address]},
                                  "api": {"servers": [b[0].address],
                                          "rate_limit": {"rate": "1/m", "burst": 1}}}})
    lb = rustext.Balancer(cfg)
    lb.start()
    try:
        port = lb.address[1]
        assert statuses(port, 3, path="/api/x") == [404, 404, 429]  # the backend answers 404 to /api/x
        assert statuses(port, 3) == [200, 200, 200]  # the other pool: no limit
        c = Conn(port)
        status, headers, _ = c.request("/api/echo", body=b"x", chunked=True)  # hyper's path
        c.close()
        assert status == 429 and headers["retry-after"] == "60"
        assert lb.stats()["rate_limited"] == 2
    finally:
        lb.close()
    with pytest.raises(BalancerConfigError, match=r"backends\.api\.rate_limit\.rate"):
        from_dict({"listen": "127.0.0.1:0", "backends": {"api": {"servers": ["127.0.0.1:1"],
                                                                  "rate_limit": {"rate": "fast"}}}})


def route_limited(address: str, login_limit: dict[str, object] | None, pool_limit: dict[str, object] | None = None,
                  extra_routes: tuple[dict[str, object], ...] = ()) -> dict[str, object]:
    """A file with a rate-limited /login route (nginx's limit_req in a location) beside unlimited routes."""
    login: dict[str, object] = {"path": "/login", "backend": "web"}
    if login_limit is not None:
        login["rate_limit"] = login_limit
    pool: dict[str, object] = {"servers": [address]}
    if pool_limit is not None:
        pool["rate_limit"] = pool_limit
    return {"listen": "127.0.0.1:0", "workers": 2, "default_backend": "web",
            "routes": [*extra_routes, login, {"path_prefix": "/old/", "redirect": {"location": "/new/"},
                                              "rate_limit": {"rate": "1/m"}}],
            "backends": {"web": pool}}


def test_a_route_of_its_own_limit_on_both_paths(backends):
    import rustext

    b = backends(1)
    lb = rustext.Balancer(from_dict(route_limited(b[0].address, {"rate": "1/m", "burst": 1})))
    lb.start()
    try:
        port = lb.address[1]
        assert statuses(port, 3, path="/login") == [404, 404, 429]  # the backend answers 404 to /login
        assert statuses(port, 3) == [200, 200, 200]  # other requests to the same pool: not limited
        c = Conn(port)
        status, headers, _ = c.request("/login", body=b"x", chunked=True)  # hyper's path, the same table
        c.close()
        assert status == 429 and headers["retry-after"] == "60"
        # a redirect route with a limit: counted before it answers
        assert statuses(port, 2, path="/old/x") == [302, 429]
        assert lb.stats()["rate_limited"] == 3
    finally:
        lb.close()


def test_route_and_pool_limits_both_count(backends):
    import rustext

    b = backends(1)
    lb = rustext.Balancer(from_dict(route_limited(b[0].address, {"rate": "1/m", "burst": 3},
                                                  pool_limit={"rate": "1/m", "burst": 1})))
    lb.start()
    try:
        port = lb.address[1]
        # the pool's limit (2 requests) is the tighter: /login requests count in both tables
        assert statuses(port, 1, path="/login") == [404]
        assert statuses(port, 2) == [200, 429]
        assert statuses(port, 1, path="/login") == [429]
    finally:
        lb.close()


def test_reload_keeps_a_routes_counts_by_its_conditions(backends):
    import rustext

    b = backends(1)
    lb = rustext.Balancer(from_dict(route_limited(b[0].address, {"rate": "1/m"})))
    lb.start()
    try:
        port = lb.address[1]
        assert statuses(port, 2, path="/login") == [404, 429]
        # a route added before it moves it in the list: same conditions, same counts
        moved = route_limited(b[0].address, {"rate": "1/m"}, extra_routes=({"path": "/other", "backend": "web"},))
        lb.update(from_dict(moved))
        assert statuses(port, 1, path="/login") == [429]
        lb.update(from_dict(route_limited(b[0].address, {"rate": "1/m", "burst": 1})))  # a new burst
        assert statuses(port, 2, path="/login") == [404, 429]
        lb.update(from_dict(route_limited(b[0].address, None)))  # the limit removed
        assert statuses(port, 3, path="/login") == [404] * 3
    finally:
        lb.close()


def test_route_limit_errors_name_the_line(tmp_path):
    path = tmp_path / "lb.toml"
    head = ('listen = "127.0.0.1:0"\ndefault_backend = "web"\n\n[backends.web]\nservers = ["127.0.0.1:1"]\n\n'
            '[[routes]]\npath = "/login"\nbackend = "web"\n')
    for table, message in (('{ rate = "5/x" }', r"lb.toml:10: routes\[0\]\.rate_limit\.rate"),
                           ('{ rate = "5/s", brust = 1 }', r"lb.toml:10: unknown key\(s\) in routes\[0\]\.rate_limit: brust"),
                           ('{ rate = "5/s", status = 200 }', r"lb.toml:10: routes\[0\]\.rate_limit\.status")):
        path.write_text(head + f"rate_limit = {table}\n")
        with pytest.raises(BalancerConfigError, match=message):
            load(path)
    path.write_text(head + '\n[routes.rate_limit]\nrate = "5/s"\nburst = -2\n')
    with pytest.raises(BalancerConfigError, match=r"lb.toml:13: routes\[0\]\.rate_limit\.burst"):
        load(path)
    path.write_text(head + 'rate_limit = { rate = "5/s", burst = 2 }\n')
    assert load(path).routes[0].rate_limit == RateLimit(rate="5/s", burst=2)


def test_delay_mode_holds_early_requests_back_then_refuses(backends, proxy):
    """nginx's limit_req without nodelay (burst=3 delay=1): of six requests at once, two pass, two wait
    their turn at the rate (1 s and 2 s) and are sent on, two are refused."""
    b = backends(1)
    lb = proxy(b, rate_limit=limit("1/s", burst=3, nodelay=False, delay=1))
    port = lb.address[1]
    barrier = threading.Barrier(6)
    results: list[tuple[int, float]] = []
    lock = threading.Lock()

    def one() -> None:
        c = Conn(port)
        try:
            barrier.wait(timeout=10)
            t0 = time.monotonic()
            status = c.request()[0]
            with lock:
                results.append((status, time.monotonic() - t0))
        finally:
            c.close()

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(s for s, _ in results) == [200, 200, 200, 200, 429, 429]
    passed = sorted(d for s, d in results if s == 200)
    assert passed[2] >= 0.5 and passed[3] >= 1.5, passed  # held back about one and two intervals
    st = lb.stats()
    assert st["rate_delayed"] == 2 and st["rate_limited"] == 2


def test_delay_mode_on_hyper_path(backends, proxy):
    b = backends(1)
    lb = proxy(b, rate_limit=limit("1/s", burst=1, nodelay=False))
    c = Conn(lb.address[1])
    try:
        assert c.request()[0] == 200  # passes at once
        t0 = time.monotonic()
        status, _, body = c.request("/echo", body=b"abc", chunked=True)  # hyper's path: waits its turn
        assert (status, body) == (200, b"abc") and time.monotonic() - t0 >= 0.5
    finally:
        c.close()
    assert lb.stats()["rate_delayed"] == 1


def test_delay_settings_are_checked():
    assert RateLimit(rate="10/s", burst=5, nodelay=False, delay=2).delay == 2
    assert RateLimit(rate="10/s", burst=5).nodelay is True  # the default: nothing waits
    for kw, message in (({"delay": 2}, "delay applies with nodelay = false"),
                        ({"nodelay": False, "delay": -1}, "rate_limit.delay"),
                        ({"nodelay": "no"}, "rate_limit.nodelay")):
        with pytest.raises(BalancerConfigError, match=re.escape(message)):
            RateLimit(rate="10/s", **kw)  # type: ignore[arg-type]
