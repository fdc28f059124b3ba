"""Failures and changes under load: kills, retries, ejection, limits, reloads."""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from balancer_helpers import lb_config, pattern
from tests.netutil import free_port


def wait_until(cond, timeout: float = 10.0) -> None:
    """Poll an observable state (bounded)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


class Load:
    """Client threads doing keep-alive GETs until stopped; records every outcome."""

    def __init__(self, port: int, threads: int = 6, path: str = "/size/1024", size: int = 1024) -> None:
        self.port, self.path, self.size = port, path, size
        self.ok = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.progress = threading.Condition()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stop.is_set():
            try:
                c.request("GET", self.path)
                r = c.getresponse()
                body = r.read()
                good = r.status == 200 and body == pattern(self.size)
                with self._lock:
                    if good:
                        self.ok += 1
                    else:
                        self.errors.append(f"{r.status} {len(body)}")
                with self.progress:
                    self.progress.notify_all()
            except (OSError, http.client.HTTPException) as exc:
                with self._lock:
                    self.errors.append(repr(exc))
                c.close()
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.close()

    def wait_for(self, n: int) -> None:
        """Block until `n` more requests succeeded (bounded)."""
        target = self.ok + n
        with self.progress:
            assert self.progress.wait_for(lambda: self.ok >= target or self.errors, timeout=60)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=30)


def test_backend_killed_mid_run_no_client_visible_failure(backends, proxy):
    bks = backends(4)
    lb = proxy(bks, retries=3, passive={"eject_after": 2, "cooldown": 30})
    with Load(lb.address[1]) as load:
        load.wait_for(300)
        bks[1].kill()
        load.wait_for(600)
    assert load.errors == []
    st = {b["name"]: b for b in lb.backends()}
    assert st[bks[1].address]["state"] == "ejected"
    assert st[bks[1].address]["failures"] >= 1


def test_retry_to_next_backend_on_connect_failure(backends, proxy):
    alive = backends(1)[0]
    dead = f"127.0.0.1:{free_port()}"
    lb = proxy([dead, alive.address], retries=1, passive={"eject_after": 0}, workers=1)
    c = http.client.HTTPConnection("127.0.0.1", lb.address[1], timeout=10)
    for _ in range(10):
        c.request("GET", "/whoami")
        r = c.getresponse()
        assert (r.status, r.read()) == (200, b"b0")
    c.close()
    assert lb.stats()["retries"] >= 5
    # A POST with a body is never replayed: it gets the backend's answer or a
    # 502 (and the connection is closed, its body having been consumed).
    for _ in range(4):
        c = http.client.HTTPConnection("127.0.0.1", lb.address[1], timeout=10)
        c.request("POST", "/echo", body=b"abc")
        r = c.getresponse()
        assert (r.status, r.read()) in ((200, b"abc"), (502, b"backend unavailable\n"))
        c.close()


def test_drained_backend_gets_no_new_requests_and_in_flight_finishes(backends, proxy):
    b = backends(2)
    lb = proxy(b, workers=1)
    port = lb.address[1]
    with ThreadPoolExecutor(1) as pool:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/whoami")  # b0 next is b1
        assert c.getresponse().read() == b"b0"
        slow = pool.submit(lambda: _get(port, "/slow?ms=500"))  # goes to b1
        wait_until(lambda: {x["name"]: x["active"] for x in lb.backends()}[b[1].address] == 1)
        lb.set_backend_state(b[1].address, "drain")
        for _ in range(10):
            c.request("GET", "/whoami")
            assert c.getresponse().read() == b"b0"
        c.close()
        assert slow.result(timeout=10) == (200, b"b1")
    assert {x["name"]: x["state"] for x in lb.backends()}[b[1].address] == "drain"


def _get(port: int, path: str) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_max_connections_queue_then_503(backends, proxy):
    b = backends(1)
    lb = proxy([{"address": b[0].address, "max_connections": 1}], timeouts={"queue": 10})
    with ThreadPoolExecutor(4) as pool:
        res = list(pool.map(lambda _: _get(lb.address[1], "/slow?ms=100"), range(4)))
    assert res == [(200, b"b0")] * 4  # queued, not refused
    lb.update(lb_config([{"address": b[0].address, "max_connections": 1}], timeouts={"queue": 0.2}))
    with ThreadPoolExecutor(2) as pool:
        res = list(pool.map(lambda _: _get(lb.address[1], "/slow?ms=2000")[0], range(2)))
    assert sorted(res) == [200, 503]


def test_update_under_load_drops_nothing(backends, proxy):
    b = backends(4)
    lb = proxy(b[:2])
    configs = [
        lb_config([b[0], b[1], b[2]]),
        lb_config([{"address": b[2].address, "weight": 3}, b[3]], algorithm="weighted_round_robin"),
        lb_config([b[1], b[3]], algorithm="least_connections"),
        lb_config([b[0], b[1], b[2], b[3]], algorithm="random_two"),
    ]
    with Load(lb.address[1], threads=6) as load:
        for cfg in configs * 3:
            load.wait_for(100)
            lb.update(cfg)
        load.wait_for(100)
    assert load.errors == []
    assert lb.stats()["algorithm"] == "random_two"


def test_invalid_update_keeps_running_config(backends, proxy):
    import pytest

    import rustext

    b = backends(2)
    lb = proxy(b)
    for bad in (  # refused by balancer.config, before the data plane sees them
        {"backends": ["nonsense"]},
        {"backends": [b[0].address, b[0].address]},
        {"backends": [b[0].address], "algorithm": "fastest"},
        {"backends": [b[0].address], "retries": -1},
    ):
        with pytest.raises(rustext.BalancerConfigError):
            lb.update(lb_config(**bad))
    # a name that does not resolve: only the data plane finds out
    with pytest.raises(rustext.BalancerConfigError, match="no-such-host.invalid"):
        lb.update(lb_config(["no-such-host.invalid:80"]))
    assert Counter(_get(lb.address[1], "/whoami")[1] for _ in range(4)) == {b"b0": 2, b"b1": 2}


def test_drain_finishes_in_flight_then_stops(backends, proxy):
    b = backends(1)
    lb = proxy(b)
    port = lb.address[1]
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(_get, port, "/slow?ms=500")
        wait_until(lambda: lb.backends()[0]["active"] == 1)
        lb.drain(10)
        assert slow.result(timeout=10) == (200, b"b0")
    assert not lb.is_running
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        refused = False
    except OSError:
        refused = True
    assert refused


def test_response_timeout_is_504_and_counts_from_end_of_upload(backends, proxy):
    b = backends(1)
    lb = proxy(b, timeouts={"response": 0.5}, passive={"eject_after": 0})
    assert _get(lb.address[1], "/slow?ms=3000")[0] == 504
    assert lb.stats()["timeouts"] == 1

    # An upload slower than the response timeout still succeeds.
    block = pattern(256 * 1024)

    def slow_body():
        for _ in range(8):
            yield block
            time.sleep(0.2)  # a slow client: 1.6 s of upload against a 0.5 s timeout

    c = http.client.HTTPConnection("127.0.0.1", lb.address[1], timeout=30)
    c.request("POST", "/echo", body=slow_body(), headers={"Content-Length": str(8 * len(block))})
    r = c.getresponse()
    assert r.status == 200 and r.read() == block * 8
    c.close()


def test_client_abort_is_not_a_backend_failure(backends, proxy):
    import socket

    b = backends(1)
    lb = proxy(b, passive={"eject_after": 1})
    with socket.create_connection(("127.0.0.1", lb.address[1]), timeout=10) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 100_000)
        wait_until(lambda: lb.backends()[0]["active"] == 1)
    wait_until(lambda: lb.backends()[0]["active"] == 0)
    assert lb.backends()[0]["failures"] == 0
    assert lb.backends()[0]["state"] == "up"
    assert _get(lb.address[1], "/whoami") == (200, b"b0")


def test_total_timeout_bounds_the_exchange(backends, proxy):
    b = backends(1)
    lb = proxy(b, timeouts={"total": 0.5, "response": 30}, passive={"eject_after": 0})
    assert _get(lb.address[1], "/slow?ms=3000")[0] == 504
    assert _get(lb.address[1], "/size/1000") == (200, pattern(1000))
