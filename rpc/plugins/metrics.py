"""Prometheus metrics of the server: requests, errors, latency, in flight.

Metrics go to the ``CollectorRegistry`` given (a new one by default, never
the process-global one), labelled by service and method::

    rpc_server_requests_total{service,method}
    rpc_server_errors_total{service,method}
    rpc_server_request_duration_seconds{service,method}   (histogram, seconds)
    rpc_server_in_flight                                  (gauge)
    rpc_server_connections                                (gauge)

Per request this plugin only bumps plain integers (hooks run on the event
loop thread, so no lock is needed); the metric families are built when the
registry is scraped. That keeps its cost far below prometheus_client's
locked per-sample updates at tens of thousands of requests per second.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

if TYPE_CHECKING:
    from rpc.service import Context, Peer

BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Stats:
    __slots__ = ("requests", "errors", "sum", "buckets")

    def __init__(self, n: int) -> None:
        self.requests = 0
        self.errors = 0
        self.sum = 0.0
        self.buckets = [0] * (n + 1)  # last one is +Inf


class MetricsPlugin:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "rpc_server",
        buckets: tuple[float, ...] = BUCKETS,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.namespace = namespace
        self.buckets = tuple(sorted(buckets))
        self._stats: dict[tuple[str, str], _Stats] = {}
        self.in_flight = 0
        self.connections = 0
        self.registry.register(self)

    # -- hooks ---------------------------------------------------------------

    def on_conn_accept(self, peer: Peer) -> None:
        self.connections += 1

    def on_conn_close(self, peer: Peer) -> None:
        self.connections -= 1

    def pre_call(self, ctx: Context, args: Any) -> None:
        self.in_flight += 1
        if ctx.values is None:
            ctx.values = {}
        ctx.values["metrics.in_flight"] = True

    def post_call(self, ctx: Context, args: Any, reply: Any, error: BaseException | None) -> None:
        key = (ctx.service, ctx.method)
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = _Stats(len(self.buckets))
        elapsed = time.perf_counter() - ctx.started
        stats.requests += 1
        if error is not None:
            stats.errors += 1
        stats.sum += elapsed
        stats.buckets[bisect.bisect_left(self.buckets, elapsed)] += 1
        # pre_call does not run when the request failed before it (unknown
        # method, undecodable args): then it never counted as in flight.
        if ctx.values is not None and ctx.values.pop("metrics.in_flight", False):
            self.in_flight -= 1

    # -- prometheus collector --------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        ns = self.namespace
        labels = ["service", "method"]
        requests = CounterMetricFamily(f"{ns}_requests", "Requests handled", labels=labels)
        errors = CounterMetricFamily(f"{ns}_errors", "Requests answered with an error", labels=labels)
        latency = HistogramMetricFamily(
            f"{ns}_request_duration_seconds", "Handler latency (decode to encode)", labels=labels
        )
        for (service, method), s in sorted(self._stats.items()):
            requests.add_metric([service, method], s.requests)
            errors.add_metric([service, method], s.errors)
            cumulative = 0
            buckets = []
            for bound, n in zip((*self.buckets, float("inf")), s.buckets, strict=True):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            latency.add_metric([service, method], buckets, s.sum)
        yield requests
        yield errors
        yield latency
        yield GaugeMetricFamily(f"{ns}_in_flight", "Requests being handled", value=self.in_flight)
        yield GaugeMetricFamily(f"{ns}_connections", "Open connections", value=self.connections)

    def exposition(self) -> bytes:
        """The text exposition format (what ``/metrics`` serves)."""
        return generate_latest(self.registry)
