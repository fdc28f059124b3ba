"""NameStats (sans-I/O, a controlled clock): counts, the recent rate, and the cap on tracked names."""

from __future__ import annotations

import pytest

from seq.namestats import OTHER, NameStats


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_counts_and_last_time() -> None:
    clock = Clock()
    s = NameStats(clock=clock, wall=lambda: 1.7e9 + clock.t)
    assert s.get("a") is None
    s.served("a", 10)
    clock.t += 5
    s.served("a", 1)
    f = s.get("a")
    assert f is not None and (f.ranges, f.ids, f.last_wall) == (2, 11, 1.7e9 + 1005)


def test_a_steady_rate_reads_as_itself_and_decays_when_it_stops() -> None:
    clock = Clock()
    s = NameStats(clock=clock)
    for _ in range(6000):  # 50 IDs/s for ten minutes
        clock.t += 0.1
        s.served("a", 5)
    f = s.get("a")
    assert f is not None and f.rate(clock.t) == pytest.approx(50, rel=0.01)
    clock.t += 60
    assert f.rate(clock.t) == pytest.approx(50 / 2.718, rel=0.02)  # one time constant later
    clock.t += 3600
    assert f.rate(clock.t) < 1e-20


def test_names_beyond_the_cap_are_aggregated_from_their_first_range() -> None:
    s = NameStats(max_tracked=2, clock=Clock())
    for name in ("a", "b", "c", "d", OTHER):
        s.served(name, 1)
    s.served("c", 4)
    tracked, other, count = s.tracked()
    assert [n for n, _ in tracked] == ["a", "b"]
    assert other is not None and (other.ranges, other.ids, count) == (4, 7, 3)  # c, d and a name "_other"
    assert len(s) == 5 and s.get("c").ids == 5  # type: ignore[union-attr]  # per-name figures are kept for all


def test_no_aggregate_below_the_cap() -> None:
    s = NameStats(max_tracked=10, clock=Clock())
    s.served("a", 1)
    assert s.tracked()[1:] == (None, 0)
    with pytest.raises(ValueError):
        NameStats(max_tracked=-1)
