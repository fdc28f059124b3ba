"""Selectors: distribution, stability, exclusion, and consistent hashing's
minimal remapping (measured)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rpc.selector import (
    ConsistentHashSelector,
    FunctionSelector,
    LatencySelector,
    RandomSelector,
    RoundRobinSelector,
    WeightedRoundRobinSelector,
    make_selector,
    parse_metadata,
    weight_of,
)

S3 = {"tcp@a:1": "", "tcp@b:1": "", "tcp@c:1": ""}


def picks(sel, n: int, exclude=()) -> Counter:
    return Counter(sel.select("Svc", "M", b"", exclude) for _ in range(n))


def test_metadata() -> None:
    assert parse_metadata("weight=3&group=x") == {"weight": "3", "group": "x"}
    assert weight_of("weight=3") == 3 and weight_of("") == 1 and weight_of("weight=x") == 1
    assert weight_of("weight=-2") == 0


def test_random_uniform_and_exclusion() -> None:
    sel = RandomSelector(random.Random(1))
    sel.update_servers(S3)
    c = picks(sel, 30000)
    assert set(c) == set(S3)
    for n in c.values():
        assert abs(n - 10000) < 600
    assert set(picks(sel, 200, exclude={"tcp@a:1"})) == {"tcp@b:1", "tcp@c:1"}
    assert sel.select("S", "M", b"", set(S3)) is None
    sel.update_servers({})
    assert sel.select("S", "M", b"") is None


def test_inactive_servers_are_skipped() -> None:
    sel = RoundRobinSelector()
    sel.update_servers({"tcp@a:1": "state=inactive", "tcp@b:1": ""})
    assert set(picks(sel, 10)) == {"tcp@b:1"}


def test_round_robin_cycles_exactly() -> None:
    sel = RoundRobinSelector()
    sel.update_servers(S3)
    seq = [sel.select("S", "M", b"") for _ in range(9)]
    assert seq == ["tcp@a:1", "tcp@b:1", "tcp@c:1"] * 3
    seq = [sel.select("S", "M", b"", {"tcp@b:1"}) for _ in range(4)]
    assert "tcp@b:1" not in seq and Counter(seq) == Counter({"tcp@a:1": 2, "tcp@c:1": 2})


def test_smooth_weighted_round_robin() -> None:
    sel = WeightedRoundRobinSelector()
    sel.update_servers({"a": "weight=5", "b": "weight=1", "c": "weight=1", "z": "weight=0"})
    seq = [sel.select("S", "M", b"") for _ in range(7)]
    assert seq == ["a", "a", "b", "a", "c", "a", "a"]  # nginx's smooth sequence
    c = picks(sel, 7000)
    assert c == Counter({"a": 5000, "b": 1000, "c": 1000})  # exact per period, z gets none
    c = picks(sel, 600, exclude={"a"})
    assert c == Counter({"b": 300, "c": 300})
    sel.update_servers({"a": "weight=1", "b": "weight=3"})
    assert picks(sel, 400) == Counter({"a": 100, "b": 300})


def test_latency_weighted_by_rtt() -> None:
    sel = LatencySelector(alpha=1.0)
    sel.update_servers(S3)
    # unmeasured servers first get equal (max) weight: everyone gets measured
    assert set(picks(sel, 3)) == set(S3)
    for addr, rtt in (("tcp@a:1", 0.001), ("tcp@b:1", 0.002), ("tcp@c:1", 0.004)):
        sel.observe(addr, rtt)
    c = picks(sel, 1750)
    assert c == Counter({"tcp@a:1": 1000, "tcp@b:1": 500, "tcp@c:1": 250})
    sel.observe("tcp@zzz:1", 0.0001)  # unknown servers are ignored
    assert "tcp@zzz:1" not in sel.rtt


def test_latency_ewma_and_least_mode() -> None:
    sel = LatencySelector("least", alpha=0.5)
    sel.update_servers(S3)
    sel.observe("tcp@a:1", 0.010)
    sel.observe("tcp@b:1", 0.002)
    assert sel.select("S", "M", b"") == "tcp@c:1"  # not measured yet: probe it
    sel.observe("tcp@c:1", 0.005)
    assert picks(sel, 20) == Counter({"tcp@b:1": 20})
    sel.observe("tcp@b:1", 0.020)  # ewma 0.011 now
    assert sel.rtt["tcp@b:1"] == pytest.approx(0.011)
    assert sel.select("S", "M", b"") == "tcp@c:1"
    assert sel.select("S", "M", b"", {"tcp@c:1"}) == "tcp@a:1"
    sel.update_servers({"tcp@a:1": ""})
    assert set(sel.rtt) == {"tcp@a:1"}


def keys(n: int) -> list[bytes]:
    return [f"user-{i}".encode() for i in range(n)]


def assignment(sel: ConsistentHashSelector, ks: list[bytes]) -> dict[bytes, str]:
    return {k: sel.select("Svc", "Get", k) for k in ks}


TEN_SERVERS = {f"tcp@10.0.0.{i}:8972": "" for i in range(10)}


def ring(servers: dict[str, str]) -> ConsistentHashSelector:
    """A consistent-hash selector over ``servers``."""
    sel = ConsistentHashSelector()
    sel.update_servers(servers)
    return sel


def test_consistent_hash_stable_and_balanced() -> None:
    sel = ring(TEN_SERVERS)
    ks = keys(20000)
    first = assignment(sel, ks)
    assert assignment(sel, ks) == first  # stable
    other = ring(dict(reversed(list(TEN_SERVERS.items()))))
    assert assignment(other, ks) == first  # independent of discovery order
    load = Counter(first.values())
    assert len(load) == 10
    assert max(load.values()) < 2000 * 1.35 and min(load.values()) > 2000 * 0.65
    # the method takes part in the key
    assert sum(sel.select("Svc", "Put", k) != first[k] for k in ks[:2000]) > 1000


def test_consistent_hash_minimal_remapping() -> None:
    servers = TEN_SERVERS
    sel = ring(servers)
    ks = keys(20000)
    before = assignment(sel, ks)

    removed = "tcp@10.0.0.3:8972"
    sel.update_servers({a: m for a, m in servers.items() if a != removed})
    after = assignment(sel, ks)
    moved = [k for k in ks if after[k] != before[k]]
    assert all(before[k] == removed for k in moved)  # only the removed server's keys move
    assert len(moved) == sum(1 for k in ks if before[k] == removed)
    assert len(moved) / len(ks) < 0.15  # ~1/10

    added = "tcp@10.0.0.99:8972"
    sel.update_servers({**servers, added: ""})
    grown = assignment(sel, ks)
    moved = [k for k in ks if grown[k] != before[k]]
    assert moved and all(grown[k] == added for k in moved)  # keys only move to the new server
    assert len(moved) / len(ks) < 0.15  # ~1/11

    # excluding a server picks what removing it would
    sel.update_servers(servers)
    for k in ks[:3000]:
        assert sel.select("Svc", "Get", k, {removed}) == after[k]
    assert sel.select("Svc", "Get", b"x", set(servers)) is None


def test_consistent_hash_custom_key() -> None:
    sel = ConsistentHashSelector(key=lambda s, m, p: p[:4])
    sel.update_servers(S3)
    assert sel.select("A", "x", b"abcd-1") == sel.select("B", "y", b"abcd-2")


def test_function_selector() -> None:
    def prefer_b(servers, service, method, payload, exclude):
        return "tcp@b:1" if "tcp@b:1" not in exclude else min(a for a in servers if a not in exclude)

    sel = FunctionSelector(prefer_b)
    sel.update_servers(S3)
    assert picks(sel, 5) == Counter({"tcp@b:1": 5})
    assert sel.select("S", "M", b"", {"tcp@b:1"}) == "tcp@a:1"
    bad = FunctionSelector(lambda *a: "tcp@nowhere:1")
    bad.update_servers(S3)
    assert bad.select("S", "M", b"") is None


def test_make_selector() -> None:
    assert isinstance(make_selector("round_robin"), RoundRobinSelector)
    assert isinstance(make_selector("ConsistentHash"), ConsistentHashSelector)
    assert make_selector("leastlatency").mode == "least"
    with pytest.raises(ValueError):
        make_selector("geo")
