"""Server selectors: which server of a service takes the next call.

A selector holds the current servers (address → rpcx metadata string such as
``"weight=3&group=a"``), updated by discovery through ``update_servers``, and
answers ``select(service, method, payload, exclude)`` with an address, or
None when no server is left after ``exclude`` (servers already tried by a
fail mode, or with an open circuit breaker). Selectors that learn from calls
also define ``observe(address, rtt_seconds)``.

- ``RandomSelector``               uniform
- ``RoundRobinSelector``           in turn
- ``WeightedRoundRobinSelector``   smooth weighted round robin (nginx's), weight from ``weight=``
- ``LatencySelector``              by measured round-trip time: weighted by 1/RTT, or least RTT
- ``ConsistentHashSelector``       hash ring over (service, method, payload): a server change
                                   moves only the keys of that server
- ``FunctionSelector``             user-defined: a function of (servers, service, method, payload, exclude)

Any object with ``update_servers`` and ``select`` is a selector (``Selector``).
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections.abc import Callable, Collection, Mapping
from typing import Protocol, runtime_checkable
from urllib.parse import parse_qsl

__all__ = [
    "ConsistentHashSelector",
    "FunctionSelector",
    "LatencySelector",
    "RandomSelector",
    "RoundRobinSelector",
    "Selector",
    "WeightedRoundRobinSelector",
    "make_selector",
    "parse_metadata",
    "weight_of",
]


@runtime_checkable
class Selector(Protocol):
    def update_servers(self, servers: Mapping[str, str]) -> None: ...

    def select(self, service: str, method: str, payload: bytes, exclude: Collection[str] = ()) -> str | None: ...


def parse_metadata(metadata: str) -> dict[str, str]:
    """rpcx server metadata (URL query form, ``weight=3&state=active``) → dict."""
    if not metadata:
        return {}
    return dict(parse_qsl(metadata, keep_blank_values=True))


def weight_of(metadata: str, default: int = 1) -> int:
    """``weight=`` of the metadata; ``default`` when absent or invalid; never negative."""
    raw = parse_metadata(metadata).get("weight")
    if raw is None:
        return default
    try:
        return max(0, int(raw))
    except ValueError:
        return default


def _usable(servers: Mapping[str, str]) -> list[str]:
    # rpcx lets an operator disable a server through metadata "state=inactive"
    return sorted(a for a, m in servers.items() if parse_metadata(m).get("state") != "inactive")


class RandomSelector:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._servers: list[str] = []

    def update_servers(self, servers: Mapping[str, str]) -> None:
        self._servers = _usable(servers)

    def select(self, service: str, method: str, payload: bytes, exclude: Collection[str] = ()) -> str | None:
        candidates = [s for s in self._servers if s not in exclude] if exclude else self._servers
        if not candidates:
            return None
        return candidates[self._rng.randrange(len(candidates))]


class RoundRobinSelector:
    def __init__(self) -> None:
        self._servers: list[str] = []
        self._next = 0

    def update_servers(self, servers: Mapping[str, str]) -> None:
        self._servers = _usable(servers)

    def select(self, service: str, method: str, payload: bytes, exclude: Collection[str] = ()) -> str | None:
        servers = self._servers
        n = len(servers)
        for _ in range(n):
            addr = servers[self._next % n]
            self._next = (self._next + 1) % n
            if addr not in exclude:
                return addr
        return None


class _SmoothWeighted:
    """Smooth weighted round robin (nginx): each pick adds every weight to its
    server's current value, takes the largest, and subtracts the total from it.
    Over any ``sum(weights)`` picks each server gets exactly its weight, spread out."""

    def __init__(self) -> None:
        self.weights: dict[str, int] = {}
        self.current: dict[str, int] = {}

    def set_weights(self, weights: Mapping[str, int]) -> None:
        self.weights = {a: w for a, w in sorted(weights.items()) if w > 0}
        self.current = {a: self.current.get(a, 0) for a in self.weights}

    def pick(self, exclude: Collection[str]) -> str | None:
        best = None
        best_cur = 0
        total = 0
        current = self.current
        for addr, w in self.weights.items():
            if exclude and addr in exclude:
                continue
            cur = current[addr] + w
            current[addr] = cur
            total += w
            if best is None or cur > best_cur:
                best, best_cur = addr, cur
        if best is not None:
            current[best] -= total
        return best


class WeightedRoundRobinSelector:
    """Smooth weighted round robin; weight from server metadata ``weight=`` (default 1, 0 = no traffic)."""

    def __init__(self) -> None:
        self._swrr = _SmoothWeighted()

    def update_servers(self, servers: Mapping[str, str]) -> None:
        self._swrr.set_weights({a: weight_of(servers[a]) for a in _usable(servers)})

    def select(self, service: str, method: str, payload: bytes, exclude: Collection[str] = ()) -> str | None:
        return self._swrr.pick(exclude)

    @property
    def weights(self) -> dict[str, int]:
        return dict(self._swrr.weights)


class LatencySelector:
    """Select by measured round-trip time (an exponentially weighted average of
    the call times reported through ``observe``).

    ``mode="weighted"`` (rpcx's ping-weighted selector): smooth weighted round
    robin with weight ∝ 1/RTT (the fastest server gets ``max_weight``).
    ``mode="least"``: always the lowest average RTT. A server not measured yet
    counts as the fastest, so that every server gets measured.
    """

    def __init__(self, mode: str = "weighted", *, alpha: float = 0.3, max_weight: int = 100) -> None:
        if mode not in ("weighted", "least"):
            raise ValueError("mode must be 'weighted' or 'least'")
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self.mode = mode
        self.alpha = alpha
        self.max_weight = max_weight
        self._servers: list[str] = []
        self.rtt: dict[str, float] = {}
        self._swrr = _SmoothWeighted()
        self._dirty = True

    def update_servers(self, servers: Mapping[str, str]) -> None:
        self._servers = _usable(servers)
        self.rtt = {a: r for a, r in self.rtt.items() if a in servers}
        self._dirty = True

    def observe(self, address: str, rtt: float) -> None:
        if address not in self._servers or rtt < 0:
            return
        old = self.rtt.get(address)
        self.rtt[address] = rtt if old is None else old + self.alpha * (rtt - old)
        self._dirty = True

    def _reweight(self) -> None:
        measured = [self.rtt[a] for a in self._servers if a in self.rtt]
        best = min(measured) if measured else 0.0
        weights = {}
        for a in self._servers:
            r = self.rtt.get(a)
            if r is None or r <= 0 or best <= 0:
                weights[a] = self.max_weight
            else:
                weights[a] = max(1, round(self.max_weight * best / r))
        self._swrr.set_weights(weights)
        self._dirty = False

    def select(self, service: str, method: str, payload: bytes, exclude: Collection[str] = ()) -> str | None:
        if self.mode == "least":
            best = None
            best_rtt = 0.0
            for a in self._servers:
                if a in exclude:
                    continue
                r = self.rtt.get(a, 0.0)
                if best is None or r < best_rtt:
                    best, best_rtt = a, r
            return best
        if self._dirty:
            self._reweight()
        return self._swrr.pick(exclude)


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class ConsistentHashSelector:
    """A hash ring with ``replicas`` virtual nodes per server; the key is
    (service, method, payload) unless ``key`` gives another one.

    Adding or removing a server moves only the keys that land on it: the rest
    keep their server. With ``exclude``, the ring is walked clockwise to the
    next allowed server (the same as if the excluded ones were removed).
    """

    def __init__(self, replicas: int = 160, key: Callable[[str, str, bytes], bytes] | None = None) -> None:
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        self.replicas = replicas
        self._key = key
        self._ring: list[int] = []
        self._owners: list[str] = []
        self._servers: frozenset[str] = frozenset()

    def update_servers(self, servers: Mapping[str, str]) -> None:
        usable = frozenset(_usable(servers))
        if usable == self._servers:
            return
        points: list[tuple[int, str]] = []
        for addr in usable:
            for i in range(self.replicas):
                points.append((_hash64(f"{addr}#{i}".encode()), addr))
        points.sort()
        self._ring = [p for p, _ in points]
        self._owners = [a for _, a in points]
        self._servers = usable

    def key_of(self, service: str, method: str, payload: bytes) -> bytes:
        if self._key is not None:
            return self._key(service, method, payload)
        return b"%s\x00%s\x00%s" % (service.encode(), method.encode(), payload)

    def select(self, service: str, method: str, payload: bytes, exclude: Collection[str] = ()) -> str | None:
        ring = self._ring
        if not ring:
            return None
        h = _hash64(self.key_of(service, method, payload))
        i = bisect.bisect_left(ring, h)
        n = len(ring)
        owners = self._owners
        if not exclude:
            return owners[i % n]
        if all(s in exclude for s in self._servers):
            return None
        for j in range(n):
            addr = owners[(i + j) % n]
            if addr not in exclude:
                return addr
        return None


SelectFn = Callable[[Mapping[str, str], str, str, bytes, Collection[str]], "str | None"]


class FunctionSelector:
    """User-defined selection: ``fn(servers, service, method, payload, exclude)``
    returns an address (or None); ``servers`` maps address → metadata."""

    def __init__(self, fn: SelectFn) -> None:
        self._fn = fn
        self._servers: dict[str, str] = {}

    def update_servers(self, servers: Mapping[str, str]) -> None:
        self._servers = dict(servers)

    def select(self, service: str, method: str, payload: bytes, exclude: Collection[str] = ()) -> str | None:
        addr = self._fn(self._servers, service, method, payload, exclude)
        if addr is not None and (addr not in self._servers or addr in exclude):
            return None
        return addr


def make_selector(name: str) -> Selector:
    """A selector by name: random, roundrobin, weighted, latency, leastlatency, consistenthash."""
    factories: dict[str, Callable[[], Selector]] = {
        "random": RandomSelector,
        "roundrobin": RoundRobinSelector,
        "weighted": WeightedRoundRobinSelector,
        "latency": LatencySelector,
        "leastlatency": lambda: LatencySelector("least"),
        "consistenthash": ConsistentHashSelector,
    }
    try:
        return factories[name.replace("_", "").replace("-", "").lower()]()
    except KeyError:
        raise ValueError(f"unknown selector {name!r} ({', '.join(factories)})") from None
