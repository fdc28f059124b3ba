"""Prometheus metrics of the server: requests, errors, latency, in flight.

Metrics go to the ``CollectorRegistry`` given (a new one by default, never
the process-global one), labelled by service and method::

    rpc_server_requests_total{service,method}
    rpc_server_errors_total{service,method}
    rpc_server_request_duration_seconds{service,method}   (histogram)
    rpc_server_in_flight                                  (gauge)
    rpc_server_connections                                (gauge)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from rpc.service import Context, Peer

BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class MetricsPlugin:
    def __init__(self, registry: CollectorRegistry | None = None, *, namespace: str = "rpc_server") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ("service", "method")
        self.requests = Counter(f"{namespace}_requests", "Requests handled", labels, registry=self.registry)
        self.errors = Counter(f"{namespace}_errors", "Requests answered with an error", labels, registry=self.registry)
        self.latency = Histogram(
            f"{namespace}_request_duration_seconds", "Handler latency (decode to encode)", labels,
            buckets=BUCKETS, registry=self.registry,
        )
        self.in_flight = Gauge(f"{namespace}_in_flight", "Requests being handled", registry=self.registry)
        self.connections = Gauge(f"{namespace}_connections", "Open connections", registry=self.registry)
        self._children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    def _labels(self, ctx: Context) -> tuple[Any, Any, Any]:
        key = (ctx.service, ctx.method)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.requests.labels(*key), self.errors.labels(*key), self.latency.labels(*key),
            )
        return children

    def on_conn_accept(self, peer: Peer) -> None:
        self.connections.inc()

    def on_conn_close(self, peer: Peer) -> None:
        self.connections.dec()

    def pre_call(self, ctx: Context, args: Any) -> None:
        self.in_flight.inc()
        if ctx.values is None:
            ctx.values = {}
        ctx.values["metrics.in_flight"] = True

    def post_call(self, ctx: Context, args: Any, reply: Any, error: BaseException | None) -> None:
        requests, errors, latency = self._labels(ctx)
        requests.inc()
        if error is not None:
            errors.inc()
        latency.observe(time.perf_counter() - ctx.started)
        # pre_call does not run when the request failed before it (unknown
        # method, undecodable args): then it never counted as in flight.
        if ctx.values is not None and ctx.values.pop("metrics.in_flight", False):
            self.in_flight.dec()

    def exposition(self) -> bytes:
        """The text exposition format (what ``/metrics`` serves)."""
        return generate_latest(self.registry)
