"""Circuit breaker transitions under a controlled clock."""

from __future__ import annotations

import pytest

from rpc.breaker import BreakerConfig, BreakerState, CircuitBreaker

CLOSED, OPEN, HALF = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_consecutive_failures_open_then_half_open_probe_closes() -> None:
    clock = Clock()
    b = CircuitBreaker(BreakerConfig(consecutive_failures=3, open_timeout=5), clock=clock)
    for _ in range(2):
        assert b.allow()
        b.on_failure()
    b.on_success()  # resets the run
    for _ in range(2):
        b.on_failure()
    assert b.state is CLOSED
    b.on_failure()
    assert b.state is OPEN and not b.allow() and not b.available()
    clock.t += 4.9
    assert b.state is OPEN
    clock.t += 0.1
    assert b.state is HALF and b.available()
    assert b.allow()  # the one probe
    assert not b.allow() and not b.available()  # no second concurrent probe
    b.on_success()
    assert b.state is CLOSED and b.allow()
    assert b.transitions == [(CLOSED, OPEN), (OPEN, HALF), (HALF, CLOSED)]


def test_failed_probe_reopens_with_a_new_timer() -> None:
    clock = Clock()
    b = CircuitBreaker(BreakerConfig(consecutive_failures=1, open_timeout=2), clock=clock)
    b.on_failure()
    clock.t += 2
    assert b.allow()
    b.on_failure()
    assert b.state is OPEN
    clock.t += 1.9
    assert b.state is OPEN
    clock.t += 0.1
    assert b.state is HALF
    assert b.transitions == [(CLOSED, OPEN), (OPEN, HALF), (HALF, OPEN), (OPEN, HALF)]


def test_abandoned_probe_frees_its_slot() -> None:
    clock = Clock()
    b = CircuitBreaker(BreakerConfig(consecutive_failures=1, open_timeout=1), clock=clock)
    b.on_failure()
    clock.t += 1
    assert b.allow() and not b.allow()
    b.on_abandon()
    assert b.allow()


def test_failure_rate_over_window() -> None:
    clock = Clock()
    cfg = BreakerConfig(consecutive_failures=0, failure_rate=0.5, window=10, min_requests=10, open_timeout=1)
    b = CircuitBreaker(cfg, clock=clock)
    # 9 calls, 8 failures: below min_requests, stays closed (alternating so no run matters)
    for i in range(9):
        (b.on_failure if i % 9 else b.on_success)()
    assert b.state is CLOSED
    b.on_success()  # 10 calls, 8 failures, but the check runs on failures
    b.on_failure()  # 11 calls, 9 failures: ≥ 50%
    assert b.state is OPEN


def test_failure_rate_forgets_old_buckets() -> None:
    clock = Clock()
    cfg = BreakerConfig(consecutive_failures=0, failure_rate=0.5, window=10, min_requests=4, open_timeout=1)
    b = CircuitBreaker(cfg, clock=clock)
    for _ in range(3):
        b.on_failure()
    clock.t += 11  # the failures left the window
    for _ in range(5):
        b.on_success()
    b.on_failure()  # 1 of 6 in the window
    assert b.state is CLOSED
    for _ in range(4):
        b.on_failure()  # 5 of 10
    assert b.state is OPEN


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        BreakerConfig(consecutive_failures=0)
    with pytest.raises(ValueError):
        BreakerConfig(failure_rate=1.5)
    with pytest.raises(ValueError):
        BreakerConfig(half_open_probes=0)
