"""Per-loop deadline tracking on the rustext min-heap timer.

One ``DeadlineScheduler`` serves many connections: deadlines live in a
``rustext.DeadlineHeap`` (O(log n) add and cancel, millisecond integers) and
a single ``loop.call_at`` is armed for the earliest one, re-armed only when a
new deadline is earlier than the armed one. No asyncio timer per request.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from rustext import DeadlineHeap


class DeadlineScheduler:
    """Call ``fire(key)`` for each key whose deadline (ms resolution) passed.

    ``add`` returns a handle for ``cancel``; a cancelled or fired handle
    cancels nothing. Keys fire in deadline order; a key fires no earlier than
    its deadline (deadlines round up to the next millisecond).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fire: Callable[[Any], None]) -> None:
        self._loop = loop
        self._fire = fire
        self._heap = DeadlineHeap()
        self._armed_at: int | None = None
        self._handle: asyncio.TimerHandle | None = None

    def now_ms(self) -> int:
        return int(self._loop.time() * 1000)

    def add(self, timeout: float, key: Any) -> int:
        deadline = math.ceil((self._loop.time() + timeout) * 1000)
        handle = self._heap.add(deadline, key)
        if self._armed_at is None or deadline < self._armed_at:
            self._arm(deadline)
        return handle

    def cancel(self, handle: int) -> bool:
        # The armed call_at may now be early; it then finds nothing due and re-arms.
        return self._heap.cancel(handle)

    def __len__(self) -> int:
        return len(self._heap)

    def _arm(self, deadline: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = deadline
        self._handle = self._loop.call_at(deadline / 1000, self._run)

    def _run(self) -> None:
        self._handle = None
        self._armed_at = None
        # loop.time() may be a hair before the ms boundary we asked for.
        due = self._heap.pop_expired(math.ceil(self._loop.time() * 1000))
        nxt = self._heap.next_deadline()
        if nxt is not None:
            self._arm(nxt)
        for key in due:
            self._fire(key)

    def close(self) -> list[Any]:
        """Stop the timer; returns the keys still scheduled."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed_at = None
        return self._heap.clear()
