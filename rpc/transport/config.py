"""Typed configuration of connections, servers and pools (keyword-only dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rustext.backoff import BackoffPolicy


@dataclass(frozen=True, kw_only=True)
class ConnectionConfig:
    """Per-connection behaviour (both sides)."""

    #: largest message accepted in bytes (rpcx total length, frame body); a larger one closes the
    #: connection before it is buffered
    max_frame: int = 64 * 1024 * 1024
    #: largest inflated gzip payload in bytes (rpcx)
    max_decompressed: int = 64 * 1024 * 1024
    #: bound of the send queue: bytes written but not yet taken by the kernel
    send_queue_bytes: int = 8 * 1024 * 1024
    #: over ``send_queue_bytes``: "wait" makes senders wait for room (within their deadline), "fail" raises QueueFull
    send_policy: Literal["wait", "fail"] = "wait"
    #: incoming requests handled at once on this connection; past it reading pauses (TCP back-pressure)
    max_handlers: int = 256
    #: deadline in seconds of a request that gives none; None = no deadline
    default_timeout: float | None = 30.0
    #: seconds ``aclose()`` waits for in-flight requests and handlers
    drain_timeout: float = 5.0

    def __post_init__(self) -> None:
        if self.max_frame <= 0 or self.max_decompressed <= 0:
            raise ValueError("max_frame and max_decompressed must be positive")
        if self.send_queue_bytes <= 0:
            raise ValueError("send_queue_bytes must be positive")
        if self.send_policy not in ("wait", "fail"):
            raise ValueError("send_policy must be 'wait' or 'fail'")
        if self.max_handlers < 1:
            raise ValueError("max_handlers must be >= 1")
        if self.default_timeout is not None and self.default_timeout <= 0:
            raise ValueError("default_timeout must be positive or None")
        if self.drain_timeout < 0:
            raise ValueError("drain_timeout must be >= 0")


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """Server-wide bounds."""

    #: the behaviour of every accepted connection
    connection: ConnectionConfig = ConnectionConfig()
    #: requests handled at once across all connections; past it reading pauses
    max_handlers: int = 4096
    #: connections open at once; extra ones are closed at accept
    max_connections: int = 10_000

    def __post_init__(self) -> None:
        if self.max_handlers < 1 or self.max_connections < 1:
            raise ValueError("max_handlers and max_connections must be >= 1")


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """Pool behaviour: reconnecting with backoff, failing fast while an
    endpoint is down, and finding silent peers with heartbeats.

    The delay before reconnect attempt n is ``backoff_initial * backoff_factor**(n-1)``,
    capped at ``backoff_max``, the last ``jitter`` of it random (the suite's
    one backoff policy, ``rustext.backoff``)."""

    #: the behaviour of every pooled connection
    connection: ConnectionConfig = ConnectionConfig()
    #: seconds one connection attempt may take
    connect_timeout: float = 5.0
    #: seconds before the first reconnect attempt
    backoff_initial: float = 0.05
    #: growth of the delay from one attempt to the next
    backoff_factor: float = 2.0
    #: longest delay between attempts, in seconds
    backoff_max: float = 5.0
    #: fraction of each delay that is random (0 ≤ jitter < 1): a delay d is drawn from [d·(1−jitter), d]
    jitter: float = 0.2
    #: consecutive failed attempts after which the endpoint is down: callers fail fast (Unavailable)
    #: while the pool keeps retrying
    down_after: int = 3
    #: seconds between heartbeats on each working connection; None = no heartbeats
    heartbeat_interval: float | None = None
    #: a heartbeat unanswered this long closes the connection (its requests fail at once)
    heartbeat_timeout: float = 5.0

    def __post_init__(self) -> None:
        if self.heartbeat_interval is not None and self.heartbeat_interval <= 0:
            raise ValueError("heartbeat_interval must be positive or None")
        if self.heartbeat_timeout <= 0:
            raise ValueError("heartbeat_timeout must be positive")
        if self.connect_timeout <= 0:
            raise ValueError("connect_timeout must be positive")
        if self.backoff_initial <= 0 or self.backoff_max < self.backoff_initial:
            raise ValueError("need 0 < backoff_initial <= backoff_max")
        if self.backoff_factor < 1:
            raise ValueError("backoff_factor must be >= 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")

    @property
    def backoff(self) -> BackoffPolicy:
        """The reconnect delays as the suite's backoff policy."""
        return BackoffPolicy(initial=self.backoff_initial, maximum=self.backoff_max,
                             factor=self.backoff_factor, jitter=self.jitter)
        if self.down_after < 1:
            raise ValueError("down_after must be >= 1")
