"""Per-server circuit breaker (sans-I/O: time comes from an injected clock).

States::

    CLOSED ──(N consecutive failures, or failure rate ≥ R over the window
    │         with at least min_requests calls)──▶ OPEN
    OPEN ──(open_timeout elapsed)──▶ HALF_OPEN: up to half_open_probes calls go through
    HALF_OPEN ──(a probe succeeds)──▶ CLOSED (counters reset)
    HALF_OPEN ──(a probe fails)──▶ OPEN (timer restarts)

The caller asks ``allow()`` before a call and reports ``on_success()`` or
``on_failure()`` after it; a call that ends with neither (cancelled) must
call ``on_abandon()`` so that a half-open probe slot is given back.
Only failures of the *server* count (transport errors, timeouts); a service
error is a healthy server answering, and counts as a success.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, kw_only=True)
class BreakerConfig:
    """When a server's breaker opens, and how it closes again. Only transport
    failures and timeouts count: a service error comes from a healthy server."""

    #: open after this many failures in a row; 0 = off
    consecutive_failures: int = 5
    #: open when failures / calls reach this over the last ``window`` seconds; None = off
    failure_rate: float | None = None
    #: seconds over which ``failure_rate`` is measured
    window: float = 10.0
    #: calls seen in the window before ``failure_rate`` applies
    min_requests: int = 20
    #: seconds open before probe calls are let through (half-open)
    open_timeout: float = 5.0
    #: concurrent probe calls when half-open; a successful probe closes the breaker
    half_open_probes: int = 1
    #: the window is counted in this many buckets
    buckets: int = 10

    def __post_init__(self) -> None:
        if self.consecutive_failures < 0:
            raise ValueError("consecutive_failures must be >= 0")
        if self.failure_rate is not None and not 0 < self.failure_rate <= 1:
            raise ValueError("failure_rate must be in (0, 1]")
        if self.consecutive_failures == 0 and self.failure_rate is None:
            raise ValueError("enable consecutive_failures or failure_rate")
        if self.window <= 0 or self.open_timeout < 0 or self.buckets < 1:
            raise ValueError("window and buckets must be > 0, open_timeout >= 0")
        if self.min_requests < 1 or self.half_open_probes < 1:
            raise ValueError("min_requests and half_open_probes must be >= 1")


class CircuitBreaker:
    def __init__(self, config: BreakerConfig | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or BreakerConfig()
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        self._opened_at = 0.0
        self._probes = 0
        self._bucket_width = self.config.window / self.config.buckets
        # ring of (bucket index, calls, failures)
        self._buckets: list[list[int]] = [[-1, 0, 0] for _ in range(self.config.buckets)]
        self.transitions: list[tuple[BreakerState, BreakerState]] = []

    # -- state ------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.config.open_timeout:
            self._set(BreakerState.HALF_OPEN)
        return self._state

    def available(self) -> bool:
        """Whether ``allow()`` would let a call through (does not take a probe slot)."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN:
            return self._probes < self.config.half_open_probes
        return False

    def allow(self) -> bool:
        """Take the right to make one call (a probe slot when half-open)."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and self._probes < self.config.half_open_probes:
            self._probes += 1
            return True
        return False

    def on_success(self) -> None:
        if self._state is BreakerState.HALF_OPEN:
            self._probes = max(0, self._probes - 1)
            self._reset()
            self._set(BreakerState.CLOSED)
            return
        self._consecutive = 0
        self._count(failed=False)

    def on_failure(self) -> None:
        if self._state is BreakerState.HALF_OPEN:
            self._probes = max(0, self._probes - 1)
            self._trip()
            return
        if self._state is BreakerState.OPEN:
            return
        self._consecutive += 1
        calls, failures = self._count(failed=True)
        cfg = self.config
        if cfg.consecutive_failures and self._consecutive >= cfg.consecutive_failures:
            self._trip()
        elif cfg.failure_rate is not None and calls >= cfg.min_requests and failures / calls >= cfg.failure_rate:
            self._trip()

    def on_abandon(self) -> None:
        """The allowed call ended without an outcome (cancelled): free its probe slot."""
        if self._state is BreakerState.HALF_OPEN:
            self._probes = max(0, self._probes - 1)

    # -- internals ----------------------------------------------------------------

    def _set(self, state: BreakerState) -> None:
        if state is not self._state:
            self.transitions.append((self._state, state))
            self._state = state
            if state is BreakerState.HALF_OPEN:
                self._probes = 0

    def _trip(self) -> None:
        self._opened_at = self._clock()
        self._set(BreakerState.OPEN)
        # a re-trip from half-open is a state change to OPEN as well
        self._reset()

    def _reset(self) -> None:
        self._consecutive = 0
        for b in self._buckets:
            b[0], b[1], b[2] = -1, 0, 0

    def _count(self, failed: bool) -> tuple[int, int]:
        """Record one call in the current bucket; return (calls, failures) in the window."""
        idx = math.floor(self._clock() / self._bucket_width)
        bucket = self._buckets[idx % len(self._buckets)]
        if bucket[0] != idx:
            bucket[0], bucket[1], bucket[2] = idx, 0, 0
        bucket[1] += 1
        if failed:
            bucket[2] += 1
        oldest = idx - len(self._buckets) + 1
        calls = failures = 0
        for b in self._buckets:
            if b[0] >= oldest:
                calls += b[1]
                failures += b[2]
        return calls, failures
