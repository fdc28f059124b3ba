"""Capped, jittered exponential backoff: the one policy behind every
reconnect and retry loop of the suite (brokers, cluster routing, discovery
watches, connection pools, seq links).

Why jitter: when a shared dependency (Redis, etcd, a peer) restarts, every
client that lost it retries; without randomness they retry in lock-step and
hit it together on each round. Each delay here is drawn from
``[d * (1 - jitter), d]`` where ``d = min(maximum, initial * factor**n)``, so
it never exceeds ``maximum`` (the cap is a promise to operators) and, with
the default ``jitter = 0.5``, it is "equal jitter": at least half the
exponential delay, spread over the other half.

Pure Python and I/O-free apart from :meth:`Backoff.sleep`; the random source
can be injected so tests control it.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

__all__ = ["Backoff", "BackoffPolicy"]


@dataclass(frozen=True, kw_only=True)
class BackoffPolicy:
    """How delays grow: ``initial`` seconds, times ``factor`` per failed
    attempt, capped at ``maximum``; ``jitter`` is the fraction of each delay
    that is randomised (0 = none, 1 = anywhere from 0 to the delay)."""

    initial: float = 0.05
    maximum: float = 2.0
    factor: float = 2.0
    jitter: float = 0.5
    #: seconds a connection must stay up to count as a success (see :meth:`Backoff.after_loss`)
    healthy_after: float = 5.0

    def __post_init__(self) -> None:
        if not self.initial > 0:
            raise ValueError(f"backoff initial delay must be > 0, got {self.initial!r}")
        if not self.maximum >= self.initial:
            raise ValueError(f"backoff maximum ({self.maximum!r}) must be >= the initial delay ({self.initial!r})")
        if not self.factor >= 1:
            raise ValueError(f"backoff factor must be >= 1, got {self.factor!r}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff jitter must be in [0, 1], got {self.jitter!r}")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay before retry number ``attempt`` (1-based)."""
        if attempt < 1:
            raise ValueError(f"attempt is 1-based, got {attempt}")
        # factor ** (attempt - 1) overflows float for large attempts; the cap is reached long before
        exponent = min(attempt - 1, 1024)
        try:
            base = min(self.maximum, self.initial * self.factor**exponent)
        except OverflowError:
            base = self.maximum
        if not self.jitter:
            return base
        draw = (rng or random).random()
        return base * (1.0 - self.jitter * draw)


class Backoff:
    """One loop's backoff state.

    Call :meth:`next_delay` (or ``await`` :meth:`sleep`) after each failure
    and :meth:`reset` after a success; for a connection that may be lost
    right after it opened, :meth:`after_loss` instead of a reset on open.
    Not shared between tasks: each loop owns one.
    """

    __slots__ = ("policy", "attempts", "_rng")

    def __init__(self, policy: BackoffPolicy | None = None, *, rng: random.Random | None = None) -> None:
        self.policy = policy if policy is not None else BackoffPolicy()
        self.attempts = 0
        self._rng = rng

    def next_delay(self) -> float:
        """Count one more failed attempt and return how long to wait before the next."""
        self.attempts += 1
        return self.policy.delay(self.attempts, self._rng)

    async def sleep(self) -> float:
        """Wait :meth:`next_delay` seconds; returns the delay waited. Safe to cancel."""
        delay = self.next_delay()
        await asyncio.sleep(delay)
        return delay

    def reset(self) -> None:
        """Back to the initial delay (after a success)."""
        self.attempts = 0

    def after_loss(self, up_for: float) -> float:
        """The delay before reconnecting once a connection that stayed up
        `up_for` seconds is lost. Only a connection that proved healthy
        (up ``healthy_after`` seconds) starts the delays afresh; one lost
        sooner counts as one more failed attempt. So a server that accepts
        and drops at once (Redis at ``maxclients``, a proxy without its
        backend) is retried at a growing interval, never in a tight loop."""
        if up_for >= self.policy.healthy_after:
            self.attempts = 0
        return self.next_delay()

    def __repr__(self) -> str:
        return f"Backoff({self.policy!r}, attempts={self.attempts})"
