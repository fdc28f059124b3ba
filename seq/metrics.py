"""Prometheus metrics of one member (``juggler seq server --metrics-port``).

A collector reads the member's counters at scrape time (own registry, no
global state); the HTTP endpoint runs on prometheus_client's thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from seq.server import RRServer


class _Collector(Collector):
    def __init__(self, server: RRServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Any]:
        s = self._server.stats
        store = self._server.store
        rounds = CounterMetricFamily("seq_rounds", "Quorum rounds by outcome", labels=["result"])
        rounds.add_metric(["won"], s.rounds_won)
        rounds.add_metric(["conflict"], s.rounds_conflict)
        rounds.add_metric(["no_quorum"], s.rounds_no_quorum)
        yield rounds
        yield CounterMetricFamily("seq_requests", "NextID requests coordinated here", value=s.requests)
        yield CounterMetricFamily("seq_requests_expired", "Requests that hit their deadline", value=s.requests_expired)
        yield CounterMetricFamily("seq_ids_issued", "IDs in ranges won here", value=s.ids_issued)
        yield CounterMetricFamily("seq_forwarded", "Batches served by the preferred member", value=s.forwarded)
        yield CounterMetricFamily("seq_forward_failures", "Forwards that failed", value=s.forward_failures)
        yield CounterMetricFamily("seq_store_fsyncs", "Log batches written and fsync'd", value=store.fsyncs)
        yield CounterMetricFamily("seq_store_writes", "Entries written to the log", value=store.writes)
        yield GaugeMetricFamily("seq_round_max_attempts", "Most attempts one round needed", value=s.max_attempts)
        yield GaugeMetricFamily("seq_ready", "1 when this member votes", value=1 if self._server.state == "ready" else 0)
        yield GaugeMetricFamily("seq_names", "Sequences this member holds", value=len(store))


def serve_metrics(server: RRServer, port: int, addr: str = "127.0.0.1") -> Any:
    """Start the endpoint; returns the WSGI server (call ``shutdown()`` to stop it)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Collector(server))
    httpd, _thread = start_http_server(port, addr=addr, registry=registry)
    return httpd
