"""Rate limits: connections per second and requests per second (token buckets).

``TokenBucket`` is sans-I/O: it takes the current time from an injected
clock, so tests drive it with a controlled clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rpc.errors import RateLimited

if TYPE_CHECKING:
    from rpc.message import Message
    from rpc.service import Peer


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` stored; starts full."""

    __slots__ = ("rate", "burst", "_tokens", "_last", "_clock")

    def __init__(self, rate: float, burst: float | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(rate, 1.0))
        if self.burst < 1:
            raise ValueError("burst must be >= 1")
        self._clock = clock
        self._tokens = self.burst
        self._last = clock()

    def try_take(self, n: float = 1.0) -> bool:
        now = self._clock()
        elapsed = now - self._last
        if elapsed > 0:
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
            self._last = now
        if self._tokens >= n - 1e-9:  # float drift must not lose a whole token
            self._tokens -= n
            return True
        return False

    @property
    def tokens(self) -> float:
        return self._tokens


class ConnRateLimitPlugin:
    """Refuse (close) connections accepted above ``rate`` per second."""

    def __init__(self, rate: float, burst: float | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.bucket = TokenBucket(rate, burst, clock=clock)
        self.refused = 0

    def on_conn_accept(self, peer: Peer) -> bool:
        if self.bucket.try_take():
            return True
        self.refused += 1
        return False


class ReqRateLimitPlugin:
    """Answer "request rate limit exceeded" above ``rate`` requests per second
    (server-wide, or per connection with ``per_connection=True``)."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        per_connection: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self.per_connection = per_connection
        self.bucket = TokenBucket(rate, burst, clock=clock)
        self._buckets: dict[int, TokenBucket] = {}
        self.refused = 0

    def post_read(self, peer: Peer, msg: Message) -> None:
        if msg.heartbeat:
            return
        bucket = self.bucket
        if self.per_connection:
            bucket = self._buckets.get(peer.conn_id)  # type: ignore[assignment]
            if bucket is None:
                bucket = self._buckets[peer.conn_id] = TokenBucket(self.rate, self.burst, clock=self._clock)
        if not bucket.try_take():
            self.refused += 1
            raise RateLimited("request rate limit exceeded")

    def on_conn_close(self, peer: Peer) -> None:
        self._buckets.pop(peer.conn_id, None)
