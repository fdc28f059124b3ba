"""Per-connection limits of the juggler server.

- :class:`TokenBucket` — the per-connection message rate (``rate_limit``
  messages/s, bursts of ``rate_burst``): a message that finds the bucket
  empty is refused with NACK 429, or closes the connection (1008) when
  ``rate_limit_action = "close"``.
- The other limits are counters checked where they apply (see
  ``juggler.conn``): ``max_connections`` (handshake refused with 503),
  ``max_inflight_calls`` (CALL NACK 429), ``max_waiting_calls`` (CALL NACK
  503, all connections together), ``max_subscriptions`` (SUB NACK
  500, as before), and the outbound bounds of a slow consumer
  (``max_write_buffer`` bytes, ``max_outbound`` queued messages,
  ``write_timeout``: the connection is dropped).

Every refusal is counted by reason in ``ServerStats.rejections`` (Prometheus
``juggler_rejections_total{reason}``).
"""

from __future__ import annotations

__all__ = ["REASONS", "TokenBucket"]

#: reasons of ``juggler_rejections_total`` (and of connection-close log lines)
REASONS = (
    "max_connections", "draining", "unauthenticated", "origin", "unauthorized", "forbidden",
    "rate_limited", "inflight_limit", "overloaded", "subscription_limit", "slow_consumer", "write_timeout",
    # the HTTP fallback (juggler.fallback): a POST or reopened stream for no live session, a POST
    # to a session with max_pending messages queued (429)
    "unknown_session", "backpressure",
)


class TokenBucket:
    """`rate` tokens/s, at most `burst` stored; ``take(now)`` spends one if there is one."""

    __slots__ = ("burst", "rate", "t", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.t = now

    def take(self, now: float) -> bool:
        tokens = self.tokens + (now - self.t) * self.rate
        self.t = now
        if tokens > self.burst:
            tokens = self.burst
        if tokens < 1.0:
            self.tokens = tokens
            return False
        self.tokens = tokens - 1.0
        return True
