"""Calls waiting for their result: the server's table of pending calls.

A CALL that the broker accepted is *pending* until its RES comes back
(routed here by ``msg_uuid`` to the connection that made it) or its timeout
passes. After the timeout a result can no longer come (the callee drops
calls whose deadline passed), so the entry is forgotten ``grace`` seconds
later.

Expiry runs on ``rustext.DeadlineHeap``: each entry is scheduled once, a
result cancels it (O(log n)), and one timer, armed for the earliest
deadline, pops only what is due: no periodic scan of every pending call.

Owners are the connections that made the calls; the table keeps each
owner's ``inflight`` count (calls ACKed and waiting for their RES) and reads
its ``closed`` flag. Times are the event loop's clock (``loop.time()``).

``on_expire(owner, msg_uuid, uri, timeout_ms)``, when set, is told of each
call forgotten by expiry: the server answers it with an error RES, so that
no acknowledged call is left without an answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import rustext

__all__ = ["PendingCalls", "PendingOwner"]


class PendingOwner(Protocol):
    """What the table needs of a caller (a :class:`juggler.conn.Conn`)."""

    inflight: int

    @property
    def closed(self) -> bool: ...


O = TypeVar("O", bound=PendingOwner)


class PendingCalls(Generic[O]):
    """``msg_uuid`` -> (owner, deadline) of the calls waiting for a result.

    Not thread-safe; lives on one event loop. ``on_change`` (if set) is
    called whenever an entry goes away (a result, a failed call, expiry):
    the server's drain waits on it.
    """

    __slots__ = ("_calls", "_clock", "_heap", "_loop", "_timer", "_timer_at", "grace", "on_change", "on_expire")

    def __init__(self, *, grace: float = 1.0, loop: asyncio.AbstractEventLoop | None = None) -> None:
        #: seconds an entry outlives its deadline (a result racing the timeout is still routed)
        self.grace = grace
        self.on_change: Callable[[], None] | None = None
        self.on_expire: Callable[[O, str, str, int], None] | None = None
        # msg_uuid -> (owner, deadline, heap handle, uri, timeout in ms)
        self._calls: dict[str, tuple[O, float, int, str, int]] = {}
        self._heap = rustext.DeadlineHeap()
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def __len__(self) -> int:
        return len(self._calls)

    def __contains__(self, msg_uuid: object) -> bool:
        return msg_uuid in self._calls

    def owner(self, msg_uuid: str) -> O | None:
        """Who is waiting for `msg_uuid`'s result, if anyone."""
        entry = self._calls.get(msg_uuid)
        return entry[0] if entry is not None else None

    def add(self, msg_uuid: str, owner: O, timeout_ms: int, now: float, uri: str = "") -> bool:
        """`owner` waits for `msg_uuid`'s result until ``now + timeout_ms``;
        True. A uuid another owner still waits for (connected, the call
        pending) is refused: False, nothing changed. Results route by uuid,
        so one live caller keeps it; a closed owner's entry is taken over."""
        calls = self._calls
        old = calls.get(msg_uuid)
        if old is not None:
            prev = old[0]
            if prev is not owner and not prev.closed:
                return False
            prev.inflight -= 1
            self._heap.cancel(old[2])
        deadline = now + timeout_ms / 1000.0
        expires = deadline + self.grace
        handle = self._heap.add(int(expires * 1000.0), msg_uuid)
        calls[msg_uuid] = (owner, deadline, handle, uri, timeout_ms)
        owner.inflight += 1
        if self._timer is None or expires < self._timer_at:
            self._arm(expires)
        return True

    def pop(self, msg_uuid: str) -> O | None:
        """The owner waiting for `msg_uuid` (its entry removed), or None: no
        such call, or it expired."""
        entry = self._calls.pop(msg_uuid, None)
        if entry is None:
            return None
        owner = entry[0]
        owner.inflight -= 1
        self._heap.cancel(entry[2])
        if self.on_change is not None:
            self.on_change()
        return owner

    def live(self, now: float) -> int:
        """Calls whose owner is still connected and whose deadline has not passed."""
        return sum(1 for owner, deadline, *_ in self._calls.values() if not owner.closed and deadline > now)

    def expire(self, now: float) -> int:
        """Forget the calls whose deadline (plus ``grace``) has passed; returns how many."""
        due = self._heap.pop_expired(int(now * 1000.0))
        calls = self._calls
        on_expire = self.on_expire
        for msg_uuid in due:
            entry = calls.pop(msg_uuid)
            entry[0].inflight -= 1
            if on_expire is not None:
                on_expire(entry[0], msg_uuid, entry[3], entry[4])
        if due and self.on_change is not None:
            self.on_change()
        return len(due)

    def clear(self) -> None:
        """Forget every call and stop the timer (the server has closed)."""
        for owner, *_ in self._calls.values():
            owner.inflight -= 1
        self._calls.clear()
        self._heap.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # the timer: armed for the earliest expiry while anything is pending -----------

    def _arm(self, at: float) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        assert self._loop is not None
        self.expire(self._loop.time())
        nxt = self._heap.next_deadline()
        if nxt is not None:
            # at least 50 ms apart: entries due close together expire in one run
            self._arm(max(nxt / 1000.0, self._loop.time() + 0.05))
