"""rustext.backoff: delays grow, are capped, are jittered within bounds, reset."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rustext.backoff import Backoff, BackoffPolicy


def test_without_jitter_delays_double_then_stay_at_the_cap() -> None:
    b = Backoff(BackoffPolicy(initial=0.1, maximum=1.0, factor=2.0, jitter=0))
    assert [b.next_delay() for _ in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    b.reset()
    assert b.next_delay() == pytest.approx(0.1)


@given(
    initial=st.floats(0.001, 10),
    spread=st.floats(1, 100),
    factor=st.floats(1, 10),
    jitter=st.floats(0, 1),
    attempt=st.integers(1, 5000),
    seed=st.integers(0, 2**32),
)
def test_every_delay_lies_within_the_jitter_band_and_under_the_cap(
    initial: float, spread: float, factor: float, jitter: float, attempt: int, seed: int
) -> None:
    policy = BackoffPolicy(initial=initial, maximum=initial * spread, factor=factor, jitter=jitter)
    delay = policy.delay(attempt, random.Random(seed))
    capped = (attempt - 1) * math.log(factor) >= math.log(policy.maximum / initial)
    base = policy.maximum if capped else initial * factor ** (attempt - 1)
    assert delay <= policy.maximum * (1 + 1e-9)
    assert delay >= base * (1 - jitter) * (1 - 1e-9)


def test_jitter_spreads_delays_of_the_same_attempt() -> None:
    policy = BackoffPolicy(initial=1.0, maximum=1.0, jitter=0.5)
    rng = random.Random(7)
    delays = {round(policy.delay(1, rng), 6) for _ in range(50)}
    assert len(delays) > 40
    assert min(delays) >= 0.5 and max(delays) <= 1.0


@pytest.mark.parametrize(
    "kwargs",
    [dict(initial=0), dict(initial=1, maximum=0.5), dict(factor=0.5), dict(jitter=1.5), dict(jitter=-0.1)],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BackoffPolicy(**kwargs)


def test_attempts_are_one_based() -> None:
    with pytest.raises(ValueError):
        BackoffPolicy().delay(0)


async def test_sleep_waits_the_delay_it_returns() -> None:
    b = Backoff(BackoffPolicy(initial=0.01, maximum=0.01, jitter=0))
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await b.sleep() == pytest.approx(0.01)
    assert loop.time() - start >= 0.009
    assert b.attempts == 1


def test_a_connection_lost_as_soon_as_it_opened_counts_as_a_failure() -> None:
    """A server that accepts and drops at once is retried at a growing
    interval; a connection that stayed up healthy_after starts afresh."""
    b = Backoff(BackoffPolicy(initial=0.05, maximum=2.0, jitter=0, healthy_after=5.0))
    delays = [b.after_loss(0.001) for _ in range(7)]
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert b.after_loss(5.0) == 0.05  # it had proved healthy
    assert b.after_loss(4.9) == 0.1


def test_throttled_warnings_say_how_many_were_left_out(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from rustext.throttledlog import ThrottledLog

    now = [100.0]
    t = ThrottledLog(logging.getLogger("test.throttled"), interval=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.throttled"):
        assert t.warning("lost %s", "redis")
        for _ in range(500):
            assert not t.warning("lost %s", "redis")
        assert t.warning("another kind")  # each kind has its own interval
        now[0] += 10.0
        assert t.warning("lost %s", "redis")
        t.reset("lost %s")
        assert t.warning("lost %s", "redis")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["lost redis", "another kind", "lost redis (500 more like it in the last 10 s)", "lost redis"]
