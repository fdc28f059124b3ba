"""seq/quorum.py: vote counting without a network."""

from __future__ import annotations

import pytest

from seq.quorum import Outcome, ReadTally, WriteTally


def tally() -> WriteTally:
    return WriteTally(asked=3, write_quorum=2, read_quorum=2)


def test_two_yeses_win() -> None:
    t = tally()
    t.observe(0, 11)
    assert t.outcome is Outcome.PENDING
    t.accepted(1, 11)
    assert t.outcome is Outcome.PENDING
    t.accepted(0)
    assert t.outcome is Outcome.WON


def test_lost_as_soon_as_a_quorum_is_impossible() -> None:
    t = tally()
    t.rejected(0, 20)
    assert t.outcome is Outcome.PENDING
    t.failed(1)
    assert t.outcome is Outcome.LOST
    assert t.next_h() is None  # one value seen: not a read quorum


def test_a_lost_round_gives_the_next_h_from_a_read_quorum() -> None:
    t = tally()
    t.observe(0, 15)  # our own store accepted (value now 15), fsync pending
    t.rejected(1, 30)
    t.rejected(2, 25)
    assert t.outcome is Outcome.LOST
    assert t.next_h() == 30


def test_local_yes_waits_for_durability() -> None:
    t = tally()
    t.observe(0, 15)
    t.rejected(1, 30)
    assert t.outcome is Outcome.PENDING  # member 0 may still say yes, member 2 has not answered
    t.failed(0)  # fsync failed
    assert t.outcome is Outcome.LOST


def test_more_answers_than_members_is_a_bug() -> None:
    t = WriteTally(asked=1, write_quorum=1, read_quorum=1)
    t.accepted(0, 2)
    with pytest.raises(RuntimeError):
        t.failed(0)


@pytest.mark.parametrize("bad", [dict(asked=3, write_quorum=4, read_quorum=2), dict(asked=3, write_quorum=0, read_quorum=2)])
def test_bad_sizes(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        WriteTally(**bad)


def test_read_tally() -> None:
    r = ReadTally(asked=3, read_quorum=2)
    r.answered(5)
    assert r.outcome is Outcome.PENDING and r.value() is None
    r.failed()
    r.answered(9)
    assert r.outcome is Outcome.WON and r.value() == 9
    r = ReadTally(asked=3, read_quorum=2)
    r.failed()
    r.failed()
    assert r.outcome is Outcome.LOST
