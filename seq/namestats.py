"""Per-name figures of one member: ranges and IDs it served, when, and how fast (sans-I/O).

:class:`NameStats` counts every range this member answered to a client,
whatever the API (gRPC ``GRPCNextID`` or HTTP ``/v1/next``): the number of
ranges, the number of IDs, the wall-clock time of the last one and a recent
rate (IDs/s, an exponentially weighted average with a one-minute time
constant, so a steady rate reads as itself and a stopped name decays
towards 0).

Monitoring series are bounded: the first ``max_tracked`` names served get
series of their own; every later name is added to one aggregate reported
under the label value :data:`OTHER`, from its first range on, so each
series only ever goes up. A sequence literally named ``_other`` is always
counted in the aggregate. The per-name entries themselves (what
``/v1/names`` and the status page show) are kept for every name served:
they are at most as many as the names the member's store holds.

Time is injected (``clock``: seconds, monotonic; ``wall``: Unix time), so
tests control it. Not thread-safe: the event loop updates it;
:meth:`tracked` copies for a reader on another thread (a scrape).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["OTHER", "NameFigures", "NameStats"]

#: label value of the aggregate of the names beyond the cap
OTHER = "_other"

RATE_WINDOW = 60.0  # seconds: time constant of the recent rate


@dataclass(slots=True)
class NameFigures:
    """What one name (or the aggregate) was served."""

    ranges: int = 0
    ids: int = 0
    last_wall: float | None = None  # Unix time of the last range, None when none
    _rate: float = 0.0  # IDs/s at _rate_at
    _rate_at: float = 0.0

    def add(self, n: int, now: float, wall: float) -> None:
        self.ranges += 1
        self.ids += n
        self.last_wall = wall
        self._rate = self._rate * math.exp(-(now - self._rate_at) / RATE_WINDOW) + n / RATE_WINDOW
        self._rate_at = now

    def rate(self, now: float) -> float:
        """Recent IDs/s as of `now` (the same clock as :meth:`add`)."""
        if self._rate == 0.0:
            return 0.0
        return self._rate * math.exp(-max(0.0, now - self._rate_at) / RATE_WINDOW)

    def copy(self) -> NameFigures:
        return NameFigures(self.ranges, self.ids, self.last_wall, self._rate, self._rate_at)


class NameStats:
    """Per-name figures; see the module doc for the cap."""

    def __init__(
        self,
        *,
        max_tracked: int = 1000,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if max_tracked < 0:
            raise ValueError("max_tracked must be >= 0")
        self.max_tracked = max_tracked
        self.clock = clock
        self._wall = wall
        self._names: dict[str, NameFigures] = {}
        self._tracked: dict[str, NameFigures] = {}  # the same objects as in _names, first come
        self._other = NameFigures()
        self._other_names = 0

    def served(self, name: str, n: int) -> None:
        """This member answered a range of `n` IDs of `name`."""
        now, wall = self.clock(), self._wall()
        f = self._names.get(name)
        if f is None:
            f = self._names[name] = NameFigures()
            if len(self._tracked) < self.max_tracked and name != OTHER:
                self._tracked[name] = f
            else:
                self._other_names += 1
        f.add(n, now, wall)
        if name not in self._tracked:
            self._other.add(n, now, wall)

    def get(self, name: str) -> NameFigures | None:
        return self._names.get(name)

    def __len__(self) -> int:
        return len(self._names)

    def tracked(self) -> tuple[list[tuple[str, NameFigures]], NameFigures | None, int]:
        """Copies of (the tracked names' figures, the aggregate or None when
        no name is beyond the cap, how many names the aggregate holds)."""
        while True:
            try:
                items = [(k, v.copy()) for k, v in list(self._tracked.items())]
                break
            except RuntimeError:  # changed size under a reader on another thread: read again
                continue
        other = self._other.copy() if self._other_names else None
        return items, other, self._other_names
