"""Typed configuration of connections, servers and pools (keyword-only dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class ConnectionConfig:
    """Per-connection behaviour (both sides).

    - ``max_frame``: largest message accepted (rpcx total length / frame body);
      a larger one closes the connection before it is buffered.
    - ``max_decompressed``: largest inflated gzip payload (rpcx).
    - ``send_queue_bytes``: bound of the send queue (bytes written but not yet
      taken by the kernel). Over it, ``send_policy`` decides: ``"wait"`` makes
      senders await room (with their deadline), ``"fail"`` raises QueueFull.
    - ``max_handlers``: incoming requests handled at once on this connection;
      further ones queue and reading pauses (TCP back-pressure).
    - ``default_timeout``: deadline of a request without an explicit one
      (seconds; None = no deadline).
    - ``drain_timeout``: how long ``aclose()`` waits for in-flight work.
    """

    max_frame: int = 64 * 1024 * 1024
    max_decompressed: int = 64 * 1024 * 1024
    send_queue_bytes: int = 8 * 1024 * 1024
    send_policy: Literal["wait", "fail"] = "wait"
    max_handlers: int = 256
    default_timeout: float | None = 30.0
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
    """Server-wide bounds: ``max_handlers`` across all connections,
    ``max_connections`` accepted at once (extra ones are closed at accept)."""

    connection: ConnectionConfig = ConnectionConfig()
    max_handlers: int = 4096
    max_connections: int = 10_000

    def __post_init__(self) -> None:
        if self.max_handlers < 1 or self.max_connections < 1:
            raise ValueError("max_handlers and max_connections must be >= 1")


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """Pool behaviour: ``connect_timeout`` per attempt; reconnect backoff
    ``backoff_initial * backoff_factor**n`` capped at ``backoff_max`` with
    ±``jitter`` (fraction) randomisation; after ``down_after`` consecutive
    failures the endpoint is *down*: callers fail fast while the pool keeps
    retrying at ``backoff_max``. With ``heartbeat_interval`` set, the pool
    sends a heartbeat on each working connection that often; one unanswered
    within ``heartbeat_timeout`` closes the connection (its requests fail at
    once) and reconnecting starts: a silent peer is found without traffic."""

    connection: ConnectionConfig = ConnectionConfig()
    connect_timeout: float = 5.0
    backoff_initial: float = 0.05
    backoff_factor: float = 2.0
    backoff_max: float = 5.0
    jitter: float = 0.2
    down_after: int = 3
    heartbeat_interval: float | None = None
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
        if self.down_after < 1:
            raise ValueError("down_after must be >= 1")
