"""Repeated warnings, at most one line per interval.

A dependency that fails in a loop (a Redis that accepts and drops every
connection) must not fill the logs: the first warning of a kind is written,
then at most one per ``interval`` seconds, saying how many were left out
since the last one written. Pure Python; the clock can be injected.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["ThrottledLog"]


class ThrottledLog:
    """Warnings through `logger`, at most one per `interval` seconds per key
    (the message format by default)."""

    __slots__ = ("_clock", "_state", "interval", "logger")

    def __init__(self, logger: logging.Logger, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._state: dict[str, tuple[float, int]] = {}  # key -> (next time a line may go out, left out since)

    def warning(self, msg: str, *args: object, key: str | None = None) -> bool:
        """Log `msg % args` as a warning unless one of its kind went out less
        than `interval` seconds ago; True when written."""
        k = msg if key is None else key
        now = self._clock()
        due, skipped = self._state.get(k, (0.0, 0))
        if now < due:
            self._state[k] = (due, skipped + 1)
            return False
        if skipped:
            msg += f" ({skipped} more like it in the last {self.interval:g} s)"
        self.logger.warning(msg, *args)
        self._state[k] = (now + self.interval, 0)
        return True

    def reset(self, key: str) -> None:
        """Forget a kind (it recovered): its next warning goes out at once."""
        self._state.pop(key, None)
