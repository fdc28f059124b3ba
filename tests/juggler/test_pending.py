"""juggler/pending.py: the table of calls waiting for their result, expiring
on the native deadline heap (times are passed in; one test runs the timer)."""

from __future__ import annotations

import asyncio

from juggler.pending import PendingCalls


class Owner:
    def __init__(self) -> None:
        self.inflight = 0
        self.closed = False


def test_add_pop_and_inflight_counts() -> None:
    t = PendingCalls[Owner](loop=asyncio.new_event_loop())
    a, b = Owner(), Owner()
    try:
        t.add("u1", a, 1000, now=0.0)
        t.add("u2", a, 1000, now=0.0)
        t.add("u3", b, 1000, now=0.0)
        assert (len(t), a.inflight, b.inflight) == (3, 2, 1)
        assert t.owner("u1") is a and "u3" in t and t.owner("nope") is None
        assert t.pop("u1") is a and a.inflight == 1
        assert t.pop("u1") is None and a.inflight == 1  # a late result
        # a uuid another connected caller waits for is refused; once it has gone, taken over
        assert t.add("u2", b, 1000, now=0.0) is False
        assert (a.inflight, b.inflight, t.owner("u2")) == (1, 1, a)
        assert t.add("u2", a, 2000, now=0.0) is True  # its own call again: renewed
        a.closed = True
        assert t.add("u2", b, 1000, now=0.0) is True
        assert (a.inflight, b.inflight, t.owner("u2")) == (0, 2, b)
        assert len(t) == 2
    finally:
        t.clear()
        t._loop.close()  # type: ignore[union-attr]


def test_expire_pops_only_what_is_due_after_the_grace() -> None:
    loop = asyncio.new_event_loop()
    t = PendingCalls[Owner](grace=1.0, loop=loop)
    o = Owner()
    changes = []
    t.on_change = lambda: changes.append(len(t))
    try:
        t.add("short", o, 100, now=10.0)  # deadline 10.1, forgotten at 11.1
        t.add("long", o, 5000, now=10.0)  # deadline 15.0, forgotten at 16.0
        assert t.live(now=10.05) == 2
        assert t.live(now=10.2) == 1  # past its deadline: no longer live, still routed
        assert t.expire(now=11.0) == 0 and len(t) == 2
        assert t.expire(now=11.1) == 1 and t.owner("short") is None and t.owner("long") is o
        assert o.inflight == 1 and changes == [1]
        o.closed = True
        assert t.live(now=12.0) == 0  # its caller has gone
        assert t.pop("long") is o and changes == [1, 0]
        assert t.expire(now=100.0) == 0  # popped entries left nothing in the heap
        assert o.inflight == 0
    finally:
        t.clear()
        loop.close()


def test_clear_forgets_everything() -> None:
    loop = asyncio.new_event_loop()
    t = PendingCalls[Owner](loop=loop)
    o = Owner()
    try:
        for i in range(5):
            t.add(f"u{i}", o, 1000, now=0.0)
        t.clear()
        assert len(t) == 0 and o.inflight == 0 and t.expire(now=1e9) == 0
    finally:
        loop.close()


async def test_the_timer_expires_calls_on_its_own() -> None:
    t = PendingCalls[Owner](grace=0.01)
    o = Owner()
    gone = asyncio.Event()
    t.on_change = lambda: gone.set() if not len(t) else None
    now = asyncio.get_running_loop().time()
    t.add("later", o, 200, now)
    t.add("sooner", o, 20, now)  # an earlier expiry re-arms the timer
    t.add("result", o, 20, now)
    assert t.pop("result") is o
    await asyncio.wait_for(gone.wait(), timeout=5)
    assert len(t) == 0 and o.inflight == 0
    t.clear()
