"""The Redis broker's options and counters."""

from __future__ import annotations

from dataclasses import dataclass

from rustext.tls import ClientTls, TlsConfigError

from juggler.broker.resp import RedisAddress

__all__ = ["RedisBrokerConfig", "RedisBrokerStats"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RedisBrokerConfig:
    """Redis broker options: where Redis is, queue capacities, batching, timeouts."""

    #: ``redis://[user:password@]host:port/db``, ``rediss://…`` (TLS) or ``unix:///path?db=N`` (unused when ``cluster`` is set)
    url: str = "redis://127.0.0.1:6379/0"
    #: max calls queued per URI (more: NACK 500 "list capacity exceeded"); 0 = unbounded, as the original
    call_cap: int = 10_000
    #: max results queued per routing key; 0 = unbounded
    result_cap: int = 100_000
    #: calls a callee stream pops at once
    call_batch: int = 32
    #: results the listener pops at once
    result_batch: int = 512
    #: seconds one blocking pop waits before it is re-issued
    block_timeout: float = 2.0
    #: seconds without a reply before a connection is declared dead (its commands fail)
    command_timeout: float = 10.0
    #: seconds to open a connection to Redis
    connect_timeout: float = 5.0
    #: command connections shared by the process (per node on a cluster)
    pool_size: int = 2
    #: seconds between health PINGs on the pub-sub connection (no answer by the next: reconnect)
    pubsub_health_interval: float = 15.0
    #: ms a callee gives a call whose deadline was lost with a pop check's reply (then asked again
    #: and gone: expired, or consumed by the lost check); the server drops a result that comes too late
    unknown_deadline_ms: int = 60_000
    #: the routing key of this process's calls (a fresh UUID when None)
    conn_uuid: str | None = None
    #: Redis Cluster seed node URLs; non-empty = cluster mode (``url`` is then unused)
    cluster: tuple[str, ...] = ()
    #: cluster mode: seconds an operation keeps retrying MOVED/ASK/CLUSTERDOWN/connection errors
    cluster_retry_timeout: float = 10.0
    #: ``rediss://`` URLs: PEM CA certificates to verify Redis against (none: the system's trust store)
    tls_ca: str | None = None
    #: ``rediss://`` URLs: PEM client certificate, for a Redis that requires one (``tls-auth-clients``)
    tls_cert: str | None = None
    #: ``rediss://`` URLs: PEM private key of ``tls_cert``
    tls_key: str | None = None
    #: ``rediss://`` URLs: do not verify Redis's certificate at all (only for trying things out)
    tls_insecure: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.cluster, str):
            object.__setattr__(self, "cluster", tuple(u for u in self.cluster.split(",") if u))
        else:
            object.__setattr__(self, "cluster", tuple(self.cluster))
        tls = self.client_tls()
        for u in self.cluster:
            RedisAddress.from_url(u, tls=tls)
        if self.cluster_retry_timeout <= 0:
            raise ValueError("cluster_retry_timeout must be > 0")
        if self.call_cap < 0 or self.result_cap < 0:
            raise ValueError("capacities must be >= 0")
        if self.call_batch < 1 or self.result_batch < 1:
            raise ValueError("batches must be >= 1")
        if self.block_timeout <= 0 or self.pubsub_health_interval <= 0:
            raise ValueError("block_timeout and pubsub_health_interval must be > 0")
        if self.pool_size < 1:
            raise ValueError("pool_size must be >= 1")
        if self.unknown_deadline_ms < 1:
            raise ValueError("unknown_deadline_ms must be >= 1")
        if not self.cluster:
            RedisAddress.from_url(self.url, tls=tls)
        if tls is not None:
            tls.context()  # a bad file is reported at start, naming it

    def client_tls(self) -> ClientTls | None:
        """The TLS options for ``rediss://`` URLs, if any was set."""
        if not (self.tls_ca or self.tls_cert or self.tls_key or self.tls_insecure):
            return None
        try:
            return ClientTls(ca=self.tls_ca, cert=self.tls_cert, key=self.tls_key, insecure=self.tls_insecure)
        except TlsConfigError as exc:
            raise ValueError(f"Redis TLS: {exc}") from None

    def address(self) -> RedisAddress:
        """Where the broker connects (the first seed in cluster mode)."""
        return RedisAddress.from_url(self.cluster[0] if self.cluster else self.url, tls=self.client_tls())


@dataclass(slots=True)
class RedisBrokerStats:
    calls: int = 0  # calls pushed
    call_failures: int = 0  # pushes refused (capacity, Redis errors)
    results_received: int = 0  # results popped and routed
    expired_results: int = 0  # results popped with their TTL gone
    calls_popped: int = 0  # calls handed to callees
    expired_calls: int = 0  # calls popped with their TTL gone
    checks_unknown: int = 0  # calls/results popped whose pop check's reply was lost (handed on, not dropped)
    results_sent: int = 0  # results pushed by callees
    published: int = 0
    events: int = 0  # events delivered to local subscribers
    redis_subscriptions: int = 0  # channels + patterns subscribed in Redis now
