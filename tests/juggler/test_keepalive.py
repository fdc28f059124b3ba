"""juggler/keepalive.py: the keepalive rules, sans-I/O, on a clock the test
moves (plain numbers; no socket, no loop, no sleep)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from juggler.keepalive import (
    KEEPALIVE,
    PING,
    PING_TIMEOUT,
    READ_TIMEOUT,
    Keepalive,
    ServerWatch,
    keepalive_frame,
    keepalive_interval,
    opted_in,
)

UUID = "5f0c1d9e-8a52-4f0e-9d64-8a3d7e1b2c4f"


class Peer:
    """A connection driven as conn.py drives it: the timer fires at next_tick."""

    def __init__(self, ka: Keepalive, now: float = 0.0) -> None:
        self.ka = ka
        self.now = now
        self.last_in = now
        self.last_message = now
        self.pings: list[float] = []
        self.closed: tuple[str, float] | None = None

    def receive(self, at: float, message: bool = False) -> None:
        self.last_in = at
        if message:
            self.last_message = at

    def run_until(self, end: float, answer_after: float | None = None, answer_until: float = float("inf")) -> None:
        """Fire the timer until `end`; ``answer_after``: the peer answers each
        ping that long after it (a pong), as long as the ping is before ``answer_until``."""
        pongs: list[float] = []
        while self.closed is None:
            when = self.ka.next_tick(self.last_message)
            if when is None or when > end:
                return
            while pongs and pongs[0] <= when:
                self.receive(pongs.pop(0))
            self.now = when
            due = self.ka.tick(when, self.last_in, self.last_message)
            if due == PING:
                self.pings.append(when)
                if answer_after is not None and when < answer_until:
                    pongs.append(when + answer_after)
            elif due is not None:
                self.closed = (due, when)


def keepalive(interval: float = 25.0, timeout: float = 10.0, read_timeout: float = 0.0) -> Keepalive:
    return Keepalive(ping_interval=interval, pong_timeout=timeout, read_timeout=read_timeout, now=0.0)


def test_a_ping_every_interval_and_a_peer_that_answers_stays() -> None:
    peer = Peer(keepalive(25, 10))
    peer.run_until(1000, answer_after=0.05)
    assert peer.closed is None
    assert peer.pings == [25.0 * i for i in range(1, 41)]


def test_a_silent_peer_is_closed_at_the_first_unanswered_ping_plus_pong_timeout() -> None:
    peer = Peer(keepalive(25, 10))
    peer.run_until(1000)
    assert peer.pings == [25.0]
    assert peer.closed == (PING_TIMEOUT, 35.0)  # ping_interval + pong_timeout after the last bytes


def test_a_peer_that_stops_answering_goes_within_interval_plus_timeout_of_its_last_bytes() -> None:
    peer = Peer(keepalive(25, 10))
    peer.run_until(1000, answer_after=0.05, answer_until=100)  # answers the pings at 25, 50, 75
    assert peer.closed == (PING_TIMEOUT, 110.0)  # the ping at 100 is never answered
    assert peer.closed[1] - 75.05 <= 25 + 10


def test_any_traffic_counts_as_life_not_only_pongs() -> None:
    ka = keepalive(1, 0.5)
    assert ka.tick(1.0, 0.0, 0.0) == PING
    assert ka.next_tick(0.0) == 1.5
    assert ka.tick(1.5, 1.2, 1.2) is None  # a message (or any frame) after the ping answers it
    assert ka.awaiting is None and ka.next_tick(1.2) == 2.0


def test_a_pong_timeout_longer_than_the_interval_counts_from_the_first_unanswered_ping() -> None:
    peer = Peer(keepalive(1, 2.5))
    peer.run_until(100)
    assert peer.pings == [1.0, 2.0, 3.0]  # pings go on while waiting
    assert peer.closed == (PING_TIMEOUT, 3.5)


def test_a_late_timer_pings_first_a_paused_server_does_not_drop_everyone() -> None:
    ka = keepalive(25, 10)
    assert ka.tick(25.0, 0.0, 0.0) == PING
    assert ka.tick(25.1, 25.05, 25.05) is None  # answered
    # the process was stopped for a minute: the peer was not asked anything meanwhile
    assert ka.tick(110.0, 25.05, 25.05) == PING
    assert ka.next_tick(25.05) == 120.0
    assert ka.tick(110.2, 110.1, 25.05) is None  # and it answers
    assert ka.next_tick(25.05) == 135.0


def test_an_early_timer_does_nothing_and_asks_again() -> None:
    ka = keepalive(1, 1)
    assert ka.tick(0.999, 0.0, 0.0) is None
    assert ka.next_tick(0.0) == 1.0


def test_read_timeout_counts_messages_only_pongs_do_not_keep_an_idle_client() -> None:
    peer = Peer(keepalive(1, 1, read_timeout=5.5))
    peer.run_until(100, answer_after=0.01)
    assert peer.closed == (READ_TIMEOUT, 5.5)
    peer = Peer(keepalive(1, 1, read_timeout=5.5))
    peer.receive(4.0, message=True)
    peer.run_until(100, answer_after=0.01)
    assert peer.closed == (READ_TIMEOUT, 9.5)


def test_read_timeout_alone_and_nothing_at_all() -> None:
    ka = keepalive(0, 10, read_timeout=3)
    assert ka.active and ka.next_tick(0.0) == 3.0
    assert ka.tick(3.0, 2.0, 0.0) == READ_TIMEOUT
    off = keepalive(0, 10)
    assert not off.active and off.next_tick(0.0) is None and off.tick(1e9, 0.0, 0.0) is None


@pytest.mark.parametrize("kw", [dict(ping_interval=-1), dict(read_timeout=-1), dict(pong_timeout=0)])
def test_invalid_settings(kw: dict[str, float]) -> None:
    args = dict(ping_interval=1.0, pong_timeout=1.0, read_timeout=0.0, now=0.0) | kw
    with pytest.raises(ValueError):
        Keepalive(**args)


@given(
    interval=st.floats(0.1, 100), timeout=st.floats(0.01, 100),
    answers=st.lists(st.floats(0, 200), max_size=30),
)
@settings(deadline=None)  # up to a few thousand ticks an example: no per-example time limit on a busy machine
def test_a_dead_peer_is_closed_within_the_bound_and_no_live_one_is(interval: float, timeout: float,
                                                                   answers: list[float]) -> None:
    """Whatever the peer sends when: closed only after a ping was left
    unanswered for pong_timeout, and never later than interval + timeout
    after its last bytes."""
    ka = keepalive(interval, timeout)
    arrivals = sorted(answers)
    last_in = 0.0
    now = 0.0
    while True:
        when = ka.next_tick(0.0)
        assert when is not None and when >= now
        while arrivals and arrivals[0] <= when:
            last_in = max(last_in, arrivals.pop(0))
        now = when
        due = ka.tick(now, last_in, 0.0)
        if due == PING_TIMEOUT:
            break
        assert due in (PING, None)
    assert ka.awaiting is not None and ka.awaiting > last_in and now >= ka.awaiting + timeout
    assert now - last_in <= interval + timeout + 1e-9


# --- the wire: the opt-in and the KEEPALIVE message ---------------------------------------------


def test_opt_in_values() -> None:
    assert opted_in("1") and opted_in(" 1 ")
    assert not opted_in(None) and not opted_in("0") and not opted_in("") and not opted_in("  ")
    for bad in ("yes", "true", "2", "1,1", "01"):
        with pytest.raises(ValueError, match="expected 1 or 0"):
            opted_in(bad)


@given(st.text(max_size=50))
def test_opt_in_is_1_0_or_refused(value: str) -> None:
    try:
        got = opted_in(value)
    except ValueError:
        assert value.strip() not in ("", "0", "1")
    else:
        assert got is (value.strip() == "1")


def test_the_keepalive_message() -> None:
    frame = keepalive_frame(UUID, 25)
    assert frame.endswith(b"\n")
    msg = json.loads(frame)
    assert msg == {"meta": {"type": KEEPALIVE, "uuid": UUID}, "payload": {"interval_ms": 25000}}
    assert json.loads(keepalive_frame(UUID, 0.2))["payload"] == {"interval_ms": 200}
    assert json.loads(keepalive_frame(UUID, 0.0001))["payload"] == {"interval_ms": 1}


@given(st.floats(0.001, 1e6))
def test_the_interval_a_client_reads_is_the_one_sent(interval: float) -> None:
    got = keepalive_interval(json.loads(keepalive_frame(UUID, interval))["payload"])
    assert got == round(interval * 1000) / 1000


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


@given(st.one_of(json_values, st.dictionaries(st.just("interval_ms"), json_values, min_size=1)))
def test_a_client_ignores_any_payload_without_a_positive_integer_interval(payload: Any) -> None:
    got = keepalive_interval(payload)
    ms = payload.get("interval_ms") if isinstance(payload, dict) else None
    if type(ms) is int and ms > 0:
        assert got == ms / 1000
    else:
        assert got is None


# --- the client's watch of its server ---------------------------------------------------------


def test_the_watch_waits_for_ever_until_a_keepalive_says_the_interval() -> None:
    watch = ServerWatch(grace=10)
    assert watch.limit is None and watch.deadline(0.0) is None and not watch.dead(1e9, 0.0)
    assert not watch.announced({"interval_ms": "25000"})  # ignored: still unarmed
    assert watch.deadline(0.0) is None
    assert watch.announced({"interval_ms": 25000})
    assert watch.limit == 35.0
    assert watch.deadline(100.0) == 135.0
    assert not watch.dead(134.9, 100.0) and watch.dead(135.0, 100.0)
    assert watch.announced({"interval_ms": 5000}) and watch.limit == 15.0  # a later one may change it


def test_the_watch_needs_a_positive_grace() -> None:
    for grace in (0, -1, float("nan")):
        with pytest.raises(ValueError):
            ServerWatch(grace)
