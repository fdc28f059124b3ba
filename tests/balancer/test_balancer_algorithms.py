"""Each algorithm's distribution, observed through the real proxy."""

from __future__ import annotations

import http.client
from collections import Counter
from concurrent.futures import ThreadPoolExecutor


def who(port: int, n: int, path: str = "/whoami", headers_for=None) -> list[str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    try:
        for i in range(n):
            c.request("GET", path if "{" not in path else path.format(i=i), headers=headers_for(i) if headers_for else {})
            r = c.getresponse()
            assert r.status == 200
            out.append(r.read().decode())
    finally:
        c.close()
    return out


def test_round_robin_even(backends, proxy):
    lb = proxy(backends(4), algorithm="round_robin")
    assert Counter(who(lb.address[1], 400)) == {"b0": 100, "b1": 100, "b2": 100, "b3": 100}


def test_smooth_weighted_round_robin(backends, proxy):
    b = backends(3)
    lb = proxy([{"address": b[0].address, "weight": 5}, {"address": b[1].address, "weight": 1},
                {"address": b[2].address, "weight": 1}], algorithm="weighted_round_robin")
    seq = who(lb.address[1], 70)
    assert Counter(seq) == {"b0": 50, "b1": 10, "b2": 10}
    # smooth (a a b a c a a, repeated): never all five of b0 in a row
    runs = max(len(r) for r in "".join("x" if s == "b0" else "." for s in seq).split("."))
    assert runs <= 4


def test_weight_zero_takes_nothing_and_weights_change_live(backends, proxy):
    b = backends(2)
    lb = proxy([{"address": b[0].address, "weight": 1}, {"address": b[1].address, "weight": 0}],
               algorithm="weighted_round_robin")
    assert set(who(lb.address[1], 20)) == {"b0"}
    lb.set_backend_weight(b[1].address, 3)
    assert Counter(who(lb.address[1], 40)) == {"b0": 10, "b1": 30}


def test_least_connections_spreads_in_flight(backends, proxy):
    lb = proxy(backends(2), algorithm="least_connections", workers=1)
    with ThreadPoolExecutor(16) as pool:
        res = list(pool.map(lambda i: who(lb.address[1], 1, "/slow?ms=300")[0], range(16)))
    c = Counter(res)
    assert c["b0"] >= 5 and c["b1"] >= 5, c


def test_random_two_choices_uses_all(backends, proxy):
    lb = proxy(backends(4), algorithm="random_two")
    c = Counter(who(lb.address[1], 400))
    assert len(c) == 4 and min(c.values()) > 40, c


def test_consistent_hash_on_header_is_sticky_and_minimal(backends, proxy):
    lb = proxy(backends(4), algorithm="consistent_hash", hash_key="header:X-User")
    port = lb.address[1]
    users = lambda i: {"X-User": f"user-{i % 200}"}  # noqa: E731
    first = who(port, 200, headers_for=users)
    again = who(port, 200, headers_for=users)
    assert first == again
    assert len(set(first)) == 4
    gone = lb.backends()[1]["name"]
    lb.set_backend_state(gone, "down")
    after = who(port, 200, headers_for=users)
    for before, now in zip(first, after, strict=True):
        if before != "b1":
            assert now == before  # only the lost backend's keys move
        else:
            assert now != "b1"


def test_consistent_hash_on_path(backends, proxy):
    lb = proxy(backends(3), algorithm="consistent_hash", hash_key="path")
    port = lb.address[1]
    a = who(port, 60, path="/slow?ms=0&k={i}")
    # the query is part of the path key only through the path: all share "/slow"
    assert len(set(a)) == 1


def test_consistent_hash_on_client_ip(backends, proxy):
    lb = proxy(backends(3), algorithm="consistent_hash", hash_key="client_ip")
    assert len(set(who(lb.address[1], 30))) == 1
